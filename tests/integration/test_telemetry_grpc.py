"""Metrics and traces of the gRPC door end to end: real engine, real image, real gRPC, and a
real OTLP/HTTP receiver on loopback that decodes what the SDK's exporter sends.

Known calls (one allowed, one denied, one failing, one waiting for approval) are made, then
the registry is scraped with prometheus_client's parser and the increments checked exactly;
a call made with a caller's ``traceparent`` must arrive at the receiver as a ``callbox.call``
span in the caller's trace, its parent the caller's span, with a child per step.
"""

from __future__ import annotations

import contextlib
import gzip
import http.server
import secrets
import shutil
import tempfile
import textwrap
import threading
import weakref
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from prometheus_client.parser import text_string_to_metric_families

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.telemetry import metrics, tracing
from harness.telemetry.metrics import exposition
from harness.v1 import executor_pb2, executor_pb2_grpc
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN = "token-of-the-telemetry-test-0123"
TOKENS = TokenSet({"tele": TOKEN}, source="test tokens")
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "512m"

    [[tools.shell.rules]]
    action = "deny"
    command = "*deny-me*"

    [[tools.shell.rules]]
    action = "ask"
    command = "*approve-me*"
""")
STEPS = {"callbox.validate", "callbox.authorize", "callbox.exec", "callbox.shape", "callbox.audit"}


class Receiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1: every ExportTraceServiceRequest POSTed to
    /v1/traces, decoded; ``spans`` flattens them with their resource's attributes."""

    def __init__(self) -> None:
        self.requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.arrived = threading.Condition()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path != "/v1/traces" or self.headers.get("Content-Type") != "application/x-protobuf":
                    self.send_error(404 if self.path != "/v1/traces" else 415)
                    return
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                with receiver.arrived:
                    receiver.requests.append(request)
                    receiver.arrived.notify_all()
                answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}/v1/traces"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def spans(self) -> list[tuple[dict[str, Any], Any]]:
        with self.arrived:
            return [({a.key: a.value.string_value for a in rs.resource.attributes}, span)
                    for request in self.requests for rs in request.resource_spans
                    for ss in rs.scope_spans for span in ss.spans]

    def wait_for(self, trace_id: bytes, names: set[str], timeout: float = 10.0) -> list[tuple[dict[str, Any], Any]]:
        """The spans of ``trace_id`` once every one of ``names`` arrived (or ``timeout`` passed)."""
        def found() -> list[tuple[dict[str, Any], Any]]:
            return [(r, s) for r, s in self.spans() if s.trace_id == trace_id]

        with self.arrived:
            self.arrived.wait_for(lambda: names <= {s.name for _, s in found()}, timeout=timeout)
        return found()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    made = Receiver()
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def traced(receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> Iterator[Receiver]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    tracing.configure(receiver.endpoint, service_name="callbox-itest")
    try:
        yield receiver
    finally:
        tracing.shutdown()


@contextlib.contextmanager
def _serving(tmp_path: Path, policy: str) -> Iterator[GrpcServer]:
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    handle = serve_grpc(str(short / "x.sock"), policy=parse_policy(policy), audit=AuditStore(tmp_path / "a.sqlite3"),
                        announce=None, tokens=TOKENS, reaper_interval_s=0.5)
    try:
        yield handle
    finally:
        handle.stop(grace=1)
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture
def server(engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[GrpcServer]:
    # Only this server's audit store is counted in the pending-approvals gauge.
    monkeypatch.setattr(metrics, "_approval_sources", weakref.WeakValueDictionary())
    with _serving(tmp_path, POLICY) as handle:
        yield handle


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape() -> Samples:
    text = exposition()[0].decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


def call_with_trace(server: GrpcServer, sandbox_id: str, command: str, call_id: str,
                    traceparent: str) -> executor_pb2.ToolResult:
    """CallTool through the generated stub, with a caller's traceparent in the metadata."""
    with grpc.insecure_channel(server.target) as channel:
        stub = executor_pb2_grpc.ExecutorStub(channel)
        request = executor_pb2.CallToolRequest(sandbox_id=sandbox_id, name="shell", call_id=call_id,
                                               arguments_json=f'{{"command": "{command}"}}')
        metadata = (("authorization", f"Bearer {TOKEN}"), ("traceparent", traceparent))
        for event in stub.CallTool(request, metadata=metadata, timeout=60):
            if event.HasField("result"):
                return event.result
    raise AssertionError("CallTool ended without a result")


def test_known_calls_move_the_metrics_exactly(server):
    before = scrape()
    with ExecutorClient(server.target, TOKEN) as client:
        sandbox_id = client.create_sandbox()
        try:
            mid = scrape()
            assert mid.get(("callbox_sandboxes_live", frozenset()), 0) >= 1
            ok = client.call(sandbox_id, "shell", {"command": "echo hello"}, call_id="ok-1")
            denied = client.call(sandbox_id, "shell", {"command": "echo deny-me"}, call_id="deny-1")
            failed = client.call(sandbox_id, "shell", {"command": "exit 3"}, call_id="fail-1")
            pending = client.call(sandbox_id, "shell", {"command": "echo approve-me"}, call_id="ask-1")
            assert not ok.is_error and "hello" in ok.text
            assert denied.is_error and failed.is_error and pending.is_error
            after = scrape()
        finally:
            client.delete_sandbox(sandbox_id)
    calls = "callbox_calls_total"
    assert delta(before, after, calls, tool="shell", door="grpc", decision="allow", outcome="ok") == 1
    assert delta(before, after, calls, tool="shell", door="grpc", decision="deny", outcome="denied") == 1
    assert delta(before, after, calls, tool="shell", door="grpc", decision="allow", outcome="nonzero_exit") == 1
    assert delta(before, after, calls, tool="shell", door="grpc", decision="ask", outcome="approval_pending") == 1
    assert sum(v for (name, _), v in after.items() if name == calls) - \
        sum(v for (name, _), v in before.items() if name == calls) == 4
    # every call has harness time; the two that ran have sandbox time too
    assert delta(before, after, "callbox_call_harness_seconds_count", tool="shell", door="grpc") == 4
    assert delta(before, after, "callbox_call_sandbox_seconds_count", tool="shell", door="grpc") == 2
    assert delta(before, after, "callbox_call_sandbox_seconds_sum", tool="shell", door="grpc") > 0
    assert delta(before, after, "callbox_sandboxes_created_total", source="cold") == 1
    assert delta(before, after, "callbox_sandbox_create_seconds_count", source="cold") == 1
    assert after[("callbox_approvals_pending", frozenset())] == 1


def test_a_callers_trace_continues_into_the_call(server, traced):
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    with ExecutorClient(server.target, TOKEN) as client:
        sandbox_id = client.create_sandbox()
        try:
            result = call_with_trace(server, sandbox_id, "echo traced", "traced-1", f"00-{trace_id}-{parent_id}-01")
            assert not result.is_error and "traced" in result.text
        finally:
            client.delete_sandbox(sandbox_id)
    assert tracing.flush()
    spans = traced.wait_for(bytes.fromhex(trace_id), {"callbox.call", *STEPS})
    by_name = {span.name: (resource, span) for resource, span in spans}
    assert set(by_name) == {"callbox.call", *STEPS}  # the run's sandbox was started by CreateSandbox
    resource, call = by_name["callbox.call"]
    assert resource["service.name"] == "callbox-itest"
    assert call.parent_span_id == bytes.fromhex(parent_id)
    attributes = {a.key: a.value.string_value for a in call.attributes}
    assert attributes == {"callbox.run_id": sandbox_id, "callbox.call_id": "traced-1", "callbox.tool": "shell",
                          "callbox.door": "grpc", "callbox.decision": "allow"}
    for name in STEPS:
        step = by_name[name][1]
        assert step.parent_span_id == call.span_id, name
        step_attributes = {a.key: a.value.string_value for a in step.attributes}
        assert step_attributes == {"callbox.run_id": sandbox_id, "callbox.call_id": "traced-1"}


def test_a_create_from_the_warm_pool_is_counted_as_such(engine, tmp_path):
    with _serving(tmp_path, POLICY + "\n[pool]\nsize = 1\n") as server:
        shared = server.service.engine_factory
        docker_engine = shared()  # connects, and the pool starts filling
        assert docker_engine.pool is not None and docker_engine.pool.wait_filled(120), "the pool did not fill"
        before = scrape()
        assert before[("callbox_sandboxes_pooled", frozenset())] >= 1
        with ExecutorClient(server.target, TOKEN) as client:
            sandbox_id = client.create_sandbox()
            try:
                after = scrape()
            finally:
                client.delete_sandbox(sandbox_id)
    assert delta(before, after, "callbox_sandboxes_created_total", source="pool") == 1
    assert delta(before, after, "callbox_sandboxes_created_total", source="cold") == 0
    assert delta(before, after, "callbox_sandbox_create_seconds_count", source="pool") == 1
