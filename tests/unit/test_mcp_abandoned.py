"""AbandonedSessions (harness/doors/mcp/abandoned.py) in front of a recording ASGI app: a
session whose GET stream closed gets its DELETE replayed after the grace, unless the client
comes back first; sessions without a GET stream, and requests without a session, are left
alone. Found with Claude Code, which exits without DELETE."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest

from harness.doors.mcp.abandoned import AbandonedSessions

GRACE_S = 0.05
QUIET_S = GRACE_S * 6
"""Long enough for a timer that should not fire to have fired."""


class Recorder:
    """The inner app: records (method, session id, user) of each request; a GET or POST holds
    until its ``release`` event is set, as an open stream or a running call does."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str | None, Any]] = []
        self.deleted = anyio.Event()
        self.release: dict[str, anyio.Event] = {}

        self.refuse_get = False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        headers = dict(scope["headers"])
        self.seen.append((scope["method"], headers.get(b"mcp-session-id", b"").decode() or None, scope.get("user")))
        if scope["method"] == "DELETE":
            self.deleted.set()
            return
        refused = scope["method"] == "GET" and self.refuse_get
        await send({"type": "http.response.start", "status": 406 if refused else 200, "headers": []})
        if not refused:
            await self.release.setdefault(scope["method"], anyio.Event()).wait()


def _scope(method: str, session: str | None = "s1") -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1:1")] + ([(b"mcp-session-id", session.encode())] if session else [])
    return {"type": "http", "method": method, "path": "/mcp", "headers": headers, "user": "alice"}


async def _nothing() -> dict[str, Any]:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _drop(_message: dict[str, Any]) -> None:
    return None


def _run(test: Callable[[AbandonedSessions, Recorder, anyio.abc.TaskGroup], Awaitable[None]]) -> None:
    async def main() -> None:
        recorder = Recorder()
        watcher = AbandonedSessions(recorder, GRACE_S)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                await group.start(watcher.run)
                await test(watcher, recorder, group)
                group.cancel_scope.cancel()

    anyio.run(main)


async def _request(watcher: AbandonedSessions, recorder: Recorder, method: str, session: str | None = "s1") -> None:
    """One request whose inner handling returns at once."""
    recorder.release.setdefault(method, anyio.Event()).set()
    await watcher(_scope(method, session), _nothing, _drop)
    recorder.release.pop(method)


def test_a_closed_get_stream_ends_the_session_after_the_grace() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        await _request(watcher, recorder, "POST")
        await _request(watcher, recorder, "GET")  # the stream opens and closes: the client left
        await recorder.deleted.wait()
        assert recorder.seen[-1] == ("DELETE", "s1", "alice")  # the GET's request, as the client's DELETE

    _run(test)


def test_a_session_that_never_opened_a_stream_is_left_to_the_idle_timeout() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        await _request(watcher, recorder, "POST")
        await _request(watcher, recorder, "POST", session=None)  # an initialize: no session yet
        await anyio.sleep(QUIET_S)
        assert [method for method, _, _ in recorder.seen] == ["POST", "POST"]

    _run(test)


def test_a_refused_get_is_no_stream() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        recorder.refuse_get = True  # e.g. 406: the client does not accept text/event-stream
        await _request(watcher, recorder, "GET")
        await anyio.sleep(QUIET_S)
        assert not recorder.deleted.is_set()

    _run(test)


def test_a_client_that_comes_back_keeps_its_session() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        await _request(watcher, recorder, "GET")
        group.start_soon(watcher, _scope("GET"), _nothing, _drop)  # it reconnects and holds the stream
        await anyio.sleep(QUIET_S)
        assert not recorder.deleted.is_set()
        recorder.release["GET"].set()  # ... until it goes for good
        await recorder.deleted.wait()

    _run(test)


def test_a_call_in_flight_holds_the_session() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        recorder.release["GET"] = anyio.Event()
        group.start_soon(watcher, _scope("GET"), _nothing, _drop)
        group.start_soon(watcher, _scope("POST"), _nothing, _drop)  # a long call
        await anyio.sleep(QUIET_S)
        recorder.release["GET"].set()  # the stream closes while the call runs
        await anyio.sleep(QUIET_S)
        assert not recorder.deleted.is_set()
        recorder.release["POST"].set()  # the call ends: now the grace runs
        await recorder.deleted.wait()

    _run(test)


def test_the_clients_own_delete_cancels_the_timer() -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        await _request(watcher, recorder, "GET")
        await watcher(_scope("DELETE"), _nothing, _drop)
        await anyio.sleep(QUIET_S)
        assert [method for method, _, _ in recorder.seen] == ["GET", "DELETE"]  # no second DELETE

    _run(test)


@pytest.mark.parametrize("scope_type", ["lifespan", "websocket"])
def test_other_scopes_pass_through(scope_type: str) -> None:
    async def test(watcher: AbandonedSessions, recorder: Recorder, group: anyio.abc.TaskGroup) -> None:
        seen: list[str] = []

        async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
            seen.append(scope["type"])

        await AbandonedSessions(inner, GRACE_S)({"type": scope_type}, _nothing, _drop)
        assert seen == [scope_type]

    _run(test)
