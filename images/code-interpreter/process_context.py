"""A code-interpreter context that is one long-lived process of ours (bash, node), not a Jupyter kernel.

The process runs in its own session (so an interrupt reaches the cell's children too) with its
stdout and stderr on pipes this server reads, and a control pipe on which it says what is not
output: that it is ready, a cell's results and errors, and that a cell has ended (each message
tagged with the cell's sequence number). A subclass says how to start the process
(:meth:`ProcessContext.command`), how to hand it a cell (:meth:`ProcessContext.submit`) and what
its control lines mean (:meth:`ProcessContext.control`).

Output that a cell wrote before its end is on the output pipes before the end is on the control
pipe, so every control line is handled after what the output pipes hold at that moment: a cell's
lines keep their order around its results and its end. When the process exits during a cell, the
cell ends with an ``error`` and a fresh process takes its place (its state is gone).
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

Emit = Callable[[dict[str, Any]], bool]
"""Sends one NDJSON line to the client; False when the client has gone."""

START_S = 30.0
POLL_S = 0.1
DRAIN_READS = 64
RESEND_S = 1.0
"""After an interrupt, how long before the next nudge of a cell that has not ended: the end
asked for once more, then the interrupt sent again, in turn (an interrupt may reach the process
as it reads the cell or that request, which discards it, and the cell then runs on)."""
NUDGES = 20
"""How many nudges an interrupted cell gets before it is left to its own end."""


class ContextStartError(Exception):
    """The process did not start or did not say it was ready."""


class ProcessContext:
    """One process and its pipes; ``lock`` is held while a cell runs (the next one waits)."""

    language = ""
    name = ""
    """How the process is named in errors (``bash``, ``node``)."""

    def __init__(self, cwd: str, env: dict[str, str], state: str) -> None:
        self.id = uuid.uuid4().hex
        self.cwd = cwd
        self.env = env
        self.state = state
        self.lock = threading.Lock()
        self.process: subprocess.Popen[bytes] | None = None
        self.control_fd = -1
        self.kept: tuple[int, ...] = ()
        self.seq = 0
        self._control_buffer = b""

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    # ---- what a language says ---------------------------------------------------------------

    def command(self, child_fds: tuple[int, ...]) -> list[str]:
        """The argv of the process, given the fds it inherits (see :meth:`pipes`)."""
        raise NotImplementedError

    def pipes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The fds the child inherits and those this server keeps: by default one control pipe,
        the child writing it; the server's first kept fd is the control pipe's read end."""
        read, write = os.pipe()
        return (write,), (read,)

    def started(self, child_fds: tuple[int, ...]) -> None:
        """Called once the process runs (``child_fds`` are the numbers it has them under); it
        must then write a first control line, that it is ready."""

    def check(self, env_vars: dict[str, str]) -> None:
        """Refuse (ValueError) ``env_vars`` this language cannot set, before the cell starts."""

    def submit(self, code: str, env_vars: dict[str, str]) -> None:
        """Hand the process the cell ``self.seq``."""
        raise NotImplementedError

    def control(self, message: bytes, emit: Emit) -> bool:
        """Handle one control line (one of the current cell's, or a stale one to drop); whether
        the cell has ended."""
        raise NotImplementedError

    # ---- the process ----------------------------------------------------------------------

    def start(self) -> None:
        if not os.path.isdir(self.cwd):
            raise ContextStartError(f"cwd {self.cwd!r} is not a directory in the sandbox")
        child_fds, kept = self.pipes()
        try:
            self.process = subprocess.Popen(
                self.command(child_fds), cwd=self.cwd, env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=child_fds, start_new_session=True,
            )
        except OSError as error:
            for fd in (*child_fds, *kept):
                os.close(fd)
            raise ContextStartError(f"{self.name} did not start: {error}") from None
        for fd in child_fds:
            os.close(fd)
        self.kept = kept
        self.control_fd = kept[0]
        self._control_buffer = b""
        self.seq = 0
        self.started(child_fds)
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                said = "".join(self._drain_text(fd) for fd in self._output_fds())
                self.stop()
                raise ContextStartError(f"{self.name} exited at its start ({said.strip()[-500:] or 'no output'})")
            ready = self._read_control(POLL_S)
            if ready is not None:
                for fd in self._output_fds():  # what the process says at its start is no cell's
                    self._drain_text(fd)
                return
        self.stop()
        raise ContextStartError(f"{self.name} did not start within {START_S:g} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None:
            with contextlib.suppress(ProcessLookupError):  # what a cell left running in the background too
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            for pipe in (process.stdin, process.stdout, process.stderr):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        for fd in self.kept:
            with contextlib.suppress(OSError):
                os.close(fd)
        self.kept = ()
        self.control_fd = -1

    def interrupt(self) -> None:
        """SIGINT to the process's group: the cell and what it started (the process survives it)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGINT)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    # ---- a cell ---------------------------------------------------------------------------

    def run(self, code: str, env_vars: dict[str, str], emit: Emit, gone: Callable[[], bool]) -> None:
        """Run one cell, sending its lines with ``emit`` (the caller holds ``lock``). A client
        that has gone interrupts the cell; what it still says is dropped."""
        if not self.alive():
            self.stop()
            self.start()
        assert self.process is not None
        self.seq += 1
        self.submit(code, env_vars)
        decoders = {name: codecs.getincrementaldecoder("utf-8")(errors="replace") for name in ("stdout", "stderr")}
        listening = True
        interrupted_at: float | None = None
        nudged_at = 0.0
        nudges = 0

        def hang_up() -> None:
            nonlocal listening, interrupted_at
            listening = False
            if interrupted_at is None:
                self.interrupt()
                interrupted_at = time.monotonic()

        def send(doc: dict[str, Any]) -> bool:
            if listening and not emit(doc):
                hang_up()
            return listening

        def pump(timeout: float) -> bool:
            """Send what the pipes hold, control lines last; whether the cell has ended."""
            streams = self._output_fds()
            readable, _, _ = select.select([*streams, self.control_fd], [], [], timeout)
            for fd, name in streams.items():
                if fd in readable or self.control_fd in readable:
                    text = self._drain(fd, decoders[name])
                    if text:
                        send({"type": name, "text": text, "timestamp": time.time_ns()})
            if self.control_fd in readable:
                for line in self._control_lines():
                    if self.control(line, send):
                        return True
            return False

        send({"type": "number_of_executions", "execution_count": self.seq})
        while True:
            if listening and gone():
                hang_up()
            if pump(POLL_S):
                send({"type": "end_of_execution"})
                return
            assert self.process is not None
            if self.process.poll() is not None:
                if pump(0):  # what it said just before it exited
                    send({"type": "end_of_execution"})
                    return
                status = self.process.returncode
                self.stop()
                send({"type": "error", "name": "ContextRestarted",
                      "value": f"{self.name} exited with status {status} during the cell; a fresh {self.name} "
                               "takes its place (the context's state is gone)", "traceback": ""})
                send({"type": "end_of_execution"})
                with contextlib.suppress(ContextStartError):
                    self.start()
                return
            now = time.monotonic()
            if interrupted_at is not None and nudges < NUDGES and now - max(interrupted_at, nudged_at) > RESEND_S:
                nudges += 1
                nudged_at = now
                if nudges % 2:
                    self.ask_end()
                else:
                    self.interrupt()

    def ask_end(self) -> None:
        """Ask again for the end of the current cell (after an interrupt); nothing by default."""

    # ---- pipes ----------------------------------------------------------------------------

    def _output_fds(self) -> dict[int, str]:
        assert self.process is not None and self.process.stdout is not None and self.process.stderr is not None
        return {self.process.stdout.fileno(): "stdout", self.process.stderr.fileno(): "stderr"}

    def _drain(self, fd: int, decoder: codecs.IncrementalDecoder) -> str:
        chunks = []
        for _ in range(DRAIN_READS):  # bounded: a background job may write without end
            if not select.select([fd], [], [], 0)[0]:
                break
            data = os.read(fd, 65536)
            if not data:
                break
            chunks.append(data)
        return decoder.decode(b"".join(chunks))

    def _drain_text(self, fd: int) -> str:
        return self._drain(fd, codecs.getincrementaldecoder("utf-8")(errors="replace"))

    def _read_control(self, timeout: float) -> bytes | None:
        """The next control line within ``timeout`` (any cell's), or None."""
        if select.select([self.control_fd], [], [], timeout)[0]:
            lines = self._control_lines()
            if lines:
                return lines[0]
        return None

    def _control_lines(self) -> list[bytes]:
        data = os.read(self.control_fd, 65536)
        self._control_buffer += data
        *lines, self._control_buffer = self._control_buffer.split(b"\n")
        return lines

    def write_stdin(self, data: bytes) -> None:
        assert self.process is not None and self.process.stdin is not None
        try:
            self.process.stdin.write(data)
            self.process.stdin.flush()
        except OSError:
            pass  # the process has exited: the cell ends with that
