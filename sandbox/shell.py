"""Persistent bash sessions: the Shell service behind the ``bash`` tool.

One session is one ``bash --noprofile --norc`` started as the tool user, through the
same ``Launcher`` as Exec commands, with the same identity, minimal environment and
a marker group of its own (see ``proctree``), so killing the session kills its whole
tree: the shell, the running command and every background job, however detached.

How a command runs and how its end is detected: :mod:`sandbox.shell_loop`; a session's
process and what breaks it: :mod:`sandbox.shell_session`.

The shell's environment is the tool environment (as for Exec) plus the ``env`` of the
Run that starts it (or of the Restart). Background jobs (``cmd &``) keep running
between Runs; they die on Restart, Close, timeout, cancellation, or with the sandbox.
One command runs at a time per session: a second Run waits for the first (up to its
own timeout, then BUSY) before its own timeout starts. Sessions live as long as the
agent.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping

import grpc

from sandbox import proctree
from sandbox.errors import BUSY, INVALID_ARGUMENT, TOO_LARGE, AgentError, answer, stream
from sandbox.identity import FsIdentity, acting_as
from sandbox.launch import Child, Launcher, ToolUser
from sandbox.shell_loop import STATUS_FD, parse_status, wrap_command
from sandbox.shell_session import (
    BUSY_MESSAGE,
    CANCELLED_MESSAGE,
    RunToken,
    Session,
    SessionBroken,
    ended_message,
    timeout_message,
)
from sandbox.toolstart import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, ToolStarter, checked_timeout_ms
from sandbox.v1 import shell_pb2, shell_pb2_grpc

__all__ = [
    "BUSY_MESSAGE",
    "CANCELLED_MESSAGE",
    "DEFAULT_TIMEOUT_MS",
    "MAX_TIMEOUT_MS",
    "STATUS_FD",
    "RunToken",
    "Session",
    "SessionBroken",
    "ShellManager",
    "ShellService",
    "ended_message",
    "parse_status",
    "timeout_message",
    "wrap_command",
]

DEFAULT_SESSION = "default"
DEFAULT_OUTPUT_CAP = 1 << 20
MAX_COMMAND_BYTES = 4 << 20
MAX_SESSION_ID = 128
MAX_SESSIONS = 16
BASH = ("bash", "--noprofile", "--norc")
"""Found on the tool environment's PATH; bash's messages then start with ``bash:`` as in a terminal."""
# Markers of shell sessions come from a range of their own, next to Exec's, so the two
# allocators can never hand out the same gid.
SHELL_MARKER_BASE = proctree.MARKER_BASE + proctree.MARKER_SPAN


class ShellManager:
    """The agent's bash sessions, by session id."""

    def __init__(
        self,
        user: ToolUser | None,
        workspace: str,
        launcher: Launcher | None = None,
        *,
        max_sessions: int = MAX_SESSIONS,
        runtime_dir: str | None = None,
    ) -> None:
        self.user = user
        self.workspace = workspace
        self.starter = ToolStarter(user, launcher)
        self.max_sessions = max_sessions
        self._runtime_dir = runtime_dir
        root = os.geteuid() == 0
        # The status FIFO is made as the tool user (the agent has no CAP_DAC_OVERRIDE).
        self.fs_identity = FsIdentity(user.uid, user.gid) if user is not None and root else None
        # Only root can give a process the marker group; elsewhere only the group is killed.
        self.uses_markers = user is not None or root
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._markers: set[int] = set()

    @property
    def runtime_dir(self) -> str:
        """Where sessions keep their private directories (default: the temporary directory).

        Found on the first session, so the agent's start-up does not import tempfile."""
        if self._runtime_dir is None:
            import tempfile

            self._runtime_dir = tempfile.gettempdir()
        return self._runtime_dir

    def as_tool_user(self) -> contextlib.AbstractContextManager[None]:
        """File operations as the tool user (in the container), else as this process."""
        return acting_as(self.fs_identity)

    # ---- public API -----------------------------------------------------------------

    def run(
        self, request: shell_pb2.ShellRunRequest, on_start: Callable[[RunToken], None] | None = None
    ) -> Iterator[shell_pb2.ShellEvent]:
        """Run the request's command in its session: Output events, then one ShellDone."""
        session_id = _session_id(request.session_id)
        command = request.command.encode("utf-8")
        if b"\0" in command:
            raise AgentError(INVALID_ARGUMENT, "the command contains a NUL byte")
        if len(command) > MAX_COMMAND_BYTES:
            raise AgentError(
                TOO_LARGE,
                f"the command is {len(command)} bytes; at most {MAX_COMMAND_BYTES} are accepted",
            )
        timeout_ms = checked_timeout_ms(request.timeout_ms)
        cap = request.output_cap_bytes or DEFAULT_OUTPUT_CAP
        env = _checked_env(request.env)
        token = RunToken()
        if on_start is not None:
            on_start(token)
        wait_deadline = time.monotonic() + timeout_ms / 1000
        while True:
            session = self._session(session_id)
            state = session.acquire(token, max(0.0, wait_deadline - time.monotonic()))
            if state == "cancelled":
                return  # the client left while this call waited: nothing ran
            if state == "ok":
                break
            # "closed": restarted or closed while this call waited; use the current session
        try:
            yield from session.run(command, timeout_ms, cap, token, env)
        finally:
            session.release()

    def restart(self, session_id: str, env: Mapping[str, str] | None = None) -> tuple[int, str]:
        """Replace the session with a fresh shell; return its pid and working directory."""
        session_id = _session_id(session_id)
        extra = _checked_env(env or {})
        with self._lock:
            old = self._sessions.pop(session_id, None)
            new = self._sessions[session_id] = self._new_session(session_id, replacing=old is not None)
            new.busy = True  # reserved for this restart: a Run arriving now waits for the new shell
        if old is not None:
            old.close()
        try:
            try:
                new.start(extra)
            except BaseException:
                with self._lock:
                    if self._sessions.get(session_id) is new:
                        del self._sessions[session_id]
                new.closed = True
                raise
            assert new.child is not None
            return new.child.pid, new.cwd
        finally:
            new.release()

    def close(self, session_id: str) -> bool:
        session_id = _session_id(session_id)
        with self._lock:
            session = self._sessions.pop(session_id, None)
        if session is None:
            return False
        session.close()
        return True

    def close_all(self) -> None:
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            session.close()

    # ---- internals ------------------------------------------------------------------

    def _session(self, session_id: str) -> Session:
        with self._lock:
            session = self._sessions.get(session_id)
            if session is None:
                session = self._sessions[session_id] = self._new_session(session_id)
            return session

    def _new_session(self, session_id: str, replacing: bool = False) -> Session:
        """Caller holds ``_lock``."""
        if not replacing and len(self._sessions) >= self.max_sessions:
            raise AgentError(
                BUSY,
                f"{self.max_sessions} bash sessions are open already; close one first",
            )
        while True:
            marker = SHELL_MARKER_BASE + proctree.random_below(proctree.MARKER_SPAN)
            if marker not in self._markers:
                self._markers.add(marker)
                return Session(self, session_id, marker)

    def release_marker(self, marker: int) -> None:
        with self._lock:
            self._markers.discard(marker)

    def launch(self, marker: int, extra_env: Mapping[str, str]) -> Child:
        # A missing or forbidden workspace reads as bash failing to start, not as a bad cwd.
        return self.starter.start(BASH, self.workspace, extra_env, marker, with_stdin=True, blame_cwd=False)


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise AgentError(
                INVALID_ARGUMENT,
                f"environment variable {name!r} is not valid (empty name, '=' or NUL)",
            )
    return dict(env)


def _session_id(value: str) -> str:
    session_id = value or DEFAULT_SESSION
    if len(session_id) > MAX_SESSION_ID or "\0" in session_id:
        raise AgentError(
            INVALID_ARGUMENT,
            f"a session id is at most {MAX_SESSION_ID} characters without NUL",
        )
    return session_id


class ShellService(shell_pb2_grpc.ShellServicer):
    """Run, Restart and Close over the ShellManager."""

    def __init__(self, manager: ShellManager) -> None:
        self.manager = manager

    def Run(
        self, request: shell_pb2.ShellRunRequest, context: grpc.ServicerContext
    ) -> Iterator[shell_pb2.ShellEvent]:
        return stream(context, lambda on_start: self.manager.run(request, on_start))

    def Restart(
        self, request: shell_pb2.ShellRestartRequest, context: grpc.ServicerContext
    ) -> shell_pb2.ShellRestartResponse:
        pid, cwd = answer(context, lambda: self.manager.restart(request.session_id, request.env))
        return shell_pb2.ShellRestartResponse(pid=pid, cwd=cwd)

    def Close(
        self, request: shell_pb2.ShellCloseRequest, context: grpc.ServicerContext
    ) -> shell_pb2.ShellCloseResponse:
        return answer(context, lambda: shell_pb2.ShellCloseResponse(closed=self.manager.close(request.session_id)))
