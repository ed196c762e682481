"""A caller's trace continues into the MCP door over streamable HTTP: the official ``mcp``
client sends a W3C ``traceparent`` (as an HTTP header, or in the request's ``_meta``), and
the call's span, caught by the SDK's in-memory exporter, is a child of the caller's span,
labelled ``door=mcp``; the call is counted under that door too.

The calls are refused by the policy, so no sandbox is started (the engine is still required:
the MCP server checks it like any door).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.parser import text_string_to_metric_families

from harness.doors.mcp.http import McpHttpServer, serve_mcp_http
from harness.telemetry import tracing
from harness.telemetry.metrics import exposition
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    caught = InMemorySpanExporter()
    tracing.configure(None, exporter=caught)
    try:
        yield caught
    finally:
        tracing.shutdown()


@pytest.fixture
def server(engine: Any, tmp_path: Path) -> Iterator[McpHttpServer]:
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[sandbox]\nimage = "{IMAGE}"\n\n[tools.shell]\ndecision = "deny"\n')
    handle = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=tmp_path / "audit.sqlite3")
    try:
        yield handle
    finally:
        handle.stop()


def _denied_calls() -> float:
    text = exposition()[0].decode()
    return sum(s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.name == "callbox_calls_total" and s.labels.get("door") == "mcp"
               and s.labels.get("decision") == "deny")


def _call(server: McpHttpServer, *, header: str | None = None, meta: str | None = None) -> None:
    async def flow() -> None:
        headers = {"traceparent": header} if header is not None else {}
        async with httpx2.AsyncClient(headers=headers) as http, \
                Client(streamable_http_client(server.url, http_client=http)) as client:
            result = await client.call_tool("shell", {"command": "true"},
                                            meta={"traceparent": meta} if meta is not None else None)
            assert result.is_error

    anyio.run(flow)


@pytest.mark.parametrize("carried_in", ["header", "meta"])
def test_an_http_callers_trace_continues_into_the_call(server, exporter, carried_in):
    trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
    traceparent = f"00-{trace_id}-{parent_id}-01"
    before = _denied_calls()
    if carried_in == "header":
        _call(server, header=traceparent)
    else:
        _call(server, meta=traceparent)
    assert _denied_calls() == before + 1
    calls = [s for s in exporter.get_finished_spans() if s.name == "callbox.call"]
    assert len(calls) == 1
    call = calls[0]
    assert format(call.context.trace_id, "032x") == trace_id
    assert call.parent is not None and format(call.parent.span_id, "016x") == parent_id
    attributes = dict(call.attributes or {})
    assert attributes["callbox.door"] == "mcp" and attributes["callbox.decision"] == "deny"
    assert attributes["callbox.call_id"].startswith("mcp-")


def test_without_a_traceparent_the_call_starts_its_own_trace(server, exporter):
    _call(server)
    calls = [s for s in exporter.get_finished_spans() if s.name == "callbox.call"]
    assert len(calls) == 1 and calls[0].parent is None
