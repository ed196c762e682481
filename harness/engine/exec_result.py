"""Collect an Exec event stream into one result, keeping head, tail and the gap between."""

from __future__ import annotations

import base64
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import AgentCallError
from harness.engine.cancel import note_command_started
from sandbox.errors import program_missing
from sandbox.v1 import process_pb2

OutputCallback = Callable[[str, bytes, int], None]
"""Called as ``(stream, data, dropped_before)`` for each Output event, in order."""


def gap_marker(dropped: int) -> bytes:
    return f"\n[... {dropped} bytes dropped ...]\n".encode()


@dataclass
class StreamResult:
    """One output stream as kept by the agent: head, then (after a gap) the tail."""

    head: bytearray = field(default_factory=bytearray)
    tail: bytearray = field(default_factory=bytearray)
    total_bytes: int = 0
    dropped_bytes: int = 0
    _in_tail: bool = False

    def add(self, data: bytes, dropped_before: int) -> None:
        if dropped_before:
            self._in_tail = True
        (self.tail if self._in_tail else self.head).extend(data)

    @property
    def truncated(self) -> bool:
        return self.dropped_bytes > 0

    def data(self) -> bytes:
        """Everything received, with no marker (what the process wrote, minus the gap)."""
        return bytes(self.head + self.tail)

    def rendered(self) -> bytes:
        """Head, a one-line marker naming the dropped byte count, then tail."""
        if not self.truncated:
            return self.data()
        return bytes(self.head) + gap_marker(self.dropped_bytes) + bytes(self.tail)


@dataclass
class OutputStreams:
    """A command's stdout and stderr, filled from the agent's Output events (Exec and Shell
    streams carry the same ones) and completed with its final stream statistics."""

    stdout: StreamResult = field(default_factory=StreamResult)
    stderr: StreamResult = field(default_factory=StreamResult)

    def add(self, output: process_pb2.Output) -> tuple[str, bytes] | None:
        """Keep one Output event's chunk; ``(stream, data)``, or None for an event with no data."""
        which = output.WhichOneof("data")
        if which is None:
            return None
        data: bytes = getattr(output, which)
        (self.stdout if which == "stdout" else self.stderr).add(data, output.dropped_before)
        return which, data

    def finish(self, stdout: process_pb2.StreamStats, stderr: process_pb2.StreamStats) -> None:
        """Record what each stream held in all and what the agent dropped of it."""
        for stream, stats in ((self.stdout, stdout), (self.stderr, stderr)):
            stream.total_bytes = stats.total_bytes
            stream.dropped_bytes = stats.dropped_bytes

    @property
    def truncated(self) -> bool:
        return self.stdout.truncated or self.stderr.truncated


@dataclass
class ExecResult:
    exit_code: int
    signal: int
    timed_out: bool
    oom_killed: bool
    duration_ms: float
    stdout: StreamResult
    stderr: StreamResult
    pid: int = 0
    error: str | None = None
    """Why the command never started (then ``exit_code`` is the shell's 127 or 126)."""

    @classmethod
    def not_started(cls, exit_code: int, message: str) -> ExecResult:
        """A command that could not start, as a shell reports it: ``exit_code`` and the
        message on stderr."""
        stderr = StreamResult(head=bytearray(f"callbox: {message}\n".encode()))
        stderr.total_bytes = len(stderr.head)
        return cls(exit_code=exit_code, signal=0, timed_out=False, oom_killed=False, duration_ms=0.0,
                   stdout=StreamResult(), stderr=stderr, error=message)

    @property
    def shell_exit_code(self) -> int:
        """The code a shell would report: 124 for a timeout, 128+N for signal N."""
        if self.timed_out:
            return 124
        if self.oom_killed:
            return 137
        if self.signal:
            return 128 + self.signal
        return self.exit_code

    def to_json(self) -> dict[str, Any]:
        """The ``callbox exec --json`` object, plus exact bytes when not UTF-8 and ``error``
        when the command never started."""
        out: dict[str, Any] = {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "timed_out": self.timed_out,
            "oom_killed": self.oom_killed,
            "duration_ms": round(self.duration_ms, 3),
        }
        for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)):
            raw = stream.rendered()
            try:
                out[name] = raw.decode("utf-8")
            except UnicodeDecodeError:
                out[name] = raw.decode("utf-8", errors="replace")
                out[f"{name}_base64"] = base64.b64encode(raw).decode("ascii")
        out["stdout_truncated"] = self.stdout.truncated
        out["stderr_truncated"] = self.stderr.truncated
        out["stdout_dropped_bytes"] = self.stdout.dropped_bytes
        out["stderr_dropped_bytes"] = self.stderr.dropped_bytes
        if self.error is not None:
            out["error"] = self.error
        return out


COMMAND_NOT_FOUND_EXIT = 127
NOT_EXECUTABLE_EXIT = 126


def start_failure_exit_code(error: AgentCallError) -> int | None:
    """The code a shell gives a command the agent could not start: 127 when it does not
    exist, 126 when it exists but cannot be run (not executable, a directory); None when
    the failure is not the command's (busy, the sandbox went away, ...)."""
    if error.reason != "SPAWN_FAILED":
        return None
    return COMMAND_NOT_FOUND_EXIT if program_missing(error.message) else NOT_EXECUTABLE_EXIT


def collect(events: Iterable[process_pb2.ExecEvent], on_output: OutputCallback | None = None,
            streams: OutputStreams | None = None) -> ExecResult:
    """Consume an Exec stream to its Exited event; ``streams`` (a new one by default) keeps the
    output as it comes, so a caller stopped half-way still has what arrived."""
    streams = streams if streams is not None else OutputStreams()
    pid = 0
    for event in events:
        kind = event.WhichOneof("event")
        if kind == "started":
            pid = event.started.pid
            note_command_started()
        elif kind == "output":
            chunk = streams.add(event.output)
            if chunk is not None and on_output is not None:
                on_output(*chunk, event.output.dropped_before)
        elif kind == "exited":
            exited = event.exited
            streams.finish(exited.stdout, exited.stderr)
            return ExecResult(
                exit_code=exited.exit_code,
                signal=exited.signal,
                timed_out=exited.timed_out,
                oom_killed=exited.oom_killed,
                duration_ms=exited.duration.ToNanoseconds() / 1e6,
                stdout=streams.stdout,
                stderr=streams.stderr,
                pid=pid,
            )
    raise RuntimeError("the agent ended the Exec stream without an Exited event")
