"""``callbox exec | ps | gc``: disposable sandboxes from the command line.

``exec`` runs one command in a fresh sandbox, streams its output and exits with its code
(124 timeout, 128+N for signal N, 137 OOM); ``ps`` lists live sandboxes; ``gc`` removes
expired or orphaned ones.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from harness.cli.foreground import command_of, foreground_options, output_cap, print_interrupted, run_foreground
from harness.cli.options import connect_engine, engine_options, read_stdin, sandbox_options, spec_from_args
from harness.core.stopping import STOPS

COMMANDS = ("exec", "ps", "gc")


def add_parsers(sub: Any) -> None:
    ex = sub.add_parser("exec", help="run one command in a fresh disposable sandbox")
    sandbox_options(ex)
    engine_options(ex)
    foreground_options(ex, json_help="print one JSON result object instead of streaming")

    ps = sub.add_parser("ps", help="list live sandboxes")
    ps.add_argument("--json", action="store_true",
                    help="print a JSON list of {sandbox_id, container_id, status, expires_at, expires_in_s, "
                         "expired, owner}")
    engine_options(ps)
    gc = sub.add_parser("gc", help="remove expired or orphaned sandboxes")
    gc.add_argument("--json", action="store_true", help="print one JSON object {removed: [ids], count}")
    engine_options(gc)


def run(args: argparse.Namespace) -> int:
    if args.command == "exec":
        return _exec(args)
    if args.command == "ps":
        return _ps(args)
    return _gc(args)


def _exec(args: argparse.Namespace) -> int:
    cmd = command_of(args, "callbox exec [OPTIONS] -- CMD [ARG...]")
    cap = output_cap(args)
    spec = spec_from_args(args, ttl_seconds=max(600, int(args.timeout) + 300))
    stdin = read_stdin()
    engine = connect_engine(args)
    try:
        sandbox = engine.create(spec)
    except STOPS as stop:
        if args.json:
            print_interrupted(stop)
        raise
    try:
        return run_foreground(sandbox.agent, cmd, cwd=spec.workdir, env=sandbox.spec.env, stdin=stdin,
                              timeout=args.timeout, cap=cap, as_json=args.json, memory=args.memory)
    finally:
        sandbox.destroy()


def _ps(args: argparse.Namespace) -> int:
    engine = connect_engine(args)
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
    from harness.cli.options import engine_choice
    from harness.engine.docker.engine import DockerEngine, connect_client

    choice = engine_choice(args)
    if choice.ray is not None:  # each node's host removes what expired there
        removed = connect_engine(args).gc()
    else:
        removed = DockerEngine(connect_client(), reap_on_start=False).gc()
    if args.json:
        print(json.dumps({"removed": removed, "count": len(removed)}))
        return 0
    for sandbox_id in removed:
        print(f"removed {sandbox_id}")
    print(f"{len(removed)} sandbox(es) removed")
    return 0
