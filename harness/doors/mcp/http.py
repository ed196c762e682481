"""The MCP door over streamable HTTP (``callbox serve --mcp-http ADDR``): one MCP session,
and sandbox, per ``Mcp-Session-Id`` on ``/mcp``; the ASGI app, binding, and the server
thread or foreground process.

Auth: given the server's tokens (the token file the gRPC and E2B doors use), every request
must carry ``Authorization: Bearer TOKEN``, on loopback too, as every other door of such a
server asks; a missing or unknown token is HTTP 401 with ``WWW-Authenticate: Bearer`` and
a JSON body saying what is wrong. The token's client name owns the sessions it opens (a
request for another client's session is refused), is served with that client's policy,
and is counted in that client's quotas. Without tokens (``callbox serve --mcp-http`` with no
token file: a developer's machine) the door stays open as before, every session the client
``local``, and only on loopback unless ``insecure``: there it is reachable only from this
machine, and DNS-rebinding protection keeps browsers' pages out. Bearer tokens over plain
HTTP off loopback are still refused without ``insecure`` (the door has no TLS).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import uvicorn
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Route

from harness.core.errors import CallboxError, UsageError
from harness.doors.grpc.tokens import TokenSet
from harness.doors.mcp.abandoned import DEFAULT_ABANDONED_GRACE_S, AbandonedSessions
from harness.doors.mcp.process import log_to_stderr, terminate_ignored
from harness.doors.mcp.protocol import CLIENT_SCOPE_KEY, build_mcp_server
from harness.doors.mcp.service import McpToolService
from harness.doors.profiles import PolicySource
from harness.doors.quota_ledger import QuotaKeeper

__all__ = [
    "DEFAULT_HOST",
    "DEFAULT_IDLE_TIMEOUT_S",
    "DEFAULT_MAX_SESSIONS",
    "MCP_PATH",
    "McpHttpServer",
    "mcp_http_app",
    "parse_addr",
    "run_mcp_http",
    "serve_mcp_http",
]

log = logging.getLogger("callbox.mcp")

MCP_PATH = "/mcp"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_IDLE_TIMEOUT_S = 30 * 60.0
"""An HTTP session with no request in flight and no open GET stream for this long ends."""
DEFAULT_MAX_SESSIONS = 64
GRACEFUL_SHUTDOWN_S = 5.0
"""On shutdown, how long open HTTP streams get before they are closed and sessions end."""

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
    max_sessions: int | None = DEFAULT_MAX_SESSIONS, tokens: TokenSet | None = None,
    abandoned_grace_s: float | None = DEFAULT_ABANDONED_GRACE_S,
) -> Starlette:
    """The ASGI app: streamable HTTP on ``/mcp``, one MCP session (and sandbox) per
    ``Mcp-Session-Id``. On a loopback host, requests whose Host/Origin is not loopback get
    HTTP 421/403 (DNS-rebinding protection). A session whose client closed its GET stream
    and sent nothing for ``abandoned_grace_s`` ends (see :mod:`harness.doors.mcp.abandoned`;
    None: only the idle timeout ends it). Its shutdown ends every session."""
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

    endpoint: Any = StreamableHTTPASGIApp(manager)
    abandoned = None if abandoned_grace_s is None else AbandonedSessions(endpoint, abandoned_grace_s)

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        try:
            async with manager.run(), anyio.create_task_group() as timers:
                if abandoned is not None:
                    await timers.start(abandoned.run)
                yield
                timers.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(service.close_sessions)

    if abandoned is not None:
        endpoint = abandoned
    if tokens is not None:
        endpoint = _BearerAuth(endpoint, tokens)
    return Starlette(routes=[Route(MCP_PATH, endpoint=endpoint)], lifespan=lifespan)


class _BearerAuth:
    """ASGI: lets through only requests with a bearer token of ``tokens``, the token's client
    name in the scope (:data:`~harness.doors.mcp.protocol.CLIENT_SCOPE_KEY`); 401 otherwise."""

    def __init__(self, app: Any, tokens: TokenSet) -> None:
        self.app = app
        self.tokens = tokens

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
        scheme, _, token = headers.get("authorization", "").partition(" ")
        client = self.tokens.lookup(token.strip()) if scheme.lower() == "bearer" and token.strip() else None
        if client is not None:
            scope[CLIENT_SCOPE_KEY] = client
            await self.app(scope, receive, send)
            return
        message = ("this server's MCP door needs 'Authorization: Bearer TOKEN' with a token of its token file"
                   if "authorization" not in headers else "the bearer token is not valid for this server")
        body = json.dumps({"error": "unauthorized", "message": message}).encode()
        await send({"type": "http.response.start", "status": 401, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"www-authenticate", b'Bearer realm="callbox"')]})
        await send({"type": "http.response.body", "body": body})


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # asyncio sets TCP_NODELAY only on sockets it made itself with IPPROTO_TCP; without it a
    # response waits on Nagle for the client's delayed ACK (~40 ms). Accepted sockets inherit it.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
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


def _check_host(host: str, insecure: bool, tokens: TokenSet | None = None) -> None:
    if not _is_loopback(host) and not insecure:
        why = ("bearer tokens would cross the network in clear text (this door has no TLS)" if tokens is not None
               else "without a token file the MCP door has no authentication, so anyone who can reach it can run "
                    "commands in sandboxes")
        raise UsageError(
            f"refusing to serve MCP over HTTP on {host}: {why}; listen on 127.0.0.1 (the default) and tunnel, or "
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
    insecure: bool = False, service: McpToolService | None = None, tokens: TokenSet | None = None,
    quotas: QuotaKeeper | None = None, policies: PolicySource | None = None,
    abandoned_grace_s: float | None = DEFAULT_ABANDONED_GRACE_S,
) -> McpHttpServer:
    """Start streamable HTTP MCP on ``addr`` in a background thread; returns the running
    server (``.url``, ``.port``, ``.stop()``). Port 0 picks a free port. ``tokens``: require
    a bearer token of them (see the module docstring); ``quotas`` and ``policies``: as for
    the gRPC door (for a service made here)."""
    host, port = parse_addr(addr)
    _check_host(host, insecure, tokens)
    sock = _bind(host, port)
    try:
        service = service or McpToolService.open(policy_path=policy_path, audit_path=audit_path, quotas=quotas,
                                                 policies=policies)
    except BaseException:
        sock.close()
        raise
    app = mcp_http_app(service, host=host, idle_timeout_s=idle_timeout_s, max_sessions=max_sessions, tokens=tokens,
                       abandoned_grace_s=abandoned_grace_s)
    handle = McpHttpServer(service, _uvicorn_server(app), sock, host)
    handle.start()
    log.debug("MCP server listening on %s", handle.url)
    return handle


def run_mcp_http(
    addr: str, *, policy_path: Path | None = None, audit_path: Path | None = None,
    idle_timeout_s: float | None = DEFAULT_IDLE_TIMEOUT_S, max_sessions: int | None = DEFAULT_MAX_SESSIONS,
    insecure: bool = False, on_ready: Callable[[str], None] | None = None,
) -> None:
    """``callbox serve --mcp-http ADDR``: serve streamable HTTP MCP in the foreground until
    SIGINT/SIGTERM, then end every session (destroying its sandbox). ``on_ready(url)`` is
    called once listening (default: print the URL to stderr)."""
    log_to_stderr()
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
        with terminate_ignored():
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
