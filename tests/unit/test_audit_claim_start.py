"""``AuditStore.claim_and_start``: the claim, decision and running mark of a call in one
transaction store what ``claim_call``, ``record_decision`` and ``mark_running`` store one after
the other (real database files under tmp_path)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ErrorCode, ToolResult

ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")
DENY = Decision(Action.DENY, "tools.shell deny", "not here")
ASK = Decision(Action.ASK, "tools.shell ask", "needs a human")
ARGS = '{"command": "true"}'


@pytest.fixture
def store(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as opened:
        yield opened


def _stored(store: AuditStore, run: str, call_id: str) -> dict[str, Any]:
    record = store.get_call(run, call_id)
    assert record is not None
    fields = record.to_dict()
    for moment in ("started", "finished", "owner", "call_id", "run_id"):
        fields.pop(moment, None)
    return fields


@pytest.mark.parametrize("decision", [ALLOW, DENY, ASK], ids=["allow", "deny", "ask"])
def test_one_transaction_stores_what_the_three_steps_store(store: AuditStore, decision: Decision) -> None:
    store.claim_call("steps", "c1", "shell", ARGS)
    store.record_decision("steps", "c1", decision)
    if decision.action is Action.ALLOW:
        assert store.mark_running("steps", "c1", max_calls=10)
    seen: list[int] = []

    def decide(counted: int) -> Decision:
        seen.append(counted)
        return decision

    start = store.claim_and_start("joined", "c1", "shell", ARGS, decide, max_calls=10)
    assert start.claim.fresh and start.decision == decision and seen == [0]
    assert start.running is (decision.action is Action.ALLOW)
    assert _stored(store, "joined", "c1") == _stored(store, "steps", "c1")
    assert store.count_calls("joined") == store.count_calls("steps")


def test_a_repeat_gets_the_record_and_is_not_decided_again(store: AuditStore) -> None:
    store.claim_and_start("r", "c1", "shell", ARGS, lambda _: ALLOW)
    decided: list[int] = []
    again = store.claim_and_start("r", "c1", "shell", ARGS, lambda n: decided.append(n) or ALLOW)
    assert not again.claim.fresh and again.decision is None and not again.running
    assert again.claim.state == "running" and decided == []
    other = store.claim_and_start("r", "c1", "shell", '{"command": "false"}', lambda _: ALLOW)
    assert not other.claim.fresh and other.claim.conflict


def test_decide_gets_the_authorized_calls_so_far(store: AuditStore) -> None:
    for number in range(3):
        start = store.claim_and_start("r", f"c{number}", "shell", ARGS, lambda counted: ALLOW)
        store.finish_call("r", f"c{number}", ToolResult(call_id=f"c{number}", text="ok"), decision=None,
                          exit_code=0, duration_ms=1.0, bytes_out=2, truncated=False)
        assert start.running
    seen: list[int] = []
    store.claim_and_start("r", "c9", "shell", ARGS, lambda counted: seen.append(counted) or DENY)
    assert seen == [3]


def test_an_allow_over_the_budget_is_not_started(store: AuditStore) -> None:
    store.claim_and_start("r", "c1", "shell", ARGS, lambda _: ALLOW, max_calls=1)
    start = store.claim_and_start("r", "c2", "shell", ARGS, lambda _: ALLOW, max_calls=1)
    assert start.claim.fresh and not start.running
    record = store.get_call("r", "c2")
    assert record is not None and record.state == "claimed" and not record.authorized
    assert store.count_calls("r") == 1


def test_nothing_is_recorded_when_decide_raises(store: AuditStore) -> None:
    def broken(counted: int) -> Decision:
        raise RuntimeError("a bug in the policy")

    with pytest.raises(RuntimeError):
        store.claim_and_start("r", "c1", "shell", ARGS, broken)
    assert store.get_call("r", "c1") is None
    assert store.claim_and_start("r", "c1", "shell", ARGS, lambda _: ALLOW).claim.fresh


def test_a_retry_safe_failure_is_claimed_again_and_decided_anew(store: AuditStore) -> None:
    store.claim_and_start("r", "c1", "shell", ARGS, lambda _: ALLOW)
    failure = ToolResult.failure("c1", ErrorCode.SANDBOX_UNAVAILABLE, "no engine")
    failure = ToolResult(call_id="c1", text=failure.text, is_error=True, error=failure.error,
                         structured={"command_started": False})
    store.finish_call("r", "c1", failure, decision=None, exit_code=None, duration_ms=0.0, bytes_out=9,
                      truncated=False)
    seen: list[int] = []
    retry = store.claim_and_start("r", "c1", "shell", ARGS, lambda counted: seen.append(counted) or ALLOW)
    assert retry.claim.fresh and retry.claim.attempt == 2 and retry.running
    assert seen == [0]  # the failed attempt no longer counts
    assert store.count_calls("r") == 1
