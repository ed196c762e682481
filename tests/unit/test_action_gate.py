"""The sandbox action gate against a real audit store (a temporary SQLite file): each action
authorized by the policy and recorded (who, what, when, outcome); deny raises, ask waits for
an approval that allows exactly one repeat of exactly that action; actions do not spend the
tool-call budget; `callbox audit` and `callbox approvals` show them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from harness.cli.main import main
from harness.core.actions import ActionDenied, ActionGate, ActionTicket, ApprovalPending
from harness.core.calls import Action, Decision
from harness.core.errors import CallboxError
from harness.core.policy import Policy, parse_policy

RUN = "sandbox-web"
ASKING = parse_policy('[actions.copy_out]\ndecision = "ask"\n[actions.port_forward]\ndecision = "ask"\n')


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


def gate(audit: AuditStore, policy: Policy | None = None, *, run_id: str = RUN, actor: str = "cli:alice") -> ActionGate:
    return ActionGate(policy or Policy(), audit, run_id=run_id, actor=actor)


def only_call(audit: AuditStore, run_id: str = RUN) -> dict[str, object]:
    (call,) = audit.calls_for_run(run_id)
    return call


def ask(g: ActionGate, action: str, details: dict[str, object]) -> str:
    with pytest.raises(ApprovalPending) as pending:
        g.authorize(action, details)
    return pending.value.approval_id


# ---- allow --------------------------------------------------------------------------------------


def test_an_allowed_action_is_recorded_from_start_to_outcome(audit: AuditStore) -> None:
    g = gate(audit)
    assert audit.get_run(RUN).meta == {"kind": "sandbox"}
    ticket = g.authorize("snapshot", {"sandbox": "web", "name": "before-upgrade"})
    assert isinstance(ticket, ActionTicket) and ticket.run_id == RUN and ticket.tool == "sandbox.snapshot"
    assert ticket.call_id.startswith("action-") and ticket.decision.action is Action.ALLOW
    running = audit.get_call(RUN, ticket.call_id)
    assert running is not None and running.state == "running" and running.tool == "sandbox.snapshot"
    assert json.loads(running.arguments) == {"actor": "cli:alice", "sandbox": "web", "name": "before-upgrade"}
    assert running.decision == Decision(Action.ALLOW, "actions.snapshot.decision",
                                        'allowed by policy (actions.snapshot.decision = "allow", the default)')

    g.finish(ticket, ok=True, detail={"bytes": 1234})
    call = only_call(audit)
    assert (call["tool"], call["state"], call["decision"], call["is_error"]) == ("sandbox.snapshot", "done", "allow",
                                                                                 False)
    assert call["result_text"] == "sandbox.snapshot: done" and call["finished"] is not None
    done = audit.get_call(RUN, ticket.call_id)
    assert done is not None and done.result is not None
    assert done.result.structured == {"bytes": 1234}
    assert done.result.meta["actor"] == "cli:alice" and done.result.meta["decision"] == "allow"
    with pytest.raises(CallboxError, match="already finished"):
        g.finish(ticket, ok=True)


def test_a_failed_action_is_an_error_result(audit: AuditStore) -> None:
    g = gate(audit)
    ticket = g.authorize("copy_in", {"sandbox": "web", "path": "/workspace", "host_path": "/home/a/proj"})
    g.finish(ticket, ok=False, detail={"error": "no space left on device", "exit_code": 28})
    call = only_call(audit)
    assert (call["is_error"], call["error_code"], call["exit_code"]) == (True, "tool_failed", 28)
    assert call["result_text"] == "sandbox.copy_in: failed: no space left on device"


def test_an_existing_run_keeps_its_meta(audit: AuditStore) -> None:
    audit.start_run("session-run", {"kind": "session", "model": "m"})
    gate(audit, run_id="session-run").finish(gate(audit, run_id="session-run").authorize("pause", {"op": "pause"}),
                                             ok=True)
    assert audit.get_run("session-run").meta == {"kind": "session", "model": "m"}


def test_bad_use_is_refused_before_anything_is_recorded(audit: AuditStore) -> None:
    with pytest.raises(ValueError, match="needs an actor"):
        gate(audit, actor=" ")
    g = gate(audit)
    with pytest.raises(ValueError, match="unknown sandbox action 'copy'; the actions are process, attach"):
        g.authorize("copy", {})
    with pytest.raises(ValueError, match="'actor' is not a detail"):
        g.authorize("fork", {"actor": "mallory"})
    assert audit.calls_for_run(RUN) == []


# ---- deny ---------------------------------------------------------------------------------------


def test_port_forward_is_denied_by_default_and_recorded(audit: AuditStore) -> None:
    with pytest.raises(ActionDenied) as denied:
        gate(audit).authorize("port_forward", {"sandbox": "web", "port": 8000, "host_port": 0})
    error = denied.value
    assert isinstance(error, CallboxError) and error.exit_code == 6  # refused by the policy
    assert (error.denial, error.action, error.rule) == ("denied", "port_forward", "actions.port_forward.decision")
    assert '[actions.port_forward] decision = "allow"' in error.message
    call = only_call(audit)
    assert (call["tool"], call["state"], call["decision"], call["error_code"]) == (
        "sandbox.port_forward", "done", "deny", "denied")
    assert call["rule"] == "actions.port_forward.decision" and call["result_text"] == error.message


def test_a_deny_rule_names_its_key(audit: AuditStore) -> None:
    policy = parse_policy('[[actions.copy_out.rules]]\naction = "deny"\npath = "**/.env"\nreason = "secrets stay"')
    with pytest.raises(ActionDenied) as denied:
        gate(audit, policy).authorize("copy_out", {"path": "app/.env", "host_path": "out"})
    assert denied.value.rule == 'actions.copy_out.rules[0] (deny path "**/.env")'
    assert denied.value.message == "denied by policy rule actions.copy_out.rules[0]: secrets stay"


# ---- ask ----------------------------------------------------------------------------------------


def test_ask_then_approve_then_repeat_runs_once(audit: AuditStore) -> None:
    g = gate(audit, ASKING)
    details = {"sandbox": "web", "path": "/workspace/dist", "host_path": "./dist"}
    with pytest.raises(ApprovalPending) as pending:
        g.authorize("copy_out", details)
    approval_id = pending.value.approval_id
    assert pending.value.exit_code == 3 and pending.value.rule == "actions.copy_out.decision"
    assert f"`callbox approvals approve {approval_id}`" in pending.value.message
    assert f"--approval {approval_id}" in pending.value.message
    (approval,) = audit.list_approvals()
    assert (approval.id, approval.tool, approval.run_id) == (approval_id, "sandbox.copy_out", RUN)
    assert json.loads(approval.arguments)["actor"] == "cli:alice"
    asked = only_call(audit)
    assert (asked["decision"], asked["state"]) == ("ask", "claimed")

    # Still pending: the same approval again, nothing new recorded.
    with pytest.raises(ApprovalPending) as again:
        g.authorize("copy_out", details, approval_id=approval_id)
    assert again.value.approval_id == approval_id and "still pending" in again.value.message
    assert len(audit.calls_for_run(RUN)) == 1

    audit.resolve_approval(approval_id, True, by="bob", reason="release build")
    ticket = g.authorize("copy_out", dict(details), approval_id=approval_id)
    assert ticket.call_id == asked["call_id"] and ticket.approval_id == approval_id
    assert ticket.decision.rule == f"approval {approval_id}"
    assert audit.get_approval(approval_id).state == "consumed"
    g.finish(ticket, ok=True, detail={"files": 3})
    call = only_call(audit)
    assert (call["decision"], call["state"], call["is_error"]) == ("allow", "done", False)
    assert call["rule"] == f"actions.copy_out.decision; approved by bob (approval {approval_id})"
    stored = audit.get_call(RUN, ticket.call_id)
    assert stored is not None and stored.result is not None and stored.result.meta["decision"] == "approved"

    # An approval allows one action.
    with pytest.raises(ActionDenied) as used:
        g.authorize("copy_out", details, approval_id=approval_id)
    assert used.value.denial == "approval_used" and used.value.code == "already_resolved"
    assert "already used" in used.value.message
    assert [c["decision"] for c in audit.calls_for_run(RUN)] == ["allow", "deny"]


def test_a_persons_denial_is_final(audit: AuditStore) -> None:
    g = gate(audit, ASKING)
    details = {"sandbox": "web", "port": 5432}
    approval_id = ask(g, "port_forward", details)
    audit.resolve_approval(approval_id, False, by="bob", reason="not the database")
    for _ in range(2):  # a second repeat is refused the same way and records nothing more
        with pytest.raises(ActionDenied) as denied:
            g.authorize("port_forward", details, approval_id=approval_id)
        assert denied.value.denial == "approval_denied"
        assert denied.value.message == f"a person denied this port_forward (approval {approval_id}, by bob): " \
                                       "not the database"
    call = only_call(audit)
    assert (call["decision"], call["state"], call["error_code"]) == ("deny", "done", "approval_denied")
    assert "denied by bob" in str(call["rule"])


@pytest.mark.parametrize(
    ("action", "details", "run_id", "actor"),
    [
        ("port_forward", {"sandbox": "web", "port": 8001}, RUN, "cli:alice"),  # other details
        ("copy_out", {"sandbox": "web", "port": 8000}, RUN, "cli:alice"),  # another action
        ("port_forward", {"sandbox": "web", "port": 8000}, "sandbox-other", "cli:alice"),  # another run
        ("port_forward", {"sandbox": "web", "port": 8000}, RUN, "cli:mallory"),  # someone else
    ],
)
def test_an_approval_is_for_one_run_action_actor_and_details(
    audit: AuditStore, action: str, details: dict[str, object], run_id: str, actor: str
) -> None:
    asked = {"sandbox": "web", "port": 8000}
    approval_id = ask(gate(audit, ASKING), "port_forward", asked)
    audit.resolve_approval(approval_id, True, by="bob", reason=None)
    other = gate(audit, ASKING, run_id=run_id, actor=actor)
    with pytest.raises(ActionDenied) as denied:
        other.authorize(action, details, approval_id=approval_id)
    assert denied.value.denial == "approval_mismatch"
    assert f"approval {approval_id} is not for this" in denied.value.message
    refused = [c for c in audit.calls_for_run(run_id) if c["decision"] == "deny"]
    assert len(refused) == 1 and refused[0]["tool"] == f"sandbox.{action}"  # the attempt is on record
    # The approval is still there for the action it was given for.
    assert audit.get_approval(approval_id).state == "approved"
    gate(audit, ASKING).finish(gate(audit, ASKING).authorize("port_forward", asked, approval_id=approval_id), ok=True)


def test_an_unknown_approval_is_a_mismatch(audit: AuditStore) -> None:
    with pytest.raises(ActionDenied) as denied:
        gate(audit, ASKING).authorize("port_forward", {"port": 1}, approval_id="nosuchid22")
    assert denied.value.denial == "approval_mismatch"


def test_an_approval_only_lifts_an_ask(audit: AuditStore) -> None:
    approval_id = ask(gate(audit, ASKING), "port_forward", {"port": 8000})
    audit.resolve_approval(approval_id, True, by="bob", reason=None)
    # The policy now denies: the approval does not override it.
    with pytest.raises(ActionDenied) as denied:
        gate(audit).authorize("port_forward", {"port": 8000}, approval_id=approval_id)
    assert denied.value.denial == "denied"
    # The policy now allows: the action runs without using the approval.
    allowing = parse_policy('[actions.port_forward]\ndecision = "allow"')
    ticket = gate(audit, allowing).authorize("port_forward", {"port": 8000}, approval_id=approval_id)
    assert ticket.approval_id is None and audit.get_approval(approval_id).state == "approved"


# ---- budgets ------------------------------------------------------------------------------------


def test_actions_do_not_spend_the_tool_call_budget(audit: AuditStore) -> None:
    g = gate(audit, ASKING)
    for n in range(3):
        g.finish(g.authorize("process", {"command": ["sleep", str(n)]}), ok=True)
    approval_id = ask(g, "copy_out", {"path": "/workspace/a"})
    audit.resolve_approval(approval_id, True, by="bob", reason=None)
    g.finish(g.authorize("copy_out", {"path": "/workspace/a"}, approval_id=approval_id), ok=True)
    assert audit.count_calls(RUN) == 0
    audit.claim_call(RUN, "call_1", "shell", {"command": "ls"})
    audit.record_decision(RUN, "call_1", Decision(Action.ALLOW, "default_decision"))
    assert audit.count_calls(RUN) == 1
    assert audit.get_run(RUN).calls == 5  # every record is listed all the same (the approved one once)


# ---- guard --------------------------------------------------------------------------------------


def test_guard_records_the_outcome_of_its_block(audit: AuditStore) -> None:
    g = gate(audit, parse_policy('[actions.port_forward]\ndecision = "allow"'))
    with g.guard("port_forward", {"port": 8000}) as ticket:
        ticket.outcome["connections"] = 2
    with pytest.raises(RuntimeError), g.guard("attach", {"pid": 7, "mode": "logs"}):
        raise RuntimeError("the agent went away\nmore text")
    with pytest.raises(KeyboardInterrupt), g.guard("attach", {"pid": 7, "mode": "terminal"}) as ticket:
        ticket.outcome["bytes"] = 10
        raise KeyboardInterrupt
    forward, failed, interrupted = (audit.get_call(RUN, c["call_id"]) for c in audit.calls_for_run(RUN))
    assert forward is not None and forward.result is not None and forward.result.structured == {"connections": 2}
    assert failed is not None and failed.is_error
    assert failed.result_text == "sandbox.attach: failed: the agent went away"
    assert interrupted is not None and interrupted.result is not None and not interrupted.is_error
    assert interrupted.result.structured == {"bytes": 10, "ended": "interrupted"}


# ---- the CLI ------------------------------------------------------------------------------------


def test_audit_and_approvals_show_actions(
    audit: AuditStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    g = gate(audit, ASKING)
    with pytest.raises(ActionDenied):
        gate(audit).authorize("port_forward", {"sandbox": "web", "port": 8000})
    approval_id = ask(g, "port_forward", {"sandbox": "web", "port": 8000})
    db = str(tmp_path / "audit.sqlite3")
    capsys.readouterr()

    assert main(["approvals", "--audit-db", db, "list"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert row.split()[:5] == [approval_id, "pending", RUN, only_pending_call(audit), "sandbox.port_forward"]
    assert header.index("TOOL") == row.index("sandbox.port_forward")

    assert main(["approvals", "--audit-db", db, "approve", approval_id]) == 0
    assert capsys.readouterr().out == f"{approval_id} approved; repeat the port_forward command with --approval " \
                                      f"{approval_id}\n"

    assert main(["audit", "--audit-db", db, "--run", RUN]) == 0
    header, denied, approved = capsys.readouterr().out.splitlines()
    assert header.index("TOOL") == denied.index("sandbox.port_forward") == approved.index("sandbox.port_forward")
    assert header.index("DECISION") == denied.index("deny ") == approved.index("allow ")
    assert denied.split()[0].startswith("action-") and "actions.port_forward.decision" in denied


def only_pending_call(audit: AuditStore) -> str:
    (approval,) = audit.list_approvals()
    return approval.call_id
