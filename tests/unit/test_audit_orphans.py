"""Calls whose claiming process is gone (harness.audit.orphans): recorded as interrupted by the
next claimant, never run again unless they never reached their handler; live owners waited
for; the owner columns added to an existing database."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.audit import schema
from harness.audit.interruptions import PROCESS_STOPPED, SERVER_STOPPED, audit_line, interruption
from harness.audit.orphans import OWNER_COLUMNS
from harness.audit.owners import ClaimOwner, this_process
from harness.audit.records import arguments_digest, retry_safe
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ErrorCode

ARGS = '{"command": "echo once >> /data/count"}'
ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")
ASK = Decision(Action.ASK, "tools.shell ask", "needs a human")


@pytest.fixture
def store(tmp_path: Path):  # type: ignore[no-untyped-def]
    with AuditStore(tmp_path / "audit.sqlite3") as s:
        yield s


def ghost(*, boot: str | None = None, started_before: float = 100.0) -> ClaimOwner:
    """An owner with this process's pid but another start time: a pid in use again by another
    process (this one), so the owner is provably gone."""
    me = this_process()
    started = me.started - started_before
    return ClaimOwner(f"{me.host}/{me.pid}/{started:.2f}", me.host, me.pid, started,
                      boot if boot is not None else me.boot_id, me.pid_ns)


def parent() -> ClaimOwner:
    """The process that started the tests: alive for as long as they run."""
    me, pid = this_process(), psutil.Process().ppid()
    started = psutil.Process(pid).create_time()
    return ClaimOwner(f"{me.host}/{pid}/{started:.2f}", me.host, pid, started, me.boot_id, me.pid_ns)


def own(store: AuditStore, run: str, call_id: str, owner: ClaimOwner) -> None:
    """Make ``owner`` the holder of the call's claim, as if that process had claimed it."""
    assert store._conn is not None
    store._conn.execute(f"UPDATE calls SET ({OWNER_COLUMNS}) = (?, ?, ?, ?, ?) WHERE run_id = ? AND call_id = ?",
                        (*owner.columns(), run, call_id))


def running(store: AuditStore, run: str, call_id: str, owner: ClaimOwner) -> None:
    start = store.claim_and_start(run, call_id, "shell", ARGS, lambda _counted: ALLOW)
    assert start.running
    own(store, run, call_id, owner)


def test_a_running_call_of_a_gone_owner_is_recorded_interrupted_and_never_run_again(store: AuditStore) -> None:
    dead = ghost()
    running(store, "r", "x1", dead)
    claim = store.claim_call("r", "x1", "shell", ARGS)
    assert not claim.fresh and claim.state == "done"
    result = claim.result
    assert result is not None and result.is_error and result.error is ErrorCode.INTERRUPTED
    assert result.structured == {"command_started": None, "interrupted": PROCESS_STOPPED, "owner": dead.label,
                                 "noticed_by": this_process().label}
    assert not retry_safe(result)
    assert "'x1' was interrupted (its harness process stopped)" in result.text
    assert "unknown" in result.text and "not run again" in result.text
    again = store.claim_call("r", "x1", "shell", ARGS)  # the same record, still no second run
    assert not again.fresh and again.result == result and again.attempt == 1
    record = store.get_call("r", "x1")
    assert record is not None and record.decision == ALLOW and record.finished is not None
    line = audit_line("x1", interruption(record.result) or {})
    assert line.startswith(f"x1 was interrupted: its harness process (pid {dead.pid} on {dead.host}) stopped; ")
    assert f"pid {this_process().pid} on {dead.host} found it gone" in line and "not run again" in line


def test_a_claimed_call_of_a_gone_owner_never_started_so_the_same_claim_runs_it(store: AuditStore) -> None:
    assert store.claim_call("r", "x1", "shell", ARGS).fresh  # claimed, never decided nor running
    own(store, "r", "x1", ghost())
    claim = store.claim_call("r", "x1", "shell", ARGS)
    assert claim.fresh and claim.attempt == 2 and claim.record.owner == this_process().label
    (earlier,) = claim.record.earlier_attempts
    assert earlier.error_code == "interrupted" and earlier.result is not None
    assert (earlier.result.structured or {})["command_started"] is False
    assert "before its command started" in earlier.result.text


def test_another_boot_of_this_machine_is_gone(store: AuditStore) -> None:
    running(store, "r", "x1", ghost(boot="a-boot-before-this-one", started_before=-5000.0))
    claim = store.claim_call("r", "x1", "shell", ARGS)
    assert not claim.fresh and interruption(claim.result) is not None


def test_a_live_owner_is_waited_for_and_its_call_left_alone(store: AuditStore) -> None:
    running(store, "r", "x1", parent())
    claim = store.claim_call("r", "x1", "shell", ARGS)
    assert not claim.fresh and claim.state == "running"
    assert store.interrupt_orphan("r", "x1") is None
    assert store.wait_for_result("r", "x1", 0.2) is None  # its time ran out: nothing recorded
    record = store.get_call("r", "x1")
    assert record is not None and record.state == "running"


def test_a_call_waiting_for_a_person_is_not_an_orphan(store: AuditStore) -> None:
    start = store.claim_and_start("r", "x1", "shell", ARGS, lambda _counted: ASK)
    assert start.decision == ASK and not start.running
    own(store, "r", "x1", ghost())  # `callbox call` exits once the call is pending: normal
    claim = store.claim_call("r", "x1", "shell", ARGS)
    assert not claim.fresh and claim.state == "claimed" and claim.decision == ASK
    assert store.interrupt_orphan("r", "x1") is None


def test_the_process_that_runs_an_approved_call_becomes_its_owner(store: AuditStore) -> None:
    store.claim_and_start("r", "x1", "shell", ARGS, lambda _counted: ASK)
    own(store, "r", "x1", ghost())
    assert store.mark_running("r", "x1")
    record = store.get_call("r", "x1")
    assert record is not None and record.owner == this_process().label
    assert store.interrupt_orphan("r", "x1") is None  # it runs here, alive


def test_wait_stops_once_the_owner_dies_and_the_call_is_then_recorded(store: AuditStore) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        me, started = this_process(), psutil.Process(child.pid).create_time()
        running(store, "r", "x1", ClaimOwner(f"{me.host}/{child.pid}/{started:.2f}", me.host, child.pid, started,
                                             me.boot_id, me.pid_ns))
        assert store.interrupt_orphan("r", "x1") is None
    finally:
        child.communicate(b"")  # it exits and is reaped
    begun = time.monotonic()
    assert store.wait_for_result("r", "x1", 60) is None
    assert time.monotonic() - begun < 5
    record = store.interrupt_orphan("r", "x1", cause=SERVER_STOPPED)
    assert record is not None and record.state == "done"
    assert (interruption(record.result) or {})["interrupted"] == SERVER_STOPPED
    assert "(the server stopped)" in (record.result_text or "")
    assert store.interrupt_orphan("r", "x1") == record  # finished: the same record, nothing new


# --------------------------------------------------------------------------- older databases


def _old_database(path: Path, owner_label: str) -> None:
    """A database as callbox wrote it before the owner columns: schema version 1, no
    call_counts, one call left running by ``owner_label``."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in schema._SCHEMA_V1:
            conn.execute(statement)
        conn.execute("PRAGMA user_version = 1")
        conn.execute("INSERT INTO runs (id, created) VALUES ('r', 1.0)")
        conn.execute(
            "INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, bytes_in, state, decision, authorized, "
            "owner, started) VALUES ('r', 'x1', 'shell', ?, ?, 40, 'running', 'allow', 1, ?, 2.0)",
            (arguments_digest(ARGS), ARGS, owner_label),
        )
    finally:
        conn.close()


def test_an_old_database_gets_the_owner_columns_and_its_orphans_are_judged_by_label(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    _old_database(path, ghost().label)
    with AuditStore(path) as store:
        assert store._conn is not None
        columns = {row[1] for row in store._conn.execute("PRAGMA table_info(calls)")}
        assert {"owner_pid", "owner_boot_id", "owner_started", "owner_pid_ns"} <= columns
        assert store._conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
        claim = store.claim_call("r", "x1", "shell", ARGS)
        assert not claim.fresh and interruption(claim.result) is not None
        assert store.count_calls("r") == 1
    with AuditStore(path) as store:  # opened again: nothing more to add
        assert store.claim_call("r", "x2", "shell", ARGS).fresh


def test_rows_an_older_callbox_writes_without_the_columns_still_work(tmp_path: Path) -> None:
    path = tmp_path / "audit.sqlite3"
    AuditStore(path).close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:  # what an older callbox inserts: no owner columns
        conn.execute("INSERT INTO runs (id, created) VALUES ('r', 1.0)")
        conn.execute("INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, bytes_in, state, owner, "
                     "started) VALUES ('r', 'x1', 'shell', 'd', '{}', 2, 'running', ?, 2.0)", (parent().label,))
    finally:
        conn.close()
    with AuditStore(path) as store:
        assert store.interrupt_orphan("r", "x1") is None  # its label names a live process
        record = store.get_call("r", "x1")
        assert record is not None and record.state == "running"
