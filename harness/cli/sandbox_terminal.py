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
it comes (a 0x1d in it detaches too), the end of the input closes the job's input (a PTY job
gets ``^D``, what typing it would send), and Ctrl-C interrupts callbox (exit 130), not the
job, which keeps running. ``--json`` prints one object on stdout after the terminal ends: ``{sandbox,
sandbox_id, pid, detached, state, exit_code, signal}``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import queue
import signal
import sys
import threading
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any

from harness.cli.sandbox_common import (
    connect,
    gate_options,
    guarded,
    known_job,
    load_gate_policy,
    opened,
    print_json,
    run_of,
)
from harness.cli.sandbox_jobs import job_exit_code
from harness.core.errors import AgentCallError, UsageError

if TYPE_CHECKING:
    from harness.engine.docker.sandbox import Sandbox
    from harness.engine.jobs import JobInfo, JobsClient

DETACH_KEY = b"\x1d"
"""Ctrl-]: detach, leaving the job running."""
DEFAULT_COMMAND = ["bash", "-i"]
READ_BYTES = 4096


def add_verbs(verbs: Any) -> None:
    attach = verbs.add_parser("attach", help="an interactive terminal: start CMD on a PTY, or join job --pid",
                              description="Ctrl-] detaches (the job keeps running); the end of the job ends it.")
    attach.add_argument("name", help="sandbox name or id (a server's sandbox: also its E2B or run id)")
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
    engine = connect(args)
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
        with guarded(args, policy, run_of(sandbox), action, details, workdir=sandbox.spec.workdir) as ticket:
            if args.pid is None:
                env = {**sandbox.spec.env, "TERM": local.term_name()}
                pid = jobs.start(command, tag="terminal", cwd=sandbox.spec.workdir, env=env, pty=True,
                                 rows=rows, cols=cols).pid
            else:
                pid = args.pid
            with known_job(sandbox, pid):
                jobs.get(pid)
            if args.pid is not None and rows:
                with contextlib.suppress(AgentCallError):  # a job without a terminal has no size
                    jobs.resize(pid, rows, cols)  # its programs redraw for this terminal
            ended, detached = _session(jobs, pid, local)
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


class _Detach(BaseException):
    """Raised in the main thread (by DETACH_SIGNAL) to leave the output loop on a detach."""


DETACH_SIGNAL = signal.SIGUSR1
"""How the input thread wakes the main thread, blocked reading the output, to detach."""


def _session(jobs: JobsClient, pid: int, local: LocalTerminal) -> tuple[JobInfo | None, bool]:
    """Pump keys in and output out until the job ends (its final info) or the user detaches.

    The output is one Attach stream read by the main thread; keys go in by WriteInput from an
    input thread, sizes by Resize from another (so a signal handler never makes a call). A
    detach interrupts the main thread's read with DETACH_SIGNAL; the stream is then only
    cancelled, never read again (a gRPC call interrupted mid-read takes no second read)."""
    from harness.engine.jobs import JobChunk, JobEnded, JobGap, gap_text

    detached = threading.Event()
    pumping = True
    ended: JobInfo | None = None
    out = sys.stdout.buffer
    sizes: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()  # put() is safe in a handler

    def on_detach() -> None:
        if pumping:
            raise _Detach

    with local.raw(), local.signals(on_resize=lambda rows, cols: sizes.put((rows, cols)), on_detach=on_detach):
        reader = threading.Thread(target=_keys, args=(jobs, pid, local, detached), name="attach-input", daemon=True)
        resizer = threading.Thread(target=_resizes, args=(jobs, pid, sizes), name="attach-resize", daemon=True)
        events = jobs.attach(pid, follow=True)
        try:
            resizer.start()
            reader.start()  # inside the try: a detach may come before start() returns
            for event in events:
                if isinstance(event, JobChunk):
                    out.write(event.data)
                    out.flush()
                elif isinstance(event, JobGap):
                    out.write(gap_text(event))
                    out.flush()
                elif isinstance(event, JobEnded):
                    ended = event.info
        except _Detach:
            pass
        finally:
            pumping = False
            sizes.put(None)
            if isinstance(events, Generator):
                events.close()  # cancels the stream; the job runs on
    return ended, detached.is_set()


def _resizes(jobs: JobsClient, pid: int, sizes: queue.SimpleQueue[tuple[int, int] | None]) -> None:
    """The resize thread: each new local size to the job's terminal, until None."""
    while (size := sizes.get()) is not None:
        with contextlib.suppress(AgentCallError):  # the job ended meanwhile, or has no terminal
            jobs.resize(pid, *size)


def _keys(jobs: JobsClient, pid: int, local: LocalTerminal, detached: threading.Event) -> None:
    """The input thread: local keys (or piped bytes) to the job until the detach key or the
    end of the input. Keys the job cannot take (it ended, or has no stdin) are dropped; the
    detach key still works."""
    taking = True
    try:
        while data := local.read():
            before, key, _ = data.partition(DETACH_KEY)
            if before and taking:
                taking = _write(jobs, pid, before)
            if key:
                detached.set()
                local.wake_main()
                return
        if not local.is_tty and taking:
            _write(jobs, pid, b"", close=True)  # a terminal gets ^D, a pipe its end of file
    except OSError:
        return  # stdin went away


def _write(jobs: JobsClient, pid: int, data: bytes, *, close: bool = False) -> bool:
    try:
        jobs.write(pid, data, close=close)
    except AgentCallError:
        return False
    return True


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
            with contextlib.suppress(termios.error):  # the terminal is gone (SIGHUP)
                termios.tcsetattr(fd, termios.TCSADRAIN, saved)

    def wake_main(self) -> None:
        """Make the main thread run its ``on_detach`` (see :meth:`signals`)."""
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, DETACH_SIGNAL)

    @contextlib.contextmanager
    def signals(self, *, on_resize: Callable[[int, int], None], on_detach: Callable[[], None]) -> Iterator[None]:
        """SIGWINCH resizes (a terminal only); DETACH_SIGNAL runs ``on_detach``; SIGHUP and
        SIGTERM unwind through every ``finally`` (raw mode is undone) and exit 128+N. The
        previous handlers come back after. Only the main thread can have signal handlers."""
        if threading.current_thread() is not threading.main_thread():
            raise UsageError("callbox sandbox attach runs in the main thread only (it handles signals)")

        def resized(_signum: int, _frame: object) -> None:
            rows, cols = self.size()
            if rows:
                on_resize(rows, cols)

        def ended(signum: int, _frame: object) -> None:
            raise SystemExit(128 + signum)

        def detach(_signum: int, _frame: object) -> None:
            on_detach()

        wanted: dict[int, Any] = {signal.SIGHUP: ended, signal.SIGTERM: ended, DETACH_SIGNAL: detach}
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
