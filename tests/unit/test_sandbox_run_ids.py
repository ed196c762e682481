"""A run's sandbox is owned by its run (``run:<run id>``), so the operator finds a server's
sandbox by the id its client knows: the session tells the engine, the records answer which
sandbox serves a run, a removal from outside shows in the records' absence, and ``cp`` takes
a server's run id as the sandbox side."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.cli.sandbox_files import split_endpoint
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.base import owner_run, run_owner
from harness.engine.docker import living
from harness.engine.docker.kept import KeptSandbox, kept_path
from harness.engine.docker.kept import write_record as write_kept
from harness.engine.docker.lifetime import LifetimeRecord, record_path, sandbox_of_run, write_record
from tests.support.fake_sandbox import FakeSandbox

E2B_ID = "e2b-20250102T030405-0123456789ab"


class RecordingEngine:
    """Hands out fake sandboxes and keeps what each create was told."""

    def __init__(self) -> None:
        self.options: list[dict[str, Any]] = []

    def create(self, _spec: Any, **options: Any) -> FakeSandbox:
        self.options.append(options)
        return FakeSandbox()


def _record(sandbox_id: str, owner: str | None, created_at: float) -> LifetimeRecord:
    return LifetimeRecord(sandbox_id=sandbox_id, name=None, owner=owner, created_at=created_at, ttl_s=300.0,
                          expires=created_at + 300, container_id="c" * 64, socket_dir=f"/run/x/{sandbox_id}",
                          spec={}, tool_uid=1000, tool_gid=1000)


def _kept(sandbox_id: str, run_id: str, kept_at: float) -> KeptSandbox:
    return KeptSandbox(sandbox_id=sandbox_id, run_id=run_id, until=kept_at + 300, container_id="c" * 64,
                       socket_dir=f"/run/x/{sandbox_id}", spec={}, tool_uid=1000, tool_gid=1000, kept_at=kept_at)


def test_the_session_starts_its_sandbox_owned_by_its_run(tmp_path: Path) -> None:
    engine = RecordingEngine()
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        session = Session(ToolRegistry([]), Policy(), audit, run_id=E2B_ID, engine_factory=lambda: engine)
        try:
            session.sandbox()
        finally:
            session.close()
    assert engine.options == [{"owner": f"run:{E2B_ID}"}]


def test_a_run_owner_names_its_run_and_no_other_owner_does() -> None:
    assert run_owner(E2B_ID) == f"run:{E2B_ID}" and owner_run(run_owner(E2B_ID)) == E2B_ID
    for other in (None, "", "run:", "user:1000", "grpc:alice", "callbox:pool", "host/12/3.00"):
        assert owner_run(other) is None, other


def test_the_sandbox_serving_a_run_is_found_by_its_run_id_or_owner(tmp_path: Path) -> None:
    now = time.time()
    write_record(tmp_path, _record("aaaaaaaaaaaa", "user:1000", now - 30))
    write_record(tmp_path, _record("bbbbbbbbbbbb", run_owner(E2B_ID), now - 20))
    write_record(tmp_path, _record("cccccccccccc", run_owner("e2b-other"), now - 10))
    assert sandbox_of_run(tmp_path, E2B_ID) == "bbbbbbbbbbbb"
    assert sandbox_of_run(tmp_path, f"run:{E2B_ID}") == "bbbbbbbbbbbb"
    assert sandbox_of_run(tmp_path, "e2b-20250102T030405") is None  # no prefixes: the whole id
    assert sandbox_of_run(tmp_path, "user:1000") is None  # an owner that is no run names none
    # a newer sandbox of the same run (its first one was lost and replaced) wins
    write_record(tmp_path, _record("dddddddddddd", run_owner(E2B_ID), now - 5))
    assert sandbox_of_run(tmp_path, E2B_ID) == "dddddddddddd"


def test_a_paused_runs_kept_sandbox_is_found_by_its_run_id(tmp_path: Path) -> None:
    now = time.time()
    write_kept(tmp_path, _kept("eeeeeeeeeeee", "r-paused", now - 60))
    write_kept(tmp_path, _kept("ffffffffffff", "r-paused", now - 30))
    write_kept(tmp_path, _kept("000000000000", "r-other", now))
    (tmp_path / "kept" / "111111111111.json").write_text("not a record")
    assert sandbox_of_run(tmp_path, "r-paused") == "ffffffffffff"
    assert sandbox_of_run(tmp_path, "run:r-paused") == "ffffffffffff"
    assert sandbox_of_run(tmp_path, "r-none") is None


def test_a_sandbox_whose_records_are_gone_was_removed(tmp_path: Path) -> None:
    engine = SimpleNamespace(run_root=tmp_path)
    box = SimpleNamespace(id="bbbbbbbbbbbb")
    write_record(tmp_path, _record(box.id, run_owner(E2B_ID), time.time()))
    assert not living.is_removed(engine, box)  # type: ignore[arg-type]
    write_kept(tmp_path, _kept(box.id, E2B_ID, time.time()))
    record_path(tmp_path, box.id).unlink()
    assert not living.is_removed(engine, box)  # type: ignore[arg-type]  # kept: still there
    kept_path(tmp_path, box.id).unlink()
    assert living.is_removed(engine, box)  # type: ignore[arg-type]


@pytest.mark.parametrize(("text", "expected"), [
    (f"{E2B_ID}:/home/user/note.txt", (E2B_ID, "/home/user/note.txt")),
    ("grpc-20250102T030405-abcdefabcdef:out", ("grpc-20250102T030405-abcdefabcdef", "out")),
    ("web:/workspace", ("web", "/workspace")),
    ("E2B-20250102T030405-0123456789ab:/x", None),  # not a run id a server gives
    ("./e2b-20250102T030405-0123456789ab:/x", None),
])
def test_cp_takes_a_servers_run_id_as_the_sandbox_side(text: str, expected: tuple[str, str] | None) -> None:
    assert split_endpoint(text) == expected
