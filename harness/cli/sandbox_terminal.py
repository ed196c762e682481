"""``callbox sandbox attach NAME [--pid P] [-- CMD]``: an interactive terminal in a living sandbox.

Without ``--pid`` it starts CMD (default ``bash -i``) as a PTY job the size of the local
terminal (the ``process`` action); with ``--pid`` it joins a running job (the ``attach``
action), replaying the output still held first. Keystrokes go to the job, its output to
stdout. When the local stdin is a terminal it is put in raw mode (every key, Ctrl-C and
Ctrl-Z included, goes to the job) and always restored on the way out, on errors and signals
too; a change of its size (SIGWINCH) resizes the job's terminal.

``Ctrl-]`` (byte 0x1d, as in telnet) detaches: the job keeps running, ``attach --pid P``
joins it again; exit 0. When the job ends, the command exits with its code (128+N for
signal N). Without a terminal on stdin there is no raw mode: piped input goes to the job as
it comes (a 0x1d in it detaches too) and the end of the input is sent as ``^D``, what typing
it would send. ``--json`` prints one object on stdout after the terminal ends: ``{sandbox,
sandbox_id, pid, detached, state, exit_code, signal}``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from harness.cli.sandbox_common import (
    connect,
    gate_options,
    guarded,
    known_job,
    load_gate_policy,
    opened,
    print_json,
)
from harness.cli.sandbox_jobs import job_exit_code
from harness.core.errors import UsageError

if TYPE_CHECKING:
    from harness.engine.docker.sandbox import Sandbox
    from harness.engine.jobs import JobInfo, Terminal

DETACH_KEY = b"\x1d"
"""Ctrl-]: detach, leaving the job running."""
END_OF_INPUT = b"\x04"
"""^D: what the end of piped input is sent as."""
DEFAULT_COMMAND = ["bash", "-i"]
READ_BYTES = 4096


def add_verbs(verbs: Any) -> None:
    attach = verbs.add_parser("attach", help="an interactive terminal: start CMD on a PTY, or join job --pid",
                              description="Ctrl-] detaches (the job keeps running); the end of the job ends it.")
    attach.add_argument("name", help="sandbox name or id")
    attach.add_argument("--pid", type=int, help="join this running job instead of starting CMD")
    attach.add_argument("--json", action="store_true",
                        help="print {sandbox, sandbox_id, pid, detached, state, exit_code, signal} at the end")
    gate_options(attach)
    attach.add_argument("cmd", nargs="*", help="-- CMD [ARG...] (default bash -i)")


def _attach(args: argparse.Namespace) -> int:
    cmd: list[str] = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if cmd and args.pid is not None:
        raise UsageError("give either --pid P (join a job) or -- CMD (start one), not both")
    local = LocalTerminal()
    policy = load_gate_policy(args)
    engine = connect()
    with opened(engine, args.name) as sandbox:
        jobs = sandbox.jobs
        rows, cols = local.size()
        if args.pid is None:
            command = cmd or DEFAULT_COMMAND
            details: dict[str, Any] = {"sandbox": args.name, "command": command, "tag": "terminal", "pty": True}
            action = "process"
        else:
            details = {"sandbox": args.name, "pid": args.pid, "mode": "terminal"}
            action = "attach"
        with guarded(args, policy, sandbox.id, action, details, workdir=sandbox.spec.workdir) as ticket:
            if args.pid is None:
                env = {**sandbox.spec.env, "TERM": local.term_name()}
                pid = jobs.start(command, tag="terminal", cwd=sandbox.spec.workdir, env=env, pty=True,
                                 rows=rows, cols=cols).pid
            else:
                pid = args.pid
            with known_job(sandbox, pid):
                term = jobs.terminal(pid)
            if args.pid is not None and rows:
                term.resize(rows, cols)  # the job's programs redraw for this terminal
            ended, detached = _session(term, local)
            ticket.outcome.update(pid=pid, detached=detached)
    return _report(args, sandbox, pid, ended, detached)


def _report(args: argparse.Namespace, sandbox: Sandbox, pid: int, ended: JobInfo | None, detached: bool) -> int:
    if args.json:
        print_json({"sandbox": sandbox.label, "sandbox_id": sandbox.id, "pid": pid, "detached": detached,
                    "state": ended.state if ended else "running", "exit_code": ended.exit_code if ended else None,
                    "signal": ended.signal if ended else 0})
    if ended is not None:
        return job_exit_code(ended)
    how = "detached from" if detached else "the terminal stream ended for"
    print(f"callbox: {how} job {pid} in sandbox {sandbox.label}; it keeps running "
          f"(`callbox sandbox attach {sandbox.label} --pid {pid}` joins it again)", file=sys.stderr)
    return 0 if detached else 1


def _session(term: Terminal, local: LocalTerminal) -> tuple[JobInfo | None, bool]:
    """Pump keys in and output out until the job ends (its final info) or the user detaches."""
    from harness.engine.jobs import JobChunk, JobEnded, JobGap, gap_text

    detached = threading.Event()
    ended: JobInfo | None = None
    out = sys.stdout.buffer
    with local.raw(), local.signals(on_resize=lambda r, c: _resize(term, r, c)):
        reader = threading.Thread(target=_keys, args=(term, local, detached), name="attach-input", daemon=True)
        reader.start()
        try:
            for event in term.events():
                if isinstance(event, JobChunk):
                    out.write(event.data)
                    out.flush()
                elif isinstance(event, JobGap):
                    out.write(gap_text(event))
                    out.flush()
                elif isinstance(event, JobEnded):
                    ended = event.info
        finally:
            term.close()
    return ended, detached.is_set()


def _resize(term: Terminal, rows: int, cols: int) -> None:
    with contextlib.suppress(ValueError):  # the terminal closed meanwhile
        term.resize(rows, cols)


def _keys(term: Terminal, local: LocalTerminal, detached: threading.Event) -> None:
    """The input thread: local keys (or piped bytes) to the job, until detach or the end."""
    try:
        while data := local.read():
            before, key, _ = data.partition(DETACH_KEY)
            if before:
                term.send(before)
            if key:
                detached.set()
                term.close()
                return
        if not local.is_tty:
            term.send(END_OF_INPUT)
    except (ValueError, OSError):
        return  # the terminal closed (the job ended) or stdin went away


class LocalTerminal:
    """The local side: stdin (raw mode when it is a terminal), its size, its signals."""

    def __init__(self) -> None:
        self.fd: int | None
        try:
            self.fd = sys.stdin.fileno()
        except (AttributeError, ValueError, OSError):  # no stdin, or one without a descriptor
            self.fd = None
        self.is_tty = self.fd is not None and os.isatty(self.fd)

    def size(self) -> tuple[int, int]:
        """(rows, columns) of the local terminal (stdin's, else stdout's); (0, 0) when there
        is none (the job then gets 24 x 80)."""
        for fd in (self.fd, _fileno(sys.stdout)):
            if fd is not None and os.isatty(fd):
                with contextlib.suppress(OSError):
                    columns, lines = os.get_terminal_size(fd)
                    return lines, columns
        return 0, 0

    def term_name(self) -> str:
        """``TERM`` for the job: the local one on a terminal, else ``dumb``."""
        return (os.environ.get("TERM") or "xterm-256color") if self.is_tty else "dumb"

    def read(self) -> bytes:
        if self.fd is not None:
            return os.read(self.fd, READ_BYTES)
        stdin: Any = sys.stdin
        return b"" if stdin is None else bytes(stdin.buffer.read1(READ_BYTES))

    @contextlib.contextmanager
    def raw(self) -> Iterator[None]:
        """Raw mode while the block runs (a terminal only); its settings restored however it ends."""
        if not self.is_tty or self.fd is None:
            yield
            return
        import termios
        import tty

        fd = self.fd
        saved = termios.tcgetattr(fd)
        try:
            tty.setraw(fd, termios.TCSANOW)
            yield
        finally:
            termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    @contextlib.contextmanager
    def signals(self, *, on_resize: Callable[[int, int], None]) -> Iterator[None]:
        """SIGWINCH resizes (a terminal only); SIGHUP and SIGTERM unwind through every
        ``finally`` (raw mode is undone) and exit 128+N. The previous handlers come back after."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return

        def resized(_signum: int, _frame: object) -> None:
            rows, cols = self.size()
            if rows:
                on_resize(rows, cols)

        def ended(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        wanted: dict[int, Any] = {signal.SIGHUP: ended, signal.SIGTERM: ended}
        if self.is_tty:
            wanted[signal.SIGWINCH] = resized
        previous = {signum: signal.signal(signum, handler) for signum, handler in wanted.items()}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, ValueError, OSError):
        return None


VERBS: dict[str, Callable[[argparse.Namespace], int]] = {"attach": _attach}
