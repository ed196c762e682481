"""The Connect protocol, server side, for the E2B door's envd services.

The e2b SDK calls envd (the daemon in an E2B sandbox) over the Connect protocol, version 1,
with its JSON codec and compression off (its ``connectrpc`` client). This module serves the
:class:`~harness.doors.e2b.rpc.Service` methods that way. It is our own small implementation,
not connectrpc's server classes: those are built on the protobuf-py runtime (not the
``google.protobuf`` messages callbox generates), and envd's generated server classes ship
only inside the e2b SDK, which is a test dependency here.

What a request may be (anything else is refused with a Connect error naming the fix):

* **Unary**: ``POST /SERVICE/METHOD``, ``content-type: application/json`` (or
  ``application/proto``), the body one message. The answer is 200 with the response message
  in the same codec, or ``{"code": "...", "message": "..."}`` (``application/json``) with the
  HTTP status :data:`~harness.doors.e2b.errors.CONNECT_STATUS` gives the code.
* **Server stream, client stream**: ``content-type: application/connect+json`` (or
  ``connect+proto``); the bodies are envelopes, each a flags byte, a 4-byte big-endian length
  and a message. A response is 200 with the messages, then an end-of-stream envelope (flags
  ``0x02``) holding ``{}`` or ``{"error": {"code", "message"}}``: once a stream call reaches
  its handler, every error is reported there.
* ``Connect-Protocol-Version``: absent or ``1``. ``Connect-Timeout-Ms``: the deadline; when it
  passes the call's scope is cancelled and the answer is ``deadline_exceeded``.
  ``Keepalive-Ping-Interval`` (seconds, what the SDK sends on long streams): a server stream
  with a keepalive message sends one whenever it has been idle that long.
* Compression: refused (``unimplemented``); the SDK never compresses envd calls.

Not implemented: unary GET (the envd methods have side effects), bidirectional streams
(envd has none the SDK calls), error details and response metadata (the SDK reads neither).
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import struct
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError, Message

from harness.core.errors import CallboxError, ErrorCode
from harness.doors.e2b.bridge import IDLE, STOPPED, Done, Exchange, OutputChannel
from harness.doors.e2b.errors import E2bError, from_callbox
from harness.doors.e2b.rpc import EnvdCall, Method
from harness.engine.cancel import current_scope
from harness.wire import MAX_MESSAGE_BYTES

__all__ = [
    "JSON",
    "MAX_MESSAGE_BYTES",
    "PROTO",
    "CallHead",
    "Codec",
    "EnvelopeReader",
    "as_error",
    "connect_error_response",
    "end_stream",
    "envelope",
    "read_head",
    "serve_call",
]

log = logging.getLogger("callbox.e2b")

FLAG_COMPRESSED = 0x01
FLAG_END_STREAM = 0x02
_HEAD = struct.Struct(">BI")
MAX_TIMEOUT_DIGITS = 10
MIN_KEEPALIVE_S = 0.01
WRITE_BATCH_BYTES = 64 << 10
"""Stream messages ready at once are written together, up to about this much."""


# ---- codecs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Codec:
    """How messages are written: ``json`` (proto3 JSON) or ``proto`` (binary)."""

    name: str

    @property
    def unary_type(self) -> str:
        return f"application/{self.name}"

    @property
    def stream_type(self) -> str:
        return f"application/connect+{self.name}"

    def decode(self, data: bytes, cls: type[Message]) -> Message:
        message = cls()
        try:
            if self.name == "json":
                json_format.Parse(data.decode("utf-8") if data.strip() else "{}", message,
                                  ignore_unknown_fields=True)
            else:
                message.ParseFromString(data)
        except (json_format.ParseError, DecodeError, UnicodeDecodeError, RecursionError) as error:
            raise E2bError(ErrorCode.INVALID_REQUEST,
                           f"the request is not a valid {cls.DESCRIPTOR.full_name} in {self.name}: {error}") from None
        return message

    def encode(self, message: Message) -> bytes:
        if self.name == "json":
            return json.dumps(json_format.MessageToDict(message), separators=(",", ":")).encode()
        return message.SerializeToString()


JSON = Codec("json")
PROTO = Codec("proto")
_CODECS = {"json": JSON, "proto": PROTO}


# ---- envelopes ---------------------------------------------------------------------------------


def envelope(payload: bytes, flags: int = 0) -> bytes:
    """One enveloped message: flags, big-endian length, payload."""
    return _HEAD.pack(flags, len(payload)) + payload


def end_stream(error: E2bError | None = None) -> bytes:
    """The end-of-stream envelope: ``{}``, or ``{"error": {...}}``."""
    body = {"error": error.connect_body()} if error is not None else {}
    return envelope(json.dumps(body, separators=(",", ":")).encode(), FLAG_END_STREAM)


class EnvelopeReader:
    """Splits a stream of bytes into enveloped messages (at most ``limit`` bytes each)."""

    def __init__(self, limit: int = MAX_MESSAGE_BYTES) -> None:
        self._buffer = bytearray()
        self._limit = limit

    def feed(self, data: bytes) -> Iterator[bytes]:
        """The complete message payloads ``data`` finishes (a request's end-of-stream
        envelope, which clients need not send, ends nothing and is skipped)."""
        self._buffer += data
        while len(self._buffer) >= _HEAD.size:
            flags, length = _HEAD.unpack_from(self._buffer)
            if length > self._limit:
                raise E2bError(ErrorCode.TOO_LARGE,
                               f"a request message of {length} bytes is over the limit of {self._limit} bytes")
            if len(self._buffer) < _HEAD.size + length:
                return
            payload = bytes(self._buffer[_HEAD.size:_HEAD.size + length])
            del self._buffer[:_HEAD.size + length]
            if flags & FLAG_COMPRESSED:
                raise E2bError(ErrorCode.NOT_SUPPORTED,
                    "a compressed message arrived; this server does not compress: send "
                                                "messages uncompressed (connect-content-encoding: identity)")
            if flags & FLAG_END_STREAM:
                continue
            yield payload

    def close(self) -> None:
        """The stream ended: refuse a message cut short."""
        if self._buffer:
            raise E2bError(ErrorCode.INVALID_REQUEST,
                           f"the request ended inside an enveloped message ({len(self._buffer)} bytes left over)")


# ---- the request's head ------------------------------------------------------------------------


@dataclass(frozen=True)
class CallHead:
    """What a Connect request's method and headers say about the call."""

    codec: Codec
    deadline: float | None
    """``time.monotonic()`` of ``Connect-Timeout-Ms``, or None."""
    keepalive_s: float | None
    """``Keepalive-Ping-Interval``, or None."""


def read_head(method: Method, http_method: str, headers: Mapping[str, str], now: float | None = None) -> CallHead:
    """Check a Connect request's method and headers for ``method``; E2bError naming the fix."""
    stream = method.kind != "unary"
    want = "application/connect+json" if stream else "application/json"
    if http_method != "POST":
        raise E2bError(ErrorCode.NOT_SUPPORTED, f"{http_method} is not how a Connect call is made: POST it "
                                        f"with content-type {want}", status=405)
    content_type = headers.get("content-type", "").partition(";")[0].strip().lower()
    prefix = "application/connect+" if stream else "application/"
    codec = _CODECS.get(content_type[len(prefix):]) if content_type.startswith(prefix) else None
    if codec is None:
        kind = "a streaming" if stream else "a unary"
        raise E2bError(ErrorCode.INVALID_REQUEST, f"{method.name} is {kind} method: send content-type {want} "
                                           f"(or {prefix}proto), not {content_type or 'none'!r}", status=415)
    version = headers.get("connect-protocol-version", "1").strip()
    if version != "1":
        raise E2bError(ErrorCode.INVALID_REQUEST, f"connect-protocol-version must be 1, not {version!r}")
    encoding_header = "connect-content-encoding" if stream else "content-encoding"
    encoding = headers.get(encoding_header, "identity").strip().lower()
    if encoding not in ("", "identity"):
        raise E2bError(ErrorCode.NOT_SUPPORTED, f"{encoding_header} {encoding!r} is not supported: this server takes "
                                        "uncompressed requests only (identity)")
    moment = time.monotonic() if now is None else now
    deadline = None
    timeout = headers.get("connect-timeout-ms")
    if timeout is not None:
        text = timeout.strip()
        if not text.isdigit() or len(text) > MAX_TIMEOUT_DIGITS:
            raise E2bError(ErrorCode.INVALID_REQUEST, f"connect-timeout-ms must be 1 to {MAX_TIMEOUT_DIGITS} digits "
                                               f"(milliseconds), not {timeout!r}")
        deadline = moment + int(text) / 1000
    keepalive = None
    interval = headers.get("keepalive-ping-interval")
    if interval is not None:
        try:
            keepalive = float(interval)
        except ValueError:
            keepalive = math.nan
        if not math.isfinite(keepalive) or keepalive <= 0:
            raise E2bError(ErrorCode.INVALID_REQUEST, f"keepalive-ping-interval must be a number of seconds above 0, "
                                               f"not {interval!r}")
        keepalive = max(keepalive, MIN_KEEPALIVE_S)
    return CallHead(codec, deadline, keepalive)


# ---- errors ------------------------------------------------------------------------------------


def as_error(exc: BaseException, where: str) -> E2bError:
    """What a handler raised, as the client sees it: E2bError as it is, callbox's errors
    converted, anything else logged and ``internal``."""
    if isinstance(exc, E2bError):
        return exc
    if isinstance(exc, CallboxError):
        return from_callbox(exc)
    log.error("%s failed", where, exc_info=exc)
    return E2bError(ErrorCode.INTERNAL,
        f"{where} failed inside the server ({type(exc).__name__}); the server's log has "
                                "the details")


def connect_error_response(error: E2bError) -> tuple[int, list[tuple[str, str]], bytes]:
    """A unary (or refused) call's error: status, headers, body. The status is the one
    :data:`~harness.doors.e2b.errors.CONNECT_STATUS` gives the code unless the error names its own (405, 415, a
    proxy's 502): clients read the code from the body either way."""
    body = json.dumps(error.connect_body(), separators=(",", ":")).encode()
    status = error.connect_status
    headers = [("content-type", "application/json"), *error.headers()]
    if status == 405:
        headers.append(("allow", "POST"))
    return status, headers, body


def _deadline_error(where: str) -> E2bError:
    return E2bError(ErrorCode.TIMED_OUT, f"{where} ran past the deadline the client set (connect-timeout-ms)")


_SHUTDOWN = "the server is shutting down; the call was cancelled"


async def _until(future: Any, deadline: float | None) -> Any:
    """``await future``, raising TimeoutError at ``deadline`` (the future runs on)."""
    if deadline is None:
        return await future
    return await asyncio.wait_for(asyncio.shield(future), max(0.0, deadline - time.monotonic()))


# ---- serving a call ----------------------------------------------------------------------------


async def serve_call(exchange: Exchange, method: Method, where: str, head: CallHead, call: EnvdCall) -> None:
    """Answer the Connect request ``exchange`` for ``method`` (``where``: its path, for errors)."""
    exchange.on_end(call.scope.cancel)
    if method.kind == "unary":
        await _unary(exchange, method, where, head, call)
    elif method.kind == "server_stream":
        await _server_stream(exchange, method, where, head, call)
    else:
        await _client_stream(exchange, method, where, head, call)


def _check_response(message: Any, method: Method, where: str) -> Message:
    if not isinstance(message, Message):
        raise TypeError(f"{where} returned {type(message).__name__}, not a protobuf message")
    return message


async def _respond_error(exchange: Exchange, error: E2bError) -> None:
    if exchange.ended is None:
        await exchange.respond(*connect_error_response(error))


async def _unary(exchange: Exchange, method: Method, where: str, head: CallHead, call: EnvdCall) -> None:
    try:
        body = await exchange.read_all(MAX_MESSAGE_BYTES)
    except E2bError as error:
        await _respond_error(exchange, error)
        return
    exchange.watch()
    codec = head.codec

    def work() -> bytes:
        with current_scope(call.scope):
            request = codec.decode(body, method.request)
            return codec.encode(_check_response(method.handler(request, call), method, where))

    try:
        payload = await _until(exchange.run(work), head.deadline)
    except TimeoutError:
        call.scope.cancel()
        await _respond_error(exchange, _deadline_error(where))
        return
    except Exception as exc:
        await _respond_error(exchange, as_error(exc, where))
        return
    if exchange.ended is None:
        await exchange.respond(200, [("content-type", codec.unary_type)], payload)


def _one_message(body: bytes, where: str) -> bytes:
    reader = EnvelopeReader()
    messages = list(reader.feed(body))
    reader.close()
    if len(messages) != 1:
        raise E2bError(ErrorCode.INVALID_REQUEST, f"{where} takes exactly one request message, not {len(messages)}")
    return messages[0]


def _close(iterator: object, where: str) -> None:
    close = getattr(iterator, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            log.exception("closing the stream of %s failed", where)


async def _server_stream(exchange: Exchange, method: Method, where: str, head: CallHead, call: EnvdCall) -> None:
    try:
        body = await exchange.read_all(MAX_MESSAGE_BYTES + 5)
    except E2bError as error:
        await _respond_error(exchange, error)
        return
    exchange.watch()
    codec = head.codec
    out = OutputChannel(exchange.loop)
    exchange.on_end(out.stop)

    def work() -> None:
        error: BaseException | None = None
        stream: Any = None
        try:
            with current_scope(call.scope):
                request = codec.decode(_one_message(body, where), method.request)
                stream = method.handler(request, call)
                try:
                    for message in stream:
                        if not out.put(envelope(codec.encode(_check_response(message, method, where)))):
                            break
                finally:
                    _close(stream, where)
        except Exception as exc:
            error = exc
        out.done(error)

    exchange.run(work)
    keepalive = None
    if method.keepalive is not None and head.keepalive_s is not None:
        keepalive = envelope(codec.encode(method.keepalive()))
    await _drain(exchange, out, codec, where, head, keepalive, call)


async def _drain(exchange: Exchange, out: OutputChannel, codec: Codec, where: str, head: CallHead,
                 keepalive: bytes | None, call: EnvdCall) -> None:
    """Write what the handler's thread yields, with keepalives, until it is done or the call ends."""
    last = time.monotonic()
    error: E2bError | None = None
    pending: object | None = None
    while True:
        if pending is not None:
            item, pending = pending, None
        else:
            waits = []
            if keepalive is not None and head.keepalive_s is not None:
                waits.append(last + head.keepalive_s)
            if head.deadline is not None:
                waits.append(head.deadline)
            item = await out.get(min(waits) - time.monotonic() if waits else None)
        if item is IDLE:
            now = time.monotonic()
            if head.deadline is not None and now >= head.deadline:
                call.scope.cancel()
                out.stop()
                error = _deadline_error(where)
                break
            if keepalive is not None:
                await _write(exchange, codec, keepalive)
            last = now
            continue
        if item is STOPPED:
            if exchange.ended == "disconnected":
                return
            error = E2bError(ErrorCode.SHUTTING_DOWN, _SHUTDOWN)
            break
        if isinstance(item, Done):
            error = as_error(item.error, where) if item.error is not None else None
            break
        assert isinstance(item, bytes)
        batch = [item]
        size = len(item)
        while size < WRITE_BATCH_BYTES:
            more = out.get_nowait()
            if not isinstance(more, bytes):
                pending = more  # None, or a Done or STOPPED to look at on the next turn
                break
            batch.append(more)
            size += len(more)
        await _write(exchange, codec, b"".join(batch))
        last = time.monotonic()
    if exchange.ended == "disconnected":
        return
    if not exchange.started and error is not None and error.retry_after is not None:
        # Refused before the stream began (a quota): a plain 429 with Retry-After, which
        # Connect clients read like an end-of-stream error and HTTP clients can honour.
        await exchange.respond(*connect_error_response(error))
        return
    if not exchange.started:
        await exchange.start(200, [("content-type", codec.stream_type)])
    await exchange.finish(end_stream(error))


async def _write(exchange: Exchange, codec: Codec, data: bytes) -> None:
    if not exchange.started:
        await exchange.start(200, [("content-type", codec.stream_type)])
    await exchange.write(data)


def _messages(chunks: Iterator[bytes], codec: Codec, cls: type[Message]) -> Generator[Message, None, None]:
    reader = EnvelopeReader()
    for chunk in chunks:
        for payload in reader.feed(chunk):
            yield codec.decode(payload, cls)
    reader.close()


async def _client_stream(exchange: Exchange, method: Method, where: str, head: CallHead, call: EnvdCall) -> None:
    codec = head.codec
    channel = exchange.stream_body()

    def work() -> bytes:
        with current_scope(call.scope):
            requests = _messages(channel.chunks(), codec, method.request)
            try:
                response = method.handler(requests, call)
            finally:
                requests.close()
            return envelope(codec.encode(_check_response(response, method, where)))

    error: E2bError | None = None
    payload = b""
    try:
        payload = await _until(exchange.run(work), head.deadline)
    except TimeoutError:
        call.scope.cancel()
        error = _deadline_error(where)
        channel.finish(error)
    except Exception as exc:
        error = as_error(exc, where)
    if exchange.ended == "disconnected":
        return
    if exchange.ended == "shutdown" and error is not None and error.error is ErrorCode.CANCELLED:
        error = E2bError(ErrorCode.SHUTTING_DOWN, _SHUTDOWN)
    await exchange.start(200, [("content-type", codec.stream_type)])
    await exchange.finish((payload if error is None else b"") + end_stream(error))
