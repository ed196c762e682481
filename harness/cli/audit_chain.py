"""``callbox audit verify`` and ``callbox audit export``: the audit chain from the command line.

``verify`` checks the chain (:mod:`harness.audit.chain_verify`) and prints its head, or the
first record that was changed, removed or inserted outside the store (exit 1) and the
others after it. ``export`` writes the chain as JSON lines (:mod:`harness.audit.chain_export`),
all clients' or one client's, to stdout or a file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any, TextIO

from harness.cli.options import UsageParser

__all__ = ["PROBLEMS_SHOWN", "add_verbs", "run"]

PROBLEMS_SHOWN = 20
"""``verify`` lists this many findings after the first (``--json`` gives them all)."""


def add_verbs(audit: argparse.ArgumentParser, read_db: str) -> None:
    """``verify`` and ``export`` under the ``audit`` parser (which still works without a verb)."""
    verbs = audit.add_subparsers(dest="audit_command", parser_class=UsageParser, metavar="{verify,export}")
    verify = verbs.add_parser("verify", help="check the audit chain; name the first record changed, removed or "
                                             "inserted outside callbox")
    verify.add_argument("--anchor", action="append", default=[], metavar="SEQ:HASH",
                        help="a chain head kept elsewhere (the log's or /metrics' head) that must still be in the "
                             "chain; may be given more than once")
    verify.add_argument("--json", action="store_true", help="print the verdict as JSON")
    export = verbs.add_parser("export", help="write the audit chain's entries and records as JSON lines")
    export.add_argument("--client", help="only this client's runs (runs whose meta.client it is)")
    export.add_argument("--since", help="only entries written since: epoch seconds or ISO 8601 (UTC without a zone)")
    export.add_argument("--output", "-o", type=Path, help="write to this file (mode 0600) instead of stdout")
    for verb in (verify, export):
        verb.add_argument("--audit-db", type=Path, default=argparse.SUPPRESS, help=read_db)


def _path(args: argparse.Namespace) -> Path:
    """The store's path, opened once through the store, which starts the chain of an older
    store (the migration) before it is read."""
    from harness.audit.store import AuditStore

    with AuditStore(args.audit_db, create=False) as store:
        return store.path


def run(args: argparse.Namespace) -> int:
    if args.audit_command == "verify":
        return _verify(args)
    return _export(args)


def _verify(args: argparse.Namespace) -> int:
    from harness.audit.chain_verify import parse_anchor, verify

    anchors = [parse_anchor(a) for a in args.anchor]
    verdict = verify(_path(args), anchors)
    if args.json:
        out: dict[str, Any] = {"ok": verdict.ok, "head": str(verdict.head), "entries": verdict.entries,
                               "records": verdict.rows, "problems": [p.to_dict() for p in verdict.problems]}
        print(json.dumps(out, indent=2))
        return 0 if verdict.ok else 1
    if verdict.ok:
        anchored = f"; {len(anchors)} anchor(s) found in it" if anchors else ""
        print(f"audit chain intact: {verdict.entries} entries, {verdict.rows} records; head {verdict.head}{anchored}")
        return 0
    first = verdict.first
    assert first is not None
    print(f"audit chain BROKEN: {first.text}")
    others = [p for p in verdict.problems if p is not first]
    if others:
        print(f"{len(others)} more finding(s):")
        for problem in others[:PROBLEMS_SHOWN]:
            print(f"  {problem.text}")
        if len(others) > PROBLEMS_SHOWN:
            print(f"  ... and {len(others) - PROBLEMS_SHOWN} more (--json lists them all)")
    print(f"chain: {verdict.entries} entries, head {verdict.head}")
    return 1


def _export(args: argparse.Namespace) -> int:
    from harness.audit.chain_export import export_lines, parse_since

    since = parse_since(args.since) if args.since else None
    lines = export_lines(_path(args), client=args.client, since=since)
    with contextlib.ExitStack() as stack:
        out: TextIO = sys.stdout
        if args.output is not None:
            fd = os.open(args.output, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            out = stack.enter_context(open(fd, "w", encoding="utf-8"))
        count = 0
        for line in lines:
            out.write(line)
            count += 1
    if args.output is not None:
        print(f"wrote {count} entries to {args.output}", file=sys.stderr)
    return 0
