"""One command run in the foreground of a sandbox: what ``callbox exec`` (a fresh sandbox)
and ``callbox sandbox exec NAME`` (a living one) share.

The command's output is streamed as it comes (stdout to stdout, stderr to stderr, a marker
where the agent dropped bytes), or, with ``--json``, printed as one result object at the
end; the caller exits with :func:`run_foreground`'s code: the command's own, 124 for a
timeout, 128+N for signal N, 137 for the OOM killer, 126/127 for a command that could not
start.

Stopped by Ctrl-C or SIGTERM, ``--json`` still prints its one object before callbox exits
(130 or 143), with what arrived so far, ``"interrupted": true``, ``exit_code`` 128+N and
``signal`` N for the signal N that stopped callbox (:func:`print_interrupted`); the command
itself is stopped with the sandbox's call.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Generator, Mapping, Sequence
from typing import TYPE_CHECKING

from harness.cli.options import say
from harness.core.errors import UsageError
from harness.core.units import parse_size, timeout_seconds

if TYPE_CHECKING:
    from harness.engine.agent_client import AgentClient
    from harness.engine.exec_result import OutputStreams

__all__ = ["DEFAULT_TIMEOUT_S", "command_of", "foreground_options", "output_cap", "print_interrupted",
           "run_foreground"]

DEFAULT_TIMEOUT_S = 30.0


def foreground_options(parser: argparse.ArgumentParser, *, json_help: str,
                       timeout_default: float | None = DEFAULT_TIMEOUT_S, remainder: bool = True) -> None:
    """``--timeout``, ``--json``, ``--output-cap`` and ``-- CMD`` (``timeout_default`` None: the
    caller tells an absent ``--timeout`` from 30). ``remainder``: CMD is everything after the
    options (``callbox exec [OPTIONS] CMD``); else the words after ``--`` (a parser that
    splits there, as :class:`harness.cli.sandbox_common.CommandParser` does)."""
    parser.add_argument("--timeout", type=timeout_seconds, default=timeout_default,
                        help="wall-clock limit in seconds, at most 86400 (default 30)")
    parser.add_argument("--json", action="store_true", help=json_help)
    parser.add_argument("--output-cap", default="1m",
                        help="bytes kept per stream, head and tail, at least 1 (default 1m)")
    parser.add_argument("cmd", nargs=argparse.REMAINDER if remainder else "*", help="-- CMD [ARG...]")


def command_of(args: argparse.Namespace, usage: str) -> list[str]:
    """The command after ``--``; UsageError naming ``usage`` when there is none."""
    cmd: list[str] = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError(f"no command given: use `{usage}`")
    return cmd


def output_cap(args: argparse.Namespace) -> int:
    """``--output-cap`` in bytes: at least 1. The agent reads 0 as its default (1 MiB), so 0
    is refused rather than passed on: there is no unbounded output to ask for."""
    try:
        cap = parse_size(args.output_cap)
    except ValueError as exc:
        raise UsageError(f"--output-cap: {exc}") from None
    if cap < 1:
        raise UsageError(f"--output-cap: {args.output_cap} is below the minimum of 1 byte; output is always capped "
                         "(the first half of the cap streams live, the last half is held in the sandbox's memory "
                         "until the command ends): to keep more, pass a larger size, e.g. --output-cap 64m")
    return cap


def run_foreground(agent: AgentClient, cmd: Sequence[str], *, cwd: str, env: Mapping[str, str], stdin: bytes,
                   timeout: float, cap: int, as_json: bool, memory: str) -> int:
    """Run ``cmd`` through ``agent`` to its end, streaming its output (or printing the JSON
    result); the exit code a shell would give it."""
    from harness.core.errors import AgentCallError
    from harness.core.stopping import STOPS
    from harness.engine.exec_result import ExecResult, OutputStreams, collect, gap_marker, start_failure_exit_code

    def stream(name: str, data: bytes, dropped_before: int) -> None:
        out = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        if dropped_before:
            out.write(gap_marker(dropped_before))
        out.write(data)
        out.flush()

    began = time.monotonic()
    streams = OutputStreams()
    events = agent.exec(cmd, cwd=cwd, env=env, stdin=stdin, timeout_ms=int(timeout * 1000),
                        output_cap_bytes=cap, rpc_timeout=timeout + 60)
    try:
        result = collect(events, on_output=None if as_json else stream, streams=streams)
    except AgentCallError as error:
        code = start_failure_exit_code(error)
        if code is None:
            raise
        result = ExecResult.not_started(code, error.message)
    except STOPS as stop:
        if as_json:
            print_interrupted(stop, streams, began)
        raise
    finally:
        # On any way out (a reader that left raises BrokenPipeError in stream()), the RPC
        # is cancelled before the caller goes on (a fresh sandbox is destroyed next).
        if isinstance(events, Generator):
            events.close()
    if as_json:
        print(json.dumps(result.to_json()))
    elif result.error is not None:
        say(result.error)
    elif result.timed_out:
        print(f"callbox: timed out after {timeout:g} s; the process tree was killed", file=sys.stderr)
    elif result.oom_killed:
        print(f"callbox: killed by the OOM killer (memory limit {memory})", file=sys.stderr)
    return result.shell_exit_code


def print_interrupted(stop: BaseException, streams: OutputStreams | None = None, began: float | None = None) -> None:
    """The ``--json`` object of a command callbox was stopped in (``stop``: KeyboardInterrupt,
    or the SystemExit of SIGTERM): what ``streams`` got since ``began``; with no streams the
    command never started, and ``error`` says so."""
    from harness.core.stopping import stop_signal
    from harness.engine.exec_result import ExecResult, OutputStreams

    name = stop_signal(stop) or "SIGINT"
    signum = int(signal.Signals[name])
    seen = streams if streams is not None else OutputStreams()
    result = ExecResult(exit_code=128 + signum, signal=signum, timed_out=False, oom_killed=False,
                        duration_ms=0.0 if began is None else (time.monotonic() - began) * 1000,
                        stdout=seen.stdout, stderr=seen.stderr,
                        error=None if streams is not None else f"interrupted ({name}) before the command started")
    print(json.dumps({**result.to_json(), "interrupted": True}), flush=True)
