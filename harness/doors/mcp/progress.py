"""A tool's output as MCP ``notifications/progress`` while it runs.

When a ``tools/call`` request carries a ``progressToken``, :class:`OutputPump` collects the
output chunks the tool's worker thread produces and :meth:`OutputPump.forward` turns them
into progress notifications on the event loop: at most every ``PROGRESS_INTERVAL_S`` while
output arrives (``message`` is the new output text, at most ``PROGRESS_MESSAGE_MAX`` bytes of
it), and every ``HEARTBEAT_S`` when there is none (``message`` says how long it has run).
``progress`` is the seconds elapsed, strictly increasing; there is no ``total``.
"""

from __future__ import annotations

import codecs
import threading
import time
from typing import Any

import anyio
from mcp.server.context import ServerRequestContext

__all__ = ["HEARTBEAT_S", "PROGRESS_INTERVAL_S", "PROGRESS_MESSAGE_MAX", "OutputPump", "progress_requested"]

PROGRESS_INTERVAL_S = 0.1
HEARTBEAT_S = 5.0
PROGRESS_MESSAGE_MAX = 4096
"""Bytes of new output one progress notification carries (the newest; older ones are dropped)."""


class OutputPump:
    """Output chunks from the tool's worker thread, turned into progress notifications on the
    event loop. Bounded: if the client reads slower than the tool writes, only the newest
    ``PROGRESS_MESSAGE_MAX`` bytes wait (the count of skipped ones is reported)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._skipped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._started = time.monotonic()
        self._last_sent = self._started
        self._progress = 0.0

    def push(self, _stream: str, data: bytes) -> None:
        with self._lock:
            self._buffer += data
            excess = len(self._buffer) - PROGRESS_MESSAGE_MAX
            if excess > 0:
                del self._buffer[:excess]
                self._skipped += excess

    def _take(self) -> tuple[bytes, int]:
        with self._lock:
            data, skipped = bytes(self._buffer), self._skipped
            self._buffer.clear()
            self._skipped = 0
            return data, skipped

    async def report(self, ctx: ServerRequestContext[Any, Any], *, final: bool = False) -> None:
        data, skipped = self._take()
        now = time.monotonic()
        elapsed = now - self._started
        if data:
            message = self._decoder.decode(data, final=final)
            if skipped:
                message = f"…{skipped} bytes of output skipped…{message}"
            if not message:
                return
        elif not final and now - self._last_sent >= HEARTBEAT_S:
            message = f"still running after {elapsed:.0f} s"
        else:
            return
        self._progress = max(round(elapsed, 3), round(self._progress + 0.001, 3))
        self._last_sent = now
        await ctx.session.report_progress(self._progress, None, message)

    async def forward(self, ctx: ServerRequestContext[Any, Any]) -> None:
        while True:
            await anyio.sleep(PROGRESS_INTERVAL_S)
            await self.report(ctx)


def progress_requested(ctx: ServerRequestContext[Any, Any]) -> bool:
    meta: Any = ctx.meta or {}
    return meta.get("progress_token") is not None or meta.get("progressToken") is not None
