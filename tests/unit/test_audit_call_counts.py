"""The audit store's per-run call counts (``call_counts``, kept by triggers): always what
counting the run's calls gives, whatever writes the calls, and filled in for a database
made before the table existed (real database files under tmp_path)."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.audit.records import ACTION_CALL_PREFIX, ACTION_TOOL_PREFIX
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ErrorCode, ToolResult

ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")
DENY = Decision(Action.DENY, "tools.shell deny", "not here")
ASK = Decision(Action.ASK, "tools.shell ask", "needs a human")
COUNT_BY_HAND = (
    "SELECT COUNT(*) FROM calls WHERE run_id = ? AND authorized = 1 "
    "AND (error_code IS NULL OR error_code != 'budget_exceeded') "
    f"AND NOT (tool GLOB '{ACTION_TOOL_PREFIX}*' AND call_id GLOB '{ACTION_CALL_PREFIX}*')"
)
"""The budget's count as the store made it before ``call_counts``: every call of the run read."""


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.sqlite3"


@pytest.fixture
def store(db: Path) -> Iterator[AuditStore]:
    with AuditStore(db) as opened:
        yield opened


def _by_hand(db: Path, run: str) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute(COUNT_BY_HAND, (run,)).fetchone()[0])


def _finish(store: AuditStore, run: str, call_id: str, *, error: ErrorCode | None = None,
            started: bool = True) -> None:
    if error is None:
        result = ToolResult(call_id=call_id, text="ok")
    else:
        result = ToolResult(call_id=call_id, text="failed", is_error=True, error=error,
                            structured={"command_started": started})
    store.finish_call(run, call_id, result, decision=None, exit_code=None, duration_ms=1.0, bytes_out=2,
                      truncated=False)


def test_random_call_lifecycles_keep_the_count_exact(store: AuditStore, db: Path) -> None:
    rng = random.Random(20261202)
    runs = ["a", "b"]
    for number in range(300):
        run = rng.choice(runs)
        action = rng.random() < 0.15
        tool = f"{ACTION_TOOL_PREFIX}copy_in" if action else "shell"
        call_id = f"{ACTION_CALL_PREFIX}{number}" if action else f"c{number % 40}"  # call_ids come back
        claim = store.claim_call(run, call_id, tool, {"n": number % 40} if not action else {"n": number})
        if claim.fresh:
            decision = rng.choice([ALLOW, ALLOW, DENY, ASK])
            store.record_decision(run, call_id, decision)
            if decision is ALLOW and store.mark_running(run, call_id, max_calls=rng.choice([None, 5, 1000])):
                error = rng.choice([None, None, ErrorCode.SANDBOX_UNAVAILABLE, ErrorCode.NONZERO_EXIT])
                _finish(store, run, call_id, error=error, started=rng.random() < 0.5)  # some retry-safe
            elif decision is DENY or rng.random() < 0.5:
                _finish(store, run, call_id, error=ErrorCode.BUDGET_EXCEEDED if rng.random() < 0.5 else None)
        for each in runs:
            assert store.count_calls(each) == _by_hand(db, each), (number, each)
    assert store.count_calls("never-started") == 0


def test_approvals_and_the_joined_claim_keep_the_count_exact(store: AuditStore, db: Path) -> None:
    store.claim_call("r", "asked", "shell", {"x": 1})
    store.record_decision("r", "asked", ASK)
    approval = store.create_approval("r", "asked", "shell", {"x": 1}, ASK.rule, ASK.reason)
    store.resolve_approval(approval.id, True, by="test", reason=None)
    assert store.consume_approval(approval.id)
    assert store.count_calls("r") == _by_hand(db, "r") == 1
    store.claim_and_start("r", "joined", "shell", {"x": 2}, lambda counted: ALLOW)
    assert store.count_calls("r") == _by_hand(db, "r") == 2


def test_a_database_made_before_the_counts_gets_them_filled_in(db: Path) -> None:
    with AuditStore(db) as store:
        for number in range(5):
            store.claim_and_start("old", f"c{number}", "shell", {"n": number}, lambda counted: ALLOW)
    with sqlite3.connect(db) as conn:  # what a database of an earlier callbox holds
        for trigger in ("call_counts_insert", "call_counts_update", "call_counts_delete"):
            conn.execute(f"DROP TRIGGER {trigger}")
        conn.execute("DROP TABLE call_counts")
    with AuditStore(db) as store:
        assert store.count_calls("old") == 5
        store.claim_and_start("old", "c9", "shell", {"n": 9}, lambda counted: ALLOW)
        assert store.count_calls("old") == _by_hand(db, "old") == 6
