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
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.errors import AgentError
from sandbox.execloop import ExecLoop
from sandbox.launch import BASE_ENV, Child, Launcher, ToolUser
from sandbox.toolstart import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, ToolStarter, checked_timeout_ms
from sandbox.v1 import errors_pb2, process_pb2

__all__ = ["BASE_ENV", "DEFAULT_TIMEOUT_MS", "MAX_TIMEOUT_MS", "Execution", "ProcessRunner", "ToolUser"]


@dataclass
class Execution:
    """A running command: what Signal and cancellation act on."""

    exec_id: str
    marker: int
    wake_r: int
    wake_w: int
    child: Child | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    _fd_lock: threading.Lock = field(default_factory=threading.Lock)
    _closed: bool = False

    def cancel(self) -> None:
        """Ask the loop to kill the command (called from gRPC's callback thread)."""
        self.cancelled.set()
        with self._fd_lock:
            if self._closed:
                return
            with contextlib.suppress(OSError):
                os.write(self.wake_w, b"x")

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
        execution = self._register(request.exec_id or uuid.uuid4().hex)
        swept = False
        try:
            oom_before = oom_kill_count()
            started_at = time.monotonic()
            child = execution.child = self._spawn(request, argv, cwd, execution.marker)
            if on_start is not None:
                on_start(execution)
            yield process_pb2.ExecEvent(started=process_pb2.Started(pid=child.pid, exec_id=execution.exec_id))
            loop = ExecLoop(request, execution, started_at, timeout_ms)
            yield from loop.events()
            swept = loop.swept
            if self._stopping is not None and execution.cancelled.is_set():
                raise self._stopping_error()
            yield loop.exited(oom_before)
        finally:
            self._finish(execution, swept)

    # ---- internals --------------------------------------------------------------

    def _register(self, exec_id: str) -> Execution:
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
            execution = Execution(exec_id, self._markers.acquire(), wake_r, wake_w)
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
            return ["/bin/bash", "-c", request.shell]
        if which == "argv" and request.argv.args:
            if any("\0" in a for a in request.argv.args):
                raise AgentError(errors_pb2.ERROR_REASON_INVALID_ARGUMENT, "argv contains a NUL byte")
            return list(request.argv.args)
        raise AgentError(
            errors_pb2.ERROR_REASON_INVALID_ARGUMENT, "the request has neither argv nor a shell command"
        )

    def _spawn(self, request: process_pb2.ExecRequest, argv: list[str], cwd: str, marker: int) -> Child:
        return self.starter.start(argv, cwd, request.env, marker, with_stdin=bool(request.stdin))
