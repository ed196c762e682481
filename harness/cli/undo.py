"""``callbox diff | revert``: what a run's tool calls changed in its writable places, and undoing it.

Both read the run's change records, kept beside the audit store when the run's policy has
``[checkpoints] mode = "changes"`` (:mod:`harness.core.change_recorder`). ``diff`` prints a
unified diff per recorded call (one call with ``--call``). ``revert --to CALL`` puts the run's
read-write mounts back as they were just before that call, through their host directories,
and prints each path it restored; it is refused while a call of the run is running, or while
the run is open (its sandbox may still change the mount), and, when the calls it undoes also
changed scratch places (``/workspace``, ``/tmp``, home), which only the run's sandbox holds,
unless ``--mounts-only`` accepts that those stay as they are. A revert of a living sandbox's
every place is :func:`harness.core.undo.revert_live`, for the process that holds the run.
The refusals are :func:`harness.core.undo.revert_ended_run`'s, shared with the console.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.cli.options import say

COMMANDS = ("diff", "revert")


def add_parsers(sub: Any) -> None:
    db_help = "audit store, which must exist (default $CALLBOX_AUDIT_DB or the state dir)"
    diff = sub.add_parser("diff", help="what a run's tool calls changed in its writable places")
    diff.add_argument("run", help="the run id")
    diff.add_argument("--call", help="only this call's changes")
    diff.add_argument("--audit-db", type=Path, help=db_help)

    revert = sub.add_parser("revert", help="put a run's read-write mounts back as they were before a call")
    revert.add_argument("run", help="the run id")
    revert.add_argument("--to", required=True, metavar="CALL", help="the call before which to restore")
    revert.add_argument("--mounts-only", action="store_true",
                        help="restore the mounts even though the undone calls also changed scratch places, "
                             "which only the run's sandbox holds")
    revert.add_argument("--json", action="store_true", help="print what was restored as JSON")
    revert.add_argument("--audit-db", type=Path, help=db_help)


def run(args: argparse.Namespace) -> int:
    from harness.audit.store import AuditStore
    from harness.core import undo

    with AuditStore(args.audit_db, create=False) as audit:
        if args.command == "diff":
            print(undo.diff(undo.recorded_changes(audit, args.run), args.call), end="")
            return 0
        report, lost = undo.revert_ended_run(audit, args.run, args.to, mounts_only=args.mounts_only)
    failed = bool(report.not_restored)
    if lost:
        report.not_restored.extend(f"{place}: only the run's sandbox holds it" for place in lost)
    if args.json:
        print(json.dumps({"removed": report.removed, "restored": report.written, "recreated": report.created,
                          "modes": report.modes, "not_restored": report.not_restored}, indent=2))
    else:
        for line in report.lines():
            print(line)
        sys.stdout.flush()  # the paths first, then the summary on stderr, in a pipe as on a terminal
        say(f"reverted run {args.run} to just before call {args.to}: {report.count} paths put back")
    return 1 if failed else 0
