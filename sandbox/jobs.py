"""Background jobs: detached processes with a replayable output ring buffer (sandbox.v1.Jobs).

A job starts like an Exec command (as the tool user, or as root when the request says
``as_root``; in its own session, through the same
``ToolStarter`` and launcher) with a marker group of its own, so Signal and Kill reach
every process it started however it forked. It is detached from the RPC that started it:
it runs until its leader exits (what it left behind is then killed, as for an Exec, but
for a job started with ``keep_leftovers``, whose leftovers live on with the sandbox), it
is killed, or the agent stops. Its output goes to a ``JobLog`` (see ``joblog``) that any
number of Attach and Terminal streams read at their own pace; the process I/O of every
job is driven by one thread (see ``jobloop``).

Limits: ``MAX_RUNNING`` jobs at a time (BUSY beyond); ``MAX_ENDED`` ended jobs remembered
(the oldest forgotten first); the buffers of remembered jobs reserve at most
``MAX_TOTAL_BUFFER`` bytes together (a running job its whole buffer, an ended one what it
holds): ended jobs are forgotten to make room, and a start that still does not fit is BUSY.
"""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import termios
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping

import grpc

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.errors import BUSY, INTERNAL, INVALID_ARGUMENT, NO_SUCH_PROCESS, AgentError, Cancellable, answer, stream
from sandbox.identity import FsIdentity
from sandbox.joblog import MIN_CAPACITY, JobLog
from sandbox.jobloop import RUNNING, Job, JobLoop, no_such_job
from sandbox.jobterm import follow_log, terminal_events
from sandbox.launch import Launcher, ToolUser
from sandbox.shells import command_shell
from sandbox.toolstart import ToolStarter
from sandbox.v1 import jobs_pb2, jobs_pb2_grpc

MAX_RUNNING = 64
MAX_ENDED = 256
DEFAULT_BUFFER = 1 << 20
MAX_BUFFER = 64 << 20
MAX_TOTAL_BUFFER = 128 << 20
MAX_TAG = 256
DEFAULT_ROWS, DEFAULT_COLS = 24, 80
MAX_WINDOW = 0xFFFF
PTY_TERM = "xterm-256color"
"""TERM of a PTY job unless its request sets one (other jobs get the tool environment's)."""
MAX_STREAMS = 16
"""Attach and Terminal streams open at once (each holds an RPC thread of the agent's)."""
KILL_WAIT_S = 10.0
JOB_MARKER_BASE = proctree.MARKER_BASE + 2 * proctree.MARKER_SPAN
"""Jobs' marker groups: a range of their own, apart from Exec's and the bash sessions'."""


def _checked_env(env: Mapping[str, str]) -> dict[str, str]:
    for name, value in env.items():
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise AgentError(INVALID_ARGUMENT, f"environment variable {name!r} is not valid (empty name, '=' or NUL)")
    return dict(env)


def _window(rows: int, cols: int) -> bytes:
    if rows > MAX_WINDOW or cols > MAX_WINDOW:
        raise AgentError(INVALID_ARGUMENT, f"a terminal has at most {MAX_WINDOW} rows and columns")
    return struct.pack("HHHH", rows or DEFAULT_ROWS, cols or DEFAULT_COLS, 0, 0)


class JobManager:
    """Starts and tracks the sandbox's background jobs."""

    def __init__(self, user: ToolUser | None, workspace: str, launcher: Launcher | None = None) -> None:
        self.user = user
        self.workspace = workspace
        self.starter = ToolStarter(user, launcher)
        self._lock = threading.Lock()
        self._jobs: OrderedDict[int, Job] = OrderedDict()
        self._reserved: dict[Job, int] = {}
        self._starting = 0
        self._starting_bytes = 0
        self._starting_markers: set[int] = set()
        self._leftover_markers: set[int] = set()
        """Markers of ended jobs whose leftovers live on: never given to another job, whose
        end would kill them."""
        self._stopping: str | None = None
        self._streams = 0
        self._loop = JobLoop(self._ended)

    # ---- start ----------------------------------------------------------------------

    def start(self, request: jobs_pb2.JobStartRequest) -> Job:
        argv, command = self._command(request)
        env = _checked_env(request.env)
        capacity = request.buffer_bytes or DEFAULT_BUFFER
        if not MIN_CAPACITY <= capacity <= MAX_BUFFER:
            raise AgentError(INVALID_ARGUMENT, f"buffer_bytes must be between {MIN_CAPACITY} and {MAX_BUFFER}")
        if len(request.tag) > MAX_TAG:
            raise AgentError(INVALID_ARGUMENT, f"a tag is at most {MAX_TAG} characters")
        window = _window(request.rows, request.cols)
        marker = self._reserve(capacity)
        master: int | None = None
        slave: int | None = None
        try:
            oom_before = oom_kill_count()
            cwd = request.cwd or self.workspace
            if request.pty:
                master, slave = self._open_pty()
                fcntl.ioctl(master, termios.TIOCSWINSZ, window)
                env.setdefault("TERM", PTY_TERM)
                child = self.starter.start(argv, cwd, env, marker, with_stdin=True, terminal=slave,
                                           as_root=request.as_root)
            else:
                child = self.starter.start(argv, cwd, env, marker, with_stdin=request.stdin,
                                           as_root=request.as_root)
        except BaseException:
            if master is not None:
                os.close(master)
            with self._lock:
                self._unreserve(capacity, marker)
            raise
        finally:
            if slave is not None:
                os.close(slave)
        job = Job(child, marker, JobLog(capacity, hold=request.hold_output), command=command, tag=request.tag,
                  master=master, accepts_input=request.stdin, oom_before=oom_before,
                  keep_leftovers=request.keep_leftovers)
        with self._lock:
            self._unreserve(capacity, marker)
            old = self._jobs.pop(job.pid, None)  # an ended job whose pid was reused
            if old is not None:
                self._reserved.pop(old, None)
            self._jobs[job.pid] = job
            self._reserved[job] = capacity
            stopping = self._stopping is not None
        self._loop.add(job)
        if stopping:  # stop began while it started and did not see it
            job.kill_all()
        return job

    def _command(self, request: jobs_pb2.JobStartRequest) -> tuple[list[str], list[str]]:
        """What to execute, and the command as List shows it."""
        which = request.WhichOneof("command")
        if which == "shell":
            if "\0" in request.shell:
                raise AgentError(INVALID_ARGUMENT, "the shell command contains a NUL byte")
            shell = command_shell()
            return [shell, "-c", request.shell], [os.path.basename(shell), "-c", request.shell]
        if which == "argv" and request.argv.args:
            if any("\0" in a for a in request.argv.args):
                raise AgentError(INVALID_ARGUMENT, "argv contains a NUL byte")
            return list(request.argv.args), list(request.argv.args)
        raise AgentError(INVALID_ARGUMENT, "the request has neither argv nor a shell command")

    def _open_pty(self) -> tuple[int, int]:
        """A new pseudo-terminal; its slave side belongs to the tool user (devpts gives it the
        opener's filesystem uid), so programs that reopen it by name can."""
        if self.user is not None and os.geteuid() == 0:
            with FsIdentity(self.user.uid, self.user.gid).acting():
                return os.openpty()
        return os.openpty()

    def _reserve(self, capacity: int) -> int:
        """Count a starting job against the limits; its marker."""
        with self._lock:
            if self._stopping is not None:
                raise AgentError(INTERNAL, f"the sandbox is stopping ({self._stopping}); no job can start",
                                 code=grpc.StatusCode.UNAVAILABLE)
            running = self._starting + sum(1 for job in self._jobs.values() if job.running())
            if running >= MAX_RUNNING:
                raise AgentError(BUSY, f"{MAX_RUNNING} jobs are already running in this sandbox; "
                                       "kill one (`List` shows them) or wait for one to end")
            while self._starting_bytes + sum(self._reserved.values()) + capacity > MAX_TOTAL_BUFFER:
                if not self._forget_oldest_ended():
                    raise AgentError(BUSY, f"the output buffers of the running jobs take "
                                           f"{sum(self._reserved.values()) >> 20} MiB of the {MAX_TOTAL_BUFFER >> 20} "
                                           "MiB jobs may hold; ask for a smaller buffer_bytes or kill a job")
            self._starting += 1
            self._starting_bytes += capacity
            # A marker stays taken as long as its job is remembered, so a late Signal or
            # Kill of an ended job can never reach a newer job's processes.
            used = {job.marker for job in self._jobs.values()} | self._starting_markers | self._leftover_markers
            while True:
                marker = JOB_MARKER_BASE + proctree.random_below(proctree.MARKER_SPAN)
                if marker not in used:
                    self._starting_markers.add(marker)
                    return marker

    def _unreserve(self, capacity: int, marker: int) -> None:
        """Caller holds ``_lock``: the job started (or did not)."""
        self._starting -= 1
        self._starting_bytes -= capacity
        self._starting_markers.discard(marker)

    def _forget_oldest_ended(self) -> bool:
        """Caller holds ``_lock``."""
        for pid, job in self._jobs.items():
            if job.ended.is_set():
                del self._jobs[pid]
                self._reserved.pop(job, None)
                return True
        return False

    def _ended(self, job: Job) -> None:
        """The loop thread: ``job`` has ended and its output is drained."""
        leftovers = job.has_leftovers()
        with self._lock:
            if leftovers:
                self._leftover_markers.add(job.marker)
            if job in self._reserved:
                with job.log.cond:
                    self._reserved[job] = job.log.held_cost
            job.log.close()
            job.ended.set()
            ended = [j for j in self._jobs.values() if j.ended.is_set()]
            for old in ended[:max(0, len(ended) - MAX_ENDED)]:
                self._jobs.pop(old.pid, None)
                self._reserved.pop(old, None)

    # ---- queries and control --------------------------------------------------------

    def list(self) -> list[Job]:
        with self._lock:
            return list(self._jobs.values())

    def get(self, pid: int) -> Job:
        with self._lock:
            job = self._jobs.get(pid)
        if job is None:
            raise no_such_job(pid)
        return job

    def write_input(self, pid: int, data: bytes, close: bool, wait_until: Callable[[], bool] | None = None) -> None:
        self.get(pid).feed(data, close, wait_until)

    def resize(self, pid: int, rows: int, cols: int) -> None:
        job = self.get(pid)
        if not job.pty:
            raise AgentError(INVALID_ARGUMENT, f"job {pid} has no terminal; start it with pty=true to resize it")
        if not rows or not cols:
            raise AgentError(INVALID_ARGUMENT, "a terminal needs at least one row and one column")
        window = _window(rows, cols)
        with job.lock:
            if job.master is None:
                raise AgentError(NO_SUCH_PROCESS, f"job {pid} has ended; its terminal is gone")
            # The kernel sends SIGWINCH to the terminal's foreground process group.
            fcntl.ioctl(job.master, termios.TIOCSWINSZ, window)

    def signal(self, pid: int, signum: int) -> int:
        if signum not in {s.value for s in signal.Signals}:
            raise AgentError(INVALID_ARGUMENT, f"{signum} is not a signal number")
        job = self.get(pid)
        if not job.running():
            raise AgentError(NO_SUCH_PROCESS, f"job {pid} has ended; no process of it is left to signal")
        return job.signal_all(signum)

    def kill(self, pid: int) -> Job:
        """SIGKILL the job's every process and wait (bounded) until it has ended."""
        job = self.get(pid)
        with job.lock:
            if job.state != RUNNING:
                return job
            job.kill_requested = True
        job.kill_all()
        if not job.ended.wait(KILL_WAIT_S):
            raise AgentError(INTERNAL, f"job {pid} was killed but has not ended within {KILL_WAIT_S:.0f} s")
        return job

    def attach(self, request: jobs_pb2.JobAttachRequest,
               on_start: Callable[[Cancellable], None]) -> Iterator[jobs_pb2.JobEvent]:
        job = self.get(request.pid)
        return self._counted(follow_log(job, request.from_seq, request.follow, on_start))

    def terminal(self, requests: Iterator[jobs_pb2.TerminalInput],
                 on_start: Callable[[Cancellable], None]) -> Iterator[jobs_pb2.JobEvent]:
        return self._counted(terminal_events(self, requests, on_start))

    def _counted(self, events: Iterator[jobs_pb2.JobEvent]) -> Iterator[jobs_pb2.JobEvent]:
        """``events``, counted against MAX_STREAMS while they last: each stream holds one of
        the agent's RPC threads, which Exec and the other services need too."""
        with self._lock:
            if self._streams >= MAX_STREAMS:
                raise AgentError(BUSY, f"{MAX_STREAMS} attach and terminal streams are open in this sandbox "
                                       "already; close one first")
            self._streams += 1
        try:
            yield from events
        finally:
            with self._lock:
                self._streams -= 1

    def stop(self, why: str) -> None:
        """The agent is stopping: refuse new jobs, kill every job's whole tree, end the loop."""
        with self._lock:
            self._stopping = why
            jobs = list(self._jobs.values())
        for job in jobs:
            with job.lock:
                if job.state != RUNNING:
                    continue
                job.kill_requested = True
            job.kill_all()
        for job in jobs:
            job.ended.wait(KILL_WAIT_S)
        self._loop.stop()


class JobsService(jobs_pb2_grpc.JobsServicer):
    """sandbox.v1.Jobs over a JobManager."""

    def __init__(self, manager: JobManager) -> None:
        self.manager = manager

    def Start(self, request: jobs_pb2.JobStartRequest, context: grpc.ServicerContext) -> jobs_pb2.JobInfo:
        return answer(context, lambda: self.manager.start(request).info())

    def List(self, request: jobs_pb2.JobListRequest, context: grpc.ServicerContext) -> jobs_pb2.JobListResponse:
        return jobs_pb2.JobListResponse(jobs=[job.info() for job in self.manager.list()])

    def Attach(self, request: jobs_pb2.JobAttachRequest,
               context: grpc.ServicerContext) -> Iterator[jobs_pb2.JobEvent]:
        return stream(context, lambda on_start: self.manager.attach(request, on_start))

    def Terminal(self, request_iterator: Iterator[jobs_pb2.TerminalInput],
                 context: grpc.ServicerContext) -> Iterator[jobs_pb2.JobEvent]:
        return stream(context, lambda on_start: self.manager.terminal(request_iterator, on_start))

    def WriteInput(self, request: jobs_pb2.JobInputRequest,
                   context: grpc.ServicerContext) -> jobs_pb2.JobInputResponse:
        def write() -> jobs_pb2.JobInputResponse:
            self.manager.write_input(request.pid, request.data, request.close)
            return jobs_pb2.JobInputResponse()
        return answer(context, write)

    def Resize(self, request: jobs_pb2.JobResizeRequest,
               context: grpc.ServicerContext) -> jobs_pb2.JobResizeResponse:
        def resize() -> jobs_pb2.JobResizeResponse:
            self.manager.resize(request.pid, request.rows, request.cols)
            return jobs_pb2.JobResizeResponse()
        return answer(context, resize)

    def Signal(self, request: jobs_pb2.JobSignalRequest,
               context: grpc.ServicerContext) -> jobs_pb2.JobSignalResponse:
        return answer(context, lambda: jobs_pb2.JobSignalResponse(
            delivered=self.manager.signal(request.pid, request.signal)))

    def Kill(self, request: jobs_pb2.JobKillRequest, context: grpc.ServicerContext) -> jobs_pb2.JobInfo:
        return answer(context, lambda: self.manager.kill(request.pid).info())
