"""``callbox tools | call | approvals | audit``: the harness core from the command line.

``call`` prints the exact item a caller appends to its model context and exits 0 when
the call succeeded; for an error result, the exit status the error table gives its code: 1
for an error the model should read (denied, invalid arguments, non-zero exit, ...), 3 for a
pending approval, 124 for a timeout, 137 for the OOM killer, 125 when callbox itself failed
(then its first line is also said on stderr); 2 for bad usage. ``approvals`` and ``audit``
read and write the same SQLite store as every other harness process, so an approval given here reaches a harness waiting
elsewhere. ``call``'s sandbox starts cold whatever the policy's ``[pool]`` says: the process
ends with its one sandbox (see :mod:`harness.core.shared_engine`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.audit.records import EGRESS_SCOPES
from harness.cli import audit_chain
from harness.cli.options import UsageParser, engine_options, policy_engine, sandbox_options, say, spec_from_args
from harness.core.calls import ToolResult
from harness.core.errors import ERRORS, EXIT_CALLBOX_FAILED, EXIT_ERROR_RESULT, EXIT_OK
from harness.core.formats import FORMATS, parse_format, result_item, tool_definitions
from harness.core.times import stamp

COMMANDS = ("tools", "call", "approvals", "audit")



def add_parsers(sub: Any) -> None:
    tools = sub.add_parser("tools", help="print the tool definitions a model would see")
    tools.add_argument("--format", default="openai", choices=FORMATS, help="API shape (default openai)")
    tools.add_argument("--policy", type=Path, help="policy file (its allowed_tools apply)")

    call = sub.add_parser("call", help="validate, authorize and run one tool call in a fresh sandbox")
    call.add_argument("tool", help="tool name, e.g. shell")
    call.add_argument("arguments", help="the arguments as a JSON object, e.g. '{\"command\": \"ls\"}'")
    call.add_argument("--call-id", help="the call id (default: a new one)")
    call.add_argument("--run-id", help="the run this call belongs to (default: a new run)")
    call.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    call.add_argument("--format", default="openai", choices=FORMATS, help="result item shape (default openai)")
    call.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")
    call.add_argument("--stream", action="store_true", help="copy the tool's output to stderr as it runs")
    call.add_argument("--images-dir", type=Path, metavar="DIR",
                      help="save the pictures in the result under DIR/RUN_ID/ (default: the state dir's images/)")
    sandbox_options(call, defaults=False)
    engine_options(call)

    approvals = sub.add_parser("approvals", help="list and resolve calls waiting for approval")
    read_db = "audit store, which must exist (default $CALLBOX_AUDIT_DB or the state dir)"
    approvals.add_argument("--audit-db", type=Path, help=read_db)
    verbs = approvals.add_subparsers(dest="approvals_command", required=True, parser_class=UsageParser)
    listing = verbs.add_parser("list", help="pending approvals (all with --all)")
    listing.add_argument("--all", action="store_true", help="also resolved ones")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    resolving = [verbs.add_parser(verb, help=f"{verb} a pending call") for verb in ("approve", "deny")]
    for resolve in resolving:
        resolve.add_argument("id", help="approval id (from `callbox approvals list`)")
        resolve.add_argument("--reason", help="why; a denial's reason is shown to the model")
    resolving[0].add_argument("--scope", choices=EGRESS_SCOPES,
                              help="an egress approval only: allow this connection (once, the default) or the "
                                   "destination for the rest of the sandbox's life (sandbox)")
    for verb in (listing, *resolving):  # after the verb too (`approvals list --audit-db FILE`)
        verb.add_argument("--audit-db", type=Path, default=argparse.SUPPRESS, help=read_db)

    audit = sub.add_parser("audit", help="show runs and calls from the audit store; verify or export its chain")
    audit.add_argument("--run", help="the calls of one run (default: recent runs)")
    audit.add_argument("--json", action="store_true", help="print JSON")
    audit.add_argument("--audit-db", type=Path, help=read_db)
    audit_chain.add_verbs(audit, read_db)


def run(args: argparse.Namespace) -> int:
    if args.command == "tools":
        return _tools(args)
    if args.command == "call":
        return _call(args)
    if args.command == "approvals":
        return _approvals(args)
    if getattr(args, "audit_command", None):
        return audit_chain.run(args)
    return _audit(args)


def _tools(args: argparse.Namespace) -> int:
    from harness.core.policy import load_policy
    from harness.tools import registry_for

    policy = load_policy(args.policy)
    registry = registry_for(policy)
    policy.check_tools(t.definition for t in registry.tools())
    tools = registry.exposed(policy)
    print(json.dumps(tool_definitions(tools, parse_format(args.format)), indent=2))
    return 0


def _call(args: argparse.Namespace) -> int:
    from harness.audit.store import AuditStore
    from harness.cli.notices import loosened_said_once
    from harness.cli.pictures import picture_lines
    from harness.core.calls import ToolCall
    from harness.core.errors import CallboxError
    from harness.core.policy import load_policy
    from harness.core.session import Session
    from harness.core.stopping import STOPS, signals_held
    from harness.tools import registry_for

    policy = load_policy(args.policy)
    spec = spec_from_args(args, policy.sandbox_spec())
    policy, engine_factory = policy_engine(args, policy)
    call = ToolCall(name=args.tool, arguments=args.arguments, call_id=args.call_id or f"call_{uuid.uuid4().hex}")

    def stream(_name: str, data: bytes) -> None:
        sys.stderr.buffer.write(data)
        sys.stderr.buffer.flush()

    announced = policy.sandbox_spec().loosened()  # load_policy said these, naming their keys
    with loosened_said_once(spec, announced), AuditStore(args.audit_db) as audit, Session(
        registry_for(policy), policy, audit, run_id=args.run_id, spec=spec, engine_factory=engine_factory
    ) as harness:
        try:
            result = harness.call(call, on_output=stream if args.stream else None)
        except STOPS:  # the call recorded itself as interrupted; a run of this call alone ends with it
            if args.run_id is None:
                with signals_held(), contextlib.suppress(CallboxError):
                    audit.end_run(harness.run_id, "error:interrupted")
            raise
        if args.run_id is None and not result.meta.get("approval_id"):
            audit.end_run(harness.run_id, "single_call")
        if result.meta.get("approval_id"):
            print(f"callbox: pending approval {result.meta['approval_id']} in run {harness.run_id}; resolve it "
                  f"with `callbox approvals approve|deny {result.meta['approval_id']}`, then send the call "
                  f"again with --run-id {harness.run_id} --call-id {call.call_id}", file=sys.stderr)
    for line in picture_lines(result, harness.run_id, args.images_dir):  # the item on stdout has them, base64-encoded
        say(line)
    print(json.dumps(result_item(result, parse_format(args.format))))
    return result_exit_status(result)


def result_exit_status(result: ToolResult) -> int:
    """``call``'s exit status for a result: 0, or the error table's status for its code. For
    callbox's own failure its first line is said too (the item is printed all the same: the
    caller owes the model a result for its call_id)."""
    if not result.is_error:
        return EXIT_OK
    if result.error is None:
        return EXIT_ERROR_RESULT
    status = ERRORS[result.error].exit_status
    if status == EXIT_CALLBOX_FAILED:
        say((result.text.splitlines() or ["no reason given"])[0])
    return status


def _approvals(args: argparse.Namespace) -> int:
    import getpass

    from harness.audit.records import ACTION_TOOL_PREFIX
    from harness.audit.store import AuditStore

    with AuditStore(args.audit_db, create=False) as audit:
        if args.approvals_command == "list":
            approvals = audit.list_approvals(None if args.all else "pending")
            if args.json:
                for approval in approvals:
                    print(json.dumps(approval.to_dict()))
                return 0
            run_w, call_w = _width(34, (a.run_id for a in approvals)), _width(24, (a.call_id for a in approvals))
            tool_w = _width(12, (a.tool for a in approvals))
            print(f"{'ID':<12}{'STATE':<10}{'RUN':<{run_w}}{'CALL':<{call_w}}{'TOOL':<{tool_w}}ARGUMENTS")
            for a in approvals:
                arguments = a.arguments if len(a.arguments) <= 60 else a.arguments[:57] + "..."
                print(f"{a.id:<12}{a.state:<10}{a.run_id:<{run_w}}{a.call_id:<{call_w}}{a.tool:<{tool_w}}{arguments}")
            return 0
        approve = args.approvals_command == "approve"
        approval = audit.resolve_approval(args.id, approve, by=getpass.getuser(), reason=args.reason,
                                          scope=getattr(args, "scope", None))
        if approval.scope is not None:
            print(f"{approval.id} {approval.state} ({approval.scope}); the held connection proceeds")
            return 0
        if approve and approval.tool.startswith(ACTION_TOOL_PREFIX):  # a sandbox action runs when repeated
            print(f"{approval.id} {approval.state}; repeat the {approval.tool.removeprefix(ACTION_TOOL_PREFIX)} "
                  f"command with --approval {approval.id}")
            return 0
        print(f"{approval.id} {approval.state}")
        return 0


def _audit(args: argparse.Namespace) -> int:
    from harness.audit.interruptions import audit_line
    from harness.audit.store import AuditStore
    from harness.loop.acceptance import record_lines

    with AuditStore(args.audit_db, create=False) as audit:
        if args.run:
            calls = audit.calls_for_run(args.run)
            if args.json:
                print(json.dumps(calls, indent=2, default=str))
                return 0
            # Sandbox actions are listed with the calls: tool sandbox.NAME, call id action-HEX; the
            # harness's own calls (acceptance checks) name their origin after the tool.
            call_w = _width(28, (_s(c.get("call_id")) for c in calls))
            tool_w = _width(12, (_tool(c) for c in calls))
            state_w = _width(9, (_state(c) for c in calls))
            print(f"{'CALL':<{call_w}}{'TOOL':<{tool_w}}{'DECISION':<10}{'STATE':<{state_w}}{'EXIT':<6}{'MS':>9}  "
                  f"{'REDACTED':<9}RULE")
            for c in calls:
                redacted = (c.get("redactions") or {}).get("count") or ""  # secrets taken out of the result
                print(f"{_s(c.get('call_id')):<{call_w}}{_tool(c):<{tool_w}}{_s(c.get('decision')):<10}"
                      f"{_state(c):<{state_w}}{_s(c.get('exit_code')):<6}{_ms(c.get('duration_ms')):>9}  "
                      f"{_s(redacted):<9}{_s(c.get('rule'))}")
            for c in calls:  # what a person needs to know of each interrupted call, in words
                if c.get("interrupted"):
                    print(audit_line(_s(c.get("call_id")), c["interrupted"]))
            for line in record_lines(audit.get_run(args.run).meta):  # the checks of the final answers
                print(line)
            return 0
        runs = audit.list_runs()
        if args.json:
            print(json.dumps([r.to_dict() for r in runs], indent=2, default=str))
            return 0
        created = [stamp(r.created) for r in runs]
        created_w = _width(9, created)
        print(f"{'RUN':<34}{'CREATED':<{created_w}}{'CALLS':>6}  END")
        for r, when in zip(runs, created, strict=True):
            print(f"{r.id:<34}{when:<{created_w}}{r.calls:>6}  {r.end_reason or ''}")
        return 0


def _width(least: int, values: Iterable[str]) -> int:
    """A column as wide as ``least`` or its longest value and two spaces."""
    return max([least, *(len(v) + 2 for v in values)])


def _tool(call: dict[str, Any]) -> str:
    """A call's tool, with its origin when the harness sent it (``shell [acceptance]``)."""
    origin = call.get("origin")
    return f"{_s(call.get('tool'))} [{origin}]" if origin else _s(call.get("tool"))


def _state(call: dict[str, Any]) -> str:
    """A call's state as the audit shows it: ``interrupted`` for a call whose harness process
    stopped before it recorded a result."""
    return "interrupted" if call.get("interrupted") else _s(call.get("state"))


def _s(value: object) -> str:
    return "" if value is None else str(value)


def _ms(value: object) -> str:
    return f"{value:.1f}" if isinstance(value, int | float) else ""

