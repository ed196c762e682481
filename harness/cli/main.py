"""The ``callbox`` command line: the parser, built from each command group's
``add_parsers``, and the dispatch to the group's ``run``.

Every failure a user can cause ends in one line ``callbox: <problem>`` and the exit status
the error table (:mod:`harness.core.errors`) gives its code: 2 for usage errors, 4 for
something that does not exist, 5 for a wrong state, 6 for a refusal, 7 for a limit, 125 for
callbox's own failures (engine unreachable, image missing); a command run in a sandbox
passes its own status through (124 timeout, 128+N for signal N, 137 OOM).
Output into a pipe whose reader left (``callbox tools | head``) ends quietly with 141.

Each group is a module with ``COMMANDS`` (the top-level commands it owns),
``add_parsers(sub)`` and ``run(args)``; the options they share are in
:mod:`harness.cli.options`. Groups import nothing from this module.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
import threading
from collections.abc import Sequence
from types import ModuleType
from typing import NoReturn, TextIO

from harness.cli import calls as cli_calls
from harness.cli import doctor as cli_doctor
from harness.cli import eval as cli_eval
from harness.cli import image as cli_image
from harness.cli import run as cli_run
from harness.cli import sandbox_cmd as cli_sandbox
from harness.cli import sandboxes as cli_sandboxes
from harness.cli import serve as cli_serve
from harness.cli import service as cli_service
from harness.cli import template as cli_template
from harness.cli import undo as cli_undo
from harness.cli.options import UsageParser, say
from harness.core.errors import EXIT_CALLBOX_FAILED, CallboxError, UsageError, short_reason

GROUPS: tuple[ModuleType, ...] = (cli_image, cli_sandboxes, cli_sandbox, cli_calls, cli_undo, cli_run, cli_eval,
                                  cli_serve, cli_service, cli_doctor, cli_template)
"""The command groups, in the order ``--help`` lists their commands."""


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(prog="callbox", description="Sandboxed tool execution for LLM agents.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the engine does")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=UsageParser)
    for group in GROUPS:
        group.add_parsers(sub)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: ``callbox X.Y.Z`` from the installed package's metadata, exit 0
    (looked up only when asked, so other commands do not pay for it)."""

    def __init__(self, option_strings: Sequence[str], dest: str, **_kwargs: object) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="print callbox's version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *_args: object) -> NoReturn:
        import importlib.metadata

        try:
            version = importlib.metadata.version("callbox")
        except importlib.metadata.PackageNotFoundError:  # a checkout that was never installed
            version = "(not installed)"
        print(f"callbox {version}")
        parser.exit(0)


def _terminate(signum: int, _frame: object) -> NoReturn:
    # Unwind through every `finally`, so a sandbox being used is destroyed, not leaked.
    raise SystemExit(128 + signum)


EXIT_CLOSED_OUTPUT = 128 + signal.SIGPIPE
"""141: what a shell reports for a process its pipe's reader left (``callbox tools | head``)."""


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _terminate)
    try:
        code = _main(args_list)
        sys.stdout.flush()  # buffered output meets a closed pipe here, not at interpreter exit
        return code
    except BrokenPipeError as exc:
        # Python ignores SIGPIPE, so a reader that left shows up as this exception, raised
        # through every `finally` (a sandbox in use is destroyed on the way out).
        return _output_closed(exc)


def _main(args_list: list[str]) -> int:
    try:
        args = build_parser().parse_args(args_list)
        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.WARNING,
            format="callbox: %(message)s",
        )
        return _dispatch(args)
    except CallboxError as error:
        say(error.message)
        return error.exit_code
    except KeyboardInterrupt:
        print("callbox: interrupted", file=sys.stderr)
        return 130


def _output_closed(exc: BrokenPipeError) -> int:
    """End quietly with 141 when stdout or stderr lost its reader; any other broken pipe is
    callbox's own failure."""
    closed = [s for s in (sys.stdout, sys.stderr) if _reader_gone(s) is not False]
    if not closed:
        say(short_reason(exc))
        return EXIT_CALLBOX_FAILED
    for stream in closed:
        # Nothing more can reach that reader; point the descriptor at /dev/null so the
        # interpreter's final flush does not report the same broken pipe again.
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
    return EXIT_CLOSED_OUTPUT


def _reader_gone(stream: TextIO | None) -> bool | None:
    """Whether ``stream`` is a pipe or socket whose other end was closed (None: cannot tell)."""
    if stream is None:
        return None
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return None
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return None
    return any(mask & (select.POLLERR | select.POLLHUP) for _, mask in events)


def _dispatch(args: argparse.Namespace) -> int:
    for group in GROUPS:
        if args.command in group.COMMANDS:
            code: int = group.run(args)
            return code
    raise UsageError(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
