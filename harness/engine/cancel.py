"""Cancelling what one tool call started in its sandbox.

A :class:`CallScope` collects the streaming agent RPCs (``Exec``, bash ``Run``) one call
makes; ``cancel`` cancels them, and any the call makes afterwards, and the agent then kills
the command's whole process tree. :func:`current_scope` makes a scope current for the
calling thread (a context variable, so concurrent calls in other threads keep theirs), and
every :class:`~harness.engine.agent_client.AgentClient` channel records the streams it
opens in the current scope (:class:`StreamTracker`).

A scope also notes when the agent reported that a command of the call started
(:func:`note_command_started`, from the ``Started`` event of an Exec stream), so a harness
stopped in the middle of the call can record truthfully that its command had started.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

import grpc

__all__ = ["CallScope", "StreamTracker", "active_scope", "current_scope", "note_command_started"]


class CallScope:
    """The streaming agent RPCs one tool call made; ``cancel`` cancels them (and later ones)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[Any] = []
        self.cancelled = False
        self.command_started = False
        """Whether the agent reported that a command of this call started."""

    def track(self, call: Any) -> None:
        with self._lock:
            self._calls.append(call)
            cancelled = self.cancelled
        if cancelled:
            call.cancel()

    def cancel(self) -> None:
        with self._lock:
            if self.cancelled:
                return
            self.cancelled = True
            calls = list(self._calls)
        for call in calls:
            with contextlib.suppress(Exception):
                call.cancel()


_CURRENT: contextvars.ContextVar[CallScope | None] = contextvars.ContextVar("callbox_call_scope", default=None)


@contextlib.contextmanager
def current_scope(scope: CallScope) -> Iterator[CallScope]:
    """Make ``scope`` the calling thread's current scope for the ``with`` block."""
    token = _CURRENT.set(scope)
    try:
        yield scope
    finally:
        _CURRENT.reset(token)


def active_scope() -> CallScope | None:
    """The calling thread's current scope (None outside a call)."""
    return _CURRENT.get()


def note_command_started() -> None:
    """The agent reported that a command started: note it in the current scope, if any."""
    scope = _CURRENT.get()
    if scope is not None:
        scope.command_started = True


class StreamTracker(grpc.UnaryStreamClientInterceptor):  # type: ignore[misc]
    """Records each streaming RPC in the calling thread's current CallScope, if any."""

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        call = continuation(client_call_details, request)
        scope = _CURRENT.get()
        if scope is not None:
            scope.track(call)
        return call
