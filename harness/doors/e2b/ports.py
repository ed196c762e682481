"""Sandbox ports through the E2B door: what ``get_host(port)`` leads to.

A request names a sandbox port either by headers, ``E2b-Sandbox-Id`` and ``E2b-Sandbox-Port``
(how the SDK talks to envd when ``E2B_SANDBOX_URL`` is set), or by its host name,
``PORT-SANDBOXID.ANYTHING`` (what ``sandbox.get_host(port)`` returns; the part after the
first dot is not read, so the name works under any domain that leads to this server).
:func:`port_target` reads both. A port other than envd's (49983) is this module's: the
request goes to that port on the sandbox's own loopback through the agent's Ports tunnel
(:mod:`harness.engine.ports`), so it needs no network in the sandbox.

* **Who may.** A port request must carry one of the sandbox's credentials, all of which only
  its owner is given: the traffic access token (header ``e2b-traffic-access-token``, as E2B
  asks of a sandbox without public traffic; ``sandbox.traffic_access_token`` in the SDK),
  the envd access token (``X-Access-Token``), or the owner's API key (``X-API-KEY``).
  Without one it is 403; a sandbox that does not run (or is anyone's but the key's owner's)
  is 502 "not found", as for envd. These headers are removed before the request reaches
  the sandbox: no credential enters it. A sandbox with public ports (the policy's
  ``sandbox.public_ports = true``, and its creator did not set ``allow_public_traffic`` to
  false) needs none of them: whoever names it and its port is served, as in E2B.
* **The policy.** Each request is the sandbox's ``port_forward`` action (details ``port``
  and ``request``, the method and path without its query), authorized and recorded in its
  run like every action. It is ``deny`` unless the policy allows it (``[actions.port_forward]``,
  rules on ``ports``), unlike E2B, whose sandboxes serve their ports to anyone by default.
* **Filters.** A port with a filter (:func:`register_port_filter`, or ``filters`` given to
  :class:`PortProxy`) is authorized by its filter instead of ``port_forward``: the filter
  is called with the whole request (:class:`PortRequest`, its body read first, at most
  :data:`FILTERED_BODY_LIMIT` bytes) and returns a context manager, entered before the
  request is forwarded (raise :class:`~harness.doors.e2b.errors.E2bError` there to refuse
  it, e.g. ``E2bSandboxes.acting``'s refusal) and exited when the response has ended (with
  the exception if it failed), e.g. to authorize and audit a service's requests as its
  own action.
* **HTTP.** The request goes to the sandbox with ``Connection: close``; its response is
  parsed (``h11``) and streamed back as it arrives, so a chunked or long-polling response
  streams. A port nothing listens on is 502 "port is not open"; a response cut off by the
  sandbox cuts the client's response off too (never a short, complete-looking one).
* **WebSocket.** An upgrade is the door's ASGI ``websocket`` scope: the door does the
  handshake with the program in the sandbox first (through the tunnel, passing the path,
  subprotocols and the client's other headers), accepts the client's with the subprotocol
  the program chose, then relays messages both ways until either side closes. A refused
  upgrade is answered with the same HTTP error an HTTP request would get.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import h11

from harness.core.errors import AgentCallError, ErrorCode
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.bridge import STOPPED, Done, Exchange, OutputChannel, Receive, Scope, Send
from harness.doors.e2b.errors import E2bError, from_callbox
from harness.doors.e2b.port_targets import (
    ENVD_PORT,
    HOP_BY_HOP_HEADERS,
    TRAFFIC_TOKEN_HEADER,
    PortTarget,
    forwarded_headers,
    port_target,
    target_path,
)
from harness.doors.e2b.responses import CutOff, http_refusal
from harness.doors.grpc.tokens import TokenSet
from harness.engine.ports import Tunnel

__all__ = ["ENVD_PORT", "FILTERED_BODY_LIMIT", "PORT_FILTERS", "TRAFFIC_TOKEN_HEADER", "PortFilter", "PortProxy",
           "PortRequest", "PortTarget", "port_target", "register_port_filter"]

log = logging.getLogger("callbox.e2b")

FILTERED_BODY_LIMIT = 16 << 20
"""The largest request body a port filter is given (a larger one is 413)."""


@dataclass(frozen=True)
class PortRequest:
    """One request to a filtered port, as its filter sees it."""

    sandbox: E2bSandbox
    sandboxes: E2bSandboxes
    """For the filter's own authorization (``sandboxes.acting(sandbox, ...)``)."""
    port: int
    method: str
    target: str
    """The path with its query, as sent to the sandbox."""
    headers: Mapping[str, str]
    """The request's headers (lower-case names), credentials removed."""
    body: bytes


PortFilter = Callable[[PortRequest], AbstractContextManager[Any]]
"""Authorizes (and may audit) each request to one port; see the module docstring."""

PORT_FILTERS: dict[int, PortFilter] = {}
"""The filters every :class:`PortProxy` made without its own uses, by port."""


def register_port_filter(port: int, port_filter: PortFilter) -> None:
    """Make ``port_filter`` authorize every request to ``port`` of every sandbox (instead of
    the policy's ``port_forward``) in the servers started from now on."""
    if not 1 <= port <= 65535 or port == ENVD_PORT:
        raise ValueError(f"port {port} cannot have a filter: use a TCP port other than envd's {ENVD_PORT}")
    PORT_FILTERS[port] = port_filter


def _not_open(target: PortTarget, error: AgentCallError) -> E2bError:
    if error.reason == "CONNECTION_REFUSED":
        return E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"sandbox {target.sandbox_id!r} is running but port "
                        f"{target.port} is not open: nothing listens on it in the sandbox", status=502)
    return from_callbox(error)


class PortProxy:
    """Serves the requests that name a sandbox port other than envd's; see the module docstring."""

    def __init__(self, sandboxes: E2bSandboxes, tokens: TokenSet, filters: Mapping[int, PortFilter] | None = None,
                 ) -> None:
        self.sandboxes = sandboxes
        self.tokens = tokens
        self.filters: dict[int, PortFilter] = dict(PORT_FILTERS if filters is None else filters)

    # ---- who may ----------------------------------------------------------------------------------

    def sandbox_for(self, target: PortTarget, headers: Mapping[str, str]) -> E2bSandbox:
        """The sandbox ``target`` names, if ``headers`` carry one of its credentials."""
        sandbox = self.sandboxes.find(target.sandbox_id) or self.sandboxes.find_folded(target.sandbox_id)
        if sandbox is None:
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"sandbox {target.sandbox_id!r} was not found: it was "
                           "killed, or its timeout passed", status=502)
        if sandbox.public_ports:
            return sandbox
        traffic = headers.get(TRAFFIC_TOKEN_HEADER)
        access = headers.get("x-access-token")
        key = headers.get("x-api-key")
        if ((traffic and sandbox.accepts_traffic(traffic))
                or (access and sandbox.accepts(access))
                or (key and self.tokens.lookup(key) == sandbox.client)):
            return sandbox
        raise E2bError(ErrorCode.PERMISSION_DENIED, f"port {target.port} of sandbox {target.sandbox_id} is served "
                       f"to its owner only: send its traffic access token in the {TRAFFIC_TOKEN_HEADER} header "
                       "(sandbox.traffic_access_token in the SDK); an operator can make ports public with the "
                       "policy's sandbox.public_ports = true", status=403)

    def _guard(self, sandbox: E2bSandbox, target: PortTarget, method: str, request_target: str,
               headers: Mapping[str, str], body: bytes) -> AbstractContextManager[Any]:
        port_filter = self.filters.get(target.port)
        if port_filter is not None:
            return port_filter(PortRequest(sandbox=sandbox, sandboxes=self.sandboxes, port=target.port, method=method,
                                           target=request_target, headers=dict(forwarded_headers(headers)), body=body))
        path = request_target.split("?", 1)[0]
        return self.sandboxes.acting(sandbox, "port_forward", {"port": target.port, "request": f"{method} {path}"})

    def _open(self, sandbox: E2bSandbox, target: PortTarget) -> Tunnel:
        self.sandboxes.awake(sandbox)  # paused: resumed if it auto-resumes, else refused as envd requests are
        try:
            return sandbox.running().agent.ports.connect(target.port)
        except AgentCallError as error:
            raise _not_open(target, error) from None

    # ---- HTTP -------------------------------------------------------------------------------------

    async def serve_http(self, exchange: Exchange, target: PortTarget) -> None:
        """Forward one HTTP request to ``target`` and stream its response back."""

        headers = exchange.headers
        where = f"{exchange.method} port {target.port}"
        try:
            sandbox = self.sandbox_for(target, headers)
            body = await exchange.read_all(FILTERED_BODY_LIMIT) if target.port in self.filters else None
        except Exception as error:  # every failure is an answer, never a crash
            await http_refusal(exchange, _as_error(error, where))
            return
        request_target = target_path(exchange.path, exchange.raw_path, exchange.query_string)
        head = [*forwarded_headers(headers), ("connection", "close")]
        chunked = body is None and "content-length" not in headers and exchange.method not in ("GET", "HEAD")
        if body is not None:
            head = [(k, v) for k, v in head if k != "content-length"] + [("content-length", str(len(body)))]
        elif chunked:
            head.append(("transfer-encoding", "chunked"))
        elif "content-length" in headers:
            head.append(("content-length", headers["content-length"]))
        request_head = (f"{exchange.method} {request_target} HTTP/1.1\r\n"
                        + "".join(f"{k}: {v}\r\n" for k, v in head) + "\r\n").encode("latin-1")
        channel = None if body is not None else exchange.stream_body()
        if body is not None:  # read whole for a filter: still notice the client leaving (a long-polled response)
            exchange.watch()
        out = OutputChannel(exchange.loop)
        exchange.on_end(out.stop)

        def forward() -> None:
            error: BaseException | None = None
            try:
                with self._guard(sandbox, target, exchange.method, request_target, headers, body or b"") as ticket:
                    tunnel = self._open(sandbox, target)
                    exchange.on_end(tunnel.close)
                    try:
                        sent = _Sender(tunnel, request_head, body, channel, chunked)
                        exchange.run(sent.run)
                        received = _relay_response(tunnel, exchange.method, out)
                    finally:
                        tunnel.close()
                    if ticket is not None and hasattr(ticket, "outcome"):
                        ticket.outcome.update(status=received[0], bytes_from_sandbox=received[1])
            except Exception as exc:
                error = exc
            out.done(error)

        exchange.run(forward)
        await _respond(exchange, out, where)

    # ---- WebSocket --------------------------------------------------------------------------------

    async def serve_websocket(self, scope: Scope, receive: Receive, send: Send, pool: Any) -> None:
        """Relay one WebSocket connection to the port its request names."""
        from harness.doors.e2b.ports_ws import relay_websocket

        await relay_websocket(self, scope, receive, send, pool)


class _Sender:
    """The request's head and body into the tunnel (on a worker thread of its own, so the
    response is read while a long body is still being sent)."""

    def __init__(self, tunnel: Tunnel, head: bytes, body: bytes | None, channel: Any, chunked: bool) -> None:
        self.tunnel = tunnel
        self.head = head
        self.body = body
        self.channel = channel
        self.chunked = chunked

    def _pieces(self) -> Iterator[bytes]:
        yield self.head
        if self.body is not None:
            yield self.body
            return
        for chunk in self.channel.chunks():
            yield (f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n") if self.chunked else chunk
        if self.chunked:
            yield b"0\r\n\r\n"

    def run(self) -> None:
        with contextlib.suppress(BrokenPipeError, E2bError):
            for piece in self._pieces():
                if piece:
                    self.tunnel.send(piece)


_Head = tuple[str, int, list[tuple[str, str]]]


def _relay_response(tunnel: Tunnel, method: str, out: OutputChannel) -> tuple[int, int]:
    """Parse the program's response from the tunnel and hand its head and body to ``out``;
    its status and body size. A response the program cuts off raises."""
    parser = h11.Connection(h11.CLIENT)
    parser.send(h11.Request(method=method, target="/", headers=[("host", "sandbox")]))
    parser.send(h11.EndOfMessage())
    status, size = 0, 0
    data = tunnel.recv()
    while True:
        event = parser.next_event()
        if event is h11.NEED_DATA:
            chunk = next(data, b"")
            parser.receive_data(chunk)
            continue
        if isinstance(event, h11.InformationalResponse):
            continue
        if isinstance(event, h11.Response):
            status = event.status_code
            response_headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers
                                if k.decode("latin-1").lower() not in HOP_BY_HOP_HEADERS]
            if not out.put(("head", status, response_headers)):
                return status, size
        elif isinstance(event, h11.Data):
            size += len(event.data)
            if not out.put(bytes(event.data)):
                return status, size
        elif isinstance(event, h11.EndOfMessage):
            return status, size
        else:
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, "the program in the sandbox closed the connection before "
                           "its response was complete", status=502)


async def _respond(exchange: Exchange, out: OutputChannel, where: str) -> None:

    while True:
        item = await out.get()
        if item is STOPPED:
            if exchange.started:
                raise CutOff(f"{where}: the response was cut off ({exchange.ended})")
            return
        if isinstance(item, Done):
            if item.error is None:
                if exchange.started:
                    await exchange.finish()
                else:
                    await http_refusal(exchange, E2bError(ErrorCode.SANDBOX_UNAVAILABLE, "the program in the "
                                                           "sandbox sent no response", status=502))
                return
            error = _as_error(item.error, where)
            if not exchange.started:
                await http_refusal(exchange, error)
                return
            log.warning("%s: the response failed after its head was sent: %s", where, error.message)
            raise CutOff(f"{where}: {error.message}")
        if isinstance(item, tuple):
            _, status, headers = item
            await exchange.start(status, headers)
        else:
            assert isinstance(item, bytes)
            await exchange.write(item)


def _as_error(error: BaseException, where: str) -> E2bError:
    from harness.doors.e2b.connect import as_error

    if isinstance(error, E2bError):
        return error
    if isinstance(error, h11.RemoteProtocolError):
        return E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"the program in the sandbox answered with something that "
                        f"is not HTTP/1.1: {error}", status=502)
    return as_error(error, where)


async def run_blocking(pool: Any, fn: Callable[[], Any]) -> Any:
    """``fn()`` on a worker thread of ``pool``."""
    return await asyncio.get_running_loop().run_in_executor(pool, fn)
