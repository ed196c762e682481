"""Run one command in its own session, stream its output, and kill its whole tree.

Each command runs as the tool user in a new session, tagged with a unique marker
group (see ``proctree``). The agent waits on the leader's pidfd, both pipes and a
wake-up pipe in one selector loop, so output streams as it arrives and the deadline
is checked without polling. On timeout it sends SIGTERM to every marked process,
then SIGKILL after the grace; when the leader exits, whatever it left behind is
killed too (nothing outlives its call). A non-zero exit is data, not an error.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from google.protobuf.duration_pb2 import Duration

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.errors import AgentError
from sandbox.outputcap import HeadTailBuffer
from sandbox.v1 import errors_pb2, process_pb2

DEFAULT_TIMEOUT_MS = 30_000
DEFAULT_OUTPUT_CAP = 1 << 20
DEFAULT_KILL_GRACE_MS = 500
MAX_TIMEOUT_MS = 24 * 3600 * 1000
READ_CHUNK = 256 * 1024
# After the leader exits and its leftovers are killed, wait at most this long for the
# pipes to close (a process of another command could hold a duplicated descriptor).
DRAIN_LIMIT_S = 2.0

BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "TERM": "dumb",
}


@dataclass(frozen=True)
class ToolUser:
    """Who tool processes run as, and their environment defaults."""

    uid: int
    gid: int
    home: str
    name: str = "sandbox"

    def environment(self) -> dict[str, str]:
        return {**BASE_ENV, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}


@dataclass
class Execution:
    """A running command: what Signal and cancellation act on."""

    exec_id: str
    marker: int
    proc: subprocess.Popen[bytes]
    wake_w: int
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

    def close_wake_pipe(self, wake_r: int) -> None:
        with self._fd_lock:
            self._closed = True
            os.close(wake_r)
            os.close(self.wake_w)


class ProcessRunner:
    """Starts commands and tracks the live ones by exec id."""

    def __init__(self, user: ToolUser | None, workspace: str, max_concurrent: int = 64) -> None:
        self.user = user
        self.workspace = workspace
        self.max_concurrent = max_concurrent
        self._markers = proctree.MarkerAllocator()
        self._lock = threading.Lock()
        self._live: dict[str, Execution] = {}

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
        return proctree.signal_marked(execution.marker, signum)

    def cancel_all(self) -> None:
        with self._lock:
            live = list(self._live.values())
        for execution in live:
            execution.cancel()

    def run(
        self, request: process_pb2.ExecRequest, on_start: Callable[[Execution], None] | None = None
    ) -> Iterator[process_pb2.ExecEvent]:
        """Run the request's command and yield Started, Output..., Exited."""
        argv = self._argv(request)
        cwd = request.cwd or self.workspace
        if not os.path.isdir(cwd):
            raise AgentError(
                errors_pb2.ERROR_REASON_SPAWN_FAILED, f"working directory {cwd} does not exist"
            )
        timeout_ms = request.timeout_ms or DEFAULT_TIMEOUT_MS
        if timeout_ms > MAX_TIMEOUT_MS:
            raise AgentError(
                errors_pb2.ERROR_REASON_INVALID_ARGUMENT, f"timeout_ms must be at most {MAX_TIMEOUT_MS}"
            )
        exec_id = request.exec_id or uuid.uuid4().hex
        env = self.user.environment() if self.user else dict(BASE_ENV)
        env.update(request.env)
        marker = self._markers.acquire()
        try:
            yield from self._run(request, argv, cwd, env, exec_id, marker, timeout_ms, on_start)
        finally:
            proctree.kill_marked(marker)
            self._markers.release(marker)

    # ---- internals --------------------------------------------------------------

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

    def _spawn(
        self, argv: list[str], cwd: str, env: Mapping[str, str], marker: int, with_stdin: bool
    ) -> subprocess.Popen[bytes]:
        ids: dict[str, object] = {}
        if self.user is not None:
            ids = {"user": self.user.uid, "group": self.user.gid, "extra_groups": [self.user.gid, marker]}
        else:
            ids = {"extra_groups": [*os.getgroups(), marker]} if os.geteuid() == 0 else {}
        try:
            return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
                argv,
                stdin=subprocess.PIPE if with_stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=dict(env),
                start_new_session=True,
                close_fds=True,
                **ids,
            )
        except FileNotFoundError:
            raise AgentError(
                errors_pb2.ERROR_REASON_SPAWN_FAILED, f"{argv[0]}: command not found"
            ) from None
        except PermissionError:
            raise AgentError(
                errors_pb2.ERROR_REASON_SPAWN_FAILED, f"{argv[0]}: permission denied"
            ) from None
        except BlockingIOError:
            raise AgentError(
                errors_pb2.ERROR_REASON_BUSY,
                f"cannot start {argv[0]}: the sandbox's process limit is reached; retry when processes exit",
            ) from None
        except OSError as exc:
            raise AgentError(
                errors_pb2.ERROR_REASON_SPAWN_FAILED, f"{argv[0]}: {exc.strerror or exc}"
            ) from None

    def _run(
        self,
        request: process_pb2.ExecRequest,
        argv: list[str],
        cwd: str,
        env: Mapping[str, str],
        exec_id: str,
        marker: int,
        timeout_ms: int,
        on_start: Callable[[Execution], None] | None,
    ) -> Iterator[process_pb2.ExecEvent]:
        with self._lock:
            if len(self._live) >= self.max_concurrent:
                raise AgentError(
                    errors_pb2.ERROR_REASON_BUSY,
                    f"{self.max_concurrent} commands are already running in this sandbox",
                )
            if exec_id in self._live:
                raise AgentError(
                    errors_pb2.ERROR_REASON_INVALID_ARGUMENT, f"exec id {exec_id!r} is already running"
                )
        oom_before = oom_kill_count()
        started_at = time.monotonic()
        proc = self._spawn(argv, cwd, env, marker, with_stdin=bool(request.stdin))
        wake_r, wake_w = os.pipe()
        execution = Execution(exec_id=exec_id, marker=marker, proc=proc, wake_w=wake_w)
        with self._lock:
            self._live[exec_id] = execution
        try:
            if on_start is not None:
                on_start(execution)
            yield process_pb2.ExecEvent(started=process_pb2.Started(pid=proc.pid, exec_id=exec_id))
            loop = _ExecLoop(request, execution, wake_r, started_at, timeout_ms)
            yield from loop.events()
            yield loop.exited(oom_before)
        finally:
            with self._lock:
                self._live.pop(exec_id, None)
            execution.close_wake_pipe(wake_r)
            for stream in (proc.stdin, proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
            if proc.returncode is None:
                proctree.kill_marked(marker)
                proc.wait()


class _ExecLoop:
    """The selector loop of one command: pipes, leader exit, deadline, cancellation."""

    def __init__(
        self,
        request: process_pb2.ExecRequest,
        execution: Execution,
        wake_r: int,
        started_at: float,
        timeout_ms: int,
    ) -> None:
        cap = request.output_cap_bytes or DEFAULT_OUTPUT_CAP
        self.execution = execution
        self.proc = execution.proc
        self.wake_r = wake_r
        self.started_at = started_at
        self.deadline = started_at + timeout_ms / 1000
        self.grace = (request.kill_grace_ms or DEFAULT_KILL_GRACE_MS) / 1000
        self.kill_at: float | None = None
        self.drain_until: float | None = None
        self.timed_out = False
        self.buffers = {"stdout": HeadTailBuffer(cap), "stderr": HeadTailBuffer(cap)}
        self.stdin_data = memoryview(request.stdin)
        self.seq = 0
        self.ended_at: float | None = None

    def _output(self, stream: str, data: bytes, dropped_before: int = 0) -> process_pb2.ExecEvent:
        event = process_pb2.ExecEvent(
            output=process_pb2.Output(seq=self.seq, dropped_before=dropped_before, **{stream: data})
        )
        self.seq += 1
        return event

    def events(self) -> Iterator[process_pb2.ExecEvent]:
        proc = self.proc
        sel = selectors.DefaultSelector()
        assert proc.stdout is not None and proc.stderr is not None
        streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, "pipe")
        pidfd = os.pidfd_open(proc.pid)
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if proc.stdin is not None:
            os.set_blocking(proc.stdin.fileno(), False)
            sel.register(proc.stdin.fileno(), selectors.EVENT_WRITE, "stdin")
        try:
            while streams or proc.returncode is None:
                timeout = self._next_timeout()
                ready = sel.select(timeout)
                now = time.monotonic()
                for key, _ in ready:
                    if key.data == "pipe":
                        fd = int(key.fd)
                        chunk = self._read(fd)
                        if chunk is None:
                            continue
                        if not chunk:
                            sel.unregister(fd)
                            del streams[fd]
                            continue
                        live = self.buffers[streams[fd]].feed(chunk)
                        if live:
                            yield self._output(streams[fd], live)
                    elif key.data == "exit":
                        sel.unregister(pidfd)
                        proc.wait()
                        self.ended_at = now
                        # Nothing outlives its call: kill what the leader left behind.
                        proctree.kill_marked(self.execution.marker)
                        self.drain_until = now + DRAIN_LIMIT_S
                    elif key.data == "stdin":
                        self._write_stdin(sel)
                    elif key.data == "wake":
                        os.read(self.wake_r, 64)
                if self.execution.cancelled.is_set():
                    proctree.kill_marked(self.execution.marker)
                self._enforce_deadline(now)
                if self.drain_until is not None and now >= self.drain_until and proc.returncode is not None:
                    break
            yield from self._tails()
        finally:
            sel.close()
            os.close(pidfd)

    def _read(self, fd: int) -> bytes | None:
        try:
            return os.read(fd, READ_CHUNK)
        except BlockingIOError:
            return None

    def _write_stdin(self, sel: selectors.BaseSelector) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        try:
            written = os.write(stdin.fileno(), self.stdin_data[:65536])
            self.stdin_data = self.stdin_data[written:]
        except BlockingIOError:
            return
        except BrokenPipeError:
            self.stdin_data = self.stdin_data[:0]
        if not self.stdin_data:
            sel.unregister(stdin.fileno())
            stdin.close()

    def _next_timeout(self) -> float:
        now = time.monotonic()
        targets = [t for t in (self.deadline, self.kill_at, self.drain_until) if t is not None]
        if self.proc.returncode is not None:
            targets = [t for t in (self.drain_until,) if t is not None]
        return max(0.0, min(targets) - now) if targets else 1.0

    def _enforce_deadline(self, now: float) -> None:
        if self.proc.returncode is not None:
            return
        if not self.timed_out and now >= self.deadline:
            self.timed_out = True
            proctree.signal_marked(self.execution.marker, signal.SIGTERM)
            self.kill_at = now + self.grace
        elif self.kill_at is not None and now >= self.kill_at:
            proctree.kill_marked(self.execution.marker)
            self.kill_at = None

    def _tails(self) -> Iterator[process_pb2.ExecEvent]:
        for stream, buffer in self.buffers.items():
            tail, dropped = buffer.finish()
            if tail or dropped:
                yield self._output(stream, tail, dropped_before=dropped)

    def exited(self, oom_before: int | None) -> process_pb2.ExecEvent:
        code = self.proc.returncode
        assert code is not None
        ended = self.ended_at or time.monotonic()
        signum = -code if code < 0 else 0
        oom_after = oom_kill_count()
        # The leader itself, or a child whose death the shell reports as 128 + 9.
        killed = signum == signal.SIGKILL or code == 128 + signal.SIGKILL
        oom = (
            killed
            and not self.timed_out
            and oom_before is not None
            and oom_after is not None
            and oom_after > oom_before
        )
        duration = Duration()
        duration.FromNanoseconds(int((ended - self.started_at) * 1e9))
        stats = {
            name: process_pb2.StreamStats(total_bytes=b.total, dropped_bytes=b.dropped)
            for name, b in self.buffers.items()
        }
        return process_pb2.ExecEvent(
            exited=process_pb2.Exited(
                exit_code=code if code >= 0 else -1,
                signal=signum,
                timed_out=self.timed_out,
                oom_killed=oom,
                duration=duration,
                stdout=stats["stdout"],
                stderr=stats["stderr"],
            )
        )
