"""Ending the MCP HTTP sessions whose clients went away without saying so.

A streamable-HTTP client keeps a GET stream open on its session while it lives and sends
``DELETE`` when it is done. Some exit without the ``DELETE`` (Claude Code does): their
session, and its sandbox, would then last until the idle timeout (30 minutes), each holding
one of the server's sessions, so a script that runs such a client again and again soon meets
"Too many open sessions". :class:`AbandonedSessions` sits in front of the session manager
and ends a session whose GET stream has closed and which has had no request since for a grace
period, by replaying the client's ``DELETE`` (the same request, so the same owner check and
the same teardown). A client that reconnects its stream or sends anything within the grace
keeps its session; a client that never opens a GET stream is left to the idle timeout.
"""

from __future__ import annotations

import logging
from typing import Any

import anyio
import anyio.abc

log = logging.getLogger("callbox.mcp")

DEFAULT_ABANDONED_GRACE_S = 60.0
"""How long a session whose GET stream closed waits for its client before it ends: twice the
longest wait between reconnections of the MCP SDKs' clients (the TypeScript SDK's backs off to
30 s by default), so a client that lost its stream to the network gets it back."""
SESSION_HEADER = b"mcp-session-id"


def _session_id(scope: dict[str, Any]) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == SESSION_HEADER:
            return bytes(value).decode("latin-1")
    return None


async def _no_body() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _discard(_message: dict[str, Any]) -> None:
    return None


class AbandonedSessions:
    """ASGI: passes every request to ``app`` (the session manager's) and, once a session's GET
    stream has closed and nothing of the session is in flight, replays its ``DELETE`` after
    ``grace_s`` unless another request of the session comes first. Timers run in the task
    group :meth:`run` gives them; without it, requests just pass through."""

    def __init__(self, app: Any, grace_s: float) -> None:
        self.app = app
        self.grace_s = grace_s
        self._task_group: anyio.abc.TaskGroup | None = None
        self._in_flight: dict[str, int] = {}
        self._stream_closed: dict[str, dict[str, Any]] = {}
        """Sessions whose GET stream closed, with the scope of that GET (to replay as DELETE)."""
        self._timers: dict[str, anyio.CancelScope] = {}

    async def run(self, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Serve timers until cancelled (the server's lifespan runs this in its task group)."""
        async with anyio.create_task_group() as group:
            self._task_group = group
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._task_group = None
                group.cancel_scope.cancel()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        session = _session_id(scope) if scope.get("type") == "http" else None
        if session is None or self._task_group is None:
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "")
        timer = self._timers.pop(session, None)
        if timer is not None:
            timer.cancel()
        if method in ("GET", "DELETE"):
            self._stream_closed.pop(session, None)
        status: list[int] = []

        async def watch_status(message: dict[str, Any]) -> None:
            if message.get("type") == "http.response.start":
                status.append(int(message.get("status", 0)))
            await send(message)

        self._in_flight[session] = self._in_flight.get(session, 0) + 1
        try:
            await self.app(scope, receive, watch_status)
        finally:
            if method == "GET" and status == [200]:  # a stream was open (not a refused GET)
                self._stream_closed[session] = scope
            left = self._in_flight.pop(session) - 1
            if left:
                self._in_flight[session] = left
            elif session in self._stream_closed and self._task_group is not None:
                cancel = anyio.CancelScope()
                self._timers[session] = cancel
                self._task_group.start_soon(self._end_later, session, cancel)

    async def _end_later(self, session: str, cancel: anyio.CancelScope) -> None:
        with cancel:
            await anyio.sleep(self.grace_s)
        if cancel.cancel_called or self._timers.get(session) is not cancel:
            return
        del self._timers[session]
        scope = self._stream_closed.pop(session, None)
        if scope is None:
            return
        log.info("MCP session %s: its client closed its stream and sent nothing for %.0f s; ending the session",
                 session, self.grace_s)
        await self.app({**scope, "method": "DELETE", "query_string": b""}, _no_body, _discard)
