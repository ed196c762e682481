"""The ``undo`` tool without Docker: its arguments, which policies offer it, and undo by call id and by
steps on a real directory (the agent's Changes service in this process, as in test_change_records), the
history counting only calls not undone yet and the undo itself taking no call record."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.change_store import RunChanges
from harness.core.calls import ErrorCode
from harness.core.change_recorder import ChangeRecorder, CheckpointSettings
from harness.core.context import ToolContext
from harness.core.policy import PolicyError, parse_policy
from harness.core.run_revert import LiveUndo
from harness.core.undo import RevertRefused
from harness.core.validation import CallRejected, validate_call
from harness.engine.cancel import CallScope
from harness.engine.spec import SandboxSpec
from harness.tools import registry_for
from harness.tools.undo import UNDO, run_undo, undoable_calls
from sandbox.changes import ChangesService
from sandbox.fs import FilesystemService
from sandbox.v1 import changes_pb2


class _Agent:
    def __init__(self, service: ChangesService) -> None:
        self.service = service

    def scan_changes(self, request: changes_pb2.ScanRequest) -> Iterator[changes_pb2.ScanChunk]:
        yield from self.service.scan(request)

    def apply_changes(self, ops: list[changes_pb2.ApplyOp]) -> int:
        for op in ops:
            self.service.apply(op)
        return len(ops)


class _Sandbox:
    def __init__(self, service: ChangesService) -> None:
        self.agent = _Agent(service)


@contextlib.contextmanager
def _free(own: CallScope | None, own_call: str | None) -> Iterator[None]:
    yield


@pytest.mark.parametrize("arguments", [{}, {"to_call": "c1", "steps": 1}, {"steps": 0}, {"to_call": ""},
                                       {"steps": 1, "path": "/x"}])
def test_undo_takes_exactly_one_of_to_call_or_steps(arguments: dict[str, Any]) -> None:
    with pytest.raises(CallRejected) as rejected:
        validate_call(UNDO.definition, arguments)
    assert rejected.value.code is ErrorCode.INVALID_ARGUMENTS


def test_undo_is_offered_only_when_a_policy_names_it_and_records_changes() -> None:
    assert "undo" not in registry_for(parse_policy(""))
    assert "undo" not in registry_for(parse_policy('[checkpoints]\nmode = "changes"\n'))
    with pytest.raises(PolicyError, match=r'\[checkpoints\] mode is "off"'):
        registry_for(parse_policy('[tools.undo]\ndecision = "allow"\n'))
    policy = parse_policy('allowed_tools = ["shell", "undo"]\n[checkpoints]\nmode = "changes"\n')
    registry = registry_for(policy)
    assert registry.exposed_names(policy) == ["shell", "undo"]
    assert registry_for(parse_policy('[checkpoints]\nmode = "changes"\n[tools.undo]\n')).get("undo") is UNDO
    assert not UNDO.definition.records_changes and not UNDO.definition.annotations.read_only


@pytest.fixture
def live(tmp_path: Path) -> tuple[Path, LiveUndo]:
    place = tmp_path / "project"
    place.mkdir()
    (place / "a.txt").write_text("a0\n")
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    recorder = ChangeRecorder(CheckpointSettings(mode="changes"), RunChanges(tmp_path / "changes", "run-1"),
                              SandboxSpec())
    recorder.places, recorder.mounts = (str(place),), {}
    recorder.before(sandbox)
    for call, content in (("c1", "a1\n"), ("c2", "a2\n")):
        (place / "a.txt").write_text(content)
        recorder.after(sandbox, call, "write_file")
    recorder.after(sandbox, "c3", "shell")  # changed nothing: not a step
    (place / "b.txt").write_text("b\n")
    recorder.after(sandbox, "c4", "write_file")
    return place, LiveUndo(recorder, lambda: sandbox, _free)


def _undo(live: LiveUndo, **arguments: Any) -> Any:
    ctx = ToolContext(run_id="run-1", call_id="u1", provider=None,  # type: ignore[arg-type]
                      default_timeout_s=10, timeout_ceiling_s=10, output_budget=10_000, undo=live)
    return run_undo(ctx, validate_call(UNDO.definition, arguments))


def test_undo_by_steps_counts_only_the_calls_not_undone_yet(live: tuple[Path, LiveUndo]) -> None:
    place, undo = live
    assert undoable_calls(undo.changes) == ["c1", "c2", "c4"]
    first = _undo(undo, steps=1)
    assert not first.is_error and first.structured["undone"] == ["c4"]
    assert first.structured["removed"] == [f"{place}/b.txt"] and not (place / "b.txt").exists()
    second = _undo(undo, steps=1)  # the next one back: c2, not c4 again
    assert second.structured["undone"] == ["c2"] and (place / "a.txt").read_text() == "a1\n"
    assert undoable_calls(undo.changes) == ["c1"]
    assert [r.kind for r in undo.changes.records()].count("call") == 4  # the undo calls took no call record
    too_many = _undo(undo, steps=2)
    assert too_many.is_error and too_many.error is ErrorCode.INVALID_ARGUMENTS
    assert "only 1 calls" in too_many.text and "c1" in too_many.text


def test_undo_to_a_call_and_its_refusals(live: tuple[Path, LiveUndo]) -> None:
    place, undo = live
    unknown = _undo(undo, to_call="call_of_another_run")
    assert unknown.is_error and unknown.error is ErrorCode.INVALID_ARGUMENTS
    assert "not a recorded call of this run" in unknown.text and "c1, c2, c4" in unknown.text
    after_c3 = _undo(undo, to_call="c3")  # a call that changed nothing: the calls after it are undone
    assert after_c3.structured["undone"] == ["c4"] and not (place / "b.txt").exists()
    done = _undo(undo, to_call="c1")
    assert done.structured["undone"] == ["c1", "c2"] and "c1" in done.text
    assert (place / "a.txt").read_text() == "a0\n" and not (place / "b.txt").exists()
    nothing = _undo(undo, steps=1)
    assert nothing.is_error and "no call can be undone" in nothing.text

    def busy(own: CallScope | None, own_call: str | None) -> contextlib.AbstractContextManager[None]:
        raise RevertRefused("call c9 of run run-1 is running; revert once it has finished")

    refused = _undo(LiveUndo(undo.recorder, undo.sandbox, busy), to_call="c2")
    assert refused.is_error and refused.error is ErrorCode.CONFLICT and "c9" in refused.text
    off = run_undo(ToolContext(run_id="r", call_id="u", provider=None,  # type: ignore[arg-type]
                               default_timeout_s=1, timeout_ceiling_s=1, output_budget=100),
                   validate_call(UNDO.definition, {"steps": 1}))
    assert off.is_error and "records no file changes" in off.text


def test_a_session_holds_its_calls_off_during_a_revert(tmp_path: Path) -> None:
    from harness.audit.store import AuditStore
    from harness.core.calls import ToolCall
    from harness.core.policy import Policy
    from harness.core.session import Session
    from harness.tools import builtin_registry

    def no_engine() -> Any:
        raise AssertionError("no sandbox is started while the calls are held")

    with AuditStore(tmp_path / "audit.db") as audit, \
            Session(builtin_registry(), Policy(), audit, run_id="r1", engine_factory=no_engine) as session:
        with session.calls_held():
            result = session.call(ToolCall("shell", {"command": "true"}, "c1"))
            assert result.is_error and result.error is ErrorCode.CONFLICT and "revert" in result.text
            with pytest.raises(RevertRefused, match="another call or revert of run r1 is running"), \
                    session.calls_held():
                pass
        with session.calls_held():  # released: it can be taken again
            pass


def test_the_cli_revert_is_the_policy_s_revert_action(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from harness.audit.change_store import changes_root
    from harness.audit.store import AuditStore
    from harness.cli.main import main

    place = tmp_path / "project"
    place.mkdir()
    (place / "a.txt").write_text("a0\n")
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as audit:
        run_id = audit.start_run()
    service = ChangesService(FilesystemService([str(place)], str(place), None))
    sandbox: Any = _Sandbox(service)
    recorder = ChangeRecorder(CheckpointSettings(mode="changes"), RunChanges(changes_root(db), run_id), SandboxSpec())
    recorder.places, recorder.mounts = (str(place),), {str(place): str(place)}
    recorder.before(sandbox)
    (place / "a.txt").write_text("a1\n")
    recorder.after(sandbox, "c1", "shell")
    with AuditStore(db) as audit:
        audit.end_run(run_id, "final")
    deny = tmp_path / "deny.toml"
    deny.write_text('[actions.revert]\ndecision = "deny"\n')
    assert main(["revert", run_id, "--to", "c1", "--audit-db", str(db), "--policy", str(deny)]) != 0
    assert "actions.revert" in capsys.readouterr().err and (place / "a.txt").read_text() == "a1\n"
    assert main(["revert", run_id, "--to", "c1", "--audit-db", str(db)]) == 0
    assert (place / "a.txt").read_text() == "a0\n"
    with AuditStore(db) as audit:
        reverts = [c for c in audit.calls_for_run(run_id) if c["tool"] == "sandbox.revert"]
    assert [c["state"] for c in reverts] == ["done", "done"] and len(reverts) == 2
