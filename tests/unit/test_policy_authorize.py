"""Authorizing a call, as the session does it: the budgets first (a spent budget denies any
call, whatever the rules say), then the policy's decision on the tool and its arguments."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict

from harness.audit.store import AuditStore
from harness.core.calls import Action, ErrorCode, ToolCall, ToolOutput
from harness.core.policy import Policy, parse_policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session


class ShellArgs(BaseModel):
    """Arguments shaped like the shell tool's."""

    model_config = ConfigDict(extra="forbid")
    command: str
    """The command line."""


def _ran(_ctx: Any, args: ShellArgs) -> ToolOutput:
    return ToolOutput(text=f"ran {args.command}")


SHELL = Tool(ToolDefinition(name="shell", description="Runs nothing (test).", input_model=ShellArgs,
                            command_field="command"), _ran)

RULES = '[budgets]\nmax_tool_calls = 1\n[[tools.shell.rules]]\naction = "deny"\ncommand = "*rm -rf*"\n'


@pytest.fixture
def policy() -> Policy:
    return parse_policy(RULES, source="policy file test.toml")


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


def _session(policy: Policy, audit: AuditStore, run_id: str) -> Session:
    registry = ToolRegistry()
    registry.register(SHELL)
    return Session(registry, policy, audit, run_id=run_id)


def test_the_budget_is_checked_before_the_rules(policy: Policy, audit: AuditStore) -> None:
    session = _session(policy, audit, "run-budget")
    first = session.call(ToolCall("shell", '{"command": "ls"}', "c1"))
    assert (first.is_error, first.text) == (False, "ran ls")
    second = session.call(ToolCall("shell", '{"command": "ls"}', "c2"))  # the policy allows it; the budget is spent
    assert (second.is_error, second.error) == (True, ErrorCode.BUDGET_EXCEEDED)
    record = audit.get_call("run-budget", "c2")
    assert record is not None and record.decision is not None
    assert (record.decision.action, record.decision.rule) == (Action.DENY, "budgets.max_tool_calls")


def test_within_the_budget_the_rules_decide(policy: Policy, audit: AuditStore) -> None:
    session = _session(policy, audit, "run-rules")
    denied = session.call(ToolCall("shell", '{"command": "rm -rf /"}', "c1"))
    assert (denied.is_error, denied.error) == (True, ErrorCode.DENIED)
    record = audit.get_call("run-rules", "c1")
    assert record is not None and record.decision is not None
    rule = 'tools.shell.rules[0] (deny command "*rm -rf*")'
    assert (record.decision.action, record.decision.rule) == (Action.DENY, rule)


def test_the_two_halves_on_their_own(policy: Policy) -> None:
    definition = SHELL.definition
    assert policy.budgets.check(0, 0.0) is None
    assert policy.decide(definition, {"command": "ls"}).action is Action.ALLOW
    spent = policy.budgets.check(1, 0.0)
    assert spent is not None and (spent.action, spent.rule) == (Action.DENY, "budgets.max_tool_calls")
    assert policy.decide(definition, {"command": "rm -rf /"}).action is Action.DENY
