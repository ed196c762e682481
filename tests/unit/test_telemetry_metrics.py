"""The call metrics after known calls through a Session, read back by scraping the registry
with prometheus_client's own parser; the gauges read at scrape time; engine errors and quota
refusals."""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from harness.audit.store import AuditStore
from harness.core.calls import Action, ErrorCode, ToolCall, ToolOutput
from harness.core.errors import EngineUnavailable
from harness.core.policy import Policy, ToolPolicy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.engine.docker.client import engine_calls
from harness.telemetry import metrics
from harness.telemetry.metrics import exposition, record_quota_refusal


class TextArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str


def _echo(_ctx: Any, args: TextArgs) -> ToolOutput:
    return ToolOutput(text=args.text)


def _broken(_ctx: Any, args: TextArgs) -> ToolOutput:
    return ToolOutput(text=f"failed: {args.text}", is_error=True, error=ErrorCode.TOOL_FAILED)


REGISTRY = ToolRegistry([
    Tool(ToolDefinition("echo", "Echo.", TextArgs), _echo),
    Tool(ToolDefinition("broken", "Always fails.", TextArgs), _broken),
    Tool(ToolDefinition("guarded", "Needs approval.", TextArgs), _echo),
    Tool(ToolDefinition("forbidden", "Denied.", TextArgs), _echo),
])
POLICY = Policy(tools={"guarded": ToolPolicy(decision=Action.ASK), "forbidden": ToolPolicy(decision=Action.DENY)})


def no_engine() -> Any:
    raise AssertionError("these tests never start a sandbox")


def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the registry, by (sample name, labels), parsed as Prometheus would."""
    text = exposition()[0].decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


@pytest.fixture
def door() -> str:
    return f"unit-{uuid.uuid4().hex[:8]}"  # a door of this test alone: its series start at zero


@pytest.fixture
def session(audit: AuditStore, door: str) -> Iterator[Session]:
    with Session(REGISTRY, POLICY, audit, engine_factory=no_engine, door=door) as made:
        yield made


def test_the_exposition_is_prometheus_text_with_callbox_names():
    body, content_type = exposition()
    assert content_type.startswith("text/plain; version=")
    names = {family.name for family in text_string_to_metric_families(body.decode())}
    assert {"callbox_calls", "callbox_call_harness_seconds", "callbox_call_sandbox_seconds",
            "callbox_sandboxes_created", "callbox_sandbox_create_seconds", "callbox_sandboxes_pooled",
            "callbox_approvals_pending", "callbox_egress_decisions", "callbox_engine_errors",
            "callbox_quota_refusals"} <= names
    assert all(name.startswith("callbox_") for name in names)


def test_known_calls_count_by_tool_door_decision_and_outcome(session, door):
    calls = [("echo", {"text": "a"}), ("echo", {"text": "b"}), ("broken", {"text": "c"}),
             ("forbidden", {"text": "d"}), ("guarded", {"text": "e"}), ("no_such_tool", {}),
             ("echo", {"text": 5})]
    for i, (name, arguments) in enumerate(calls):
        session.call(ToolCall(name, arguments, f"c-{i}"))
    session.call(ToolCall("echo", {"text": "a"}, "c-0"))  # a replay: counted, with the recorded decision
    samples = scrape()
    expected = {
        ("echo", "allow", "ok"): 3,
        ("broken", "allow", "tool_failed"): 1,
        ("forbidden", "deny", "denied"): 1,
        ("guarded", "ask", "approval_pending"): 1,
        ("unknown", "rejected", "unknown_tool"): 1,
        ("echo", "rejected", "invalid_arguments"): 1,
    }
    got = {(s[1], s[2], s[3]): v for (name, labels), v in samples.items() if name == "callbox_calls_total"
           for s in [_labels(labels)] if s[0] == door}
    assert got == expected
    harness = {t: value(samples, "callbox_call_harness_seconds_count", tool=t, door=door)
               for t in ("echo", "broken", "guarded", "forbidden", "unknown")}
    assert harness == {"echo": 4, "broken": 1, "guarded": 1, "forbidden": 1, "unknown": 1}
    sandbox = {t: value(samples, "callbox_call_sandbox_seconds_count", tool=t, door=door)
               for t in ("echo", "broken", "guarded", "forbidden", "unknown")}
    assert sandbox == {"echo": 2, "broken": 1, "guarded": 0, "forbidden": 0, "unknown": 0}  # the handler ran
    assert value(samples, "callbox_call_harness_seconds_sum", tool="echo", door=door) > 0


def _labels(labels: frozenset[tuple[str, str]]) -> tuple[str, str, str, str]:
    d = dict(labels)
    return d["door"], d["tool"], d["decision"], d["outcome"]


def test_the_door_is_the_runs_recorded_door_unless_given(audit):
    audit.start_run("run-grpc", meta={"door": "grpc", "client": "a"})
    with Session(REGISTRY, POLICY, audit, run_id="run-grpc", engine_factory=no_engine) as from_meta:
        assert from_meta.door == "grpc"
    with Session(REGISTRY, POLICY, audit, engine_factory=no_engine) as plain:
        assert plain.door == "local"
    with Session(REGISTRY, POLICY, audit, engine_factory=no_engine, door="mcp") as given:
        assert given.door == "mcp"


def test_quota_refusals_count_by_client_quota_and_door():
    client = f"client-{uuid.uuid4().hex[:6]}"
    record_quota_refusal(client, "calls_per_minute", "grpc")
    record_quota_refusal(client, "calls_per_minute", "grpc")
    record_quota_refusal(client, "live_sandboxes", "e2b")
    samples = scrape()
    assert value(samples, "callbox_quota_refusals_total", client=client, quota="calls_per_minute", door="grpc") == 2
    assert value(samples, "callbox_quota_refusals_total", client=client, quota="live_sandboxes", door="e2b") == 1


def test_pending_approvals_are_read_from_the_watched_store_when_scraped(session, audit, monkeypatch):
    monkeypatch.setattr(metrics, "_approval_sources", weakref.WeakValueDictionary())
    assert value(scrape(), "callbox_approvals_pending") == 0
    metrics.watch_approvals(str(audit.path), audit)
    metrics.watch_approvals(str(audit.path), audit)  # the same database counts once
    pending = session.call(ToolCall("guarded", {"text": "x"}, "g-1"))
    session.call(ToolCall("guarded", {"text": "y"}, "g-2"))
    assert value(scrape(), "callbox_approvals_pending") == 2
    audit.resolve_approval(pending.meta["approval_id"], False, by="test", reason="no")
    assert value(scrape(), "callbox_approvals_pending") == 1


class FakeEngine:
    """An engine census as the Docker engine reports it."""

    def __init__(self, live: int, paused: int, pooled: int, *, broken: bool = False) -> None:
        self.live, self.paused, self.pooled, self.broken = live, paused, pooled, broken

    def sandbox_census(self) -> tuple[int, int]:
        if self.broken:
            raise EngineUnavailable("engine gone")
        return self.live, self.paused

    def pooled_count(self) -> int:
        return self.pooled


def test_sandbox_gauges_are_read_from_the_watched_engines(monkeypatch):
    monkeypatch.setattr(metrics, "_engines", weakref.WeakSet())
    engines = [FakeEngine(0, 0, 0, broken=True), FakeEngine(7, 2, 3), FakeEngine(7, 2, 1)]
    for engine in engines:
        metrics.watch_engine(engine)
    samples = scrape()
    # live: one census of the engine (the first that answered), less every pool's warm sandboxes
    assert value(samples, "callbox_sandboxes_live") == 3
    assert value(samples, "callbox_sandboxes_paused") == 2
    assert value(samples, "callbox_sandboxes_pooled") == 4


def test_without_an_answering_engine_the_sandbox_gauges_are_left_out(monkeypatch):
    monkeypatch.setattr(metrics, "_engines", weakref.WeakSet())
    engine = FakeEngine(0, 0, 0, broken=True)
    metrics.watch_engine(engine)
    samples = scrape()
    assert ("callbox_sandboxes_live", frozenset()) not in samples
    assert value(samples, "callbox_sandboxes_pooled") == 0


def test_engine_errors_are_counted_once_by_kind():
    @engine_calls
    def lose() -> None:
        raise requests.exceptions.ConnectionError("connection refused")

    @engine_calls
    def outer() -> None:
        lose()  # engine methods call each other: counted once all the same

    before = value(scrape(), "callbox_engine_errors_total", kind="engine_unavailable")
    with pytest.raises(EngineUnavailable):
        outer()
    assert value(scrape(), "callbox_engine_errors_total", kind="engine_unavailable") == before + 1


def test_egress_decisions_count_by_decision():
    before = scrape()
    metrics.record_egress(["allow", "deny", "deny"])
    after = scrape()
    for decision, added in (("allow", 1), ("deny", 2)):
        assert value(after, "callbox_egress_decisions_total", decision=decision) == \
            value(before, "callbox_egress_decisions_total", decision=decision) + added


def test_latency_histograms_have_cumulative_buckets(door):
    metrics.record_call("echo", door, "allow", "ok", 0.0003, 0.02)
    metrics.record_call("echo", door, "allow", "ok", 0.003, 7.0)
    metrics.record_call("echo", door, "deny", "denied", 5.0, None)
    samples = scrape()

    def bucket(name: str, le: str) -> float:
        return value(samples, f"{name}_bucket", tool="echo", door=door, le=le)

    harness = "callbox_call_harness_seconds"
    assert [bucket(harness, le) for le in ("0.00025", "0.0005", "0.0025", "0.005", "2.5", "+Inf")] == [0, 1, 1, 2, 2, 3]
    assert value(samples, f"{harness}_count", tool="echo", door=door) == 3
    assert value(samples, f"{harness}_sum", tool="echo", door=door) == pytest.approx(5.0033)
    sandbox = "callbox_call_sandbox_seconds"
    assert [bucket(sandbox, le) for le in ("0.01", "0.025", "5.0", "10.0", "+Inf")] == [0, 1, 1, 2, 2]
    assert value(samples, f"{sandbox}_sum", tool="echo", door=door) == pytest.approx(7.02)


class EgressEvent:
    def __init__(self, decision: str) -> None:
        self.decision = decision
        self.raw = {"decision": decision, "host": "example.org", "port": 443}


class EgressSandbox:
    """A sandbox whose egress proxy logged decisions since it was last asked."""

    id = "box-egress"
    agent = None

    def __init__(self) -> None:
        self.pending = [EgressEvent("allow"), EgressEvent("deny"), EgressEvent("deny")]

    def new_egress_events(self) -> list[EgressEvent]:
        events, self.pending = self.pending, []
        return events

    def destroy(self) -> None:
        pass


def _in_sandbox(ctx: Any, args: TextArgs) -> ToolOutput:
    ctx.provider.sandbox()
    return ToolOutput(text=args.text)


def test_egress_decisions_recorded_by_a_call_are_counted_once(audit, door):
    registry = ToolRegistry([Tool(ToolDefinition("boxed", "Uses the sandbox.", TextArgs), _in_sandbox)])
    sandbox = EgressSandbox()
    before = scrape()
    with Session(registry, Policy(), audit, engine_factory=lambda: FakeEgressEngine(sandbox), door=door) as session:
        session.call(ToolCall("boxed", {"text": "a"}, "c-1"))
        session.call(ToolCall("boxed", {"text": "b"}, "c-2"))  # nothing new since
        assert [e["decision"] for e in audit.egress(session.run_id)] == ["allow", "deny", "deny"]
    after = scrape()
    for decision, added in (("allow", 1), ("deny", 2)):
        assert value(after, "callbox_egress_decisions_total", decision=decision) == \
            value(before, "callbox_egress_decisions_total", decision=decision) + added


class FakeEgressEngine:
    def __init__(self, sandbox: EgressSandbox) -> None:
        self.sandbox = sandbox

    def create(self, _spec: Any, **_options: Any) -> EgressSandbox:
        return self.sandbox
