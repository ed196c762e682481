"""Audit records for the console's pages, written the way the doors write them (runs, calls
with their decisions and results, approvals pending and resolved, egress decisions), with no
sandbox: the lists, filters, paging, history and charts read only the audit store."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ErrorCode, ToolResult


@dataclass
class Seeded:
    """What :func:`seed` wrote: run ids per client, and the approvals it resolved."""

    runs: dict[str, list[str]] = field(default_factory=dict)
    approved: str = ""
    denied: str = ""
    pending: str = ""


def call(audit: AuditStore, run_id: str, call_id: str, tool: str, arguments: dict[str, object], *,
         action: Action = Action.ALLOW, error: ErrorCode | None = None, exit_code: int | None = 0,
         duration_ms: float = 12.5, text: str = "ok") -> None:
    """One call of ``run_id``, decided and finished."""
    audit.claim_call(run_id, call_id, tool, arguments)
    decision = Decision(action, f"tools.{tool}", "" if action is Action.ALLOW else f"{tool} is {action.value}")
    audit.record_decision(run_id, call_id, decision)
    result = ToolResult(call_id, text, is_error=error is not None, error=error)
    audit.finish_call(run_id, call_id, result, decision=decision, exit_code=exit_code, duration_ms=duration_ms,
                      bytes_out=len(text), truncated=False)


def run(audit: AuditStore, client: str, *, door: str = "grpc") -> str:
    return audit.start_run(f"{door}-{client}-{uuid.uuid4().hex[:8]}", meta={"door": door, "client": client})


def seed(audit: AuditStore, *, runs_of_agent: int = 3) -> Seeded:
    """Runs of clients ``agent`` and ``other``: calls of ``shell`` and ``read_file`` (one
    refused by the policy, one failed), an approval approved, one denied with a reason and
    one pending (all ``agent``'s), and egress decisions allowed and refused."""
    seeded = Seeded(runs={"agent": [], "other": []})
    for i in range(runs_of_agent):
        run_id = run(audit, "agent")
        seeded.runs["agent"].append(run_id)
        call(audit, run_id, "c1", "shell", {"command": f"echo agent-{i}"}, duration_ms=20.0 + i)
        call(audit, run_id, "c2", "read_file", {"path": "/etc/hostname"}, duration_ms=3.0)
    first = seeded.runs["agent"][0]
    call(audit, first, "c3", "shell", {"command": "rm -rf /"}, action=Action.DENY, error=ErrorCode.DENIED,
         exit_code=None, duration_ms=0.4, text="denied")
    call(audit, first, "c4", "shell", {"command": "false"}, error=ErrorCode.NONZERO_EXIT, exit_code=1,
         duration_ms=40.0, text="exit 1")
    approve = audit.create_approval(first, "c5", "shell", {"command": "make deploy"}, "tools.shell.rules[0]",
                                    "deploys ask a person")
    audit.resolve_approval(approve.id, True, by="console:operator", reason=None)
    deny = audit.create_approval(first, "c6", "shell", {"command": "make wipe"}, "tools.shell.rules[0]",
                                 "wipes ask a person")
    audit.resolve_approval(deny.id, False, by="cli:ops", reason="not on a Friday")
    waiting = audit.create_approval(seeded.runs["agent"][-1], "c7", "shell", {"command": "make release"},
                                    "tools.shell.rules[0]", "releases ask a person")
    seeded.approved, seeded.denied, seeded.pending = approve.id, deny.id, waiting.id
    other = run(audit, "other", door="e2b")
    seeded.runs["other"].append(other)
    call(audit, other, "o1", "write_file", {"path": "/tmp/secret-of-other", "content": "x"}, duration_ms=5.0)
    other_approval = audit.create_approval(other, "o2", "shell", {"command": "other-asks"}, "tools.shell", "asks")
    audit.resolve_approval(other_approval.id, True, by="console:operator", reason="fine for other")
    audit.record_egress(first, "c1", first, [
        {"ts": time.time(), "decision": "allow", "method": "CONNECT", "host": "pypi.org", "port": 443,
         "address": "151.101.0.223", "reason": "allowlist pypi.org"},
        {"ts": time.time(), "decision": "deny", "method": "CONNECT", "host": "evil.example", "port": 443,
         "address": None, "reason": "not in the allowlist"},
    ])
    audit.record_egress(other, "o1", other, [
        {"ts": time.time(), "decision": "allow", "method": "GET", "host": "other-only.example", "port": 80,
         "address": "10.0.0.9", "reason": "allowlist"},
    ])
    return seeded
