"""The selector loop of one command: pipes, leader exit, deadline, cancellation.

One loop per command waits on the leader's pidfd, both output pipes, the stdin pipe
while there is input left, and a wake-up pipe (cancellation), so output streams as it
arrives and the deadline is kept without polling. On timeout every process of the
command gets SIGTERM, then SIGKILL after the grace. When the leader exits, whatever it
left behind is killed (nothing outlives its call) and the pipes are drained.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

from google.protobuf.duration_pb2 import Duration

from sandbox import proctree
from sandbox.cgroup import oom_kill_count
from sandbox.outputcap import HeadTailBuffer
from sandbox.v1 import process_pb2

if TYPE_CHECKING:
    from sandbox.process import Execution

DEFAULT_OUTPUT_CAP = 1 << 20
DEFAULT_KILL_GRACE_MS = 500
# Largest Output message: what one wake-up may gather from a pipe.
READ_CHUNK = 1 << 20
# After the leader exits and its leftovers are killed, wait at most this long for the
# pipes to close (a process of another command could hold a duplicated descriptor).
DRAIN_LIMIT_S = 2.0


def read_available(fd: int, limit: int = READ_CHUNK) -> bytes | None:
    """Read what a non-blocking descriptor holds, up to ``limit``: b"" at EOF, None if nothing yet."""
    parts: list[bytes] = []
    size = 0
    while size < limit:
        try:
            part = os.read(fd, limit - size)
        except BlockingIOError:
            break
        if not part:
            if not parts:
                return b""
            break
        parts.append(part)
        size += len(part)
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else b"".join(parts)


GATHER_BYTES = 256 << 10
"""A read smaller than this waits a moment for more before it is sent (:func:`gather`)."""
GATHER_WINDOW_S = 0.001
"""The longest a chunk waits for more: what a command's output may be delayed by."""


def gather(fd: int, chunk: bytes, limit: int = READ_CHUNK) -> bytes:
    """``chunk`` and what follows it on ``fd`` within :data:`GATHER_WINDOW_S`, up to ``limit``.

    A command writing fast fills the pipe a few KiB at a time; sent as read, that is hundreds
    of messages per 64 MiB instead of 64, and each costs both ends more than its bytes. The
    wait ends at once at the pipe's end (which the caller's next read then sees), so a command
    that prints and exits is not held back."""
    if len(chunk) >= GATHER_BYTES:
        return chunk
    parts, size = [chunk], len(chunk)
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    deadline = time.monotonic() + GATHER_WINDOW_S
    while size < GATHER_BYTES:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            break
        more = read_available(fd, limit - size)
        if not more:  # None: woken for nothing; b"": the end, which stays readable for the caller
            break
        parts.append(more)
        size += len(more)
    return parts[0] if len(parts) == 1 else b"".join(parts)


WRITE_CHUNK = 65536
"""At most this much is written to a stdin pipe per wake-up."""


def write_some(fd: int, data: memoryview) -> memoryview:
    """Write what a non-blocking descriptor takes now; what is left (nothing once the reader is gone)."""
    try:
        written = os.write(fd, data[:WRITE_CHUNK])
    except BlockingIOError:
        return data
    except BrokenPipeError:
        return data[:0]
    return data[written:]


def duration(seconds: float) -> Duration:
    message = Duration()
    message.FromNanoseconds(int(seconds * 1e9))
    return message


class CappedOutput:
    """A command's stdout and stderr, each kept within a head and tail of ``cap`` bytes, as
    numbered Output messages."""

    def __init__(self, cap: int) -> None:
        self.buffers = {"stdout": HeadTailBuffer(cap), "stderr": HeadTailBuffer(cap)}
        self.seq = 0

    def _message(self, stream: str, data: bytes, dropped_before: int = 0) -> process_pb2.Output:
        message = process_pb2.Output(seq=self.seq, dropped_before=dropped_before, **{stream: data})
        self.seq += 1
        return message

    def feed(self, stream: str, data: bytes) -> process_pb2.Output | None:
        """What of ``data`` streams now (None while the tail holds it all)."""
        live = self.buffers[stream].feed(data)
        return self._message(stream, live) if live else None

    def tails(self) -> Iterator[process_pb2.Output]:
        """Each stream's held tail, after the count of bytes dropped before it (at the end)."""
        for stream, buffer in self.buffers.items():
            tail, dropped = buffer.finish()
            if tail or dropped:
                yield self._message(stream, tail, dropped_before=dropped)

    def stats(self) -> dict[str, process_pb2.StreamStats]:
        return {
            name: process_pb2.StreamStats(total_bytes=b.total, dropped_bytes=b.dropped)
            for name, b in self.buffers.items()
        }


class ExecLoop:
    """The selector loop of one command: pipes, leader exit, deadline, cancellation."""

    def __init__(
        self,
        request: process_pb2.ExecRequest,
        execution: Execution,
        started_at: float,
        timeout_ms: int,
        wrap_window: float = 0.0,
    ) -> None:
        cap = request.output_cap_bytes or DEFAULT_OUTPUT_CAP
        self.execution = execution
        assert execution.child is not None
        self.child = execution.child
        self.wake_r = execution.wake_r
        self.started_at = started_at
        # Seconds in which the container's pids cannot wrap round (0.0: unknown, and every
        # exit is swept); see _end_leftovers.
        self.wrap_window = wrap_window
        self.deadline = started_at + timeout_ms / 1000
        self.grace = (request.kill_grace_ms or DEFAULT_KILL_GRACE_MS) / 1000
        self.kill_at: float | None = None
        self.drain_until: float | None = None
        self.timed_out = False
        self.output = CappedOutput(cap)
        self.stdin_data = memoryview(request.stdin)
        # With keep_stdin_open the pipe stays open when stdin_data runs out, until a
        # WriteStdin asks to close it; stdin_registered says whether the selector waits
        # to write (only while there is data, or the loop would spin).
        self.keep_stdin_open = request.keep_stdin_open
        self.stdin_close = not request.keep_stdin_open
        self.stdin_registered = False
        self.ended_at: float | None = None
        # True once a sweep after the leader's exit found no process of this command left.
        self.swept = False

    def events(self) -> Iterator[process_pb2.ExecEvent]:
        child = self.child
        sel = selectors.DefaultSelector()
        streams = {child.stdout: "stdout", child.stderr: "stderr"}
        for fd in streams:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, "pipe")
        pidfd = child.open_pidfd()
        sel.register(pidfd, selectors.EVENT_READ, "exit")
        sel.register(self.wake_r, selectors.EVENT_READ, "wake")
        if child.stdin is not None:
            os.set_blocking(child.stdin, False)
            sel.register(child.stdin, selectors.EVENT_WRITE, "stdin")
            self.stdin_registered = True
        try:
            while streams or child.returncode is None:
                ready = sel.select(self._next_timeout())
                now = time.monotonic()
                for key, _ in ready:
                    if key.data == "pipe":
                        fd = int(key.fd)
                        chunk = read_available(fd)
                        if chunk is None:
                            continue
                        if not chunk:
                            sel.unregister(fd)
                            del streams[fd]
                            continue
                        chunk = gather(fd, chunk)
                        output = self.output.feed(streams[fd], chunk)
                        if output is not None:
                            yield process_pb2.ExecEvent(output=output)
                    elif key.data == "exit":
                        sel.unregister(pidfd)
                        child.reap()
                        self.ended_at = now
                        self._end_leftovers()
                        self.drain_until = now + DRAIN_LIMIT_S
                    elif key.data == "stdin":
                        self._write_stdin(sel)
                    elif key.data == "wake":
                        os.read(self.wake_r, 64)
                        if self.keep_stdin_open:
                            self._take_stdin(sel)
                if self.execution.cancelled.is_set():
                    self.execution.kill_all()
                self._enforce_deadline(now)
                if self.drain_until is not None and now >= self.drain_until and child.returncode is not None:
                    break
            for tail in self.output.tails():
                yield process_pb2.ExecEvent(output=tail)
        finally:
            sel.close()
            os.close(pidfd)

    def _end_leftovers(self) -> None:
        """Nothing outlives its call: kill what the leader left behind. When no process or
        thread was created in the container since the leader was, there is nothing to find,
        and the two scans of every process are skipped."""
        if not proctree.no_task_since(self.child.pid, self.started_at, self.wrap_window):
            self.execution.kill_all()
        self.swept = True

    def _write_stdin(self, sel: selectors.BaseSelector) -> None:
        stdin = self.child.stdin
        assert stdin is not None
        self.stdin_data = write_some(stdin, self.stdin_data)
        if self.keep_stdin_open:
            self.execution.stdin_unwritten = len(self.stdin_data)
        if not self.stdin_data:
            sel.unregister(stdin)
            self.stdin_registered = False
            if self.stdin_close:
                os.close(stdin)
                self.child.stdin = None

    def _take_stdin(self, sel: selectors.BaseSelector) -> None:
        """Move what WriteStdin queued behind the data still to write; close stdin when asked."""
        data, close = self.execution.take_stdin()
        stdin = self.child.stdin
        if stdin is None:  # already closed: nothing more can be written
            self.execution.stdin_unwritten = 0
            return
        if data:
            self.stdin_data = memoryview(bytes(self.stdin_data) + data)
        self.stdin_close = close
        if self.stdin_data and not self.stdin_registered:
            sel.register(stdin, selectors.EVENT_WRITE, "stdin")
            self.stdin_registered = True
        elif not self.stdin_data and close:
            if self.stdin_registered:
                sel.unregister(stdin)
                self.stdin_registered = False
            os.close(stdin)
            self.child.stdin = None

    def _next_timeout(self) -> float:
        now = time.monotonic()
        targets = [t for t in (self.deadline, self.kill_at, self.drain_until) if t is not None]
        if self.child.returncode is not None:
            targets = [t for t in (self.drain_until,) if t is not None]
        return max(0.0, min(targets) - now) if targets else 1.0

    def _enforce_deadline(self, now: float) -> None:
        if self.child.returncode is not None:
            return
        if not self.timed_out and now >= self.deadline:
            self.timed_out = True
            self.execution.signal_all(signal.SIGTERM)
            self.kill_at = now + self.grace
        elif self.kill_at is not None and now >= self.kill_at:
            self.execution.kill_all()
            self.kill_at = None

    def exited(self, oom_before: int | None) -> process_pb2.ExecEvent:
        code = self.child.returncode
        assert code is not None
        ended = self.ended_at or time.monotonic()
        signum = -code if code < 0 else 0
        # The leader itself, or a child whose death the shell reports as 128 + 9; only
        # then can the OOM killer be the cause, and only then is the counter read again.
        killed = signum == signal.SIGKILL or code == 128 + signal.SIGKILL
        oom = False
        if killed and not self.timed_out and oom_before is not None:
            oom_after = oom_kill_count()
            oom = oom_after is not None and oom_after > oom_before
        stats = self.output.stats()
        return process_pb2.ExecEvent(
            exited=process_pb2.Exited(
                exit_code=code if code >= 0 else -1,
                signal=signum,
                timed_out=self.timed_out,
                oom_killed=oom,
                duration=duration(ended - self.started_at),
                stdout=stats["stdout"],
                stderr=stats["stderr"],
            )
        )
