"""The MCP protocol of the door: ``tools/list`` and ``tools/call`` on the SDK's low-level
``Server``, mapping results to ``CallToolResult`` and output to progress notifications;
the session-era checks of streamable HTTP (``server/discover``, no sessionless requests).
"""

from __future__ import annotations

import dataclasses
import logging
from importlib import metadata
from typing import Any, Literal

import anyio
import anyio.to_thread
import mcp_types as types
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

from harness.core.calls import ErrorCode, ToolResult
from harness.core.errors import SessionClosed
from harness.core.formats import result_item
from harness.doors.mcp.progress import OutputPump, progress_requested
from harness.doors.mcp.service import LOCAL_CLIENT, McpSession, McpToolService, SessionSlot
from harness.doors.quota_ledger import QuotaExceeded, fair_share
from harness.engine.cancel import CallScope
from harness.engine.spec import SandboxSpec
from harness.telemetry import tracing

__all__ = [
    "CALL_ID_META_KEY",
    "DEFAULT_MAX_CONCURRENT_CALLS",
    "INSTRUCTIONS",
    "SessionScope",
    "build_mcp_server",
    "instructions",
]

log = logging.getLogger("callbox.mcp")

SERVER_NAME = "callbox"
"""Concurrent HTTP sessions (each may hold a sandbox); one more gets HTTP 503."""
DEFAULT_MAX_CONCURRENT_CALLS = 64
"""Tool calls running at once across all sessions (each holds a worker thread); one client may
run a quarter of them at once, one more is an error result (``concurrent_calls``)."""
CLIENT_SCOPE_KEY = "callbox.client"
"""The ASGI scope key where the HTTP transport puts the client name of the request's token."""
GRACEFUL_SHUTDOWN_S = 5.0
"""On shutdown, how long open HTTP streams get before they are closed and sessions end."""

CALL_ID_META_KEY = "callbox/call_id"
"""Request ``_meta`` key: the client's own call id (an idempotency key) for a ``tools/call``."""
_META = "callbox/"
STRUCTURED_TEXT_KEY = "text"
"""``structuredContent`` key holding the result's text (the same as its text content block)."""

INSTRUCTIONS = (
    "Tools run in a disposable, hardened Linux sandbox (a Docker container {network}). "
    "Each MCP session has its own sandbox: files written by one call are there for the next, "
    "and everything is deleted when the session ends. A call that needs a person's approval "
    "returns an error result naming the approval id; once it is approved "
    "(`callbox approvals approve ID`), send exactly the same call again and it runs once."
)


def instructions(spec: SandboxSpec) -> str:
    """INSTRUCTIONS with the sandbox's network stated truthfully."""
    network = {
        "none": "without network",
        "allowlist": "whose only network access is HTTP(S) through a proxy to: " + ", ".join(spec.allow_hosts),
        "open": "with outside network access, but not to the host or link-local metadata",
    }[spec.network]
    return INSTRUCTIONS.format(network=network)

SessionScope = Literal["process", "connection"]


def _version() -> str:
    try:
        return metadata.version("callbox")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0"


# ---- protocol: tools/list and tools/call on a low-level Server ---------------------------




def _client_call_id(ctx: ServerRequestContext[Any, Any]) -> str | None:
    meta: Any = ctx.meta or {}
    value = meta.get(CALL_ID_META_KEY)
    return value if isinstance(value, str) else None


def _connection_of(ctx: ServerRequestContext[Any, Any]) -> Connection:
    """The connection (MCP session) a request arrived on. SDK 2.x hands low-level handlers a
    ``ServerRequestContext`` whose ``session`` holds it; its ``exit_stack`` is the SDK's
    documented per-connection teardown hook."""
    connection = getattr(ctx, "connection", None) or getattr(ctx.session, "_connection", None)
    if not isinstance(connection, Connection):  # pragma: no cover - an SDK change; pinned in requirements
        raise RuntimeError("cannot find the MCP connection of this request (mcp SDK changed?)")
    return connection


def _approval_text(result: ToolResult) -> str:
    approval_id = result.meta.get("approval_id")
    return (
        f"{result.text}. A person resolves it with `callbox approvals approve {approval_id}` "
        f"(or `callbox approvals deny {approval_id}`); then send exactly the same call again in this "
        "session: it runs once if approved, or returns the denial."
    )


class _McpProtocol:
    """The handlers: MCP requests in, McpSession calls out (in worker threads)."""

    def __init__(self, service: McpToolService, scope: SessionScope, transport: str) -> None:
        self.service = service
        self.scope = scope
        self.transport = transport
        self._process_slot: SessionSlot | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self.server: Server[Any] | None = None

    def _meta(self, ctx: ServerRequestContext[Any, Any], **extra: Any) -> dict[str, Any]:
        """What the audit run records about the session: transport and client."""
        meta: dict[str, Any] = {"transport": self.transport, "protocol_version": ctx.protocol_version, **extra}
        client = ctx.session.client_params
        if client is not None:
            meta["client"] = f"{client.client_info.name}/{client.client_info.version}"
        return meta

    def _slot(self, ctx: ServerRequestContext[Any, Any]) -> SessionSlot:
        if self.scope == "process":
            if self._process_slot is None:
                self._process_slot = self.service.new_slot(self._meta(ctx))
            return self._process_slot
        client = client_of(ctx)
        connection = _connection_of(ctx)
        slot = connection.state.get("callbox.session")
        if not isinstance(slot, SessionSlot):
            slot = self.service.new_slot(self._meta(ctx, mcp_session_id=connection.session_id), client)
            connection.state["callbox.session"] = slot
            connection.exit_stack.push_async_callback(_close_slot, slot)
        elif slot.client != client:
            raise MCPError(code=INVALID_REQUEST, message="this MCP session belongs to another client's token; "
                           "start a session of your own (initialize)")
        return slot

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [types.Tool.model_validate(d) for d in self.service.tool_definitions(client_of(ctx))]
        return types.ListToolsResult(tools=tools)

    async def call_tool(
        self, ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        name = params.name
        arguments = params.arguments if params.arguments is not None else {}
        try:
            slot = self._slot(ctx)
        except SessionClosed as ended:
            raise MCPError(code=INTERNAL_ERROR, message=ended.message) from None
        pump = OutputPump() if progress_requested(ctx) else None
        client_call_id = _client_call_id(ctx)
        scope = CallScope()
        if self._limiter is None:
            self._limiter = anyio.CapacityLimiter(DEFAULT_MAX_CONCURRENT_CALLS)
        # A caller's traceparent continues its trace: an HTTP header, else the request's _meta
        # (where MCP clients that trace put it).
        trace = tracing.carrier(getattr(ctx.request, "headers", None)) or tracing.carrier(ctx.meta)

        def run() -> tuple[ToolResult, McpSession]:
            session = slot.session()
            with tracing.continued(trace):
                result = session.call(name, arguments, call_id=client_call_id,
                                      on_output=pump.push if pump is not None else None, scope=scope)
            return result, session

        try:  # the client's share of the call threads (the limiter's), so others always find some
            self.service.quotas.enter(slot.client, door="mcp", share=fair_share(DEFAULT_MAX_CONCURRENT_CALLS))
        except QuotaExceeded as refusal:
            return _refused(refusal)
        try:
            if pump is None:
                result, session = await anyio.to_thread.run_sync(run, abandon_on_cancel=True, limiter=self._limiter)
            else:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(pump.forward, ctx)
                    result, session = await anyio.to_thread.run_sync(
                        run, abandon_on_cancel=True, limiter=self._limiter)
                    tg.cancel_scope.cancel()
                await pump.report(ctx, final=True)
        except SessionClosed as ended:
            raise MCPError(code=INTERNAL_ERROR, message=ended.message) from None
        except QuotaExceeded as refusal:
            return _refused(refusal)
        except anyio.get_cancelled_exc_class():
            # The client cancelled the request or went away: the worker thread is abandoned,
            # so stop what it started in the sandbox.
            scope.cancel()
            raise
        finally:
            self.service.quotas.leave(slot.client, door="mcp")
        if result.error in (ErrorCode.UNKNOWN_TOOL, ErrorCode.TOOL_NOT_ALLOWED):
            available = ", ".join(self.service.exposed(slot.client)) or "none"
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}; the available tools are: {available}")
        return self._shape(result, session)

    @staticmethod
    def _shape(result: ToolResult, session: McpSession) -> types.CallToolResult:
        if result.error is ErrorCode.APPROVAL_PENDING:
            result = dataclasses.replace(result, text=_approval_text(result))
        item = result_item(result, "mcp")
        structured = item.get("structuredContent")
        if isinstance(structured, dict) and STRUCTURED_TEXT_KEY not in structured:
            # Clients that follow the spec's convention (the text block is the structured
            # content serialized) give the model structuredContent alone: it must carry the text.
            # A tool whose own structured result has a "text" field keeps it as it is.
            item["structuredContent"] = {**structured, STRUCTURED_TEXT_KEY: result.text}
        meta: dict[str, Any] = {f"{_META}run_id": session.run_id, f"{_META}call_id": result.call_id}
        if session.sandbox_id is not None:
            meta[f"{_META}sandbox_id"] = session.sandbox_id
        if result.error is not None:
            meta[f"{_META}error"] = result.error.value
        if result.meta.get("approval_id"):
            meta[f"{_META}approval_id"] = result.meta["approval_id"]
        item["_meta"] = meta
        return types.CallToolResult.model_validate(item)

    async def discover_handshake_only(
        self, ctx: ServerRequestContext[Any, Any], params: types.RequestParams
    ) -> types.DiscoverResult:
        """``server/discover`` on HTTP: this server keeps a sandbox per session, so it
        advertises only the protocol versions that have sessions (the handshake era)."""
        assert self.server is not None
        return types.DiscoverResult(
            supported_versions=list(HANDSHAKE_PROTOCOL_VERSIONS),
            capabilities=self.server.get_capabilities(),
            instructions=instructions(self.service.spec),
        )

    async def refuse_sessionless(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        sessionless = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        if sessionless and ctx.request_id is not None and ctx.method != "server/discover":
            raise MCPError(
                code=UNSUPPORTED_PROTOCOL_VERSION,
                message=(
                    f"protocol {ctx.protocol_version} has no sessions, and callbox keeps one sandbox per MCP "
                    "session: connect with the initialize handshake (protocol 2025-11-25) over HTTP, or use "
                    "`callbox mcp` over stdio"
                ),
                data={"supported": list(HANDSHAKE_PROTOCOL_VERSIONS), "requested": ctx.protocol_version},
            )
        return await call_next(ctx)


def client_of(ctx: ServerRequestContext[Any, Any]) -> str:
    """The client name of the request's bearer token, which the HTTP transport's auth put in
    the ASGI scope (:data:`CLIENT_SCOPE_KEY`); :data:`LOCAL_CLIENT` without one (stdio)."""
    scope = getattr(ctx.request, "scope", None)
    client = scope.get(CLIENT_SCOPE_KEY) if isinstance(scope, dict) else None
    return client if isinstance(client, str) else LOCAL_CLIENT


def _refused(refusal: QuotaExceeded) -> types.CallToolResult:
    """A call the client's quota refused: a tool failure the model reads (nothing ran, nothing
    was recorded), naming the quota and when it frees up."""
    return types.CallToolResult.model_validate({
        "content": [{"type": "text", "text": refusal.message}],
        "isError": True,
        "_meta": {f"{_META}error": refusal.code.value, f"{_META}quota": refusal.quota,
                  f"{_META}retry_after_s": refusal.retry_after},
    })


async def _close_slot(slot: SessionSlot) -> None:
    await anyio.to_thread.run_sync(slot.close)


def build_mcp_server(
    service: McpToolService, *, session_scope: SessionScope = "process", transport: str = "stdio"
) -> Server[Any]:
    """A low-level MCP ``Server`` serving ``service``'s tools.

    ``session_scope="process"``: every request belongs to one session that lives as long as
    the server (stdio: one client per process); the caller closes it with
    ``service.close()``. ``"connection"``: one session per MCP connection (streamable HTTP's
    ``Mcp-Session-Id``), closed when the connection ends; such a server speaks only the
    protocol versions that have sessions (see the module docstring).
    """
    protocol = _McpProtocol(service, session_scope, transport)
    server: Server[Any] = Server(
        SERVER_NAME,
        version=_version(),
        title="callbox",
        description="Sandboxed tool execution: shell, bash, file and patch tools in a disposable container",
        instructions=instructions(service.spec),
        on_list_tools=protocol.list_tools,
        on_call_tool=protocol.call_tool,
    )
    protocol.server = server
    if session_scope == "connection":
        server.add_request_handler("server/discover", types.RequestParams, protocol.discover_handshake_only)
        server.middleware.append(protocol.refuse_sessionless)
    return server
