"""Session.call reports each call's decision once, before its handler runs, and puts it in
every result's meta; a closed session runs nothing and starts no sandbox."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.core.calls import Action, ErrorCode, ToolCall, ToolOutput, ToolResult
from harness.core.errors import SessionClosed
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session


class TextArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str


class Recorder:
    """on_decided, and handlers that note which decisions had been reported when they ran."""

    def __init__(self) -> None:
        self.labels: list[str] = []
        self.seen_by_handler: list[list[str]] = []

    def decided(self, label: str) -> None:
        self.labels.append(label)

    def handler(self, _ctx: Any, args: TextArgs) -> ToolOutput:
        self.seen_by_handler.append(list(self.labels))
        return ToolOutput(text=args.text)

    def registry(self) -> ToolRegistry:
        return ToolRegistry([
            Tool(ToolDefinition(name, f"The {name} test tool.", TextArgs), self.handler)
            for name in ("echo", "guarded", "forbidden")
        ])


POLICY = Policy(tools={"guarded": ToolPolicy(decision=Action.ASK), "forbidden": ToolPolicy(decision=Action.DENY)})


def no_engine() -> Any:
    raise AssertionError("these tests never start a sandbox")


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def session(recorder: Recorder, audit: AuditStore) -> Iterator[Session]:
    with Session(recorder.registry(), POLICY, audit, engine_factory=no_engine) as made:
        yield made


def _call(session: Session, recorder: Recorder, name: str, arguments: Any, call_id: str) -> tuple[str, ToolResult]:
    recorder.labels.clear()
    result = session.call(ToolCall(name, arguments, call_id), on_decided=recorder.decided)
    assert len(recorder.labels) == 1, recorder.labels
    assert result.meta["decision"] == recorder.labels[0]
    return recorder.labels[0], result


def test_allow_is_reported_before_the_handler_runs_and_a_replay_reports_it_again(session, recorder):
    label, result = _call(session, recorder, "echo", {"text": "hi"}, "c-1")
    assert label == "allow" and result.text == "hi" and not result.is_error
    assert recorder.seen_by_handler == [["allow"]]
    again, replayed = _call(session, recorder, "echo", {"text": "hi"}, "c-1")
    assert again == "allow" and replayed.text == "hi"
    assert len(recorder.seen_by_handler) == 1  # the replay ran nothing


@pytest.mark.parametrize(("name", "arguments", "label", "code"), [
    ("forbidden", {"text": "x"}, "deny", ErrorCode.DENIED),
    ("no_such_tool", {}, "rejected", ErrorCode.UNKNOWN_TOOL),
    ("echo", '{"text": 5', "rejected", ErrorCode.INVALID_JSON),
    ("echo", {"text": 5}, "rejected", ErrorCode.INVALID_ARGUMENTS),
])
def test_calls_that_never_run_report_their_decision(session, recorder, name, arguments, label, code):
    got, result = _call(session, recorder, name, arguments, "c-1")
    assert (got, result.error) == (label, code)
    assert recorder.seen_by_handler == []
    assert _call(session, recorder, name, arguments, "c-1")[0] == label  # the recorded result, replayed


def test_a_bad_call_id_is_rejected(session, recorder):
    label, result = _call(session, recorder, "echo", {"text": "x"}, "")
    assert label == "rejected" and result.error is ErrorCode.BAD_CALL_ID


def test_ask_then_approved_then_replayed(session, recorder, audit):
    label, pending = _call(session, recorder, "guarded", {"text": "go"}, "g-1")
    assert label == "ask" and pending.error is ErrorCode.APPROVAL_PENDING
    assert _call(session, recorder, "guarded", {"text": "go"}, "g-1")[0] == "ask"  # still pending
    audit.resolve_approval(pending.meta["approval_id"], True, by="test", reason=None)
    label, ran = _call(session, recorder, "guarded", {"text": "go"}, "g-1")
    assert label == "approved" and ran.text == "go" and recorder.seen_by_handler == [["approved"]]
    assert _call(session, recorder, "guarded", {"text": "go"}, "g-1")[0] == "approved"


def test_a_denied_approval_reports_deny(session, recorder, audit):
    _, pending = _call(session, recorder, "guarded", {"text": "no"}, "g-2")
    audit.resolve_approval(pending.meta["approval_id"], False, by="test", reason=None)
    label, denied = _call(session, recorder, "guarded", {"text": "no"}, "g-2")
    assert label == "deny" and denied.error is ErrorCode.APPROVAL_DENIED


def test_a_closed_session_runs_no_call_and_starts_no_sandbox(session, recorder):
    session.close()
    assert session.closed
    label, result = _call(session, recorder, "echo", {"text": "late"}, "c-9")
    assert label == "rejected" and result.error is ErrorCode.SANDBOX_UNAVAILABLE
    assert "ended" in result.text and result.structured == {"command_started": False}
    assert recorder.seen_by_handler == []
    with pytest.raises(SessionClosed):
        session.sandbox()
    assert session.close() == 0
