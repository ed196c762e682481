"""Background jobs of a sandbox's agent (sandbox.v1.Jobs): start, list, attach with replay,
input, resize, signal, kill, terminals.

A job is named by its pid in the sandbox. It runs detached from the calls that start or
watch it, until it exits, is killed, or the sandbox stops. Its output is a ring buffer of
numbered chunks in the agent: :meth:`JobsClient.attach` replays what is still held (a
:class:`JobGap` first when older chunks were dropped; :func:`gap_text` renders one), then,
with ``follow``, a :class:`JobLive` and live output until a :class:`JobEnded`. Errors are
:class:`~harness.core.errors.AgentCallError` with the agent's reason (``NO_SUCH_PROCESS``
for an unknown pid, ``BUSY`` when too many jobs run, ``INVALID_ARGUMENT`` for input to a
job started without stdin).
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Generator, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import grpc

from harness.core.errors import AgentCallError
from sandbox.v1 import jobs_pb2, jobs_pb2_grpc

__all__ = ["JobChunk", "JobEnded", "JobEvent", "JobGap", "JobInfo", "JobLive", "JobsClient", "Terminal", "gap_text"]

UNARY_TIMEOUT_S = 30.0
KILL_TIMEOUT_S = 60.0
REPLAY_TIMEOUT_S = 60.0
"""Deadline of an attach without ``follow`` when the caller sets none (it only replays)."""
CLOSE_GRACE_S = 2.0
"""How long :meth:`Terminal.close` lets the agent take the input sent before it."""

_STATES = {
    jobs_pb2.JOB_STATE_RUNNING: "running",
    jobs_pb2.JOB_STATE_EXITED: "exited",
    jobs_pb2.JOB_STATE_KILLED: "killed",
}


def _translate(error: grpc.RpcError) -> AgentCallError:
    # agent_client imports this module at its top; import its translation when needed.
    from harness.engine.agent_errors import translate

    return translate(error)


@dataclass(frozen=True)
class JobInfo:
    pid: int
    tag: str
    command: list[str]
    state: str
    """"running", "exited" or "killed" (by a signal, Kill included)."""
    exit_code: int | None
    """The exit status when "exited", else None."""
    signal: int
    """The signal that ended it when "killed", else 0."""
    pty: bool
    started_at: float
    duration_s: float
    next_seq: int
    output_bytes: int
    dropped_bytes: int
    oom_killed: bool

    @classmethod
    def from_proto(cls, info: jobs_pb2.JobInfo) -> JobInfo:
        state = _STATES.get(info.state, "unknown")
        return cls(
            pid=info.pid, tag=info.tag, command=list(info.command), state=state,
            exit_code=info.exit_code if state == "exited" else None, signal=info.signal, pty=info.pty,
            started_at=info.started_at, duration_s=info.duration.ToNanoseconds() / 1e9, next_seq=info.next_seq,
            output_bytes=info.output_bytes, dropped_bytes=info.dropped_bytes, oom_killed=info.oom_killed,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobChunk:
    seq: int
    stream: str
    """"stdout" or "stderr" (a PTY job's output is all "stdout")."""
    data: bytes


@dataclass(frozen=True)
class JobGap:
    """Chunks ``first_seq`` up to (not including) ``end_seq`` were dropped from the buffer."""

    first_seq: int
    end_seq: int
    dropped_bytes: int


@dataclass(frozen=True)
class JobLive:
    """The replay is done; live output follows."""

    info: JobInfo


@dataclass(frozen=True)
class JobEnded:
    """The job ended (the last event of its stream)."""

    info: JobInfo


JobEvent = JobChunk | JobGap | JobLive | JobEnded


def gap_text(gap: JobGap) -> bytes:
    """The marker a CLI prints where output was dropped."""
    chunks = f"chunk {gap.first_seq}" if gap.end_seq - gap.first_seq == 1 else \
        f"chunks {gap.first_seq}-{gap.end_seq - 1}"
    return f"\n[callbox: {gap.dropped_bytes} bytes ({chunks}) dropped]\n".encode()


def _event(message: jobs_pb2.JobEvent) -> JobEvent | None:
    kind = message.WhichOneof("event")
    if kind == "output":
        output = message.output
        stream = output.WhichOneof("data") or "stdout"
        return JobChunk(output.seq, stream, getattr(output, stream))
    if kind == "gap":
        return JobGap(message.gap.first_seq, message.gap.end_seq, message.gap.dropped_bytes)
    if kind == "live":
        return JobLive(JobInfo.from_proto(message.live))
    if kind == "exited":
        return JobEnded(JobInfo.from_proto(message.exited))
    return None  # an event this client does not know


def _events(call: Any) -> Iterator[JobEvent]:
    for message in call:
        event = _event(message)
        if event is not None:
            yield event


class JobsClient:
    """One sandbox agent's jobs operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = jobs_pb2_grpc.JobsStub(channel)

    def _unary(self, method: Any, request: Any, timeout: float = UNARY_TIMEOUT_S) -> Any:
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as error:
            raise _translate(error) from None

    def start(
        self, command: Sequence[str] | str, *, tag: str = "", cwd: str = "", env: Mapping[str, str] | None = None,
        pty: bool = False, rows: int = 0, cols: int = 0, stdin: bool = False, buffer_bytes: int = 0,
        as_root: bool = False, keep_leftovers: bool = False, hold_output: bool = False,
    ) -> JobInfo:
        """Start a detached job (argv when a sequence, ``bash -c`` when a string) and return at once.

        ``pty`` runs it on a terminal of ``rows`` x ``cols`` (0: 24 x 80; its output is one
        stream); ``stdin`` keeps a pipe to its stdin open for :meth:`write` (else /dev/null);
        ``buffer_bytes`` is how much output the agent holds for replay (0: 1 MiB); ``as_root``
        runs it as uid 0 instead of the tool user (the caller checks the policy allows it:
        ``sandbox.root_commands``); ``keep_leftovers`` leaves running, when it ends, the processes
        it left behind (daemons, ``cmd &``), which then end with the sandbox; ``hold_output``
        makes the job wait while a following :meth:`attach` is a buffer behind, instead of
        that reader losing the oldest output (with no one following, the buffer keeps the newest)."""
        request = jobs_pb2.JobStartRequest(cwd=cwd, env=dict(env or {}), tag=tag, pty=pty, rows=rows, cols=cols,
                                           stdin=stdin, buffer_bytes=buffer_bytes, as_root=as_root,
                                           keep_leftovers=keep_leftovers, hold_output=hold_output)
        if isinstance(command, str):
            request.shell = command
        else:
            request.argv.args.extend(command)
        return JobInfo.from_proto(self._unary(self.stub.Start, request))

    def list(self) -> list[JobInfo]:
        """Every job the agent remembers, running and ended, in start order."""
        response = self._unary(self.stub.List, jobs_pb2.JobListRequest())
        return [JobInfo.from_proto(info) for info in response.jobs]

    def get(self, pid: int) -> JobInfo:
        """One job; AgentCallError with reason NO_SUCH_PROCESS if the agent has no such job."""
        for info in self.list():
            if info.pid == pid:
                return info
        raise AgentCallError(f"no job has pid {pid}; `List` shows the jobs this sandbox remembers",
                             reason="NO_SUCH_PROCESS", grpc_code="NOT_FOUND", retryable=False)

    def attach(self, pid: int, *, from_seq: int = 0, follow: bool = False,
               timeout: float | None = None) -> Generator[JobEvent, None, None]:
        """The job's output from chunk ``from_seq`` (0: the oldest held): a JobGap first if
        chunks from there were dropped, the held chunks, then with ``follow`` a JobLive, live
        chunks and a JobEnded when the job ends; without, a JobEnded only if it has ended.

        ``timeout`` (seconds) stops following: the iterator then just ends, the job runs on.
        Closing the iterator early cancels the stream (the job is untouched)."""
        request = jobs_pb2.JobAttachRequest(pid=pid, from_seq=from_seq, follow=follow)
        deadline = timeout if timeout is not None else (None if follow else REPLAY_TIMEOUT_S)
        call = self.stub.Attach(request, timeout=deadline)
        try:
            yield from _events(call)
        except grpc.RpcError as error:
            if timeout is not None and error.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                return
            raise _translate(error) from None
        finally:
            call.cancel()

    def write(self, pid: int, data: bytes, *, close: bool = False) -> None:
        """Queue ``data`` for the job's stdin (its terminal, for a PTY job); ``close`` closes
        stdin after it (a terminal gets its end-of-file character, ^D, instead)."""
        self._unary(self.stub.WriteInput, jobs_pb2.JobInputRequest(pid=pid, data=data, close=close))

    def resize(self, pid: int, rows: int, cols: int) -> None:
        """Set a PTY job's window size (its foreground processes get SIGWINCH)."""
        self._unary(self.stub.Resize, jobs_pb2.JobResizeRequest(pid=pid, rows=rows, cols=cols))

    def signal(self, pid: int, signum: int) -> int:
        """Send ``signum`` to every process of the job; how many got it."""
        response = self._unary(self.stub.Signal, jobs_pb2.JobSignalRequest(pid=pid, signal=signum))
        return int(response.delivered)

    def kill(self, pid: int) -> JobInfo:
        """SIGKILL every process of the job, however it forked; its final info."""
        return JobInfo.from_proto(self._unary(self.stub.Kill, jobs_pb2.JobKillRequest(pid=pid), KILL_TIMEOUT_S))

    def terminal(self, pid: int, *, from_seq: int = 0) -> Terminal:
        """A bidirectional terminal on the job: :meth:`Terminal.send` keystrokes, :meth:`Terminal.resize`,
        :meth:`Terminal.events` its output (as :meth:`attach` with follow). Raises at once for
        an unknown pid."""
        self.get(pid)
        return Terminal(self.stub, pid, from_seq)


_END = object()


class Terminal:
    """The bidirectional Jobs.Terminal stream of one job. ``close`` (or leaving a ``with``
    block) detaches; the job keeps running."""

    def __init__(self, stub: jobs_pb2_grpc.JobsStub, pid: int, from_seq: int = 0) -> None:
        self.pid = pid
        self._requests: queue.Queue[object] = queue.Queue()
        self._requests.put(jobs_pb2.TerminalInput(
            attach=jobs_pb2.JobAttachRequest(pid=pid, from_seq=from_seq, follow=True)))
        self._closed = False
        self._lock = threading.Lock()
        self._readers = 0
        self._done = threading.Event()
        self._call = stub.Terminal(self._inputs())
        self._call.add_done_callback(lambda _call: self._done.set())

    def _inputs(self) -> Iterator[jobs_pb2.TerminalInput]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            assert isinstance(item, jobs_pb2.TerminalInput)
            yield item

    def send(self, data: bytes) -> None:
        """Type ``data`` into the terminal (or the job's stdin)."""
        self._put(jobs_pb2.TerminalInput(data=data))

    def resize(self, rows: int, cols: int) -> None:
        self._put(jobs_pb2.TerminalInput(resize=jobs_pb2.TerminalSize(rows=rows, cols=cols)))

    def _put(self, message: jobs_pb2.TerminalInput) -> None:
        if self._closed:
            raise ValueError("the terminal is closed")
        self._requests.put(message)

    def events(self) -> Generator[JobEvent, None, None]:
        """The job's output, as :meth:`JobsClient.attach` with follow gives it. Stopping the
        iteration early closes the terminal. Iterate it from one thread at a time."""
        finished = False
        with self._lock:
            self._readers += 1
        try:
            yield from _events(self._call)
            finished = True
        except grpc.RpcError as error:
            finished = True
            if self._closed and error.code() == grpc.StatusCode.CANCELLED:
                return
            raise _translate(error) from None
        finally:
            with self._lock:
                self._readers -= 1
            if not finished:
                self.close()

    def close(self) -> None:
        """Detach: end the input stream, let the agent apply what was sent (at most
        CLOSE_GRACE_S), then cancel the stream. The job keeps running."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            reading = self._readers > 0
        self._requests.put(_END)
        try:
            if reading:  # the reader sees the stream end; a call is read by one thread at a time
                self._done.wait(CLOSE_GRACE_S)
                return
            # The agent ends the output once it has taken all the input; read what it still
            # sends, so it is never stuck sending to nobody.
            timer = threading.Timer(CLOSE_GRACE_S, self._call.cancel)
            timer.daemon = True
            timer.start()
            try:
                with contextlib.suppress(grpc.RpcError):
                    for _ in self._call:
                        pass
            finally:
                timer.cancel()
        finally:
            self._call.cancel()

    def __enter__(self) -> Terminal:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
