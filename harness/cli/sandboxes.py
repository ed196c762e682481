"""``callbox exec | ps | gc``: disposable sandboxes from the command line.

``exec`` runs one command in a fresh sandbox, streams its output and exits with its code
(124 timeout, 128+N for signal N, 137 OOM); ``ps`` lists live sandboxes; ``gc`` removes
expired or orphaned ones.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Generator
from typing import Any

from harness.cli.options import connect_engine, read_stdin, sandbox_options, say, spec_from_args
from harness.core.errors import UsageError
from harness.core.units import parse_size, timeout_seconds

COMMANDS = ("exec", "ps", "gc")


def add_parsers(sub: Any) -> None:
    ex = sub.add_parser("exec", help="run one command in a fresh disposable sandbox")
    sandbox_options(ex)
    ex.add_argument("--timeout", type=timeout_seconds, default=30.0,
                    help="wall-clock limit in seconds, at most 86400 (default 30)")
    ex.add_argument("--json", action="store_true", help="print one JSON result object instead of streaming")
    ex.add_argument("--output-cap", default="1m", help="bytes kept per stream, head and tail (default 1m)")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, help="-- CMD [ARG...]")

    ps = sub.add_parser("ps", help="list live sandboxes")
    ps.add_argument("--json", action="store_true",
                    help="print a JSON list of {sandbox_id, container_id, status, expires_at, expires_in_s, "
                         "expired, owner}")
    gc = sub.add_parser("gc", help="remove expired or orphaned sandboxes")
    gc.add_argument("--json", action="store_true", help="print one JSON object {removed: [ids], count}")


def run(args: argparse.Namespace) -> int:
    if args.command == "exec":
        return _exec(args)
    if args.command == "ps":
        return _ps(args)
    return _gc(args)


def _exec(args: argparse.Namespace) -> int:
    from harness.core.errors import AgentCallError
    from harness.engine.exec_result import ExecResult, collect, gap_marker, start_failure_exit_code

    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        raise UsageError("no command given: use `callbox exec [OPTIONS] -- CMD [ARG...]`")
    try:
        cap = parse_size(args.output_cap)
    except ValueError as exc:
        raise UsageError(f"--output-cap: {exc}") from None
    spec = spec_from_args(args, ttl_seconds=max(600, int(args.timeout) + 300))
    stdin = read_stdin()

    def stream(name: str, data: bytes, dropped_before: int) -> None:
        out = sys.stdout.buffer if name == "stdout" else sys.stderr.buffer
        if dropped_before:
            out.write(gap_marker(dropped_before))
        out.write(data)
        out.flush()

    engine = connect_engine()
    sandbox = engine.create(spec)
    try:
        events = sandbox.agent.exec(
            cmd, cwd=spec.workdir, env=sandbox.spec.env, stdin=stdin, timeout_ms=int(args.timeout * 1000),
            output_cap_bytes=cap, rpc_timeout=args.timeout + 60,
        )
        try:
            result = collect(events, on_output=None if args.json else stream)
        except AgentCallError as error:
            code = start_failure_exit_code(error)
            if code is None:
                raise
            result = ExecResult.not_started(code, error.message)
        finally:
            # On any way out (a reader that left raises BrokenPipeError in stream()), the
            # RPC is cancelled before the sandbox is destroyed.
            if isinstance(events, Generator):
                events.close()
    finally:
        sandbox.destroy()
    if args.json:
        print(json.dumps(result.to_json()))
    elif result.error is not None:
        say(result.error)
    elif result.timed_out:
        print(f"callbox: timed out after {args.timeout:g} s; the process tree was killed", file=sys.stderr)
    elif result.oom_killed:
        print(f"callbox: killed by the OOM killer (memory limit {args.memory})", file=sys.stderr)
    return result.shell_exit_code


def _ps(args: argparse.Namespace) -> int:
    engine = connect_engine()
    now = time.time()
    rows = [{
        "sandbox_id": info.sandbox_id,
        "container_id": info.container_id,
        "status": info.status,
        "expires_at": info.expires,
        "expires_in_s": round(info.expires - now),
        "expired": info.expires <= now,
        "owner": info.owner,
    } for info in engine.list_sandboxes()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'SANDBOX':<14}{'CONTAINER':<14}{'STATUS':<10}{'EXPIRES IN':<12}OWNER")
    for row in rows:
        expires = "expired" if row["expired"] else f"{row['expires_in_s']}s"
        print(f"{row['sandbox_id']:<14}{row['container_id']:<14}{row['status']:<10}{expires:<12}{row['owner']}")
    return 0


def _gc(args: argparse.Namespace) -> int:
    from harness.engine.docker.engine import DockerEngine, connect_client

    client = connect_client()
    engine = DockerEngine(client, reap_on_start=False)
    removed = engine.gc()
    if args.json:
        print(json.dumps({"removed": removed, "count": len(removed)}))
        return 0
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    print(f"{len(removed)} sandbox(es) removed")
    return 0
