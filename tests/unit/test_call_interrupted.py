"""A process stopped in the middle of a call (Ctrl-C, SIGTERM through the CLI) records the
call as interrupted before it exits, saying truthfully whether its command had started; a
re-send returns that record and never runs a command that may have started. A call whose
process is gone without a word is recorded by the next process that sends it."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pydantic
import pytest

from harness.audit.interruptions import PROCESS_STOPPED, interruption
from harness.audit.orphans import OWNER_COLUMNS
from harness.audit.owners import ClaimOwner, this_process
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ErrorCode, ToolCall, ToolOutput, ToolResult
from harness.core.policy import Policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.engine.exec_result import collect
from sandbox.v1 import process_pb2
from tests.support.fake_sandbox import FakeSandbox

ALLOW = Decision(Action.ALLOW, "tools.boxed allow", "")


class TextArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str


class Engine:
    """Starts a sandbox, or stops the process while starting one (``stop_next``)."""

    def __init__(self) -> None:
        self.stop_next: BaseException | None = None

    def create(self, _spec: Any, **_options: Any) -> FakeSandbox:
        stop, self.stop_next = self.stop_next, None
        if stop is not None:
            raise stop
        return FakeSandbox()


class Tools:
    """Handlers that count their runs and stop the process where a test asks."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.stop: BaseException = KeyboardInterrupt()

    def _ran(self, name: str) -> None:
        self.runs[name] = self.runs.get(name, 0) + 1

    def host(self, _ctx: Any, _args: TextArgs) -> ToolOutput:
        self._ran("host")
        raise self.stop  # stopped while the handler worked on the host: nothing known

    def boxed(self, ctx: Any, args: TextArgs) -> ToolOutput:
        self._ran("boxed")
        ctx.provider.sandbox()
        return ToolOutput(text=args.text)

    def started(self, ctx: Any, _args: TextArgs) -> ToolOutput:
        self._ran("started")
        ctx.provider.sandbox()

        def events() -> Iterator[process_pb2.ExecEvent]:
            yield process_pb2.ExecEvent(started=process_pb2.Started(pid=7))
            raise self.stop  # stopped while the command runs

        collect(events())
        raise AssertionError("not reached")

    def registry(self) -> ToolRegistry:
        return ToolRegistry([Tool(ToolDefinition(name, f"The {name} test tool.", TextArgs), getattr(self, name))
                             for name in ("host", "boxed", "started")])


@pytest.fixture
def tools() -> Tools:
    return Tools()


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def session(tools: Tools, engine: Engine, audit: AuditStore) -> Iterator[Session]:
    with Session(tools.registry(), Policy(), audit, run_id="r", engine_factory=lambda: engine) as made:
        yield made


def _stopped(session: Session, name: str, call_id: str) -> ToolResult:
    """Send the call, which stops the process; the result recorded for it."""
    with pytest.raises((KeyboardInterrupt, SystemExit)):
        session.call(ToolCall(name, {"text": "hi"}, call_id))
    record = session.audit.get_call("r", call_id)
    assert record is not None and record.state == "done" and record.result is not None
    return record.result


def test_ctrl_c_while_the_command_runs_is_recorded_and_a_resend_never_runs_it(session, tools) -> None:
    recorded = _stopped(session, "started", "x1")
    me = this_process().label
    assert recorded.error is ErrorCode.INTERRUPTED and recorded.meta["decision"] == "allow"
    assert recorded.structured == {"command_started": True, "interrupted": PROCESS_STOPPED, "signal": "SIGINT",
                                   "owner": me, "noticed_by": me}
    assert recorded.text.startswith("call 'x1' was interrupted (its harness process stopped on SIGINT) before its "
                                    "result was recorded; its command had started and may have had effects. It is "
                                    "not run again under this call_id")
    again = session.call(ToolCall("started", {"text": "hi"}, "x1"))
    assert again == recorded and tools.runs == {"started": 1}


def test_sigterm_through_the_cli_is_named(session, tools) -> None:
    tools.stop = SystemExit(143)
    recorded = _stopped(session, "host", "x1")
    assert recorded.structured is not None and recorded.structured["signal"] == "SIGTERM"
    assert recorded.structured["command_started"] is None  # the handler ran on the host: unknown
    assert "whether its command ran to the end is unknown" in recorded.text
    assert session.call(ToolCall("host", {"text": "hi"}, "x1")) == recorded and tools.runs == {"host": 1}


def test_a_stop_while_the_sandbox_starts_is_a_call_that_never_started_and_runs_when_sent_again(
        session, tools, engine) -> None:
    engine.stop_next = KeyboardInterrupt()
    recorded = _stopped(session, "boxed", "x1")
    assert (recorded.structured or {})["command_started"] is False
    assert "before its command started. Send the same call again to run it." in recorded.text
    again = session.call(ToolCall("boxed", {"text": "hi"}, "x1"))
    assert not again.is_error and again.text == "hi" and tools.runs == {"boxed": 2}
    record = session.audit.get_call("r", "x1")
    assert record is not None and record.attempts == 2


def test_a_stop_after_the_handler_returned_says_the_command_ran(session, tools, monkeypatch) -> None:
    finish = session.audit.finish_call
    stops = [KeyboardInterrupt()]

    def stop_once(*args: Any, **kwargs: Any) -> None:
        if stops:
            raise stops.pop()
        finish(*args, **kwargs)

    monkeypatch.setattr(session.audit, "finish_call", stop_once)
    recorded = _stopped(session, "boxed", "x1")
    assert (recorded.structured or {})["command_started"] is True and tools.runs == {"boxed": 1}


def _claimed_by(session: Session, owner: ClaimOwner, call_id: str, *, run: bool) -> None:
    audit = session.audit
    if run:
        assert audit.claim_and_start("r", call_id, "boxed", {"text": "hi"}, lambda _n: ALLOW).running
    else:
        assert audit.claim_call("r", call_id, "boxed", {"text": "hi"}).fresh
    assert audit._conn is not None
    audit._conn.execute(f"UPDATE calls SET ({OWNER_COLUMNS}) = (?, ?, ?, ?, ?) WHERE run_id = ? AND call_id = ?",
                        (*owner.columns(), "r", call_id))


def _gone() -> ClaimOwner:
    me = this_process()
    return ClaimOwner(f"{me.host}/{me.pid}/{me.started - 50:.2f}", me.host, me.pid, me.started - 50, me.boot_id,
                      me.pid_ns)


def test_a_call_left_running_by_a_killed_process_is_answered_at_once_and_not_run(session, tools) -> None:
    _claimed_by(session, _gone(), "x1", run=True)
    result = session.call(ToolCall("boxed", {"text": "hi"}, "x1"))
    assert interruption(result) is not None and (result.structured or {})["command_started"] is None
    assert (result.structured or {})["noticed_by"] == this_process().label
    assert tools.runs == {}


def test_a_call_a_killed_process_had_only_claimed_runs_once_when_sent_again(session, tools) -> None:
    _claimed_by(session, _gone(), "x1", run=False)
    result = session.call(ToolCall("boxed", {"text": "hi"}, "x1"))
    assert not result.is_error and tools.runs == {"boxed": 1}


def test_a_duplicate_waiting_for_a_process_that_dies_gets_the_interrupted_result(session, tools, monkeypatch) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        me, started = this_process(), psutil.Process(child.pid).create_time()
        _claimed_by(session, ClaimOwner(f"{me.host}/{child.pid}/{started:.2f}", me.host, child.pid, started,
                                        me.boot_id, me.pid_ns), "x1", run=True)
        wait = session.audit.wait_for_result

        def owner_dies_while_waiting(*args: Any) -> ToolResult | None:
            child.communicate(b"")  # the owner exits (and is reaped) once the wait began
            return wait(*args)

        monkeypatch.setattr(session.audit, "wait_for_result", owner_dies_while_waiting)
        result = session.call(ToolCall("boxed", {"text": "hi"}, "x1"))
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert interruption(result) is not None and tools.runs == {}
