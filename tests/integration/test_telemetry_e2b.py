"""A caller's trace continues into the E2B door: a request with a W3C ``traceparent`` header
is a server span (``callbox.e2b``) whose parent is the caller's span, caught by the SDK's
in-memory exporter. The request lists sandboxes, so none is started."""

from __future__ import annotations

import json
import secrets
import threading
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from harness.doors.e2b.server import serve_e2b
from harness.telemetry import tracing
from tests.conftest import IMAGE
from tests.integration.e2b_door import e2b_sandboxes

pytestmark = pytest.mark.docker

KEY = "e2b_telemetry_test_key_0123456789"
POLICY = f'[sandbox]\nimage = "{IMAGE}"\n'


@pytest.fixture
def url(engine: Any) -> Iterator[str]:
    with e2b_sandboxes(engine, POLICY, prefix="cbx-e2b-tele-", keys={"tele": KEY}) as door:
        server = serve_e2b("127.0.0.1:0", sandboxes=door.sandboxes, announce=None)
        try:
            yield server.url
        finally:
            server.stop()


class WaitingExporter(InMemorySpanExporter):
    """The in-memory exporter, with a wait for spans (a request's span ends after its
    response went out, so after the client has it)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = threading.Condition()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with self.arrived:
            result = super().export(spans)
            self.arrived.notify_all()
        return result

    def wait_for(self, count: int, timeout: float = 10.0) -> tuple[ReadableSpan, ...]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.get_finished_spans()) >= count, timeout=timeout)
        return self.get_finished_spans()


@pytest.fixture
def exporter() -> Iterator[WaitingExporter]:
    caught = WaitingExporter()
    tracing.configure(None, exporter=caught)
    try:
        yield caught
    finally:
        tracing.shutdown()


def _list(url: str, headers: dict[str, str]) -> Any:
    request = urllib.request.Request(f"{url}/v2/sandboxes", headers={"X-API-Key": KEY, **headers})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, never a proxy
    with opener.open(request, timeout=30) as response:
        return json.load(response)


def test_a_request_with_a_traceparent_is_a_child_of_the_callers_span(url, exporter):
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    assert _list(url, {"traceparent": f"00-{trace_id}-{parent_id}-01"}) == []
    (traced,) = exporter.wait_for(1)
    assert _list(url, {}) == []
    _, untraced = exporter.wait_for(2)
    assert traced.name == "callbox.e2b" and traced.kind is SpanKind.SERVER
    assert format(traced.context.trace_id, "032x") == trace_id
    assert traced.parent is not None and format(traced.parent.span_id, "016x") == parent_id
    assert dict(traced.attributes or {}) == {"http.request.method": "GET", "url.path": "/v2/sandboxes"}
    assert untraced.parent is None and format(untraced.context.trace_id, "032x") != trace_id
