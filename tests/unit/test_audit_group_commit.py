"""The audit store's group commit (:mod:`harness.audit.database`): writers of one process that
write at the same time share a transaction, each returns only once its own record is
committed, a body that raises loses only its own record, and the audit chain stays one
verifiable line. Real database files under tmp_path, real threads."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.audit.chain_verify import verify
from harness.audit.database import ENSURE_RUN, _Queued
from harness.audit.store import AuditError, AuditStore

WRITERS = 6


def _wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll ``condition`` (an observable state of the store, no fixed delay) until it holds."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting for the writers to queue"
        time.sleep(0.001)


def _committed_runs(db: Path) -> set[str]:
    """The run ids another connection sees: what is committed."""
    conn = sqlite3.connect(db)
    try:
        return {row[0] for row in conn.execute("SELECT id FROM runs")}
    finally:
        conn.close()


def _insert_run(run_id: str) -> Callable[[sqlite3.Connection], str]:
    def body(conn: sqlite3.Connection) -> str:
        conn.execute(ENSURE_RUN, (run_id, time.time()))
        return threading.current_thread().name

    return body


class _Group:
    """A first writer held inside its transaction (so the others queue behind it), then
    ``WRITERS`` writers released together: they are committed as one group."""

    def __init__(self, store: AuditStore, bodies: list[Callable[[sqlite3.Connection], Any]]) -> None:
        self.store = store
        self.bodies = bodies
        self.hold = threading.Event()
        self.held = threading.Event()
        self.outcomes: dict[int, tuple[Any, BaseException | None]] = {}
        self.seen_after: dict[int, set[str]] = {}

    def _first(self, conn: sqlite3.Connection) -> None:
        conn.execute(ENSURE_RUN, ("first", time.time()))
        self.held.set()
        assert self.hold.wait(10)

    def _writer(self, i: int) -> None:
        try:
            self.outcomes[i] = (self.store._write(self.bodies[i]), None)
        except BaseException as exc:
            self.outcomes[i] = (None, exc)
        self.seen_after[i] = _committed_runs(self.store.path)

    def run(self) -> None:
        first = threading.Thread(target=self.store._write, args=(self._first,))
        first.start()
        assert self.held.wait(10)
        threads = [threading.Thread(target=self._writer, args=(i,), name=f"writer-{i}")
                   for i in range(len(self.bodies))]
        try:
            for thread in threads:
                thread.start()
            _wait_until(lambda: len(self.store._queued) == len(self.bodies))
        finally:
            self.hold.set()
            first.join(10)
            for thread in threads:
                thread.join(10)


def test_concurrent_writers_share_one_commit_and_each_returns_after_its_record(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as store:
        group = _Group(store, [_insert_run(f"run-{i}") for i in range(WRITERS)])
        group.run()
        leaders = {result for result, error in group.outcomes.values() if error is None}
        assert len(group.outcomes) == WRITERS and all(e is None for _, e in group.outcomes.values())
        assert len(leaders) == 1, f"the group ran on one thread, its leader; saw {leaders}"
        for i in range(WRITERS):
            assert f"run-{i}" in group.seen_after[i], f"writer {i} returned before its record was committed"
        chain = sqlite3.connect(db)
        try:
            # One commit: the six runs' chain entries are stamped by one seal, in one timestamp.
            stamps = chain.execute("SELECT DISTINCT ts FROM audit_chain WHERE tbl = 'runs' AND key LIKE '%run-%'"
                                   ).fetchall()
        finally:
            chain.close()
        assert len(stamps) == 1
    assert _committed_runs(db) == {"first", *(f"run-{i}" for i in range(WRITERS))}
    assert verify(db).ok


def test_a_failing_body_loses_only_its_own_record(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite3"

    def duplicate(conn: sqlite3.Connection) -> None:
        conn.execute(ENSURE_RUN, ("half-done", time.time()))  # rolled back with the failure below
        conn.execute("INSERT INTO runs (id, created) VALUES ('first', 0)")  # the primary key exists

    def raising(conn: sqlite3.Connection) -> None:
        conn.execute(ENSURE_RUN, ("also-half-done", time.time()))
        raise AuditError("this writer's own refusal")

    bodies = [_insert_run("run-0"), duplicate, _insert_run("run-2"), raising, _insert_run("run-4")]
    with AuditStore(db) as store:
        group = _Group(store, bodies)
        group.run()
        assert group.outcomes[1][1] is not None and isinstance(group.outcomes[1][1], AuditError)
        assert "UNIQUE constraint failed: runs.id" in str(group.outcomes[1][1])
        assert str(group.outcomes[3][1]) == "this writer's own refusal"
        assert all(group.outcomes[i][1] is None for i in (0, 2, 4))
        store.start_run("after")  # the store goes on writing
    assert _committed_runs(db) == {"first", "run-0", "run-2", "run-4", "after"}
    verdict = verify(db)
    assert verdict.ok, verdict


def test_a_failure_of_the_group_fails_every_writer_of_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as store:
        group = _Group(store, [_insert_run(f"run-{i}") for i in range(3)])
        assert store._chain is not None
        seal = store._chain.seal

        def failing_seal(conn: sqlite3.Connection) -> None:
            if conn.execute("SELECT 1 FROM runs WHERE id = 'run-0'").fetchone():
                raise sqlite3.OperationalError("disk I/O error")
            seal(conn)

        monkeypatch.setattr(store._chain, "seal", failing_seal)
        group.run()
        errors = [group.outcomes[i][1] for i in range(3)]
        assert all(isinstance(error, AuditError) for error in errors), errors
        assert sum("group commit of 3 records" in str(error) for error in errors) == 2  # the leader has the cause
        assert all("disk I/O error" in str(error) for error in errors)
        monkeypatch.setattr(store._chain, "seal", seal)
        store.start_run("after")
    assert _committed_runs(db) == {"first", "after"}
    assert verify(db).ok


def test_many_threads_many_writes_keep_the_chain_one_line(tmp_path: Path) -> None:
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as store:

        def writer(i: int) -> None:
            for j in range(40):
                store._write(_insert_run(f"run-{i}-{j}"))
                assert f"run-{i}-{j}" in {r[0] for r in store._read(
                    lambda conn: conn.execute("SELECT id FROM runs").fetchall())}

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not store._queued and not store._leading
    assert len(_committed_runs(db)) == 8 * 40
    verdict = verify(db)
    assert verdict.ok, verdict


def test_a_writer_interrupted_while_it_waits_passes_on_the_lead(tmp_path: Path) -> None:
    """A writer stopped while it waited (Ctrl-C in the main thread) after it was handed the
    lead of the next group: the lead passes on, so the writers queued behind it still commit."""
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as store:
        group = _Group(store, [])
        first = threading.Thread(target=store._write, args=(group._first,))
        first.start()
        assert group.held.wait(10)
        stopped = _Queued(_insert_run("never"))
        with store._queue_lock:
            store._queued.append(stopped)  # queued behind the first writer, as _write queues it
        behind = threading.Thread(target=store._write, args=(_insert_run("behind"),), daemon=True)
        behind.start()
        _wait_until(lambda: len(store._queued) == 2)
        group.hold.set()
        first.join(10)
        assert stopped.done.wait(10) and stopped.lead and not stopped.finished  # it was handed the lead
        store._withdraw(stopped)  # what _write does when the wait is interrupted
        behind.join(10)
        assert not behind.is_alive(), "the writer queued behind the interrupted one never committed"
        assert not store._queued and not store._leading
    assert _committed_runs(db) == {"first", "behind"}
