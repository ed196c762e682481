"""The MCP door: callbox's built-in tools as a Model Context Protocol server.

Built on the official ``mcp`` SDK's low-level ``Server`` (full control of ``inputSchema``,
``annotations`` and ``isError``). Three layers, so the transports know nothing about tools:

* :class:`McpToolService` (tool logic, no MCP wire types): the registry, the policy and the
  audit store shared by every session; :class:`McpSession` is one MCP session: a
  :class:`~harness.core.session.Session` (its own run in the audit store, the same validation,
  policy, approvals, budgets and at-most-once as every other door) and the sandbox that run
  starts lazily.
* :func:`build_mcp_server` (protocol): ``tools/list`` and ``tools/call`` on a low-level
  ``Server``, mapping results to ``CallToolResult`` and output to progress notifications.
* transports: :func:`run_mcp_stdio` (``callbox mcp``, in :mod:`harness.doors.mcp.stdio`),
  :func:`serve_mcp_http` / :func:`run_mcp_http` (``callbox serve --mcp-http ADDR``,
  streamable HTTP on ``/mcp``).

Cancellation
    A call the client cancels (``notifications/cancelled``), or one still running when its
    session ends (the client closed stdin, sent ``DELETE`` or went idle; the server stops),
    has its agent RPCs cancelled, the same mechanism as the gRPC door's cancelled
    ``CallTool``: the agent then kills the command's whole process tree (a ``bash`` call's
    shell with it, which the next ``bash`` call reports). The call ends with an error result
    in the audit log; a cancelled request gets no response, as the spec says.

Sessions and sandboxes
    One :class:`McpSession` per MCP session, one sandbox per session, started by the first
    tool call that needs it (a rejected, denied or pending call starts none) and reused by
    later calls, so files written by one call are there for the next. It is destroyed when
    the session ends:

    * stdio: the server process is the session (one client per process, in either protocol
      era); it ends when stdin closes (the client's shutdown), or on SIGTERM/SIGINT.
    * streamable HTTP: a session is an ``Mcp-Session-Id`` (the ``initialize`` handshake,
      protocol versions up to 2025-11-25). It ends on the client's ``DELETE``, after
      ``idle_timeout_s`` (default 30 minutes) with no request in flight and no open GET
      stream, or when the server shuts down. The 2026-07-28 protocol has no sessions, so the
      HTTP server answers ``server/discover`` advertising only the handshake versions (SDK
      clients in ``auto`` mode then use the handshake), and refuses a 2026-07-28 request with
      ``-32022`` (unsupported protocol version) naming the versions it serves.

    A call still running when its session ends is cut off: its processes are killed, the
    sandbox goes, and the call ends with an error result in the audit log. A server killed with SIGKILL leaves its
    sandboxes behind; ``callbox gc`` (and every engine start) reaps them, their owner being
    dead. A session that outlives the policy's ``sandbox.ttl_seconds`` may have its sandbox
    reaped as expired.

Errors
    Everything the model got wrong or may not do (invalid arguments, denied, over budget,
    non-zero exit, timed out, pending approval, ...) is a result with ``isError: true`` and
    readable text, recorded in the audit log. An unknown tool, or one the policy's
    ``allowed_tools`` does not expose (it is not in ``tools/list`` either), is the protocol
    error the MCP spec prescribes for unknown tools: JSON-RPC ``-32602`` (invalid params)
    with the message ``Unknown tool: NAME; the available tools are: ...``; the call is still
    recorded in the audit log.

Call ids and approvals
    MCP has no call id, so the server assigns one per call: ``mcp-000001``, ``mcp-000002``,
    ... within the session's run (see ``callbox audit --run RUN``). A call whose policy
    decision is ``ask`` returns an error result that names its approval id and says how to
    resolve it (``callbox approvals approve ID`` or ``deny ID``); the session remembers the
    pending call under (tool, canonical arguments). When the client sends exactly the same
    call again in the same session, it gets the same call id, so the harness resumes that
    call instead of asking again: still pending (the same approval id), denied (the
    denial, once), or approved (it runs, exactly once, even if resent concurrently). Once
    it has a final result the next identical call is a new call. A client that wants its
    own idempotency key can put ``"callbox/call_id": "ID"`` in the request's ``_meta``: a
    retry with the same id returns the recorded result instead of running again (unless
    that result is a failure from before the command started, such as an unreachable
    engine: then the retry runs it).

Progress
    When the request carries a ``progressToken``, ``notifications/progress`` follow while
    the tool runs: at most every 0.1 s while output arrives (``message`` is the new output
    text, at most 4 KiB of it), and every 5 s when there is none (a heartbeat: ``message``
    says how long it has run). ``progress`` is the seconds elapsed, strictly increasing;
    there is no ``total``. The server sends no log notifications (it does not declare the
    logging capability); its own logs go to stderr, so stdout stays clean for JSON-RPC.

``structuredContent`` (exit code, truncation, file metadata, ...) also holds the result's
text under ``"text"``: clients such as Pydantic AI's (FastMCP) hand the model the structured
content instead of the text blocks when there is some.

Results carry ``_meta`` with ``callbox/run_id``, ``callbox/call_id``, ``callbox/sandbox_id``
(once the session's sandbox exists), and for errors ``callbox/error`` (the error code) and,
when pending, ``callbox/approval_id``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any, Literal

import anyio
import anyio.to_thread
import mcp_types as types
import uvicorn
from mcp.server.connection import Connection
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, UNSUPPORTED_PROTOCOL_VERSION
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS
from starlette.applications import Starlette
from starlette.routing import Route

from harness.audit.store import AuditStore, arguments_digest
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.errors import CallboxError, SessionClosed, UsageError
from harness.core.formats import result_item, tool_definition
from harness.core.policy import Policy, load_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.doors.mcp.progress import OutputPump, progress_requested
from harness.engine.cancel import CallScope
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry

__all__ = [
    "CALL_ID_META_KEY",
    "DEFAULT_IDLE_TIMEOUT_S",
    "McpHttpServer",
    "McpSession",
    "McpToolService",
    "build_mcp_server",
    "mcp_http_app",
    "parse_addr",
    "run_mcp_http",
    "run_mcp_stdio",
    "serve_mcp_http",
]

log = logging.getLogger("callbox.mcp")

SERVER_NAME = "callbox"
MCP_PATH = "/mcp"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
"""An HTTP session with no request in flight and no open GET stream for this long ends."""
DEFAULT_MAX_SESSIONS = 64
"""Concurrent HTTP sessions (each may hold a sandbox); one more gets HTTP 503."""
DEFAULT_MAX_CONCURRENT_CALLS = 64
"""Tool calls running at once across all sessions (each holds a worker thread)."""
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


# ---- tool logic (no transport) ------------------------------------------------------------


class McpSession:
    """One MCP session: its own run in the audit store, its own (lazily started) sandbox.

    ``call`` blocks (it runs the tool); the server calls it from a worker thread. Thread-safe:
    a client may have several calls in flight in one session.
    """

    def __init__(self, service: McpToolService, meta: dict[str, Any]) -> None:
        extra: dict[str, Any] = {}
        if service.engine_factory is not None:
            extra["engine_factory"] = service.engine_factory
        self.harness = Session(service.registry, service.policy, service.audit, spec=service.spec, **extra)
        self.run_id = self.harness.run_id
        self._audit = service.audit
        self._lock = threading.Lock()
        self._seq = 0
        self._awaiting: dict[tuple[str, str], str] = {}
        """(tool, arguments digest) -> call id of a call waiting for (or just given) approval."""
        self._closed = False
        service.audit.update_run_meta(self.run_id, {"door": "mcp", **meta})
        log.info("MCP session started: run %s %s", self.run_id, meta)

    @property
    def sandbox_id(self) -> str | None:
        box = self.harness.active_sandbox
        return box.id if box is not None else None

    def call(
        self, name: str, arguments: dict[str, Any], *, call_id: str | None = None,
        on_output: Callable[[str, bytes], None] | None = None, scope: CallScope | None = None,
    ) -> ToolResult:
        """Run one ``tools/call``; see the module docstring for how the call id is chosen.
        ``scope.cancel()``, from any thread, cancels the call's agent RPCs (killing its
        processes in the sandbox)."""
        key = (name, arguments_digest(arguments))
        with self._lock:
            if self._closed:
                raise SessionClosed("this MCP session has ended")
            if call_id is None:
                call_id = self._awaiting.get(key)
            if call_id is None:
                self._seq += 1
                call_id = f"mcp-{self._seq:06d}"
        result = self.harness.call(ToolCall(name, arguments, call_id), on_output=on_output, scope=scope)
        with self._lock:
            if result.error is ErrorCode.APPROVAL_PENDING:
                self._awaiting[key] = call_id
            elif self._awaiting.get(key) == call_id:
                del self._awaiting[key]
        return result

    def close(self) -> None:
        """Destroy the sandbox (if one was started) and end the run; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        sandbox_id = self.sandbox_id
        try:
            self.harness.close()  # cancels the calls still running first
        finally:
            with contextlib.suppress(CallboxError):
                self._audit.end_run(self.run_id, "mcp_session_ended")
            log.info("MCP session ended: run %s, sandbox %s destroyed", self.run_id, sandbox_id or "(none)")


class SessionSlot:
    """Where a session will live: created on the event loop without I/O, the session itself
    (an audit run) on the first tool call, from a worker thread."""

    def __init__(self, service: McpToolService, meta: dict[str, Any]) -> None:
        self._service = service
        self._meta = meta
        self._lock = threading.Lock()
        self._session: McpSession | None = None
        self._closed = False

    def session(self) -> McpSession:
        with self._lock:
            if self._closed:
                raise SessionClosed("this MCP session has ended")
            if self._session is None:
                self._session = McpSession(self._service, self._meta)
            return self._session

    @property
    def current(self) -> McpSession | None:
        return self._session

    def close(self) -> None:
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        self._service.forget(self)
        if session is not None:
            session.close()


class McpToolService:
    """The tools every MCP session of one server shares: registry, policy, audit store.

    ``engine_factory`` (tests, other engines) defaults to the Session's own: connect to the
    Docker engine named by DOCKER_HOST, failing closed when there is none.
    """

    def __init__(
        self, registry: ToolRegistry, policy: Policy, audit: AuditStore, *, spec: SandboxSpec | None = None,
        engine_factory: Callable[[], Any] | None = None, owns_audit: bool = False,
    ) -> None:
        policy.check_tools(t.definition for t in registry.tools())
        self.registry = registry
        self.policy = policy
        self.audit = audit
        self.spec = spec if spec is not None else policy.sandbox_spec()
        self.engine_factory = engine_factory
        self._owns_audit = owns_audit
        self._slots: set[SessionSlot] = set()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, *, policy_path: Path | None = None, audit_path: Path | None = None) -> McpToolService:
        """The built-in tools under the policy at ``policy_path`` (default: the packaged
        default policy), auditing to ``audit_path`` (default $CALLBOX_AUDIT_DB or the state
        dir). A bad policy raises PolicyError (exit code 2) before anything is served."""
        policy = load_policy(policy_path)
        registry = builtin_registry()
        audit = AuditStore(audit_path)
        try:
            return cls(registry, policy, audit, owns_audit=True)
        except BaseException:
            audit.close()
            raise

    # ---- what clients see

    def exposed(self) -> list[str]:
        return self.registry.exposed_names(self.policy)

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The exposed tools in MCP's ``Tool`` shape (name, description, inputSchema, annotations)."""
        return [tool_definition(self.registry.get(name).definition, "mcp")  # type: ignore[union-attr]
                for name in self.exposed()]

    # ---- sessions

    def new_slot(self, meta: dict[str, Any]) -> SessionSlot:
        slot = SessionSlot(self, meta)
        with self._lock:
            if self._closed:
                raise SessionClosed("the MCP server is shutting down")
            self._slots.add(slot)
        return slot

    def forget(self, slot: SessionSlot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def live_sessions(self) -> list[McpSession]:
        with self._lock:
            slots = list(self._slots)
        return [s.current for s in slots if s.current is not None]

    def close_sessions(self) -> None:
        """End every session (destroying its sandbox); the service stays usable."""
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            try:
                slot.close()
            except Exception:
                log.exception("closing an MCP session failed")

    def close(self) -> None:
        """End every session, then close the audit store if this service opened it."""
        with self._lock:
            self._closed = True
        self.close_sessions()
        if self._owns_audit:
            self.audit.close()


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
        connection = _connection_of(ctx)
        slot = connection.state.get("callbox.session")
        if not isinstance(slot, SessionSlot):
            slot = self.service.new_slot(self._meta(ctx, mcp_session_id=connection.session_id))
            connection.state["callbox.session"] = slot
            connection.exit_stack.push_async_callback(_close_slot, slot)
        return slot

    async def list_tools(
        self, ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        tools = [types.Tool.model_validate(d) for d in self.service.tool_definitions()]
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

        def run() -> tuple[ToolResult, McpSession]:
            session = slot.session()
            result = session.call(name, arguments, call_id=client_call_id,
                                  on_output=pump.push if pump is not None else None, scope=scope)
            return result, session

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
        except anyio.get_cancelled_exc_class():
            # The client cancelled the request or went away: the worker thread is abandoned,
            # so stop what it started in the sandbox.
            scope.cancel()
            raise
        if result.error in (ErrorCode.UNKNOWN_TOOL, ErrorCode.TOOL_NOT_ALLOWED):
            available = ", ".join(self.service.exposed()) or "none"
            raise MCPError(code=INVALID_PARAMS, message=f"Unknown tool: {name}; the available tools are: {available}")
        return self._shape(result, session)

    @staticmethod
    def _shape(result: ToolResult, session: McpSession) -> types.CallToolResult:
        if result.error is ErrorCode.APPROVAL_PENDING:
            result = dataclasses.replace(result, text=_approval_text(result))
        item = result_item(result, "mcp")
        if isinstance(item.get("structuredContent"), dict):
            # Clients that follow the spec's convention (the text block is the structured
            # content serialized) give the model structuredContent alone: it must carry the text.
            item["structuredContent"] = {**item["structuredContent"], STRUCTURED_TEXT_KEY: result.text}
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


# ---- transport: stdio ---------------------------------------------------------------------


def _log_to_stderr() -> None:
    """Logs to stderr (never stdout: over stdio it carries JSON-RPC) unless logging is set up."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("callbox mcp: %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        logging.getLogger("callbox").setLevel(logging.INFO)


@contextlib.contextmanager
def _terminate_ignored() -> Iterator[None]:
    """While sessions are being closed, a second SIGTERM must not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_mcp_stdio(*, policy_path: Path | None = None, audit_path: Path | None = None) -> None:
    """``callbox mcp``: serve MCP over stdin/stdout until stdin closes (or SIGTERM/SIGINT),
    then destroy the session's sandbox (``harness.doors.mcp.stdio``). Logs go to stderr. A bad
    policy raises PolicyError before anything is read from stdin; input that is not
    JSON-RPC raises UsageError once stdin has ended."""
    from harness.doors.mcp.stdio import run_stdio

    run_stdio(policy_path=policy_path, audit_path=audit_path)


# ---- transport: streamable HTTP -----------------------------------------------------------


def parse_addr(addr: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6]:PORT``, ``:PORT`` or ``PORT`` (host 127.0.0.1); port 0 picks a free one."""
    text = addr.strip()
    host, port_text = DEFAULT_HOST, text
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or not text[end + 1:].startswith(":"):
            raise UsageError(f"bad address {addr!r}: write [IPV6]:PORT, e.g. [::1]:8765")
        host, port_text = text[1:end], text[end + 2:]
    elif ":" in text:
        host, _, port_text = text.rpartition(":")
        host = host or DEFAULT_HOST
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise UsageError(f"bad address {addr!r}: write HOST:PORT with a port from 0 to 65535, e.g. 127.0.0.1:8765")
    return host, port


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def mcp_http_app(
    service: McpToolService, *, host: str = DEFAULT_HOST, idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S,
    max_sessions: int | None = DEFAULT_MAX_SESSIONS,
) -> Starlette:
    """The ASGI app: streamable HTTP on ``/mcp``, one MCP session (and sandbox) per
    ``Mcp-Session-Id``. On a loopback host, requests whose Host/Origin is not loopback get
    HTTP 421/403 (DNS-rebinding protection). Its shutdown ends every session."""
    server = build_mcp_server(service, session_scope="connection", transport="http")
    security = None
    if _is_loopback(host):
        security = TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*", "127.0.0.1", "localhost", "[::1]"],
            allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
        )
    manager = StreamableHTTPSessionManager(
        app=server, security_settings=security, session_idle_timeout=idle_timeout_s, max_sessions=max_sessions,
    )

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            async with manager.run():
                yield
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(service.close_sessions)

    return Starlette(routes=[Route(MCP_PATH, endpoint=StreamableHTTPASGIApp(manager))], lifespan=lifespan)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app: Starlette) -> uvicorn.Server:
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan="on", timeout_graceful_shutdown=int(GRACEFUL_SHUTDOWN_S),
        log_config=None,
    )
    return uvicorn.Server(config)


def _check_host(host: str, insecure: bool) -> None:
    if not _is_loopback(host) and not insecure:
        raise UsageError(
            f"refusing to serve MCP over HTTP on {host}: the MCP door has no authentication, so anyone who "
            "can reach it can run commands in sandboxes; listen on 127.0.0.1 (the default) and tunnel, or "
            "pass insecure=True (--insecure) on a trusted network"
        )


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}{MCP_PATH}"


class McpHttpServer:
    """A streamable-HTTP MCP server running in a background thread (``serve_mcp_http``)."""

    def __init__(self, service: McpToolService, server: uvicorn.Server, sock: socket.socket, host: str) -> None:
        self.service = service
        self._server = server
        self._sock = sock
        self.host = host
        self.port: int = sock.getsockname()[1]
        self.url = _url(host, self.port)
        self._thread = threading.Thread(target=self._run, name="callbox-mcp-http", daemon=True)
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by start()/stop()
            self._error = exc

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise CallboxError(f"the MCP HTTP server did not start: {self._error or 'timed out'}")
            time.sleep(0.02)

    def stop(self, timeout: float = 60.0) -> None:
        """Stop serving: end every session (destroying its sandbox), close the audit store."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()
        self.service.close()

    def __enter__(self) -> McpHttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_mcp_http(
    addr: str = f"{DEFAULT_HOST}:0", *, policy_path: Path | None = None, audit_path: Path | None = None,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    insecure: bool = False, service: McpToolService | None = None,
) -> McpHttpServer:
    """Start streamable HTTP MCP on ``addr`` in a background thread; returns the running
    server (``.url``, ``.port``, ``.stop()``). Port 0 picks a free port."""
    host, port = parse_addr(addr)
    _check_host(host, insecure)
    sock = _bind(host, port)
    try:
        service = service or McpToolService.open(policy_path=policy_path, audit_path=audit_path)
    except BaseException:
        sock.close()
        raise
    app = mcp_http_app(service, host=host, idle_timeout_s=idle_timeout_s, max_sessions=max_sessions)
    handle = McpHttpServer(service, _uvicorn_server(app), sock, host)
    handle.start()
    log.info("MCP server listening on %s", handle.url)
    return handle


def run_mcp_http(
    addr: str, *, policy_path: Path | None = None, audit_path: Path | None = None,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    insecure: bool = False, on_ready: Callable[[str], None] | None = None,
) -> None:
    """``callbox serve --mcp-http ADDR``: serve streamable HTTP MCP in the foreground until
    SIGINT/SIGTERM, then end every session (destroying its sandbox). ``on_ready(url)`` is
    called once listening (default: print the URL to stderr)."""
    _log_to_stderr()
    host, port = parse_addr(addr)
    _check_host(host, insecure)
    sock = _bind(host, port)
    service = McpToolService.open(policy_path=policy_path, audit_path=audit_path)
    try:
        app = mcp_http_app(service, host=host, idle_timeout_s=idle_timeout_s, max_sessions=max_sessions)
        server = _uvicorn_server(app)
        # The socket already listens: a client connecting now waits in the backlog until the loop runs.
        (on_ready or partial(_announce, file=sys.stderr))(_url(host, sock.getsockname()[1]))
        with _signals_end_quietly():
            server.run(sockets=[sock])
    finally:
        sock.close()
        with _terminate_ignored():
            service.close()


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal under the
    handler it found; a no-op handler there makes ``run_mcp_http`` return normally instead."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _ignore_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _ignore_signal(_signum: int, _frame: object) -> None:
    return None


def _announce(url: str, *, file: Any) -> None:
    print(f"callbox: MCP server (streamable HTTP) listening on {url}", file=file, flush=True)
