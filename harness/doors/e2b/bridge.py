"""The E2B door's HTTP exchanges over ASGI, and the bridges between its event loop and the
worker threads its handlers run on.

The door's handlers are synchronous (:mod:`harness.doors.e2b.rpc`); the ASGI server runs one
event loop. Three pieces connect them:

* :class:`Exchange` is one request: its head, its body and its response, and its end (the
  client disconnecting, or the server shutting down: :meth:`Exchange.abort`), which runs the
  callbacks registered with :meth:`Exchange.on_end` (cancel the call's scope, stop a stream).
  A body is read either whole on the loop, up to a limit (an RPC's one message), or handed to
  a worker thread in chunks through a :class:`BodyChannel`.
* :class:`BodyChannel` carries request body chunks from the loop to a worker thread, at most
  ``window`` chunks ahead of the thread: while the handler is slower than the client, the
  loop stops asking for more, uvicorn stops reading the socket, and TCP holds the client back.
  A 50 MB upload is never held whole.
* :class:`OutputChannel` carries what a handler's iterator yields (stream messages, response
  body chunks) from its worker thread to the loop, at most ``window`` items ahead: while the
  client reads slowly, the loop waits for the socket to drain and the thread waits for room.
  When the consumer goes away (:meth:`OutputChannel.stop`) the thread's next ``put`` says so,
  and the thread closes the iterator itself: a generator is closed by the thread running it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Literal, TypeVar
from urllib.parse import parse_qs

from harness.core.errors import ErrorCode
from harness.doors.e2b.errors import E2bError

__all__ = ["IDLE", "STOPPED", "BodyChannel", "ClientGone", "Done", "Exchange", "OutputChannel"]

log = logging.getLogger("callbox.e2b")

T = TypeVar("T")
Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

BODY_WINDOW = 4
"""Request body chunks (uvicorn hands over up to about 64 KiB at a time) queued ahead of the handler."""
OUTPUT_WINDOW = 8
"""Items a handler's iterator may yield ahead of what the client has taken."""

EndReason = Literal["disconnected", "shutdown"]


class ClientGone(Exception):
    """The client closed the connection before its request was complete."""


class Exchange:
    """One HTTP request and its response over ASGI; see the module docstring."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, pool: Executor) -> None:
        self.loop = asyncio.get_running_loop()
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.raw_path: bytes = scope.get("raw_path") or self.path.encode()
        self.query_string: bytes = scope.get("query_string", b"")
        query = self.query_string.decode("latin-1")
        self.query: dict[str, list[str]] = parse_qs(query, keep_blank_values=True)
        headers: dict[str, str] = {}
        for raw_name, raw_value in scope.get("headers", ()):
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        self.headers = headers
        self._receive = receive
        self._send = send
        self._pool = pool
        self.started = False
        """The response head has been sent."""
        self.status: int | None = None
        self.done = False
        """The response is complete (its last byte handed to the server)."""
        self.ended: EndReason | None = None
        """Why the exchange ended before its response did, or None."""
        self._on_end: list[Callable[[], None]] = []
        self._body_done = False
        self._reader: asyncio.Task[None] | None = None
        self._channel: BodyChannel | None = None

    # ---- the end -------------------------------------------------------------------------------

    def on_end(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (on the loop) when the client goes away or the server aborts the
        exchange; at once if that already happened. Not run once the response is complete."""
        if self.ended is not None:
            _quietly(callback)
        else:
            self._on_end.append(callback)

    def _end(self, reason: EndReason) -> None:
        if self.done or self.ended is not None:
            return
        self.ended = reason
        callbacks, self._on_end = self._on_end, []
        for callback in callbacks:
            _quietly(callback)

    def abort(self) -> None:
        """End the exchange because the server is shutting down (from any thread)."""
        with contextlib.suppress(RuntimeError):  # the loop is closed: nothing left to end there
            self.loop.call_soon_threadsafe(self._end, "shutdown")

    # ---- the request body -----------------------------------------------------------------------

    async def read_all(self, limit: int) -> bytes:
        """The whole body; ``resource_exhausted`` if longer than ``limit`` bytes, ClientGone
        if the client leaves first."""
        parts: list[bytes] = []
        size = 0
        while not self._body_done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._end("disconnected")
                raise ClientGone
            chunk: bytes = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise E2bError(ErrorCode.TOO_LARGE, f"the request is over the limit of {limit} bytes")
            parts.append(chunk)
            self._body_done = not message.get("more_body", False)
        return b"".join(parts)

    def watch(self) -> None:
        """Notice the client leaving (the body must have been read)."""
        self._reader = self.loop.create_task(self._watch())

    def stream_body(self, window: int = BODY_WINDOW) -> BodyChannel:
        """Hand the body to a worker thread in chunks (then notice the client leaving)."""
        channel = BodyChannel(self.loop, window)
        self.on_end(lambda: channel.finish(E2bError(
            ErrorCode.CANCELLED, "the request ended before its body was complete (the client went away, or the server "
            "is shutting down)")))
        self._channel = channel
        self._reader = self.loop.create_task(self._pump(channel))
        return channel

    async def _pump(self, channel: BodyChannel) -> None:
        while not self._body_done:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._end("disconnected")
                return
            chunk: bytes = message.get("body", b"")
            self._body_done = not message.get("more_body", False)
            if chunk:
                await channel.put(chunk)
        channel.finish()
        await self._watch()

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":  # also what uvicorn says once the response is complete
                self._end("disconnected")
                return

    async def close(self) -> None:
        """Stop reading from the client (the exchange is over; a handler still reading the
        body gets ``canceled``). An exchange that ends without its response complete (an
        error, a task cancelled) runs its end callbacks, so no worker thread waits on it."""
        if not self.done:
            self._end("shutdown")
        if self._channel is not None:
            self._channel.finish(E2bError(ErrorCode.CANCELLED,
                "the response was complete before the request body was read"))
        reader, self._reader = self._reader, None
        if reader is not None and not reader.done():
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    # ---- the response ----------------------------------------------------------------------------

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        self.started = True
        self.status = status
        await self._send({
            "type": "http.response.start", "status": status,
            "headers": [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        })

    async def write(self, data: bytes) -> None:
        if data:
            await self._send({"type": "http.response.body", "body": data, "more_body": True})

    async def finish(self, data: bytes = b"") -> None:
        self.done = True
        await self._send({"type": "http.response.body", "body": data, "more_body": False})

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        """A whole response (``content-length`` added)."""
        await self.start(status, [*headers, ("content-length", str(len(body)))])
        await self.finish(body)

    # ---- worker threads ------------------------------------------------------------------------

    def run(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """``fn()`` on a worker thread."""
        return self.loop.run_in_executor(self._pool, fn)


def _quietly(callback: Callable[[], None]) -> None:
    try:
        callback()
    except Exception:
        log.exception("an end-of-request callback failed")


class _End:
    pass


_BODY_END = _End()


class BodyChannel:
    """Request body chunks from the event loop to one worker thread; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int = BODY_WINDOW) -> None:
        self._loop = loop
        self._window = window
        self._queue: queue.SimpleQueue[bytes | _End | E2bError] = queue.SimpleQueue()
        self._ahead = 0  # touched on the loop only
        self._space = asyncio.Event()
        self._space.set()
        self._finished = False
        self._lock = threading.Lock()

    async def put(self, chunk: bytes) -> None:
        """On the loop: queue ``chunk``, first waiting while ``window`` chunks are untaken."""
        while self._ahead >= self._window:
            self._space.clear()
            await self._space.wait()
        self._ahead += 1
        self._queue.put(chunk)

    def finish(self, error: E2bError | None = None) -> None:
        """From any thread: the body is complete (None) or will never be (``error``, raised to
        the reader). The first call counts."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self._queue.put(error if error is not None else _BODY_END)

    def _taken(self) -> None:
        self._ahead -= 1
        self._space.set()

    def chunks(self) -> Iterator[bytes]:
        """On the worker thread: the chunks as they arrive; raises the error ``finish`` was given."""
        while True:
            item = self._queue.get()
            if isinstance(item, _End | E2bError):
                self._queue.put(item)  # a second reader sees the same end
                if isinstance(item, E2bError):
                    raise item
                return
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._taken)
            yield item


@dataclass(frozen=True)
class Done:
    """The producing thread is finished: ``error`` is what ended it, or None."""

    error: BaseException | None = None


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


IDLE = _Marker("IDLE")
"""``OutputChannel.get`` waited its timeout out."""
STOPPED = _Marker("STOPPED")
"""``OutputChannel.stop`` was called: the exchange ended early."""


class OutputChannel:
    """Items from one worker thread to the event loop; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop, window: int = OUTPUT_WINDOW) -> None:
        self._loop = loop
        self._window = window
        self._items: asyncio.Queue[object] = asyncio.Queue()
        self._cond = threading.Condition()
        self._ahead = 0
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def put(self, item: object) -> bool:
        """On the worker thread: hand ``item`` over, first waiting for room; False once the
        consumer stopped (the thread should then stop producing)."""
        with self._cond:
            while self._ahead >= self._window and not self._stopped:
                self._cond.wait()
            if self._stopped:
                return False
            self._ahead += 1
        return self._post(item)

    def done(self, error: BaseException | None = None) -> None:
        """On the worker thread: nothing more comes (``error``: why)."""
        self._post(Done(error))

    def stop(self) -> None:
        """From any thread: the consumer is gone; ``put`` returns False from now on."""
        with self._cond:
            if self._stopped:
                return
            self._stopped = True
            self._cond.notify_all()
        self._post(STOPPED)

    def _post(self, item: object) -> bool:
        try:
            self._loop.call_soon_threadsafe(self._items.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody will take anything
            with self._cond:
                self._stopped = True
                self._cond.notify_all()
            return False
        return True

    def get_nowait(self) -> object | None:
        """On the loop: the next item if one is waiting, else None."""
        try:
            item = self._items.get_nowait()
        except asyncio.QueueEmpty:
            return None
        self._taken(item)
        return item

    async def get(self, timeout: float | None = None) -> object:
        """On the loop: the next item, :data:`IDLE` after ``timeout`` seconds without one,
        :data:`STOPPED`, or a :class:`Done`."""
        item = self.get_nowait()
        if item is not None:
            return item
        if timeout is None:
            item = await self._items.get()
        else:
            try:
                item = await asyncio.wait_for(self._items.get(), max(0.0, timeout))
            except TimeoutError:
                return IDLE
        self._taken(item)
        return item

    def _taken(self, item: object) -> None:
        if isinstance(item, Done) or item is STOPPED:
            return
        with self._cond:
            self._ahead -= 1
            self._cond.notify()
