"""How one command runs in a bash session, and how its end is detected (never by scraping output).

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
import selectors
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sandbox.execloop import CappedOutput, duration, read_available, write_some
from sandbox.v1 import shell_pb2

if TYPE_CHECKING:
    from sandbox.shell_session import RunToken, Session

STATUS_FD = 63
"""Below 64 (the smallest nofile limit a sandbox may have) and above the 3-9 scripts use."""
DRAIN_LIMIT = 4 << 20
"""At most this much is drained per stream once a command returned (a pipe holds 1 MiB)."""
MAX_STATUS_RECORD = 1 << 16

_WRAPPER_TAIL = (
    f" </dev/null {STATUS_FD}>&-; "
    f"{{ builtin printf '%d\\0%s\\0' \"$?\" \"$PWD\" >&{STATUS_FD}; }} 2>/dev/null\n"
).encode()


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


@dataclass
class Outcome:
    """How a command's Run ended."""

    kind: str  # "status" | "ended" | "timeout" | "cancelled"
    code: int = 0
    cwd: str = ""


class RunLoop:
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
        self.output = CappedOutput(cap)
        self.outcome: Outcome | None = None

    def _feed(self, fd: int, data: bytes) -> Iterator[shell_pb2.ShellEvent]:
        output = self.output.feed(self.session.streams[fd], data)
        if output is not None:
            yield shell_pb2.ShellEvent(output=output)

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
                    self.outcome = Outcome("ended")
                elif self.token.cancelled:
                    self.outcome = Outcome("cancelled")
                elif now >= self.deadline:
                    self.outcome = Outcome("timeout")
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
            self.outcome = Outcome("status", record[0], record[1])
        elif len(session.status_buf) > MAX_STATUS_RECORD:
            session.status_buf.clear()

    def _write_line(self, sel: selectors.BaseSelector, stdin: int) -> None:
        self.line = write_some(stdin, self.line)  # nothing is left once bash is gone; its pidfd reports it
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
        for tail in self.output.tails():
            yield shell_pb2.ShellEvent(output=tail)

    def done(self) -> shell_pb2.ShellEvent:
        outcome = self.outcome
        assert outcome is not None
        stats = self.output.stats()
        done = shell_pb2.ShellDone(
            duration=duration((self.ended_at or time.monotonic()) - self.started),
            stdout=stats["stdout"], stderr=stats["stderr"],
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
