"""Commands of the Process service: validate, start, track by exec id, clean up.

Each command runs as the tool user in a new session, tagged with a unique marker
group (see ``proctree``), and is driven by its own ``ExecLoop``. A non-zero exit is
data, not an error; a command that cannot start is an ``AgentError``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.errors import AgentError
from sandbox.execloop import DEFAULT_OUTPUT_CAP, ExecLoop
from sandbox.launch import BASE_ENV, Child, Launcher, ToolUser
from sandbox.shells import command_shell
from sandbox.toolstart import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, ToolStarter, checked_timeout_ms
from sandbox.v1 import errors_pb2, process_pb2

__all__ = ["BASE_ENV", "DEFAULT_TIMEOUT_MS", "MAX_BUFFERED_OUTPUT_CAP", "MAX_TIMEOUT_MS", "Execution", "ProcessRunner",
           "ToolUser"]


@dataclass
class Execution:
    """A running command: what Signal and cancellation act on."""

    exec_id: str
    marker: int
    wake_r: int
    wake_w: int
    child: Child | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    keep_stdin_open: bool = False
    _fd_lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False
    # Stdin written by WriteStdin, not yet taken by the loop; guarded by _fd_lock.
    _stdin_queue: list[bytes] = field(default_factory=list)
    _stdin_queued: int = 0
    _stdin_close: bool = False
    # Bytes the loop holds and has not yet written to the pipe (the loop sets it).
    stdin_unwritten: int = 0

    def _wake(self) -> None:
        """Wake the loop; the caller holds _fd_lock."""
        if not self._closed:
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"x")

    def cancel(self) -> None:
        """Ask the loop to kill the command (called from gRPC's callback thread)."""
        self.cancelled.set()
        with self._fd_lock:
            self._wake()

    def feed_stdin(self, data: bytes, close: bool) -> int:
        """Queue ``data`` for the command's stdin (and its close); return the bytes pending."""
        with self._fd_lock:
            if not self.keep_stdin_open:
                raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT,
                                 f"exec {self.exec_id!r} was not started with keep_stdin_open")
            if self._stdin_close:
                raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT,
                                 f"the stdin of exec {self.exec_id!r} is already closed")
            pending = self._stdin_queued + self.stdin_unwritten + len(data)
            if pending > MAX_PENDING_STDIN:
                raise AgentError(errors_pb2.ERROR_REASON_BUSY,
                                 f"{pending} bytes would be pending for the stdin of exec {self.exec_id!r} "
                                 f"(at most {MAX_PENDING_STDIN}); retry once the command reads its input")
            if data:
                self._stdin_queue.append(data)
                self._stdin_queued += len(data)
            self._stdin_close = close
            self._wake()
            return pending

    def take_stdin(self) -> tuple[bytes, bool]:
        """What WriteStdin queued since the last take, and whether stdin is to be closed after it."""
        with self._fd_lock:
            data = b"".join(self._stdin_queue)
            self._stdin_queue.clear()
            self._stdin_queued = 0
            self.stdin_unwritten += len(data)
            return data, self._stdin_close

    def signal_all(self, signum: int) -> int:
        """Signal every process carrying the marker (or, without one, the leader's group)."""
        delivered = proctree.signal_marked(self.marker, signum)
        if delivered == 0 and self.child is not None:
            try:
                os.killpg(self.child.pid, signum)
                delivered = 1
            except (ProcessLookupError, PermissionError):
                pass
        return delivered

    def kill_all(self) -> None:
        """SIGKILL the leader's process group and every process carrying the marker."""
        if self.child is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.child.pid, signal.SIGKILL)
        proctree.kill_marked(self.marker)

    def close_wake_pipe(self) -> None:
        with self._fd_lock:
            self._closed = True
            os.close(self.wake_r)
            os.close(self.wake_w)


MAX_PENDING_STDIN = 16 << 20
"""At most this much WriteStdin data may wait for a command to read it."""

MAX_BUFFERED_OUTPUT_CAP = 16 << 20
"""The largest ``output_cap_bytes`` ExecBuffered takes: two streams' kept bytes in one answer,
well within the agent's message limit."""


def _new_exec_id() -> str:
    """32 random hex digits, the shape of ``uuid.uuid4().hex`` (the uuid module, which nothing
    else in the agent needs, costs milliseconds of start-up to import)."""
    return os.urandom(16).hex()


class ProcessRunner:
    """Starts commands and tracks the live ones by exec id."""

    def __init__(
        self, user: ToolUser | None, workspace: str, max_concurrent: int = 32, launcher: Launcher | None = None
    ) -> None:
        self.user = user
        self.workspace = workspace
        self.max_concurrent = max_concurrent
        self.starter = ToolStarter(user, launcher)
        self._markers = proctree.MarkerAllocator()
        self._lock = threading.Lock()
        self._live: dict[str, Execution] = {}
        self._stopping: str | None = None
        self._wrap_window = proctree.wrap_window()

    # ---- public API -------------------------------------------------------------

    def signal(self, exec_id: str, signum: int) -> int:
        if signum not in {s.value for s in signal.Signals}:
            raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT, f"{signum} is not a signal number")
        with self._lock:
            execution = self._live.get(exec_id)
        if execution is None:
            raise AgentError(
                errors_pb2.ERROR_REASON_NO_SUCH_PROCESS, f"no running command has exec id {exec_id!r}"
            )
        return execution.signal_all(signum)

    def write_stdin(self, exec_id: str, data: bytes, close: bool) -> int:
        """Queue stdin for a running command started with keep_stdin_open; the bytes pending."""
        with self._lock:
            execution = self._live.get(exec_id)
        if execution is None:
            raise AgentError(
                errors_pb2.ERROR_REASON_NO_SUCH_PROCESS, f"no running command has exec id {exec_id!r}"
            )
        return execution.feed_stdin(data, close)

    def cancel_all(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for execution in live:
            execution.cancel()

    def stop(self, why: str) -> None:
        """The agent is stopping: kill every command and refuse new ones. The calls of the
        killed commands end with an UNAVAILABLE error saying ``why`` instead of an Exited
        that would pass for the command's own SIGKILL."""
        with self._lock:
            self._stopping = why
        self.cancel_all()

    def run(
        self, request: process_pb2.ExecRequest, on_start: Callable[[Execution], None] | None = None
    ) -> Iterator[process_pb2.ExecEvent]:
        """Run the request's command and yield Started, Output..., Exited."""
        argv = self._argv(request)
        # Whether the working directory exists and may be entered is the child's chdir to
        # tell, made with the tool user's permissions (see _spawn), not the agent's.
        cwd = request.cwd or self.workspace
        timeout_ms = checked_timeout_ms(request.timeout_ms)
        execution = self._register(request.exec_id or _new_exec_id(), request.keep_stdin_open)
        swept = False
        try:
            oom_before = oom_kill_count()
            started_at = time.monotonic()
            child = execution.child = self._spawn(request, argv, cwd, execution.marker)
            if on_start is not None:
                on_start(execution)
            yield process_pb2.ExecEvent(started=process_pb2.Started(pid=child.pid, exec_id=execution.exec_id))
            loop = ExecLoop(request, execution, started_at, timeout_ms, self._wrap_window)
            yield from loop.events()
            swept = loop.swept
            if self._stopping is not None and execution.cancelled.is_set():
                raise self._stopping_error()
            yield loop.exited(oom_before)
        finally:
            self._finish(execution, swept)

    def run_buffered(
        self, request: process_pb2.ExecRequest, on_start: Callable[[Execution], None] | None = None
    ) -> process_pb2.ExecEvents:
        """Run the request's command to its end; its Started, Output... and Exited in one message.

        Both streams' kept bytes (each at most ``output_cap_bytes``) must fit in one message,
        so a larger cap is refused, naming Exec, which streams."""
        cap = request.output_cap_bytes or DEFAULT_OUTPUT_CAP
        if cap > MAX_BUFFERED_OUTPUT_CAP:
            raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT,
                             f"output_cap_bytes {cap} is over the {MAX_BUFFERED_OUTPUT_CAP} that ExecBuffered "
                             "answers in one message; use Exec, which streams the output")
        answer = process_pb2.ExecEvents()
        answer.events.extend(self.run(request, on_start))
        return answer

    # ---- internals --------------------------------------------------------------

    def _register(self, exec_id: str, keep_stdin_open: bool) -> Execution:
        """Reserve the exec id and a marker, atomically with the checks."""
        with self._lock:
            if self._stopping is not None:
                raise self._stopping_error()
            if len(self._live) >= self.max_concurrent:
                raise AgentError(
                    errors_pb2.ERROR_REASON_BUSY,
                    f"{self.max_concurrent} commands are already running in this sandbox",
                )
            if exec_id in self._live:
                raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT, f"exec id {exec_id!r} is already running")
            wake_r, wake_w = os.pipe2(os.O_CLOEXEC)
            execution = Execution(exec_id, self._markers.acquire(), wake_r, wake_w,
                                  keep_stdin_open=keep_stdin_open)
            self._live[exec_id] = execution
            return execution

    def _stopping_error(self) -> AgentError:
        return AgentError(errors_pb2.ERROR_REASON_UNSPECIFIED,
                          f"the sandbox is stopping ({self._stopping}); the command was killed",
                          code=grpc.StatusCode.UNAVAILABLE)

    def _finish(self, execution: Execution, swept: bool) -> None:
        child = execution.child
        if child is not None and child.returncode is None:
            execution.kill_all()
            child.reap()
        elif not swept:
            execution.kill_all()
        if child is not None:
            child.close_pipes()
        with self._lock:
            self._live.pop(execution.exec_id, None)
            self._markers.release(execution.marker)
        execution.close_wake_pipe()

    @staticmethod
    def _argv(request: process_pb2.ExecRequest) -> list[str]:
        which = request.WhichOneof("command")
        if which == "shell":
            return [command_shell(), "-c", request.shell]
        if which == "argv" and request.argv.args:
            if any("\0" in a for a in request.argv.args):
                raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT, "argv contains a NUL byte")
            return list(request.argv.args)
        raise AgentError(
            errors_pb2.ERROR_REASON_INVALID_ARGUMENT, "the request has neither argv nor a shell command"
        )

    def _spawn(self, request: process_pb2.ExecRequest, argv: list[str], cwd: str, marker: int) -> Child:
        with_stdin = bool(request.stdin) or request.keep_stdin_open
        return self.starter.start(argv, cwd, request.env, marker, with_stdin=with_stdin)
