"""The spans of calls through a Session, caught by the SDK's in-memory exporter: one call span
with a child per step, the run and call ids on each, a caller's traceparent as the parent;
nothing at all while tracing is off."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from harness.audit.store import AuditStore
from harness.core.calls import Action, ToolCall, ToolOutput
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.telemetry import tracing

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


class TextArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str


def _echo(_ctx: Any, args: TextArgs) -> ToolOutput:
    return ToolOutput(text=args.text)


def _in_sandbox(ctx: Any, args: TextArgs) -> ToolOutput:
    ctx.provider.sandbox()  # the run's sandbox, started on first use
    return ToolOutput(text=args.text)


class FakeSandbox:
    """What a Session needs of a sandbox when its handlers never use it."""

    id = "box-1"
    agent = None

    def new_egress_events(self) -> list[Any]:
        return []

    def destroy(self) -> None:
        pass


class FakeEngine:
    def __init__(self) -> None:
        self.created = 0

    def create(self, _spec: Any) -> FakeSandbox:
        self.created += 1
        return FakeSandbox()


REGISTRY = ToolRegistry([
    Tool(ToolDefinition("echo", "Echo.", TextArgs), _echo),
    Tool(ToolDefinition("boxed", "Uses the sandbox.", TextArgs), _in_sandbox),
    Tool(ToolDefinition("forbidden", "Denied.", TextArgs), _echo),
])
POLICY = Policy(tools={"forbidden": ToolPolicy(decision=Action.DENY)})
STEPS = ["callbox.validate", "callbox.authorize", "callbox.exec", "callbox.shape", "callbox.audit"]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    caught = InMemorySpanExporter()
    tracing.configure(None, exporter=caught)
    try:
        yield caught
    finally:
        tracing.shutdown()


@pytest.fixture
def engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def session(tmp_path: Path, engine: FakeEngine) -> Iterator[Session]:
    with AuditStore(tmp_path / "audit.sqlite3") as audit, \
            Session(REGISTRY, POLICY, audit, run_id="run-t", engine_factory=lambda: engine, door="grpc") as made:
        yield made


def _by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    named = {span.name: span for span in spans}
    assert len(named) == len(spans), [s.name for s in spans]
    return named


def test_a_call_is_one_span_with_a_child_per_step(session, exporter):
    result = session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    assert not result.is_error
    spans = _by_name(exporter.get_finished_spans())
    assert sorted(spans) == sorted(["callbox.call", *STEPS])
    call = spans["callbox.call"]
    assert call.parent is None  # no caller's trace: a trace of its own
    assert dict(call.attributes or {}) == {
        "callbox.run_id": "run-t", "callbox.call_id": "c-1", "callbox.tool": "echo", "callbox.door": "grpc",
        "callbox.decision": "allow"}
    assert call.status.status_code is StatusCode.UNSET
    for name in STEPS:
        step = spans[name]
        assert step.parent is not None and step.parent.span_id == call.context.span_id, name
        assert step.context.trace_id == call.context.trace_id
        assert dict(step.attributes or {}) == {"callbox.run_id": "run-t", "callbox.call_id": "c-1"}
    starts = [spans[name].start_time or 0 for name in STEPS]
    assert starts == sorted(starts)  # in the order the call takes them
    assert call.resource.attributes["service.name"] == "callbox"


def test_the_sandbox_start_is_a_span_inside_the_exec(session, exporter, engine):
    session.call(ToolCall("boxed", {"text": "a"}, "c-1"))
    session.call(ToolCall("boxed", {"text": "b"}, "c-2"))  # the run's sandbox is there now: no start
    assert engine.created == 1
    spans = exporter.get_finished_spans()
    boxes = [s for s in spans if s.name == "callbox.sandbox"]
    assert len(boxes) == 1
    execs = {s.context.span_id: s for s in spans if s.name == "callbox.exec"}
    assert boxes[0].parent is not None and boxes[0].parent.span_id in execs
    assert dict(boxes[0].attributes or {})["callbox.call_id"] == "c-1"


def test_a_denied_call_has_no_exec_and_its_span_is_an_error(session, exporter):
    result = session.call(ToolCall("forbidden", {"text": "x"}, "c-1"))
    assert result.is_error
    spans = _by_name(exporter.get_finished_spans())
    assert sorted(spans) == sorted(["callbox.call", "callbox.validate", "callbox.authorize", "callbox.audit"])
    call = spans["callbox.call"]
    assert call.status.status_code is StatusCode.ERROR and call.status.description == "denied"
    assert dict(call.attributes or {})["callbox.decision"] == "deny"


def test_a_callers_traceparent_is_the_parent_of_the_call_span(session, exporter):
    headers = tracing.carrier([("authorization", "Bearer x"), ("TraceParent", TRACEPARENT.encode())])
    assert headers == {"traceparent": TRACEPARENT}
    with tracing.continued(headers):
        session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    spans = _by_name(exporter.get_finished_spans())
    call = spans["callbox.call"]
    assert call.parent is not None and call.parent.is_remote
    assert format(call.parent.span_id, "016x") == PARENT_ID
    assert {format(s.context.trace_id, "032x") for s in spans.values()} == {TRACE_ID}
    session.call(ToolCall("echo", {"text": "hi"}, "c-2"))  # outside the block: its own trace again
    later = [s for s in exporter.get_finished_spans() if s.name == "callbox.call"][-1]
    assert later.parent is None and format(later.context.trace_id, "032x") != TRACE_ID


@pytest.mark.parametrize("bad", ["garbage", f"00-{'0' * 32}-{PARENT_ID}-01", f"ff-{TRACE_ID}-{PARENT_ID}-01"])
def test_a_malformed_traceparent_starts_a_trace_of_its_own(session, exporter, bad):
    with tracing.continued(tracing.carrier({"traceparent": bad})):
        session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    call = _by_name(exporter.get_finished_spans())["callbox.call"]
    assert call.parent is None
    assert format(call.context.trace_id, "032x") != TRACE_ID


def test_off_means_no_spans_and_no_tracer(session):
    caught = InMemorySpanExporter()
    tracing.configure(None, exporter=caught)
    tracing.configure(None)  # reconfigured off: the old provider is shut down
    assert not tracing.active() and tracing.tracer() is None
    assert tracing.carrier({"traceparent": TRACEPARENT}) == {}
    assert isinstance(tracing.span("x"), contextlib.nullcontext)
    with tracing.continued({"traceparent": TRACEPARENT}):
        result = session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    assert not result.is_error
    assert caught.get_finished_spans() == ()


def test_shutdown_flushes_and_turns_tracing_off(session):
    caught = InMemorySpanExporter()
    tracing.configure(None, exporter=caught, service_name="callbox-test")
    session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    tracing.shutdown()
    assert not tracing.active()
    spans = caught.get_finished_spans()
    assert len(spans) == 1 + len(STEPS)
    assert {s.resource.attributes["service.name"] for s in spans} == {"callbox-test"}
    tracing.shutdown()  # twice is harmless
