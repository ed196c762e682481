"""Reading a job's output as a stream of JobEvents (Attach), and terminals (Terminal).

A stream replays the job's log from a seq (a JobGap first when chunks from there were
evicted, and again mid-stream if the reader falls so far behind that unread chunks are
evicted), then, when following, one JobLive and live output, and one JobEnded (``exited``)
when the job ends. It waits on the log's condition, never on the job's reader, and ends
when its ``Detach`` is cancelled: the RPC ended, or a terminal's input stream did. A
following stream is one of the log's followers (its ``Detach`` is the token) from its
start until it ends, saying how far it has sent after each batch (and after each chunk
while the job waits for it), so a log that holds its output holds the job for it.

A terminal applies its input messages (data, resize) in order on a thread of its own
that consumes the request stream, while the RPC's thread streams the output.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from sandbox.errors import BUSY, INVALID_ARGUMENT, AgentError, Cancellable
from sandbox.joblog import STDERR, JobLog
from sandbox.jobloop import Job
from sandbox.v1 import jobs_pb2

if TYPE_CHECKING:
    from sandbox.jobs import JobManager

log = logging.getLogger("callbox.agent.jobs")


class Detach:
    """Ends one attached stream (a no-op once it has ended); ``fail`` ends it with an error."""

    def __init__(self, log: JobLog) -> None:
        self.log = log
        self.cancelled = False
        self.error: AgentError | None = None

    def cancel(self) -> None:
        with self.log.cond:
            self.cancelled = True
            self.log.cond.notify_all()
        self.log.unfollow(self)

    def fail(self, error: AgentError) -> None:
        self.error = error
        self.cancel()


def _check_from_seq(log: JobLog, from_seq: int) -> None:
    with log.cond:
        if from_seq > log.next_seq:
            raise AgentError(INVALID_ARGUMENT, f"from_seq {from_seq} is past the job's output: its next chunk "
                                               f"will be seq {log.next_seq}")


def _output(seq: int, stream: str, data: bytes) -> jobs_pb2.JobEvent:
    output = jobs_pb2.JobOutput(seq=seq, stderr=data) if stream == STDERR else jobs_pb2.JobOutput(seq=seq, stdout=data)
    return jobs_pb2.JobEvent(output=output)


def follow_log(job: Job, from_seq: int, follow: bool, on_start: Callable[[Cancellable], None],
               detach: Detach | None = None) -> Iterator[jobs_pb2.JobEvent]:
    """The job's output from ``from_seq`` as events (see the module doc)."""
    log = job.log
    _check_from_seq(log, from_seq)
    if detach is None:
        detach = Detach(log)
        on_start(detach)
    seq = from_seq
    live_sent = not follow
    if follow:
        log.follow(detach, seq)
    try:
        yield from _events(job, detach, seq, follow, live_sent)
    finally:
        if follow:
            log.unfollow(detach)
    if detach.error is not None:
        raise detach.error


def _events(job: Job, detach: Detach, seq: int, follow: bool, live_sent: bool) -> Iterator[jobs_pb2.JobEvent]:
    log = job.log
    while True:
        with log.cond:
            while follow and live_sent and not detach.cancelled and seq >= log.next_seq and not log.closed:
                log.cond.wait()
            if detach.cancelled:
                break
            gap, chunks = log.read(seq)
            after = chunks[-1].seq + 1 if chunks else max(seq, log.first_seq)
            at_end = after >= log.next_seq
            ended = at_end and log.closed
        if gap is not None:
            yield jobs_pb2.JobEvent(gap=jobs_pb2.JobGap(
                first_seq=gap.first_seq, end_seq=gap.end_seq, dropped_bytes=gap.dropped_bytes))
        for chunk in chunks:
            yield _output(chunk.seq, chunk.stream, chunk.data)
            if log.waiting:  # the job waits for this stream: say at once how far it has got
                log.advance(detach, chunk.seq + 1)
        seq = after
        if follow:
            log.advance(detach, seq)
        if not at_end:
            continue
        if ended:
            yield jobs_pb2.JobEvent(exited=job.info())
            return
        if not follow:
            return
        if not live_sent:
            yield jobs_pb2.JobEvent(live=job.info())
            live_sent = True


def terminal_events(manager: JobManager, requests: Iterator[jobs_pb2.TerminalInput],
                    on_start: Callable[[Cancellable], None]) -> Iterator[jobs_pb2.JobEvent]:
    """One Terminal RPC: the first message attaches, later ones are input; output as Attach with follow."""
    first = next(requests, None)
    if first is None or first.WhichOneof("input") != "attach":
        raise AgentError(INVALID_ARGUMENT, "the first Terminal message must be `attach`, naming the job by its pid")
    job = manager.get(first.attach.pid)
    _check_from_seq(job.log, first.attach.from_seq)
    detach = Detach(job.log)
    on_start(detach)
    consumer = threading.Thread(target=_apply_input, args=(manager, job, requests, detach),
                                name=f"terminal-{job.pid}", daemon=True)
    try:
        consumer.start()
    except RuntimeError:  # no thread to be had: the sandbox's pids limit is reached
        raise AgentError(BUSY, "the sandbox's process limit is reached; retry the terminal when processes exit"
                         ) from None
    yield from follow_log(job, first.attach.from_seq, True, on_start, detach)


def _apply_input(manager: JobManager, job: Job, requests: Iterator[jobs_pb2.TerminalInput],
                 detach: Detach) -> None:
    """Apply a terminal's input in order until the client ends its stream (then detach).

    Input for a job that has ended is dropped: the output stream ends with its JobEnded."""
    try:
        for message in requests:
            kind = message.WhichOneof("input")
            if kind == "attach":
                raise AgentError(INVALID_ARGUMENT, "`attach` may only be the first Terminal message")
            if detach.cancelled:
                return
            try:
                if kind == "data":
                    job.feed(message.data, False, wait_until=lambda: detach.cancelled)
                elif kind == "resize":
                    manager.resize(job.pid, message.resize.rows, message.resize.cols)
            except AgentError:
                if job.running():
                    raise
    except AgentError as error:
        detach.fail(error)
    except Exception as exc:  # the RPC ended under us (cancelled): nothing more to apply
        log.debug("terminal of job %d: input ended: %r", job.pid, exc)
    finally:
        detach.cancel()
