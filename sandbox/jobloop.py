"""Background jobs' processes and descriptors, and the one thread that drives them all.

One thread, started with the agent (so serving never needs a new thread once the pids
limit is reached), waits on every running job's output (its stdout and stderr pipes, or
the master side of its terminal), its pidfd, its input while some is pending, and a
wake-up pipe. Output goes into the job's ``JobLog`` as it arrives; the thread never
waits for a reader. A job whose log holds its output for its followers is not read while
its slowest follower is a buffer behind (its pipes fill and it waits), and is read again
when the log says there is room. When the leader exits it is reaped, whatever it left behind (every
process carrying the job's marker group) is killed, as for an Exec, and the output is
drained until the pipes close (at most ``DRAIN_LIMIT_S``); then the job has ended.

Input (WriteInput, a terminal's keystrokes) is queued on the job, at most
``MAX_PENDING_INPUT`` bytes, and written by this thread without blocking as the job
reads it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import selectors
import signal
import termios
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.errors import BUSY, INVALID_ARGUMENT, NO_SUCH_PROCESS, AgentError
from sandbox.joblog import STDERR, STDOUT, JobLog
from sandbox.launch import Child
from sandbox.v1 import jobs_pb2

log = logging.getLogger("callbox.agent.jobs")

RUNNING = jobs_pb2.JOB_STATE_RUNNING
EXITED = jobs_pb2.JOB_STATE_EXITED
KILLED = jobs_pb2.JOB_STATE_KILLED

MAX_PENDING_INPUT = 16 << 20
"""At most this much input may wait for a job to read it."""
READ_LIMIT = 1 << 16
"""At most this much is read from one descriptor per wake-up (the size of a chunk)."""
WRITE_CHUNK = 1 << 16
DRAIN_LIMIT_S = 2.0
"""After the leader exits and its leftovers are killed, wait at most this long for the
pipes to close (a process elsewhere may hold a copy of a descriptor)."""


def no_such_job(pid: int) -> AgentError:
    return AgentError(NO_SUCH_PROCESS, f"no job has pid {pid}; `List` shows the jobs this sandbox remembers")


class Job:
    """One background job: its process, its terminal (if any), queued input, output and state.

    ``lock`` (a condition) guards the state, the input queue and ``master``; the loop
    thread notifies it as input is written and when the job ends.
    """

    def __init__(self, child: Child, marker: int, log: JobLog, *, command: Sequence[str], tag: str,
                 master: int | None, accepts_input: bool, oom_before: int | None,
                 keep_leftovers: bool = False) -> None:
        self.child = child
        self.keep_leftovers = keep_leftovers
        self.pid = child.pid
        self.marker = marker
        self.log = log
        self.command = list(command)
        self.tag = tag
        self.master = master
        self.pty = master is not None
        self.accepts_input = accepts_input or self.pty
        self.oom_before = oom_before
        self.started_at = time.time()
        self.started_mono = time.monotonic()
        self.ended_mono: float | None = None
        self.lock = threading.Condition()
        self.state = RUNNING
        self.returncode: int | None = None
        self.kill_requested = False
        self.oom_killed = False
        self.ended = threading.Event()
        """Set once the job has ended and its log is closed."""
        self._input: deque[bytes] = deque()
        self._input_bytes = 0
        self._input_close = False
        self.input_closed = False
        self.unwritten = 0
        """Input the loop took and has not written yet (the loop sets it)."""
        self.wake: Callable[[Job], None] = lambda _job: None
        """Tells the loop that input is queued (the loop sets it)."""

    # ---- state --------------------------------------------------------------------

    def info(self) -> jobs_pb2.JobInfo:
        with self.lock:
            state, code = self.state, self.returncode
            ended = self.ended_mono if state != RUNNING else None
            oom = self.oom_killed
        with self.log.cond:
            next_seq, output, dropped = self.log.next_seq, self.log.output_bytes, self.log.dropped_bytes
        info = jobs_pb2.JobInfo(
            pid=self.pid, tag=self.tag, command=self.command, state=state, pty=self.pty,
            exit_code=code if state == EXITED and code is not None else -1,
            signal=-code if state == KILLED and code is not None and code < 0 else 0,
            started_at=self.started_at, next_seq=next_seq, output_bytes=output, dropped_bytes=dropped,
            oom_killed=oom,
        )
        info.duration.FromNanoseconds(int(((ended or time.monotonic()) - self.started_mono) * 1e9))
        return info

    def running(self) -> bool:
        with self.lock:
            return self.state == RUNNING

    def end(self) -> None:
        """Record the final state (the loop calls it once the output is drained)."""
        code = self.child.returncode
        assert code is not None
        killed_by_9 = code in (-signal.SIGKILL, 128 + signal.SIGKILL)
        oom_after = oom_kill_count() if killed_by_9 else None
        with self.lock:
            self.returncode = code
            self.state = KILLED if code < 0 else EXITED
            self.oom_killed = (killed_by_9 and not self.kill_requested and self.oom_before is not None
                               and oom_after is not None and oom_after > self.oom_before)
            self.master = None
            self._input.clear()
            self._input_bytes = 0
            self.lock.notify_all()

    # ---- signals ------------------------------------------------------------------

    def signal_all(self, signum: int) -> int:
        """Signal every process carrying the marker (without one, the leader's group)."""
        delivered = proctree.signal_marked(self.marker, signum)
        if delivered == 0:
            try:
                os.killpg(self.pid, signum)
                delivered = 1
            except (ProcessLookupError, PermissionError):
                pass
        return delivered

    def kill_all(self) -> None:
        """SIGKILL the leader's group and every process carrying the marker, until none is left."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        proctree.kill_marked(self.marker)

    def end_leftovers(self) -> None:
        """At the leader's exit: kill what it left behind, unless the job keeps its leftovers."""
        if not self.keep_leftovers:
            self.kill_all()

    def has_leftovers(self) -> bool:
        """Whether processes carrying the job's marker live on after it ended."""
        return self.keep_leftovers and next(proctree.marked_pids(self.marker), None) is not None

    # ---- input --------------------------------------------------------------------

    def _check_input(self) -> None:
        """Caller holds ``lock``."""
        if self.state != RUNNING:
            raise AgentError(NO_SUCH_PROCESS, f"job {self.pid} has ended; its input is gone")
        if not self.accepts_input:
            raise AgentError(INVALID_ARGUMENT, f"job {self.pid} was started without stdin (its stdin is "
                                               "/dev/null); start it with stdin=true or pty=true to write to it")
        if self.input_closed or self._input_close:
            raise AgentError(INVALID_ARGUMENT, f"the stdin of job {self.pid} is already closed")

    def feed(self, data: bytes, close: bool, wait_until: Callable[[], bool] | None = None) -> None:
        """Queue ``data`` for the job's input; ``close`` closes a pipe after it, or sends a
        terminal its end-of-file character. Without ``wait_until`` a full queue is BUSY;
        with it, wait for room until it returns True (then drop the data)."""
        with self.lock:
            self._check_input()
            if close and self.master is not None:
                data += termios.tcgetattr(self.master)[6][termios.VEOF]
                close = False
            while self._input_bytes + self.unwritten + len(data) > MAX_PENDING_INPUT:
                pending = self._input_bytes + self.unwritten
                if wait_until is None or len(data) > MAX_PENDING_INPUT:
                    raise AgentError(BUSY, f"{pending + len(data)} bytes would be pending for the input of job "
                                           f"{self.pid} (at most {MAX_PENDING_INPUT}); retry once it reads its input")
                if wait_until():
                    return
                self.lock.wait(0.25)
                self._check_input()
            if data:
                self._input.append(data)
                self._input_bytes += len(data)
            self._input_close = close
        self.wake(self)

    def take_input(self) -> tuple[bytes, bool]:
        """What was queued since the last take, and whether to close the input after it."""
        with self.lock:
            data = b"".join(self._input)
            self._input.clear()
            self._input_bytes = 0
            self.unwritten += len(data)
            return data, self._input_close

    def written(self, unwritten: int, closed: bool) -> None:
        with self.lock:
            self.unwritten = unwritten
            self.input_closed = self.input_closed or closed
            self.lock.notify_all()


class _Watch:
    """What the loop thread keeps for one running job."""

    def __init__(self, job: Job) -> None:
        self.job = job
        child = job.child
        self.outputs: dict[int, str] = (
            {job.master: STDOUT} if job.master is not None else {child.stdout: STDOUT, child.stderr: STDERR}
        )
        self.input_fd = job.master if job.master is not None else child.stdin
        self.pending: deque[memoryview] = deque()
        self.close_input = False
        self.pidfd = child.open_pidfd()
        self.drain_until: float | None = None
        self.masks: dict[int, int] = {}
        self.held = False
        """Output is not read until the job's log has room for its followers."""


class JobLoop:
    """The thread that reads, writes and reaps every running job; ``on_ended`` runs (on it) as each ends."""

    def __init__(self, on_ended: Callable[[Job], None]) -> None:
        self._on_ended = on_ended
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._added: list[Job] = []
        self._input: set[Job] = set()
        self._room: set[Job] = set()
        self._stopping = False
        self._closed = False
        self._watches: dict[Job, _Watch] = {}
        self._thread = threading.Thread(target=self._run, name="jobs-io", daemon=True)
        self._thread.start()

    def add(self, job: Job) -> None:
        job.wake = self._input_ready
        with self._lock:
            self._added.append(job)
        self._wake()

    def stop(self) -> None:
        """End the thread once no job is left running."""
        with self._lock:
            self._stopping = True
        self._wake()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def _room_made(self, job: Job) -> None:
        with self._lock:
            self._room.add(job)
        self._wake()

    def _input_ready(self, job: Job) -> None:
        with self._lock:
            self._input.add(job)
        self._wake()

    def _wake(self) -> None:
        with self._lock:
            if self._closed:
                return
            with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                os.write(self._wake_w, b"x")

    # ---- the thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    added, self._added = self._added, []
                    inputs, self._input = self._input, set()
                    room, self._room = self._room, set()
                    if self._stopping and not self._watches and not added:
                        return
                for job in added:
                    self._start_watching(job)
                for job in inputs:
                    watch = self._watches.get(job)
                    if watch is not None:
                        self._take_input(watch)
                for job in room:
                    watch = self._watches.get(job)
                    if watch is not None and watch.held:
                        self._hold(watch, False)
                for key, mask in self._sel.select(self._timeout()):
                    if key.data is None:
                        with contextlib.suppress(OSError):
                            os.read(self._wake_r, 4096)
                    elif key.data.job in self._watches:
                        self._ready(key.data, int(key.fd), mask)
                now = time.monotonic()
                for watch in list(self._watches.values()):
                    if watch.drain_until is not None and (not watch.outputs or
                                                          (now >= watch.drain_until and not watch.held)):
                        self._finish(watch)
        except Exception:  # a bug: say so loudly rather than leave jobs unreaped in silence
            log.exception("the jobs I/O thread failed")
            raise
        finally:
            self._sel.close()
            with self._lock:  # never write to a descriptor number someone else may get next
                self._closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)

    def _timeout(self) -> float | None:
        deadlines = [w.drain_until for w in self._watches.values() if w.drain_until is not None and not w.held]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _start_watching(self, job: Job) -> None:
        watch = self._watches[job] = _Watch(job)
        job.log.on_room = lambda: self._room_made(job)
        for fd in watch.outputs:
            os.set_blocking(fd, False)
            self._update(watch, fd)
        if watch.input_fd is not None:
            os.set_blocking(watch.input_fd, False)
        self._sel.register(watch.pidfd, selectors.EVENT_READ, watch)

    def _update(self, watch: _Watch, fd: int) -> None:
        """(Re)register ``fd`` for what the job needs of it now: reading output, writing input."""
        mask = (selectors.EVENT_READ if fd in watch.outputs and not watch.held else 0) | (
            selectors.EVENT_WRITE if fd == watch.input_fd and watch.pending else 0)
        old = watch.masks.get(fd, 0)
        if mask == old:
            return
        if not old:
            self._sel.register(fd, mask, watch)
        elif not mask:
            self._sel.unregister(fd)
        else:
            self._sel.modify(fd, mask, watch)
        watch.masks[fd] = mask

    def _ready(self, watch: _Watch, fd: int, mask: int) -> None:
        if fd == watch.pidfd:
            self._leader_exited(watch)
            return
        if mask & selectors.EVENT_READ and fd in watch.outputs:
            allowed = watch.job.log.read_allowance(READ_LIMIT)
            if not allowed:
                self._hold(watch, True)
                return
            data = _read(fd, allowed)
            if data == b"":
                del watch.outputs[fd]
                self._update(watch, fd)
            elif data is not None:
                watch.job.log.append(watch.outputs[fd], data)
        if mask & selectors.EVENT_WRITE and fd == watch.input_fd:
            self._write(watch)

    def _hold(self, watch: _Watch, held: bool) -> None:
        """Stop (``held``) or go on reading the job's output; a drain's time runs only while read."""
        watch.held = held
        for fd in list(watch.outputs):
            self._update(watch, fd)
        if not held and watch.drain_until is not None:
            watch.drain_until = time.monotonic() + DRAIN_LIMIT_S

    def _leader_exited(self, watch: _Watch) -> None:
        job = watch.job
        self._sel.unregister(watch.pidfd)
        os.close(watch.pidfd)
        try:
            job.child.reap()
        except Exception:  # the spawner died: the status is lost; the process surely is too
            log.exception("job %d: no exit status", job.pid)
            job.child.returncode = -signal.SIGKILL
        job.ended_mono = time.monotonic()
        # Nothing outlives its job unless it keeps its leftovers: kill what the leader left
        # behind, then drain the output.
        job.end_leftovers()
        watch.drain_until = time.monotonic() + DRAIN_LIMIT_S

    def _take_input(self, watch: _Watch) -> None:
        data, close = watch.job.take_input()
        if watch.input_fd is None:  # closed already: nothing more can be written
            watch.job.written(0, True)
            return
        if data:
            watch.pending.append(memoryview(data))
        watch.close_input = close
        if not watch.pending and close:
            self._close_input(watch)
        else:
            self._update(watch, watch.input_fd)

    def _write(self, watch: _Watch) -> None:
        fd = watch.input_fd
        assert fd is not None
        while watch.pending:
            head = watch.pending[0]
            try:
                written = os.write(fd, head[:WRITE_CHUNK])
            except BlockingIOError:
                break
            except OSError:  # the reader is gone (EPIPE) or the terminal hung up (EIO)
                watch.pending.clear()
                break
            if written == len(head):
                watch.pending.popleft()
            else:
                watch.pending[0] = head[written:]
                break
        if not watch.pending and watch.close_input:
            self._close_input(watch)
            return
        self._update(watch, fd)
        watch.job.written(sum(len(p) for p in watch.pending), False)

    def _close_input(self, watch: _Watch) -> None:
        """Close a stdin pipe (a terminal's master stays: it is the output too)."""
        fd = watch.input_fd
        watch.pending.clear()
        if fd is not None and fd not in watch.outputs and fd != watch.job.master:
            self._update(watch, fd)
            os.close(fd)
            watch.job.child.stdin = None
            watch.input_fd = None
        watch.job.written(0, True)

    def _finish(self, watch: _Watch) -> None:
        job = watch.job
        del self._watches[job]
        for fd in list(watch.masks):
            if watch.masks[fd]:
                self._sel.unregister(fd)
        job.child.close_pipes()
        with job.lock:
            master = job.master
        job.end()
        if master is not None:
            os.close(master)
        self._on_ended(job)


def _read(fd: int, limit: int = READ_LIMIT) -> bytes | None:
    """What a non-blocking descriptor holds now (``limit`` bytes at most): b"" at its end (a
    terminal's hangup is EIO), None if nothing."""
    try:
        return os.read(fd, limit)
    except BlockingIOError:
        return None
    except OSError as exc:
        if exc.errno in (errno.EIO, errno.EBADF):
            return b""
        raise
