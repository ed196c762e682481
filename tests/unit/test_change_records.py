"""Change records without Docker: the agent's Changes service (its inotify index) in this process on a
real directory, the harness's recorder and store on the other side, then diff and a revert of the
directory as a read-write mount's host directory, checked byte for byte against copies taken on the way.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.change_store import RunChanges
from harness.core import undo
from harness.core.change_recorder import ChangeRecorder, CheckpointSettings
from harness.core.errors import AgentCallError
from harness.engine.spec import SandboxSpec
from sandbox.change_index import PlaceIndex
from sandbox.changes import ChangesService
from sandbox.errors import AgentError
from sandbox.fs import FilesystemService
from sandbox.v1 import changes_pb2, errors_pb2
from tests.support.file_trees import listing


class _Agent:
    def __init__(self, service: ChangesService) -> None:
        self.service = service

    def scan_changes(self, request: changes_pb2.ScanRequest) -> Iterator[changes_pb2.ScanChunk]:
        try:
            yield from self.service.scan(request)
        except AgentError as error:  # as the agent client turns the agent's status into one
            reason = errors_pb2.ErrorReason.Name(error.reason).removeprefix("ERROR_REASON_")
            raise AgentCallError(error.message, reason=reason, grpc_code="", retryable=False) from None


class _Sandbox:
    """What the recorder uses of a sandbox: its agent, here the real service in this process."""

    def __init__(self, service: ChangesService) -> None:
        self.agent = _Agent(service)


@pytest.fixture
def place(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\nx = 1\n")
    (root / "README").write_text("readme\n")
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "old").mkdir()
    (root / "old" / "a.txt").write_text("a\n")
    os.symlink("src/app.py", root / "link")
    return root


def _scan(service: ChangesService, root: Path, **kw: Any) -> dict[str, changes_pb2.ScanEntry]:
    reported: dict[str, changes_pb2.ScanEntry] = {}
    for chunk in service.scan(changes_pb2.ScanRequest(places=[str(root)], **kw)):
        if chunk.HasField("entry"):
            reported[chunk.entry.path] = chunk.entry
    return reported


def test_the_index_reports_only_what_changed_since_the_previous_scan(place: Path) -> None:
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    first = _scan(service, place)
    assert {Path(p).relative_to(place).as_posix() for p in first} == {
        "src", "src/app.py", "README", "data.bin", "old", "old/a.txt", "link"}
    assert _scan(service, place) == {}
    (place / "README").write_text("readme, edited\n")
    (place / "data.bin").chmod(0o600)
    shutil.rmtree(place / "old")
    (place / "src" / "new").mkdir()
    (place / "src" / "new" / "b.txt").write_text("b\n")
    (place / "link").unlink()
    os.symlink("README", place / "link")
    changed = _scan(service, place)
    rel = {Path(p).relative_to(place).as_posix(): e for p, e in changed.items()}
    assert set(rel) == {"README", "data.bin", "old", "old/a.txt", "src/new", "src/new/b.txt", "link"}
    assert rel["old"].removed and rel["old/a.txt"].removed
    assert rel["data.bin"].mode == 0o600 and rel["link"].link_target == "README"
    os.rename(place / "src", place / "lib")  # a directory moved: old paths removed, new ones reported
    moved = {Path(p).relative_to(place).as_posix(): e.removed for p, e in _scan(service, place).items()}
    assert moved == {"src": True, "src/app.py": True, "src/new": True, "src/new/b.txt": True,
                     "lib": False, "lib/app.py": False, "lib/new": False, "lib/new/b.txt": False}


def test_a_scan_cut_short_is_reported_again(place: Path) -> None:
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    _scan(service, place)
    (place / "README").write_text("changed\n")
    stream = service.scan(changes_pb2.ScanRequest(places=[str(place)]))
    next(stream)
    stream.close()  # the harness never got the rest
    assert set(_scan(service, place)) == {str(place / "README")}


def _recorder(place: Path, tmp_path: Path, **settings: Any) -> tuple[ChangeRecorder, RunChanges]:
    store = RunChanges(tmp_path / "changes", "run-1")
    recorder = ChangeRecorder(CheckpointSettings(mode="changes", **settings), store, SandboxSpec())
    recorder.places = (str(place),)
    recorder.mounts = {str(place): str(place)}  # the mount's host directory is the place itself here
    return recorder, store


def test_diff_and_revert_restore_the_mount_byte_for_byte(place: Path, tmp_path: Path) -> None:
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    recorder, store = _recorder(place, tmp_path)
    copies = {}

    def call(call_id: str) -> dict[str, Any] | None:
        copies[call_id] = listing(place)
        assert recorder.before(sandbox) is None
        return None

    call("c1")
    (place / "src" / "app.py").write_text("print('hello, world')\nx = 1\n")
    (place / "notes.txt").write_text("new file\n")
    assert recorder.after(sandbox, "c1", "write_file") == {"created": 1, "changed": 1, "removed": 0}
    call("c2")
    (place / "README").unlink()
    shutil.rmtree(place / "old")
    (place / "data.bin").write_bytes(b"\x00\xff" * 10)
    (place / "src" / "app.py").chmod(0o755)
    (place / "link").unlink()
    os.symlink("notes.txt", place / "link")
    recorder.after(sandbox, "c2", "shell")
    call("c3")
    (place / "src" / "app.py").write_text("rewritten in place\n")
    recorder.after(sandbox, "c3", "shell")

    text = undo.diff(store, "c1")
    assert "+print('hello, world')" in text and "-print('hello')" in text
    assert f"created {place}/notes.txt" in text and "+new file" in text
    two = undo.diff(store, "c2")
    assert f"removed {place}/README" in two and "-readme" in two
    assert f"mode {place}/src/app.py: 644 -> 755" in two
    assert "binary, 1024 bytes sha256" in two and "-> 20 bytes sha256" in two
    assert f"symlink {place}/link -> notes.txt (was src/app.py)" in two
    assert f"removed directory {place}/old" in two or f"removed dir {place}/old" in two

    report = undo.revert(store, "c2")
    assert listing(place) == copies["c2"]
    assert f"{place}/README" in report.created and not report.not_restored
    assert store.records()[-1].kind == "revert"  # the recorded state follows: a resumed run compares with it
    assert recorder.after(sandbox, "c2b", "shell") == {"created": 0, "changed": 0, "removed": 0}
    undo.revert(store, "c1")
    assert listing(place) == copies["c1"]
    undo.revert(store, "c3")  # forward again: the records still hold every state
    assert listing(place) == copies["c3"]


def test_records_survive_a_new_recorder_and_the_cap_stops_them(place: Path, tmp_path: Path) -> None:
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    recorder, store = _recorder(place, tmp_path, max_bytes=4096)
    recorder.before(sandbox)
    (place / "README").write_text("one\n")
    recorder.after(sandbox, "c1", "shell")
    again, _ = _recorder(place, tmp_path, max_bytes=4096)  # a server restarted: same store, same agent
    (place / "README").write_text("two\n")
    assert again.after(sandbox, "c2", "shell") == {"created": 0, "changed": 1, "removed": 0}
    assert [r.seq for r in store.records()] == [1, 2, 3]
    (place / "big.bin").write_bytes(os.urandom(8192))
    stopped = again.after(sandbox, "c3", "shell")
    assert stopped["stopped"] and "max_bytes" in stopped["error"]
    assert store.records()[-1].kind == "stopped"
    assert again.after(sandbox, "c4", "shell") == {"stopped": True}
    undo.revert(store, "c2")
    assert (place / "README").read_text() == "one\n" and not (place / "big.bin").exists()


def test_an_index_walks_everything_again_after_an_overflow(place: Path) -> None:
    index = PlaceIndex([str(place)], ())

    def opener(path: str) -> int:
        return os.open(path, os.O_RDONLY | os.O_DIRECTORY)

    entries, _ = index.refresh(opener)
    index.commit(entries)
    (place / "README").write_text("x\n")
    index.invalidate()  # as an overflow does: no event is trusted
    entries, touched = index.refresh(opener)
    assert str(place / "README") in touched and len(touched) == len(entries)
    index.close()


def test_the_cli_refuses_a_revert_while_the_run_is_open(place: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from harness.audit.change_store import changes_root
    from harness.audit.store import AuditStore
    from harness.cli.main import main

    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as audit:
        run_id = audit.start_run()
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    recorder = ChangeRecorder(CheckpointSettings(mode="changes"), RunChanges(changes_root(db), run_id), SandboxSpec())
    recorder.places, recorder.mounts = (str(place),), {str(place): str(place)}
    before = listing(place)
    recorder.before(sandbox)
    (place / "README").unlink()
    recorder.after(sandbox, "c1", "shell")
    assert main(["diff", run_id, "--audit-db", str(db)]) == 0
    assert f"removed {place}/README:" in capsys.readouterr().out
    assert main(["revert", run_id, "--to", "c1", "--audit-db", str(db)]) != 0
    assert f"run {run_id} is still open" in capsys.readouterr().err
    with AuditStore(db) as audit:
        audit.end_run(run_id, "final")
    assert main(["revert", run_id, "--to", "c1", "--audit-db", str(db)]) == 0
    assert f"recreated {place}/README" in capsys.readouterr().out
    assert listing(place) == before


class _LiveAgent(_Agent):
    def apply_changes(self, ops: list[changes_pb2.ApplyOp]) -> int:
        for op in ops:
            self.service.apply(op)
        return len(ops)


def test_a_living_sandbox_is_reverted_through_its_agent_and_the_revert_is_recorded(
        place: Path, tmp_path: Path) -> None:
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    sandbox.agent = _LiveAgent(service)
    recorder, store = _recorder(place, tmp_path)
    recorder.before(sandbox)
    copy = listing(place)
    (place / "src" / "app.py").write_text("changed\n")
    (place / "src" / "app.py").chmod(0o700)
    shutil.rmtree(place / "old")
    (place / "README").unlink()
    os.symlink("data.bin", place / "README")  # a file replaced by a symlink
    (place / "made").mkdir()
    (place / "made" / "x").write_text("x\n")
    recorder.after(sandbox, "c1", "shell")
    (place / "late.txt").write_text("changed after the last record\n")  # no record saw it yet
    report = undo.revert_live(recorder, sandbox, "c1")
    assert listing(place) == copy
    assert f"{place}/src/app.py" in report.written and f"{place}/made" in report.removed
    kinds = [(r.kind, r.note.split(",")[0]) for r in store.records()]
    assert kinds[-2:] == [("revert", "changes since the last record"), ("revert", "revert to just before call c1")]
    assert recorder.after(sandbox, "c2", "shell") == {"created": 0, "changed": 0, "removed": 0}
    undo.revert(store, "c2")  # the recorded state after the revert is what is there
    assert listing(place) == copy


def test_a_mount_inside_another_place_is_reverted_without_its_mount_point(tmp_path: Path) -> None:
    outer = tmp_path / "workspace"
    project = outer / "project"  # a mount below /workspace: the walk of /workspace records its mount point
    project.mkdir(parents=True)
    (project / "a.txt").write_text("a\n")
    service = ChangesService(FilesystemService([str(outer)], str(outer), None))
    sandbox: Any = _Sandbox(service)
    recorder, store = _recorder(project, tmp_path)
    recorder.places = (str(outer), str(project))
    recorder.before(sandbox)
    (project / "a.txt").write_text("b\n")
    recorder.after(sandbox, "c1", "shell")
    report = undo.revert(store, "c1")
    assert (project / "a.txt").read_text() == "a\n" and report.written == [f"{project}/a.txt"]


def test_records_go_with_their_run_once_it_ended_longer_ago_than_keep_days(tmp_path: Path) -> None:
    from harness.audit.change_store import ChangeRecord, changes_root
    from harness.audit.store import AuditStore
    from harness.core.change_recorder import sweep_ended_runs

    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        root = changes_root(audit.path)
        ended, open_run = audit.start_run(), audit.start_run()
        audit.end_run(ended, "final")
        runs = [ended, open_run, "not-in-this-store"]
        for run_id in runs:
            RunChanges(root, run_id).append(ChangeRecord(seq=1, kind="baseline", at=0.0))
        ended_at = audit.get_run(ended).ended
        assert ended_at is not None
        week = CheckpointSettings(mode="changes")
        assert week.keep_days == 7
        # within the week nothing goes; a day after it, the ended run's records do, and only them
        assert sweep_ended_runs(audit, root, week, now=ended_at + 6 * 86400, force=True) == []
        assert sweep_ended_runs(audit, root, week, now=ended_at + 8 * 86400, force=True) == [ended]
        assert [r for r in runs if RunChanges(root, r).exists] == [open_run, "not-in-this-store"]
        # a sweep is done at most every SWEEP_EVERY_S in a process; keep_days = 0 keeps everything
        audit.end_run(open_run, "final")
        assert sweep_ended_runs(audit, root, week, now=ended_at + 8 * 86400 + 1) == []
        forever = CheckpointSettings(mode="changes", keep_days=0)
        assert sweep_ended_runs(audit, root, forever, now=ended_at + 1e9, force=True) == []
        assert RunChanges(root, open_run).exists
