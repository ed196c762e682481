"""The spans of calls through a Session, caught by the SDK's in-memory exporter: one call span
with a child per step, the run and call ids on each, a caller's traceparent as the parent;
nothing at all while tracing is off."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from harness.audit.store import AuditStore
from harness.core.calls import Action, ToolCall, ToolOutput
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.telemetry import tracing
from tests.support.fake_sandbox import FakeSandbox

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


class FakeEngine:
    def __init__(self) -> None:
        self.created = 0

    def create(self, _spec: Any, **_options: Any) -> FakeSandbox:
        self.created += 1
        tracing.annotate("callbox.sandbox.source", "cold")  # as the Docker engine does
        return FakeSandbox()


def _fail(_ctx: Any, _args: TextArgs) -> ToolOutput:
    raise KeyboardInterrupt  # not a tool failure: it goes through the call path


REGISTRY = ToolRegistry([
    Tool(ToolDefinition("echo", "Echo.", TextArgs), _echo),
    Tool(ToolDefinition("boxed", "Uses the sandbox.", TextArgs), _in_sandbox),
    Tool(ToolDefinition("forbidden", "Denied.", TextArgs), _echo),
    Tool(ToolDefinition("interrupted", "Raises through the call.", TextArgs), _fail),
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
    assert dict(boxes[0].attributes or {}) == {"callbox.run_id": "run-t", "callbox.call_id": "c-1",
                                               "callbox.sandbox.source": "cold"}
    exec_span = execs[boxes[0].parent.span_id]
    assert (exec_span.start_time or 0) <= (boxes[0].start_time or 0) <= (boxes[0].end_time or 0) \
        <= (exec_span.end_time or 0)


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
    tracing.configure(None)  # reconfigured off: the old exporter is shut down
    assert not tracing.active() and tracing.start_call("r", "c") is None
    assert tracing.carrier({"traceparent": TRACEPARENT}) == {}
    assert isinstance(tracing.request_span("x", {"traceparent": TRACEPARENT}), contextlib.nullcontext)
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


def test_a_caller_that_does_not_sample_its_trace_gets_no_spans(session, exporter):
    with tracing.continued(tracing.carrier({"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-00"})):
        session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    assert exporter.get_finished_spans() == ()
    session.call(ToolCall("echo", {"text": "hi"}, "c-2"))
    assert len(exporter.get_finished_spans()) == 1 + len(STEPS)


def test_a_call_that_raises_still_ends_its_span_as_an_error(session, exporter):
    with pytest.raises(KeyboardInterrupt):
        session.call(ToolCall("interrupted", {"text": "x"}, "c-1"))
    call = _by_name(exporter.get_finished_spans())["callbox.call"]
    assert call.status.status_code is StatusCode.ERROR and call.status.description == "KeyboardInterrupt"
    assert call.end_time is not None


def test_steps_follow_one_another_inside_the_call(session, exporter):
    session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
    spans = _by_name(exporter.get_finished_spans())
    call = spans["callbox.call"]
    times = [(spans[name].start_time, spans[name].end_time) for name in STEPS]
    assert times[0][0] == call.start_time
    for (_, end), (start, _) in itertools.pairwise(times):
        assert end == start  # each step starts where the one before it ended
    assert times[-1][1] <= (call.end_time or 0)


def test_batched_export_sends_on_flush_and_at_shutdown(session):
    caught = InMemorySpanExporter()
    tracing.configure(None, exporter=caught, batch=True)
    try:
        session.call(ToolCall("echo", {"text": "hi"}, "c-1"))
        assert caught.get_finished_spans() == ()  # queued for the export thread
        assert tracing.flush()
        assert len(caught.get_finished_spans()) == 1 + len(STEPS)
        session.call(ToolCall("echo", {"text": "hi"}, "c-2"))
    finally:
        tracing.shutdown()
    assert len(caught.get_finished_spans()) == 2 * (1 + len(STEPS))
    assert not tracing.flush()  # off now


def test_a_request_span_continues_the_callers_trace(exporter):
    with tracing.request_span("callbox.e2b", {"TraceParent": TRACEPARENT, "x": "y"}, {"url.path": "/health"}):
        pass
    with tracing.request_span("callbox.e2b", {}, {"url.path": "/files"}):
        pass
    first, second = exporter.get_finished_spans()
    assert first.name == "callbox.e2b" and first.kind is SpanKind.SERVER
    assert first.parent is not None and format(first.parent.span_id, "016x") == PARENT_ID
    assert format(first.context.trace_id, "032x") == TRACE_ID
    assert dict(first.attributes or {}) == {"url.path": "/health"}
    assert second.parent is None


class BrokenExporter(InMemorySpanExporter):
    def export(self, spans: Any) -> Any:
        raise ConnectionError("the collector is down")


def test_an_exporter_that_fails_never_breaks_a_call(session):
    tracing.configure(None, exporter=BrokenExporter())
    try:
        result = session.call(ToolCall("echo", {"text": "still here"}, "c-1"))
    finally:
        tracing.shutdown()
    assert not result.is_error and result.text == "still here"
