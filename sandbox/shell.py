"""Persistent bash sessions: the Shell service behind the ``bash`` tool.

One session is one ``bash --noprofile --norc`` started as the tool user, through the
same ``Launcher`` as Exec commands, with the same identity, minimal environment and
a marker group of its own (see ``proctree``), so killing the session kills its whole
tree: the shell, the running command and every background job, however detached.

How a command runs and how its end is detected (never by scraping output):

* bash's stdin is a control pipe from the agent; bash reads it as its script. Its
  stdout and stderr are pipes to the agent. While starting, the agent creates a FIFO
  in a private directory (made as the tool user, mode 0700) and has bash open it on
  fd ``STATUS_FD`` (``exec 63>fifo``); the agent holds the read end, and the FIFO is
  unlinked as soon as bash reports ready, so only bash holds the write end.
* Each command is sent as one line::

      builtin eval $'<command>' </dev/null 63>&-; { builtin printf '%d\\0%s\\0' "$?" "$PWD" >&63; } 2>/dev/null

  The command is quoted with ``$'...'`` (only ``\\``, ``'``, CR and LF escaped), so
  eval parses it on its own: a syntax error, an unbalanced quote or a here-document
  stays inside it, and ``break``/``continue``/``return`` have no loop or function to
  leave. It runs with stdin from /dev/null (a command that reads stdin gets EOF) and
  with the status fd closed, so nothing it prints, however much it looks like a
  prompt or a status record, can reach the agent's status channel; its exit status
  and the shell's ``$PWD`` come from that channel as ``code NUL cwd NUL``. bash puts
  the status fd back after eval even if the command closed or redirected fd 63.
* When the record arrives, the output already in the pipes is drained (non-blocking,
  until EAGAIN) and the Run ends. Output that background jobs write later, or that a
  process substitution writes after the command returned, stays in the pipe and
  arrives at the start of the next Run's output (the reference implementation does
  the same: its buffers accumulate between calls).

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

The shell's environment is the tool environment (as for Exec) plus the ``env`` of the
Run that starts it (or of the Restart). Background jobs (``cmd &``) keep running
between Runs; they die on Restart, Close, timeout, cancellation, or with the sandbox.
One command runs at a time per session: a second Run waits for the first (up to its
own timeout, then BUSY) before its own timeout starts. Sessions live as long as the
agent.

Known limits: the status channel keeps *output* from being mistaken for a status; a
process of the tool user that sets out to (say, by opening ``/proc/<bash>/fd/63``)
can still write a fake record, which confuses only its own session. The session
trusts bash's ``builtin``, ``eval`` and ``printf``: a command that defines a function
named ``builtin``, turns on POSIX mode, or lowers ``ulimit -n`` below 64 changes how
the wrapper line behaves (the session may then time out or end: restart it). With
``set -x`` the trace shows ``+ builtin eval '<command>'`` before the command's own.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import selectors
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import grpc
from google.protobuf.duration_pb2 import Duration

from sandbox import proctree
from sandbox.errors import BUSY, INTERNAL, INVALID_ARGUMENT, SESSION_BROKEN, SPAWN_FAILED, TOO_LARGE, AgentError, abort
from sandbox.execloop import read_available
from sandbox.identity import FsIdentity
from sandbox.launch import BASE_ENV, Child, DirectLauncher, Identity, Launcher, ToolUser
from sandbox.outputcap import HeadTailBuffer
from sandbox.spawner import SpawnerDied
from sandbox.v1 import process_pb2, shell_pb2, shell_pb2_grpc

DEFAULT_SESSION = "default"
DEFAULT_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 24 * 3600 * 1000
DEFAULT_OUTPUT_CAP = 1 << 20
MAX_COMMAND_BYTES = 4 << 20
MAX_SESSION_ID = 128
MAX_SESSIONS = 16
STATUS_FD = 63
"""Below 64 (the smallest nofile limit a sandbox may have) and above the 3-9 scripts use."""
BASH = ("bash", "--noprofile", "--norc")
"""Found on the tool environment's PATH; bash's messages then start with ``bash:`` as in a terminal."""
READY_TIMEOUT_S = 10.0
KILL_WAIT_S = 5.0
DRAIN_LIMIT = 4 << 20
"""At most this much is drained per stream once a command returned (a pipe holds 1 MiB)."""
MAX_STATUS_RECORD = 1 << 16
# Markers of shell sessions come from a range of their own, next to Exec's, so the two
# allocators can never hand out the same gid.
SHELL_MARKER_BASE = proctree.MARKER_BASE + proctree.MARKER_SPAN

_WRAPPER_TAIL = (
    f" </dev/null {STATUS_FD}>&-; "
    f"{{ builtin printf '%d\\0%s\\0' \"$?\" \"$PWD\" >&{STATUS_FD}; }} 2>/dev/null\n"
).encode()


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


def wrap_command(command: bytes) -> bytes:
    """The line that runs ``command`` through eval and reports ``code NUL cwd NUL`` on the status fd."""
    quoted = (
        command.replace(b"\\", b"\\\\").replace(b"'", b"\\'").replace(b"\n", b"\\n").replace(b"\r", b"\\r")
    )
    return b"builtin eval $'" + quoted + b"'" + _WRAPPER_TAIL


def parse_status(buffer: bytearray) -> tuple[int, str] | None:
    """Take one ``code NUL cwd NUL`` record off the front of ``buffer``; None until one is complete."""
    first = buffer.find(b"\0")
    if first < 0:
        return None
    second = buffer.find(b"\0", first + 1)
    if second < 0:
        return None
    code_text = bytes(buffer[:first])
    cwd = bytes(buffer[first + 1 : second]).decode("utf-8", errors="replace")
    del buffer[: second + 1]
    try:
        code = int(code_text)
    except ValueError:
        code = -1
    return code, cwd


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


@dataclass
class _Outcome:
    kind: str  # "status" | "ended" | "timeout" | "cancelled"
    code: int = 0
    cwd: str = ""


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
        manager = self.manager
        with manager.as_tool_user():
            private = tempfile.mkdtemp(prefix="callbox-shell-", dir=manager.runtime_dir)
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
        loop = _RunLoop(self, wrap_command(command), timeout_ms, cap, token)
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


class _RunLoop:
    """The selector loop of one command: pipes, status channel, shell exit, deadline, wake-ups."""

    def __init__(self, session: Session, line: bytes, timeout_ms: int, cap: int, token: RunToken) -> None:
        self.session = session
        assert session.child is not None
        self.child = session.child
        self.line = memoryview(line)
        self.token = token
        self.started = time.monotonic()
        self.ended_at: float | None = None
        self.deadline = self.started + timeout_ms / 1000
        self.buffers = {"stdout": HeadTailBuffer(cap), "stderr": HeadTailBuffer(cap)}
        self.seq = 0
        self.outcome: _Outcome | None = None

    def _output(self, stream: str, data: bytes, dropped_before: int = 0) -> shell_pb2.ShellEvent:
        event = shell_pb2.ShellEvent(
            output=process_pb2.Output(seq=self.seq, dropped_before=dropped_before, **{stream: data})
        )
        self.seq += 1
        return event

    def _feed(self, fd: int, data: bytes) -> Iterator[shell_pb2.ShellEvent]:
        stream = self.session.streams[fd]
        live = self.buffers[stream].feed(data)
        if live:
            yield self._output(stream, live)

    def events(self) -> Iterator[shell_pb2.ShellEvent]:
        session = self.session
        stdin = self.child.stdin
        assert stdin is not None
        os.set_blocking(stdin, False)
        with selectors.DefaultSelector() as sel:
            for fd in session.streams:
                sel.register(fd, selectors.EVENT_READ, "pipe")
            if session.status_fd >= 0:
                sel.register(session.status_fd, selectors.EVENT_READ, "status")
            sel.register(session.pidfd, selectors.EVENT_READ, "exit")
            sel.register(session.wake_r, selectors.EVENT_READ, "wake")
            sel.register(stdin, selectors.EVENT_WRITE, "stdin")
            while self.outcome is None:
                ready = sel.select(max(0.0, self.deadline - time.monotonic()))
                exited = False
                for key, _ in ready:
                    fd = int(key.fd)
                    if key.data == "pipe":
                        chunk = read_available(fd)
                        if chunk is None:
                            continue
                        if not chunk:  # every holder closed it (say, `exec >/dev/null` in the shell)
                            sel.unregister(fd)
                            del session.streams[fd]
                            continue
                        yield from self._feed(fd, chunk)
                    elif key.data == "status":
                        self._read_status(sel)
                    elif key.data == "exit":
                        exited = True
                    elif key.data == "stdin":
                        self._write_line(sel, stdin)
                    else:
                        with contextlib.suppress(BlockingIOError):
                            os.read(session.wake_r, 64)
                now = time.monotonic()
                if self.outcome is not None:
                    pass
                elif exited:
                    self.outcome = _Outcome("ended")
                elif self.token.cancelled:
                    self.outcome = _Outcome("cancelled")
                elif now >= self.deadline:
                    self.outcome = _Outcome("timeout")
                if self.outcome is not None:
                    self.ended_at = now

    def _read_status(self, sel: selectors.BaseSelector) -> None:
        session = self.session
        data = read_available(session.status_fd)
        if data is None:
            return
        if not data:
            # The status channel closed: bash exec'd another program or is exiting. No
            # record can come any more; wait for the process (or the deadline).
            sel.unregister(session.status_fd)
            os.close(session.status_fd)
            session.status_fd = -1
            return
        session.status_buf += data
        record = parse_status(session.status_buf)
        if record is not None:
            self.outcome = _Outcome("status", record[0], record[1])
        elif len(session.status_buf) > MAX_STATUS_RECORD:
            session.status_buf.clear()

    def _write_line(self, sel: selectors.BaseSelector, stdin: int) -> None:
        try:
            written = os.write(stdin, self.line[:65536])
            self.line = self.line[written:]
        except BlockingIOError:
            return
        except BrokenPipeError:
            self.line = self.line[:0]  # bash is gone; its pidfd reports it
        if not self.line:
            sel.unregister(stdin)

    def drain(self) -> Iterator[shell_pb2.ShellEvent]:
        """What the command left in the pipes (non-blocking, bounded), then the tails."""
        session = self.session
        for fd in list(session.streams):
            drained = 0
            while drained < DRAIN_LIMIT:
                chunk = read_available(fd)
                if not chunk:
                    if chunk is not None:
                        del session.streams[fd]
                    break
                drained += len(chunk)
                yield from self._feed(fd, chunk)
        for stream, buffer in self.buffers.items():
            tail, dropped = buffer.finish()
            if tail or dropped:
                yield self._output(stream, tail, dropped_before=dropped)

    def done(self) -> shell_pb2.ShellEvent:
        outcome = self.outcome
        assert outcome is not None
        duration = Duration()
        duration.FromNanoseconds(int(((self.ended_at or time.monotonic()) - self.started) * 1e9))
        stats = {
            name: process_pb2.StreamStats(total_bytes=b.total, dropped_bytes=b.dropped)
            for name, b in self.buffers.items()
        }
        done = shell_pb2.ShellDone(
            duration=duration, stdout=stats["stdout"], stderr=stats["stderr"],
            timed_out=outcome.kind == "timeout",
        )
        if outcome.kind == "status":
            done.exit_code = outcome.code
            done.cwd = outcome.cwd
        elif outcome.kind == "ended":
            code = self.child.returncode
            assert code is not None
            done.session_ended = True
            done.exit_code = code if code >= 0 else -1
            done.signal = -code if code < 0 else 0
        else:
            done.exit_code = -1
        return shell_pb2.ShellEvent(done=done)


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
        self.launcher: Launcher = launcher or DirectLauncher()
        self.max_sessions = max_sessions
        self.runtime_dir = runtime_dir or tempfile.gettempdir()
        root = os.geteuid() == 0
        # The status FIFO is made as the tool user (the agent has no CAP_DAC_OVERRIDE).
        self.fs_identity = FsIdentity(user.uid, user.gid) if user is not None and root else None
        # Only root can give a process the marker group; elsewhere only the group is killed.
        self.uses_markers = user is not None or root
        self._lock = threading.Lock()
        self._sessions: dict[str, Session] = {}
        self._markers: set[int] = set()

    def as_tool_user(self) -> contextlib.AbstractContextManager[None]:
        """File operations as the tool user (in the container), else as this process."""
        return self.fs_identity.acting() if self.fs_identity is not None else contextlib.nullcontext()

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
        timeout_ms = request.timeout_ms or DEFAULT_TIMEOUT_MS
        if timeout_ms > MAX_TIMEOUT_MS:
            raise AgentError(
                INVALID_ARGUMENT, f"timeout_ms must be at most {MAX_TIMEOUT_MS}"
            )
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
            marker = SHELL_MARKER_BASE + secrets.randbelow(proctree.MARKER_SPAN)
            if marker not in self._markers:
                self._markers.add(marker)
                return Session(self, session_id, marker)

    def release_marker(self, marker: int) -> None:
        with self._lock:
            self._markers.discard(marker)

    def _identity(self, marker: int) -> Identity:
        if self.user is not None:
            return Identity(self.user.uid, self.user.gid, [self.user.gid, marker])
        if os.geteuid() == 0:
            return Identity(None, None, [*os.getgroups(), marker])
        return Identity(None, None, None)

    def launch(self, marker: int, extra_env: Mapping[str, str]) -> Child:
        env = self.user.environment() if self.user else dict(BASE_ENV)
        env.update(extra_env)
        try:
            return self.launcher.launch(list(BASH), self.workspace, env, self._identity(marker), with_stdin=True)
        except FileNotFoundError:
            raise AgentError(SPAWN_FAILED, f"{BASH[0]}: command not found") from None
        except PermissionError:
            raise AgentError(SPAWN_FAILED, f"{BASH[0]}: permission denied") from None
        except BlockingIOError:
            raise AgentError(
                BUSY,
                "cannot start bash: the sandbox's process limit is reached; retry when processes exit",
            ) from None
        except SpawnerDied as exc:
            raise AgentError(INTERNAL, f"cannot start bash: {exc}") from None
        except OSError as exc:
            raise AgentError(SPAWN_FAILED, f"bash: {exc.strerror or exc}") from None


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
        def on_start(token: RunToken) -> None:
            # Fires when the RPC ends for any reason; after the command returned it is a no-op.
            context.add_callback(token.cancel)

        try:
            yield from self.manager.run(request, on_start)
        except AgentError as error:
            abort(context, error)

    def Restart(
        self, request: shell_pb2.ShellRestartRequest, context: grpc.ServicerContext
    ) -> shell_pb2.ShellRestartResponse:
        try:
            pid, cwd = self.manager.restart(request.session_id, request.env)
        except AgentError as error:
            abort(context, error)
        return shell_pb2.ShellRestartResponse(pid=pid, cwd=cwd)

    def Close(
        self, request: shell_pb2.ShellCloseRequest, context: grpc.ServicerContext
    ) -> shell_pb2.ShellCloseResponse:
        try:
            return shell_pb2.ShellCloseResponse(closed=self.manager.close(request.session_id))
        except AgentError as error:
            abort(context, error)
