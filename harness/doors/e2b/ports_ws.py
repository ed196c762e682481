"""WebSocket connections to a sandbox port through the E2B door (see :mod:`.ports`).

The door's ASGI server speaks WebSocket to the client; this module speaks it to the program
in the sandbox, as a client (``websockets``' sans-I/O protocol) over one Ports tunnel. The
handshake with the program comes first: only once it has accepted is the client's
connection accepted, with the subprotocol the program chose. Then messages are relayed both
ways (each one whole: fragments from the program are joined), pings are answered by each
side's own protocol, and a close on either side closes the other with its code.

The protocol object lives on the event loop; only the tunnel's blocking reads and writes
run on worker threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, Any

from websockets.client import ClientProtocol
from websockets.frames import Close, Frame, Opcode
from websockets.http11 import Response
from websockets.typing import Subprotocol
from websockets.uri import parse_uri

from harness.core.errors import ErrorCode
from harness.doors.e2b.bridge import STOPPED, Done, OutputChannel, Receive, Scope, Send
from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.port_targets import WEBSOCKET_HEADERS, forwarded_headers, port_target, target_path

if TYPE_CHECKING:
    from harness.doors.e2b.ports import PortProxy

__all__ = ["relay_websocket"]

log = logging.getLogger("callbox.e2b")

MAX_MESSAGE_BYTES = 16 << 20
"""The largest message relayed from the program (a larger one closes the connection, 1009)."""


async def _refuse(send: Send, error: E2bError) -> None:
    """Answer the upgrade with the HTTP error (the ASGI denial response)."""
    body = json.dumps(error.rest_body(), separators=(",", ":")).encode()
    await send({"type": "websocket.http.response.start", "status": error.status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "websocket.http.response.body", "body": body, "more_body": False})


def _headers(scope: Scope) -> dict[str, str]:
    headers: dict[str, str] = {}
    for raw_name, raw_value in scope.get("headers", ()):
        name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    return headers


async def relay_websocket(proxy: PortProxy, scope: Scope, receive: Receive, send: Send, pool: Any) -> None:
    """Serve one ASGI ``websocket`` scope; see the module docstring."""
    loop = asyncio.get_running_loop()
    headers = _headers(scope)
    message = await receive()
    if message["type"] != "websocket.connect":
        return
    try:
        target = port_target(headers)
        if target is None:
            raise E2bError(ErrorCode.NOT_FOUND, "a WebSocket here goes to a sandbox port: name it with the host "
                           "PORT-SANDBOXID.DOMAIN (sandbox.get_host(port)) or the E2b-Sandbox-Id and "
                           "E2b-Sandbox-Port headers")
        sandbox = proxy.sandbox_for(target, headers)
    except E2bError as error:
        await _refuse(send, error)
        return
    path = target_path(scope.get("path", "/"), scope.get("raw_path"), scope.get("query_string", b""))
    subprotocols = [Subprotocol(p) for p in scope.get("subprotocols", [])]
    protocol = ClientProtocol(parse_uri(f"ws://sandbox{path}"), subprotocols=subprotocols or None,
                              max_size=MAX_MESSAGE_BYTES)
    request = protocol.connect()
    request.headers["Host"] = headers.get("host", "localhost")
    for name, value in forwarded_headers(headers, drop=WEBSOCKET_HEADERS):
        request.headers[name] = value
    protocol.send_request(request)
    guard = proxy._guard(sandbox, target, "GET", path, headers, b"")
    out = OutputChannel(loop)
    try:
        ticket = await loop.run_in_executor(pool, guard.__enter__)
    except E2bError as error:
        await _refuse(send, error)
        return
    failure: BaseException | None = None
    tunnel = None
    relay: _Relay | None = None
    try:
        tunnel = await loop.run_in_executor(pool, proxy._open, sandbox, target)
        relay = _Relay(protocol, tunnel, out, send, receive, pool)
        await relay.run(ticket)
    except E2bError as error:
        failure = error
        if relay is None or not relay.accepted:
            await _refuse(send, error)
    except Exception as exc:  # the door must not fall over on one connection
        failure = exc
        log.warning("WebSocket to port %d of sandbox %s failed: %s", target.port, target.sandbox_id, exc)
    finally:
        if tunnel is not None:
            tunnel.close()
        out.stop()
        exc_info = (type(failure), failure, failure.__traceback__) if failure is not None else (None, None, None)
        await loop.run_in_executor(pool, lambda: guard.__exit__(*exc_info))


class _Relay:
    def __init__(self, protocol: ClientProtocol, tunnel: Any, out: OutputChannel, send: Send, receive: Receive,
                 pool: Any) -> None:
        self.protocol = protocol
        self.tunnel = tunnel
        self.out = out
        self.send = send
        self.receive = receive
        self.pool = pool
        self.loop = asyncio.get_running_loop()
        self.accepted = False
        self.closed = False
        self._parts: list[bytes] = []
        self._text = False

    async def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            await self.loop.run_in_executor(self.pool, self.tunnel.send, data)

    def _read(self) -> None:
        error: BaseException | None = None
        try:
            for data in self.tunnel.recv():
                if not self.out.put(data):
                    return
        except Exception as exc:
            error = exc
        self.out.done(error)

    async def run(self, ticket: Any) -> None:
        await self._flush()
        self.loop.run_in_executor(self.pool, self._read)
        response = await self._handshake()
        subprotocol = response.headers.get("Sec-WebSocket-Protocol")
        await self.send({"type": "websocket.accept", "subprotocol": subprotocol})
        self.accepted = True
        from_client = asyncio.ensure_future(self._from_client())
        try:
            await self._from_program()
        finally:
            from_client.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await from_client
        if hasattr(ticket, "outcome"):
            ticket.outcome.update(websocket=True)

    async def _handshake(self) -> Response:
        while True:
            item = await self.out.get()
            if item is STOPPED or isinstance(item, Done):
                raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, "the program in the sandbox closed the connection "
                               "during the WebSocket handshake", status=502)
            assert isinstance(item, bytes)
            self.protocol.receive_data(item)
            for event in self.protocol.events_received():
                if isinstance(event, Response):
                    if self.protocol.handshake_exc is not None:
                        raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"the program in the sandbox refused the "
                                       f"WebSocket handshake: {self.protocol.handshake_exc}", status=502)
                    return event

    async def _from_program(self) -> None:
        while True:
            item = await self.out.get()
            if item is STOPPED:
                return
            if isinstance(item, Done):
                if not self.closed:
                    self.closed = True
                    await self._close_client(1006 if item.error is not None else 1000)
                return
            assert isinstance(item, bytes)
            self.protocol.receive_data(item)
            for event in self.protocol.events_received():
                if isinstance(event, Frame):
                    await self._frame(event)
            await self._flush()  # pongs, the answer to a close
            if self.closed:
                return

    async def _frame(self, frame: Frame) -> None:
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY):
            self._parts, self._text = [bytes(frame.data)], frame.opcode is Opcode.TEXT
        elif frame.opcode is Opcode.CONT:
            self._parts.append(bytes(frame.data))
        elif frame.opcode is Opcode.CLOSE:
            close = Close.parse(frame.data) if frame.data else Close(1000, "")
            self.closed = True
            await self._close_client(close.code, close.reason)
            return
        else:
            return  # ping and pong: the protocols answer them
        if frame.fin:
            data = b"".join(self._parts)
            self._parts = []
            if self._text:
                await self.send({"type": "websocket.send", "text": data.decode("utf-8", "replace")})
            else:
                await self.send({"type": "websocket.send", "bytes": data})

    async def _close_client(self, code: int, reason: str = "") -> None:
        with contextlib.suppress(Exception):  # the client may be gone already
            await self.send({"type": "websocket.close", "code": 1000 if code in (1005, 1006) else code,
                             "reason": reason})

    async def _from_client(self) -> None:
        while True:
            message = await self.receive()
            kind = message["type"]
            if kind == "websocket.receive":
                if message.get("text") is not None:
                    self.protocol.send_text(message["text"].encode())
                else:
                    self.protocol.send_binary(message.get("bytes") or b"")
                await self._flush()
            elif kind == "websocket.disconnect":
                self.closed = True
                code = int(message.get("code") or 1000)
                with contextlib.suppress(Exception):
                    self.protocol.send_close(code if code not in (1005, 1006) else 1000)
                    await self._flush()
                self.out.stop()
                return

