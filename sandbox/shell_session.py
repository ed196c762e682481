"""One bash session: its process, pipes and status channel, a Run at a time, and what breaks it.

Outcomes other than a status record:

* deadline passed: the session's whole tree is killed (SIGKILL) and the session is
  *broken*: later Runs fail with reason SESSION_BROKEN and the published text
  ``timed out: bash has not returned in N seconds and must be restarted`` until a
  Restart. (The reference leaves the stuck shell alive; killing it frees the
  sandbox's resources, and the only way forward is a restart either way.)
* bash itself ended (``exit``, ``exec``-ing a program that then exits, a signal,
  ``set -e`` and a failing command): the Run reports ``session_ended`` and the
  session is broken with ``bash has exited with returncode N and must be restarted``
  (N as the reference reports it: negative for a signal). Its background jobs keep
  running until Restart or Close. ``exec`` replacing the shell closes the status
  channel at once; the Run then waits for the new program (or the deadline).
* the RPC is cancelled (client gone) mid-command: handled like a timeout. The
  foreground command cannot be told apart from background jobs (one marker for the
  session), and a shell whose command was abandoned half-way is in an unknown
  state, so the session is killed and broken.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from sandbox import proctree
from sandbox.errors import BUSY, INTERNAL, SESSION_BROKEN, SPAWN_FAILED, AgentError
from sandbox.execloop import read_available
from sandbox.launch import Child
from sandbox.shell_loop import STATUS_FD, RunLoop, parse_status, wrap_command
from sandbox.v1 import shell_pb2

if TYPE_CHECKING:
    from sandbox.shell import ShellManager

READY_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0


def timeout_message(timeout_ms: int) -> str:
    """The published text for a command that did not return (seconds as the reference prints a float)."""
    return f"timed out: bash has not returned in {timeout_ms / 1000} seconds and must be restarted"


def ended_message(returncode: int) -> str:
    """Text for a session whose bash ended; ``returncode`` is negative for a signal (Popen style)."""
    return f"bash has exited with returncode {returncode} and must be restarted"


CANCELLED_MESSAGE = (
    "bash was killed because a call was cancelled before its command returned; the tool must be restarted"
)
BUSY_MESSAGE = "another command is still running in bash session {!r}; retry when it has returned"


class SessionBroken(AgentError):
    """Run on a session that must be restarted first."""

    def __init__(self, message: str) -> None:
        super().__init__(SESSION_BROKEN, message)


class RunToken:
    """One Run's cancellation handle (the gRPC callback calls ``cancel``)."""

    def __init__(self) -> None:
        self.cancelled = False
        self.finished = False
        self.session: Session | None = None

    def cancel(self) -> None:
        """Ask the Run to stop; a no-op once its command has returned."""
        if self.finished:
            return
        self.cancelled = True
        session = self.session
        if session is not None:
            session.wake()


class Session:
    """One bash process and its pipes; a Run at a time (``busy``)."""

    def __init__(self, manager: ShellManager, session_id: str, marker: int) -> None:
        self.manager = manager
        self.id = session_id
        self.marker = marker
        self.cond = threading.Condition()
        self.busy = False
        self.closed = False
        self.broken: str | None = None
        self.child: Child | None = None
        self.pidfd = -1
        self.status_fd = -1
        self.streams: dict[int, str] = {}
        self.status_buf = bytearray()
        self.cwd = ""
        self._fd_lock = threading.Lock()
        self._disposed = False
        self.wake_r, self.wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    # ---- serialization -------------------------------------------------------------

    def acquire(self, token: RunToken, wait_s: float) -> str:
        """Wait until no other Run uses the session: "ok", or "cancelled" / "closed" (not acquired)."""
        deadline = time.monotonic() + wait_s
        token.session = self
        with self.cond:
            while self.busy and not self.closed and not token.cancelled:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AgentError(BUSY, BUSY_MESSAGE.format(self.id))
                self.cond.wait(remaining)
            if self.closed:
                return "closed"
            if token.cancelled:
                return "cancelled"
            self.busy = True
            return "ok"

    def release(self) -> None:
        with self.cond:
            closed = self.closed
            if not closed:
                self.busy = False
            self.cond.notify_all()
        if closed:
            self.dispose()

    def wake(self) -> None:
        """Interrupt a Run's wait (cancellation): the selector and the busy wait both wake."""
        with self._fd_lock:
            if not self._disposed:
                with contextlib.suppress(OSError):
                    os.write(self.wake_w, b"x")
        with self.cond:
            self.cond.notify_all()

    # ---- life cycle ----------------------------------------------------------------

    def start(self, env: Mapping[str, str]) -> None:
        """Start bash with ``env`` added to its environment; wait until it holds the status FIFO.

        The caller holds ``busy``.

        On failure everything started is killed and released, so a later Run can try again.
        """
        import shutil  # here, not at the top: the agent's start-up never needs them
        import tempfile

        manager = self.manager
        runtime_dir = manager.runtime_dir  # found as the agent, not as the tool user
        with manager.as_tool_user():
            private = tempfile.mkdtemp(prefix="callbox-shell-", dir=runtime_dir)
        keep_open = -1
        try:
            with manager.as_tool_user():
                fifo = os.path.join(private, "status")
                os.mkfifo(fifo, 0o600)
                self.status_fd = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
                # Until bash has opened the FIFO, this writer keeps reads from seeing EOF.
                keep_open = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            self.child = child = manager.launch(self.marker, env)
            self.pidfd = child.open_pidfd()
            for fd, name in ((child.stdout, "stdout"), (child.stderr, "stderr")):
                os.set_blocking(fd, False)
                self.streams[fd] = name
            fifo_word = fifo.replace("'", "'\\''")
            preamble = (
                f"exec {STATUS_FD}>'{fifo_word}' || builtin exit 97; "
                f"{{ builtin printf '%d\\0%s\\0' 0 \"$PWD\" >&{STATUS_FD}; }} 2>/dev/null\n"
            ).encode()
            assert child.stdin is not None
            os.write(child.stdin, preamble)
            self._wait_ready()
        except BaseException:
            self._reset()
            raise
        finally:
            if keep_open >= 0:
                os.close(keep_open)
            with manager.as_tool_user():
                shutil.rmtree(private, ignore_errors=True)

    def _reset(self) -> None:
        """Undo a failed start: kill what started, close its descriptors, forget the child."""
        self.kill_tree()
        if self.child is not None:
            self.child.close_pipes()
        for fd in (self.pidfd, self.status_fd):
            if fd >= 0:
                os.close(fd)
        self.child = None
        self.pidfd = self.status_fd = -1
        self.streams.clear()
        self.status_buf.clear()

    def _wait_ready(self) -> None:
        assert self.child is not None
        deadline = time.monotonic() + READY_TIMEOUT_S
        with selectors.DefaultSelector() as sel:
            sel.register(self.status_fd, selectors.EVENT_READ, "status")
            sel.register(self.pidfd, selectors.EVENT_READ, "exit")
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AgentError(INTERNAL, "bash did not become ready in time")
                for key, _ in sel.select(remaining):
                    if key.data == "exit":
                        self.child.reap()
                        errors = self._pending_stderr()
                        raise AgentError(
                            SPAWN_FAILED,
                            f"bash exited while starting (returncode {self.child.returncode})"
                            + (f": {errors}" if errors else ""),
                        )
                    data = read_available(self.status_fd)
                    if data:
                        self.status_buf += data
                record = parse_status(self.status_buf)
                if record is not None:
                    self.cwd = record[1]
                    return

    def _pending_stderr(self) -> str:
        assert self.child is not None
        data = read_available(self.child.stderr) or b""
        return data.decode("utf-8", errors="replace").strip()[:500]

    def kill_tree(self) -> None:
        """SIGKILL the shell and everything it started, then reap the shell (bounded wait)."""
        child = self.child
        if child is None:
            return
        if child.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
        if self.manager.uses_markers:
            proctree.kill_marked(self.marker)
        if child.returncode is None and self.pidfd >= 0:
            with selectors.DefaultSelector() as sel:
                sel.register(self.pidfd, selectors.EVENT_READ)
                if sel.select(KILL_WAIT_S):
                    child.reap()

    def close(self) -> None:
        """Kill the tree and free the descriptors (now, or when the running Run lets go)."""
        self.closed = True
        self.kill_tree()
        self.wake()
        with self.cond:
            busy = self.busy
            self.busy = True
            self.cond.notify_all()
        if not busy:
            self.dispose()
        # else: the running Run disposes of the session when it lets go

    def dispose(self) -> None:
        with self._fd_lock:
            if self._disposed:
                return
            self._disposed = True
            if self.child is not None:
                self.child.close_pipes()
            for fd in (self.pidfd, self.status_fd, self.wake_r, self.wake_w):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            self.pidfd = self.status_fd = -1
            self.streams.clear()
        self.manager.release_marker(self.marker)

    # ---- one command ---------------------------------------------------------------

    def run(
        self, command: bytes, timeout_ms: int, cap: int, token: RunToken, env: Mapping[str, str]
    ) -> Iterator[shell_pb2.ShellEvent]:
        """Run one command (caller holds ``busy``): yield Output events, then ShellDone."""
        if self.broken is not None:
            raise SessionBroken(self.broken)
        if self.child is None:
            self.start(env)
        child = self.child
        assert child is not None
        loop = RunLoop(self, wrap_command(command), timeout_ms, cap, token)
        try:
            yield from loop.events()
            outcome = loop.outcome
            assert outcome is not None
            # Decided: from here on, the client leaving changes nothing about the session.
            token.finished = True
            if outcome.kind == "cancelled":
                self._abandon(CANCELLED_MESSAGE)
                return
            if outcome.kind == "timeout":
                self._abandon(timeout_message(timeout_ms))
            elif outcome.kind == "ended":
                self.broken = ended_message(child.reap())
            else:
                self.cwd = outcome.cwd
            yield from loop.drain()
            yield loop.done()
        except GeneratorExit:
            # Closed mid-command: the client went away.
            if not token.finished:
                token.finished = True
                self._abandon(CANCELLED_MESSAGE)
            raise
        except BaseException as exc:
            if not token.finished:
                token.finished = True
                self._abandon(f"the bash session failed ({exc!r}); the tool must be restarted")
            raise

    def _abandon(self, message: str) -> None:
        if self.broken is None:
            self.broken = message
        self.kill_tree()
