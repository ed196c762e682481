"""The SQLite audit store: real database files under tmp_path, real processes for the races.

Process tests start ``python -c WORKER`` children that open their own AuditStore on the same
file, print ``ready`` and block on stdin until the parent writes ``go`` to all of them at
once, so the racing part starts together. They print one JSON line with what they saw.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.audit import schema
from harness.audit import store as audit
from harness.audit.store import AuditError, AuditStore, default_audit_path, result_from_json, result_to_json
from harness.core.calls import Action, Decision, ErrorCode, ToolResult
from harness.core.errors import CallboxError

REPO = Path(__file__).resolve().parents[2]
ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")
DENY = Decision(Action.DENY, 'tools.shell.rules[0] deny "rm -rf *"', "rm -rf is not allowed here")
ASK = Decision(Action.ASK, "tools.shell ask", "needs a human")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state" / "audit.sqlite3"


@pytest.fixture
def store(db: Path):
    s = AuditStore(db)
    try:
        yield s
    finally:
        s.close()


def finish(store: AuditStore, run: str, call_id: str, result: ToolResult, decision: Decision | None = ALLOW) -> None:
    store.finish_call(
        run,
        call_id,
        result,
        decision=decision,
        exit_code=0,
        duration_ms=1.5,
        bytes_out=len(result.text),
        truncated=False,
    )


# --------------------------------------------------------------------------- child processes

WORKER = r"""
import json, os, sys
from pathlib import Path
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ToolResult

mode, db, rest = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
print("ready", flush=True)
if sys.stdin.readline().strip() != "go":
    sys.exit(3)
out = {}
with AuditStore(db) as store:
    if mode == "write":
        worker, n = int(rest[0]), int(rest[1])
        for i in range(n):
            store.start_run(f"w{worker}-r{i}", meta={"worker": worker, "i": i})
            call_id = f"w{worker}-c{i}"
            claim = store.claim_call("shared", call_id, "shell", {"worker": worker, "i": i})
            assert claim.fresh, claim
            store.finish_call("shared", call_id, ToolResult(call_id, f"out {worker} {i}"),
                              decision=Decision(Action.ALLOW, "default"), exit_code=0, duration_ms=0.1,
                              bytes_out=8, truncated=False)
        out = {"done": n}
    elif mode == "claim":
        run, call_ids = rest[0], rest[1:]
        fresh, texts = [], {}
        for call_id in call_ids:
            claim = store.claim_call(run, call_id, "shell", '{"command": "true"}')
            if claim.fresh:
                fresh.append(call_id)
                store.finish_call(run, call_id, ToolResult(call_id, f"ran by {os.getpid()}"), decision=None,
                                  exit_code=0, duration_ms=0.1, bytes_out=0, truncated=False)
                texts[call_id] = f"ran by {os.getpid()}"
            else:
                result = claim.result or store.wait_for_result(run, call_id, 60)
                texts[call_id] = None if result is None else result.text
        out = {"fresh": fresh, "texts": texts}
    elif mode == "consume":
        out = {"won": [a for a in rest if store.consume_approval(a)]}
    elif mode == "approve":
        pending = store.list_approvals("pending")
        out = {"seen": [a.id for a in pending]}
        for approval in pending:
            store.resolve_approval(approval.id, True, by="child", reason="looks fine")
    elif mode == "wait":
        run, call_id = rest
        claim = store.claim_call(run, call_id, "shell", '{"command": "true"}')
        print(json.dumps({"fresh": claim.fresh, "state": claim.state}), flush=True)
        result = store.wait_for_result(run, call_id, 60)
        out = {"text": None if result is None else result.text, "error": None if result is None else result.error}
    elif mode == "claim-and-die":
        run, call_id = rest
        claim = store.claim_call(run, call_id, "shell", '{"command": "true"}')
        out = {"fresh": claim.fresh}
print(json.dumps(out), flush=True)
"""


class Children:
    """Worker processes started together; every one is killed and reaped in ``close``."""

    def __init__(self, db: Path, argvs: list[list[str]]) -> None:
        self.procs: list[subprocess.Popen[str]] = []
        for argv in argvs:
            self.procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WORKER, argv[0], str(db), *argv[1:]],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    cwd=REPO,
                )
            )
        for proc in self.procs:
            assert proc.stdout is not None
            line = proc.stdout.readline()  # blocks until the child is up (or dead: "")
            assert line == "ready\n", self._died(proc)

    def _died(self, proc: subprocess.Popen[str]) -> str:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        return f"child exited early ({proc.returncode}): {err}"

    def go(self) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

    def readline(self, index: int) -> dict:
        proc = self.procs[index]
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, self._died(proc)
        return json.loads(line)

    def results(self, timeout: float = 120) -> list[dict]:
        outs = []
        for proc in self.procs:
            out, err = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, f"child failed ({proc.returncode}): {err}"
            assert "database is locked" not in err
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate(timeout=30)


# --------------------------------------------------------------------------- paths and setup


def test_default_path_follows_env_then_xdg_then_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CALLBOX_AUDIT_DB", raising=False)
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert default_audit_path() == tmp_path / "home" / ".local" / "state" / "callbox" / "audit.sqlite3"
    monkeypatch.setenv("XDG_STATE_HOME", "relative/ignored")
    assert default_audit_path() == tmp_path / "home" / ".local" / "state" / "callbox" / "audit.sqlite3"
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert default_audit_path() == tmp_path / "xdg" / "callbox" / "audit.sqlite3"
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "env.db"))
    assert default_audit_path() == tmp_path / "env.db"


def test_explicit_path_beats_env_and_default_uses_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "env" / "env.db"))
    with AuditStore(tmp_path / "explicit.db") as s:
        assert s.path == tmp_path / "explicit.db"
    assert (tmp_path / "explicit.db").is_file()
    assert not (tmp_path / "env").exists()
    with AuditStore() as s:
        assert s.path == tmp_path / "env" / "env.db"
    assert (tmp_path / "env" / "env.db").is_file()


def test_creates_private_parent_dirs_and_file(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "audit.sqlite3"
    with AuditStore(path):
        pass
    for directory in (tmp_path / "a", tmp_path / "a" / "b"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_connection_settings(store: AuditStore) -> None:
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert conn.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 10_000
    assert conn.execute("PRAGMA user_version").fetchone()[0] == schema.SCHEMA_VERSION
    with pytest.raises(sqlite3.IntegrityError, match="FOREIGN KEY"):
        conn.execute(
            "INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, bytes_in, owner, started) "
            "VALUES ('no-such-run', 'c', 't', 'd', '{}', 2, 'o', 0)"
        )


def test_wal_mode_is_persistent_in_the_file(db: Path) -> None:
    AuditStore(db).close()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()


def test_reopening_keeps_data_and_runs_no_migration(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with AuditStore(db) as s:
        s.start_run("r1", meta={"model": "scripted"})
    ran: list[int] = []
    monkeypatch.setitem(schema.MIGRATIONS, 1, lambda conn: ran.append(1))
    with AuditStore(db) as s:
        assert s.get_run("r1").meta == {"model": "scripted"}
    assert ran == []


def test_migration_hook_upgrades_once(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    AuditStore(db).close()
    ran: list[int] = []

    def to_2(conn: sqlite3.Connection) -> None:
        ran.append(2)
        conn.execute("ALTER TABLE runs ADD COLUMN label TEXT")

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(schema.MIGRATIONS, 2, to_2)
    with AuditStore(db) as s:
        assert s._conn is not None
        assert s._conn.execute("PRAGMA user_version").fetchone()[0] == 2
        assert "label" in [r[1] for r in s._conn.execute("PRAGMA table_info(runs)")]
    AuditStore(db).close()
    assert ran == [2]


def test_failed_migration_rolls_back(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    AuditStore(db).close()

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("ALTER TABLE runs ADD COLUMN half TEXT")
        raise RuntimeError("boom")

    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(schema.MIGRATIONS, 2, broken)
    with pytest.raises(RuntimeError, match="boom"):
        AuditStore(db)
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
        assert "half" not in [r[1] for r in conn.execute("PRAGMA table_info(runs)")]
    finally:
        conn.close()


def test_newer_schema_is_refused(db: Path) -> None:
    AuditStore(db).close()
    conn = sqlite3.connect(db)
    try:
        conn.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
    finally:
        conn.close()
    with pytest.raises(AuditError, match="newer than this callbox understands"):
        AuditStore(db)


def test_unusable_path_is_a_readable_error(tmp_path: Path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(AuditError, match=r"cannot open the audit database .*dir\.db") as info:
        AuditStore(tmp_path / "dir.db")
    assert isinstance(info.value, CallboxError)
    assert info.value.exit_code == 125


def test_not_a_database_is_a_readable_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(AuditError, match=r"junk\.db"):
        AuditStore(path)


def test_closed_store_refuses_use(db: Path) -> None:
    s = AuditStore(db)
    s.close()
    with pytest.raises(AuditError, match="closed"):
        s.start_run()
    s.close()  # closing twice is fine


# --------------------------------------------------------------------------- runs


def test_runs_lifecycle(store: AuditStore) -> None:
    a = store.start_run(meta={"model": "m1"})
    b = store.start_run()
    assert a != b
    assert re.fullmatch(r"[A-Za-z0-9_.:-]{1,128}", a)
    assert store.start_run("fixed", meta={"v": 1}) == "fixed"
    assert store.start_run("fixed", meta={"v": 2}) == "fixed"  # idempotent, first meta kept
    run = store.get_run("fixed")
    assert run.meta == {"v": 1}
    assert run.ended is None
    assert run.calls == 0
    store.end_run("fixed", "final_answer")
    store.end_run("fixed", "budget")  # ending again keeps the first reason
    run = store.get_run("fixed")
    assert run.end_reason == "final_answer"
    assert run.ended is not None
    assert run.ended >= run.created
    assert store.get_run(a).meta == {"model": "m1"}
    assert [r.id for r in store.list_runs()] == ["fixed", b, a]
    assert [r.id for r in store.list_runs(limit=2)] == ["fixed", b]
    assert run.to_dict()["end_reason"] == "final_answer"


def test_unknown_run_errors(store: AuditStore) -> None:
    with pytest.raises(AuditError, match="no run with id nope; list them with `callbox audit`") as info:
        store.get_run("nope")
    assert info.value.exit_code == 4  # not found
    with pytest.raises(AuditError, match="no run with id nope"):
        store.end_run("nope", "x")
    with pytest.raises(AuditError, match="no run with id nope"):
        store.calls_for_run("nope")
    with pytest.raises(AuditError, match="bad run id"):
        store.start_run("")
    with pytest.raises(AuditError, match="bad run id"):
        store.start_run("x" * 129)


# --------------------------------------------------------------------------- calls


def test_claim_is_fresh_once_then_returns_the_record(store: AuditStore) -> None:
    run = store.start_run()
    first = store.claim_call(run, "call_1", "shell", '{"command": "ls"}')
    assert first.fresh
    assert first.state == "claimed"
    assert first.result is None
    again = store.claim_call(run, "call_1", "shell", '{"command": "ls"}')
    assert not again.fresh
    assert not again.conflict
    assert again.state == "claimed"
    assert again.record.args_digest == first.record.args_digest
    assert again.record.started == first.record.started
    # another run may use the same call_id
    assert store.claim_call(store.start_run(), "call_1", "shell", "{}").fresh


def test_replay_returns_exactly_the_recorded_result(store: AuditStore) -> None:
    run = store.start_run()
    result = ToolResult(
        call_id="c1",
        text="Exit code: 0\nWall time: 0.1 seconds\nOutput:\nhéllo ✓\n",
        structured={"exit_code": 0, "nested": {"list": [1, 2.5, None, True, "x"]}},
        meta={"rule": "default", "timings": {"exec_ms": 12.25}},
    )
    assert store.claim_call(run, "c1", "shell", '{"command":"echo"}').fresh
    finish(store, run, "c1", result)
    replay = store.claim_call(run, "c1", "shell", '{"command":"echo"}')
    assert not replay.fresh
    assert replay.state == "done"
    assert replay.result == result
    assert replay.decision == ALLOW
    assert store.wait_for_result(run, "c1", 0) == result


@pytest.mark.parametrize(
    "result",
    [
        ToolResult("c", "ok"),
        ToolResult.failure("c", ErrorCode.TIMED_OUT, "timed out after 30 s", limit_s=30),
        ToolResult.failure("c", ErrorCode.DENIED, "denied by rule X"),
        ToolResult("c", "", is_error=True, error=ErrorCode.NONZERO_EXIT, structured={"exit_code": 2}),
        ToolResult("c", "unicode ☃ \x00 nul and \u2028", structured={}, meta={"k": [{"a": None}]}),
        ToolResult("c", "lone surrogate \udcff kept", meta={"s": "\ud800"}),
    ],
)
def test_result_json_round_trip(store: AuditStore, result: ToolResult) -> None:
    assert result_from_json(result_to_json(result)) == result
    run = store.start_run()
    store.claim_call(run, "c", "t", "{}")
    finish(store, run, "c", result, decision=None)
    assert store.claim_call(run, "c", "t", "{}").result == result
    record = store.get_call(run, "c")
    assert record is not None
    assert record.error_code == (None if result.error is None else result.error.value)
    assert record.is_error is result.is_error


def test_error_code_round_trips_as_the_enum() -> None:
    back = result_from_json(result_to_json(ToolResult.failure("c", ErrorCode.BUDGET_EXCEEDED, "over")))
    assert back.error is ErrorCode.BUDGET_EXCEEDED
    assert back.error.retryable is False


def test_arguments_digest_is_canonical(store: AuditStore) -> None:
    run = store.start_run()
    a = store.claim_call(run, "c1", "shell", '{"b": 1, "a": [1, 2], "u": "é"}')
    b = store.claim_call(run, "c2", "shell", {"u": "é", "a": [1, 2], "b": 1})
    canonical = json.dumps({"a": [1, 2], "b": 1, "u": "é"}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert a.record.args_digest == b.record.args_digest == hashlib.sha256(canonical.encode()).hexdigest()
    assert a.record.arguments == '{"b": 1, "a": [1, 2], "u": "é"}'  # stored as received
    same_call_other_format = store.claim_call(run, "c1", "shell", '{"a":[1,2],"b":1,"u":"\\u00e9"}')
    assert not same_call_other_format.fresh
    assert not same_call_other_format.conflict


def test_reused_call_id_with_other_arguments_is_a_conflict(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "c1", "shell", '{"command": "ls"}')
    other_args = store.claim_call(run, "c1", "shell", '{"command": "rm -rf /"}')
    assert not other_args.fresh
    assert other_args.conflict
    other_tool = store.claim_call(run, "c1", "read_file", '{"command": "ls"}')
    assert other_tool.conflict


def test_invalid_json_arguments_are_recorded(store: AuditStore) -> None:
    run = store.start_run()
    claim = store.claim_call(run, "c1", "shell", '{"command": ')
    assert claim.fresh
    assert claim.record.arguments == '{"command": '
    assert claim.record.args_digest == hashlib.sha256(b'{"command": ').hexdigest()


def test_large_arguments_are_capped_with_a_flag(store: AuditStore) -> None:
    run = store.start_run()
    big = json.dumps({"content": "é" * 100_000})
    claim = store.claim_call(run, "c1", "write_file", big)
    record = store.get_call(run, "c1")
    assert record is not None
    assert record.arguments_truncated
    assert len(record.arguments.encode()) <= audit.ARGUMENTS_CAP
    assert big.startswith(record.arguments)
    assert record.bytes_in == len(big.encode())
    assert record.args_digest == claim.record.args_digest == audit.arguments_digest(big)
    small = store.claim_call(run, "c2", "shell", '{"command": "ls"}')
    assert not small.record.arguments_truncated


def test_claim_creates_a_missing_run(store: AuditStore) -> None:
    assert store.claim_call("implicit", "c1", "shell", "{}").fresh
    assert store.get_run("implicit").calls == 1


def test_finish_twice_or_unclaimed_is_an_error(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "c1", "shell", "{}")
    finish(store, run, "c1", ToolResult("c1", "first"))
    with pytest.raises(AuditError, match=r"call c1 of run .* is already finished"):
        finish(store, run, "c1", ToolResult("c1", "second"))
    assert store.claim_call(run, "c1", "shell", "{}").result == ToolResult("c1", "first")
    with pytest.raises(AuditError, match="no call c9 in run"):
        finish(store, run, "c9", ToolResult("c9", "x"))
    with pytest.raises(AuditError, match="no call c9 in run"):
        store.record_decision(run, "c9", ALLOW)
    with pytest.raises(AuditError, match="no call c9 in run"):
        store.wait_for_result(run, "c9", 0)


def test_decision_recorded_before_execution_and_kept(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "c1", "shell", '{"command": "rm -rf /"}')
    store.record_decision(run, "c1", DENY)
    record = store.get_call(run, "c1")
    assert record is not None
    assert record.decision == DENY
    assert record.state == "claimed"
    finish(store, run, "c1", ToolResult.failure("c1", ErrorCode.DENIED, DENY.reason), decision=None)
    record = store.get_call(run, "c1")
    assert record is not None
    assert record.decision == DENY  # None keeps it
    assert record.state == "done"
    assert record.finished is not None
    assert record.duration_ms == 1.5


def test_count_calls_counts_authorized_calls_only(store: AuditStore) -> None:
    run = store.start_run()
    assert store.count_calls(run) == 0
    assert store.first_call_time(run) is None
    before = time.time()
    store.claim_call(run, "allowed", "shell", "{}")
    store.record_decision(run, "allowed", ALLOW)
    store.claim_call(run, "denied", "shell", "{}")
    store.record_decision(run, "denied", DENY)
    store.claim_call(run, "invalid", "shell", "{")
    finish(store, run, "invalid", ToolResult.failure("invalid", ErrorCode.INVALID_JSON, "bad json"), decision=None)
    store.claim_call(run, "asked", "shell", "{}")
    store.record_decision(run, "asked", ASK)
    assert store.count_calls(run) == 1
    approval = store.create_approval(run, "asked", "shell", "{}", ASK.rule, ASK.reason)
    store.resolve_approval(approval.id, True, by="me", reason=None)
    assert store.count_calls(run) == 1  # approved is not yet running
    assert store.consume_approval(approval.id)
    assert store.count_calls(run) == 2
    store.claim_call(run, "finished-allow", "shell", "{}")
    finish(store, run, "finished-allow", ToolResult("finished-allow", "ok"), decision=ALLOW)
    assert store.count_calls(run) == 3
    store.claim_call(run, "over", "shell", "{}")
    failure = ToolResult.failure("over", ErrorCode.BUDGET_EXCEEDED, "max_tool_calls=3 reached")
    finish(store, run, "over", failure, decision=ALLOW)
    assert store.count_calls(run) == 3  # refused for the budget: not counted
    assert store.count_calls("other-run") == 0
    first = store.first_call_time(run)
    assert first is not None
    assert before <= first <= time.time()


def test_mark_running_enforces_the_budget_atomically(store: AuditStore) -> None:
    run = store.start_run()
    for i in range(2):
        store.claim_call(run, f"c{i}", "shell", "{}")
        store.record_decision(run, f"c{i}", ALLOW)
        assert store.mark_running(run, f"c{i}", max_calls=2)
        assert store.get_call(run, f"c{i}").state == "running"  # type: ignore[union-attr]
    assert store.count_calls(run) == 2
    store.claim_call(run, "c2", "shell", "{}")
    store.record_decision(run, "c2", ALLOW)
    assert store.count_calls(run) == 3  # its allow is recorded...
    assert not store.mark_running(run, "c2", max_calls=2)  # ...but the budget refuses it
    assert store.count_calls(run) == 2
    assert store.get_call(run, "c2").state == "claimed"  # type: ignore[union-attr]
    with pytest.raises(AuditError, match="already running"):
        store.mark_running(run, "c0")
    with pytest.raises(AuditError, match="no call nope"):
        store.mark_running(run, "nope")


def test_calls_for_run_and_recent_calls(store: AuditStore) -> None:
    r1, r2 = store.start_run(), store.start_run()
    for run, call_id in [(r1, "a"), (r2, "x"), (r1, "b")]:
        store.claim_call(run, call_id, "shell", {"id": call_id})
    finish(store, r1, "a", ToolResult("a", "A" * 10))
    rows = store.calls_for_run(r1)
    assert [r["call_id"] for r in rows] == ["a", "b"]
    done = rows[0]
    assert done["state"] == "done"
    assert done["decision"] == "allow"
    assert done["rule"] == ALLOW.rule
    assert done["result_text"] == "A" * 10
    assert done["bytes_out"] == 10
    assert done["truncated"] is False
    assert done["exit_code"] == 0
    assert done["is_error"] is False
    assert done["arguments"] == '{"id":"a"}'
    assert "result_json" not in done
    json.dumps(rows)  # JSON-ready for `callbox audit --json`
    assert rows[1]["state"] == "claimed"
    assert rows[1]["result_text"] is None
    assert [r["call_id"] for r in store.recent_calls(2)] == ["b", "x"]
    assert [r["call_id"] for r in store.recent_calls()] == ["b", "x", "a"]
    assert store.get_run(r1).calls == 2


def test_calls_for_run_shows_the_decision_that_stands_after_a_person_decided(store: AuditStore) -> None:
    run = store.start_run()
    asked = Decision(Action.ASK, 'tools.shell.rules[0] (ask command "*push*")', "pushing needs a person")
    for call_id in ("denied", "approved", "pending", "plain"):
        store.claim_call(run, call_id, "shell", {"command": f"git push {call_id}"})
        store.record_decision(run, call_id, ALLOW if call_id == "plain" else asked)
    ids = {c: store.create_approval(run, c, "shell", {"command": f"git push {c}"}, asked.rule, asked.reason).id
           for c in ("denied", "approved", "pending")}
    store.resolve_approval(ids["denied"], False, by="alice", reason="not on a Friday")
    store.resolve_approval(ids["approved"], True, by="bob", reason=None)
    rows = {r["call_id"]: r for r in store.calls_for_run(run)}

    denied = rows["denied"]
    assert (denied["decision"], denied["reason"]) == ("deny", "not on a Friday")
    assert denied["rule"] == (f'tools.shell.rules[0] (ask command "*push*"); denied by alice '
                              f"(approval {ids['denied']}): not on a Friday")
    assert denied["approval"] == {"id": ids["denied"], "state": "denied", "resolved_by": "alice",
                                  "resolution_reason": "not on a Friday"}
    approved = rows["approved"]
    assert approved["decision"] == "allow"
    assert approved["rule"].endswith(f"; approved by bob (approval {ids['approved']})")
    pending = rows["pending"]
    assert pending["decision"] == "ask"
    assert pending["rule"].endswith(f"; waiting for a person (approval {ids['pending']})")
    assert rows["plain"]["decision"] == "allow" and rows["plain"]["approval"] is None
    assert all(r["state"] == "claimed" for r in rows.values())  # the call's own lifecycle is unchanged
    json.dumps(list(rows.values()))


NOT_STARTED = ToolResult("c1", "the sandbox is unavailable: no engine", is_error=True,
                         error=ErrorCode.SANDBOX_UNAVAILABLE, structured={"command_started": False})
"""A retry-safe failure: retryable, and the command did not start."""


def _ran_and_failed(store: AuditStore, run: str, result: ToolResult, arguments: str = '{"command": "true"}') -> None:
    assert store.claim_call(run, "c1", "shell", arguments).fresh
    store.record_decision(run, "c1", ALLOW)
    assert store.mark_running(run, "c1")
    store.finish_call(run, "c1", result, decision=ALLOW, exit_code=None, duration_ms=3.0,
                      bytes_out=len(result.text), truncated=False)


def test_a_failure_before_the_command_started_is_claimed_again_and_kept(store: AuditStore) -> None:
    run = store.start_run()
    _ran_and_failed(store, run, NOT_STARTED)
    retry = store.claim_call(run, "c1", "shell", '{ "command" : "true" }')  # same arguments, other spacing
    assert retry.fresh and not retry.conflict
    assert retry.attempt == 2
    assert (retry.state, retry.result, retry.decision, retry.record.authorized) == ("claimed", None, None, False)
    (earlier,) = retry.record.earlier_attempts
    assert (earlier.attempt, earlier.error_code, earlier.decision) == (1, "sandbox_unavailable", ALLOW)
    assert earlier.result == NOT_STARTED and earlier.result_text == NOT_STARTED.text
    assert store.count_calls(run) == 0  # re-authorized by the retry, counted once
    assert not store.claim_call(run, "c1", "shell", '{"command": "true"}').fresh  # the retry owns it now

    store.record_decision(run, "c1", ALLOW)
    assert store.mark_running(run, "c1", max_calls=1)
    finish(store, run, "c1", ToolResult("c1", "Exit code: 0\nOutput:\nhi\n"))
    replay = store.claim_call(run, "c1", "shell", '{"command": "true"}')
    assert not replay.fresh
    assert replay.result == ToolResult("c1", "Exit code: 0\nOutput:\nhi\n")
    assert replay.attempt == 2
    assert store.count_calls(run) == 1
    (row,) = store.calls_for_run(run)
    assert (row["attempts"], row["error_code"], row["state"]) == (2, None, "done")
    assert [(a["attempt"], a["error_code"]) for a in row["earlier_attempts"]] == [(1, "sandbox_unavailable")]
    assert store.recent_calls(1)[0]["attempts"] == 2
    json.dumps(row)


def test_a_second_failure_before_start_is_a_third_attempt(store: AuditStore) -> None:
    run = store.start_run()
    _ran_and_failed(store, run, NOT_STARTED)
    assert store.claim_call(run, "c1", "shell", '{"command": "true"}').fresh
    store.finish_call(run, "c1", NOT_STARTED, decision=ALLOW, exit_code=None, duration_ms=1.0, bytes_out=1,
                      truncated=False)
    third = store.claim_call(run, "c1", "shell", '{"command": "true"}')
    assert third.fresh and third.attempt == 3
    assert [a.attempt for a in third.record.earlier_attempts] == [1, 2]


@pytest.mark.parametrize(
    "result",
    [
        ToolResult("c1", "the sandbox did not answer. The command had started.", is_error=True,
                   error=ErrorCode.SANDBOX_UNAVAILABLE, structured={"command_started": True}),
        ToolResult.failure("c1", ErrorCode.SANDBOX_UNAVAILABLE, "the sandbox did not answer"),  # does not say
        ToolResult("c1", "Exit code: 1", is_error=True, error=ErrorCode.NONZERO_EXIT, structured={"exit_code": 1}),
        ToolResult("c1", "denied", is_error=True, error=ErrorCode.DENIED, structured={"command_started": False}),
        ToolResult("c1", "Exit code: 0\nOutput:\n", structured={"command_started": False}),
    ],
    ids=["started", "unknown-if-started", "nonzero-exit", "not-retryable", "success"],
)
def test_any_other_result_is_final(store: AuditStore, result: ToolResult) -> None:
    run = store.start_run()
    _ran_and_failed(store, run, result)
    replay = store.claim_call(run, "c1", "shell", '{"command": "true"}')
    assert not replay.fresh
    assert replay.result == result and replay.attempt == 1
    record = store.get_call(run, "c1")
    assert record is not None and record.attempts == 1 and record.earlier_attempts == ()


def test_a_retry_with_other_arguments_is_a_conflict_not_a_retry(store: AuditStore) -> None:
    run = store.start_run()
    _ran_and_failed(store, run, NOT_STARTED)
    other = store.claim_call(run, "c1", "shell", '{"command": "false"}')
    assert not other.fresh and other.conflict
    assert other.result == NOT_STARTED
    assert store.claim_call(run, "c1", "bash", '{"command": "true"}').conflict


def test_wait_for_result_times_out_with_none(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "c1", "shell", "{}")
    start = time.monotonic()
    assert store.wait_for_result(run, "c1", 0.3) is None
    assert 0.3 <= time.monotonic() - start < 3


def test_threads_race_one_claim(store: AuditStore) -> None:
    run = store.start_run()
    barrier = threading.Barrier(16)
    fresh: list[bool] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            barrier.wait(timeout=30)
            for i in range(50):
                fresh.append(store.claim_call(run, f"c{i}", "shell", "{}").fresh)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert len(fresh) == 16 * 50
    assert fresh.count(True) == 50


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_opens_its_own_connection(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "parent-1", "shell", "{}")
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's connection
        code = 1
        try:
            inherited = store._conn
            code = 0 if store.claim_call(run, "child-1", "shell", "{}").fresh and store._conn is not inherited else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.claim_call(run, "parent-2", "shell", "{}").fresh
    assert [r["call_id"] for r in store.calls_for_run(run)] == ["parent-1", "child-1", "parent-2"]


# --------------------------------------------------------------------------- approvals


def test_approval_lifecycle(store: AuditStore) -> None:
    run = store.start_run()
    store.claim_call(run, "c1", "shell", '{"command": "make deploy"}')
    approval = store.create_approval(run, "c1", "shell", '{"command": "make deploy"}', ASK.rule, ASK.reason)
    assert re.fullmatch(r"[a-z2-9]{10}", approval.id)
    assert approval.state == "pending"
    assert approval.arguments == '{"command": "make deploy"}'
    assert approval.args_digest == audit.arguments_digest('{"command":"make deploy"}')
    assert store.create_approval(run, "c1", "shell", "{}", "other", "other") == approval  # idempotent
    assert store.get_approval(approval.id) == approval
    assert store.find_approval(run, "c1") == approval
    assert store.find_approval(run, "c2") is None
    assert store.list_approvals() == [approval]
    with pytest.raises(AuditError, match="still pending"):
        store.consume_approval(approval.id)
    approved = store.resolve_approval(approval.id, True, by="alice", reason="ok for staging")
    assert approved.state == "approved"
    assert approved.resolved_by == "alice"
    assert approved.resolution_reason == "ok for staging"
    assert approved.resolved is not None
    assert store.get_approval(approval.id) == approved
    assert store.list_approvals() == []
    assert store.list_approvals("approved") == [approved]
    with pytest.raises(AuditError, match=f"^approval {approval.id} is already approved$") as info:
        store.resolve_approval(approval.id, False, by="bob", reason=None)
    assert info.value.exit_code == 5  # already resolved
    assert store.consume_approval(approval.id) is True
    assert store.consume_approval(approval.id) is False
    consumed = store.get_approval(approval.id)
    assert consumed.state == "consumed"
    assert consumed.consumed is not None
    with pytest.raises(AuditError, match=f"approval {approval.id} is already approved"):
        store.resolve_approval(approval.id, True, by="bob", reason=None)
    assert consumed.to_dict()["state"] == "consumed"


def test_denied_approval(store: AuditStore) -> None:
    run = store.start_run()
    approval = store.create_approval(run, "c1", "shell", "{}", ASK.rule, ASK.reason)
    denied = store.resolve_approval(approval.id, False, by="bob", reason="not today")
    assert denied.state == "denied"
    assert denied.resolution_reason == "not today"
    with pytest.raises(AuditError, match=f"approval {approval.id} is already denied"):
        store.resolve_approval(approval.id, True, by="bob", reason=None)
    with pytest.raises(AuditError, match="was denied"):
        store.consume_approval(approval.id)


def test_unknown_approval_id(store: AuditStore) -> None:
    message = "no approval with id zzz; list them with `callbox approvals list`"
    for call in (
        lambda: store.get_approval("zzz"),
        lambda: store.resolve_approval("zzz", True, by="me", reason=None),
        lambda: store.consume_approval("zzz"),
    ):
        with pytest.raises(AuditError) as info:
            call()
        assert info.value.message == message
        assert info.value.exit_code == 4  # not found


def test_list_approvals_filters(store: AuditStore) -> None:
    r1, r2 = store.start_run(), store.start_run()
    a = store.create_approval(r1, "c1", "shell", "{}", "rule", "why")
    b = store.create_approval(r2, "c1", "shell", "{}", "rule", "why")
    c = store.create_approval(r2, "c2", "shell", "{}", "rule", "why")
    store.resolve_approval(b.id, False, by="me", reason=None)
    assert [x.id for x in store.list_approvals()] == [a.id, c.id]
    assert [x.id for x in store.list_approvals(None)] == [a.id, b.id, c.id]
    assert [x.id for x in store.list_approvals("denied")] == [b.id]
    assert [x.id for x in store.list_approvals(None, run_id=r2)] == [b.id, c.id]
    with pytest.raises(AuditError, match="unknown approval state 'bogus'"):
        store.list_approvals("bogus")


# --------------------------------------------------------------------------- real processes


def test_pending_approval_survives_restart_and_is_approved_from_another_process(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
        s.claim_call(run, "c1", "shell", '{"command": "deploy"}')
        s.record_decision(run, "c1", ASK)
        approval = s.create_approval(run, "c1", "shell", '{"command": "deploy"}', ASK.rule, ASK.reason)
    children = Children(db, [["approve"]])
    try:
        children.go()
        (out,) = children.results()
    finally:
        children.close()
    assert out == {"seen": [approval.id]}
    with AuditStore(db) as s:
        got = s.get_approval(approval.id)
        assert got.state == "approved"
        assert got.resolved_by == "child"
        assert got.resolution_reason == "looks fine"
        record = s.get_call(run, "c1")
        assert record is not None
        assert record.decision == ASK
        assert s.consume_approval(approval.id)


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    db = tmp_path / "fresh" / "audit.sqlite3"  # the children race to create it, too
    workers, n = 4, 200
    children = Children(db, [["write", str(w), str(n)] for w in range(workers)])
    try:
        children.go()
        outs = children.results()
    finally:
        children.close()
    assert outs == [{"done": n}] * workers
    with AuditStore(db) as s:
        rows = s.calls_for_run("shared")
        assert len(rows) == workers * n
        expected = {f"w{w}-c{i}": f"out {w} {i}" for w in range(workers) for i in range(n)}
        assert {r["call_id"]: r["result_text"] for r in rows} == expected
        assert all(r["state"] == "done" and r["decision"] == "allow" for r in rows)
        runs = {r.id: r for r in s.list_runs(limit=10_000)}
        assert len(runs) == workers * n + 1
        assert runs["w3-r199"].meta == {"i": 199, "worker": 3}
        assert s.count_calls("shared") == workers * n


def test_processes_race_claims_exactly_one_fresh_and_all_see_its_result(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
    call_ids = [f"call_{i}" for i in range(20)]
    children = Children(db, [["claim", run, *call_ids] for _ in range(8)])
    try:
        children.go()
        outs = children.results()
    finally:
        children.close()
    for call_id in call_ids:
        winners = [o for o in outs if call_id in o["fresh"]]
        assert len(winners) == 1, (call_id, outs)
        texts = {o["texts"][call_id] for o in outs}
        assert texts == {winners[0]["texts"][call_id]}  # the loser replays the winner's result
    with AuditStore(db) as s:
        assert len(s.calls_for_run(run)) == len(call_ids)


def test_processes_racing_to_retry_a_failure_before_start_claim_it_once(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
        _ran_and_failed(s, run, NOT_STARTED)
    children = Children(db, [["claim", run, "c1"] for _ in range(8)])
    try:
        children.go()
        outs = children.results()
    finally:
        children.close()
    winners = [o for o in outs if o["fresh"] == ["c1"]]
    assert len(winners) == 1, outs
    assert {o["texts"]["c1"] for o in outs} == {winners[0]["texts"]["c1"]}  # the others got the retry's result
    with AuditStore(db) as s:
        record = s.get_call(run, "c1")
        assert record is not None and record.attempts == 2 and record.result is not None
        assert record.result.text == winners[0]["texts"]["c1"]


def test_processes_race_consume_exactly_one_wins(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
        ids = []
        for i in range(30):
            approval = s.create_approval(run, f"c{i}", "shell", "{}", "rule", "why")
            s.resolve_approval(approval.id, True, by="me", reason=None)
            ids.append(approval.id)
    children = Children(db, [["consume", *ids], ["consume", *reversed(ids)]])
    try:
        children.go()
        outs = children.results()
    finally:
        children.close()
    won = outs[0]["won"] + outs[1]["won"]
    assert sorted(won) == sorted(ids)  # every approval consumed exactly once
    with AuditStore(db) as s:
        assert {a.state for a in s.list_approvals(None)} == {"consumed"}


def test_second_process_waits_for_the_first_ones_result(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
        assert s.claim_call(run, "c1", "shell", '{"command": "true"}').fresh
        children = Children(db, [["wait", run, "c1"]])
        try:
            children.go()
            assert children.readline(0) == {"fresh": False, "state": "claimed"}  # it is now waiting
            s.record_decision(run, "c1", ALLOW)
            assert s.mark_running(run, "c1")
            finish(s, run, "c1", ToolResult.failure("c1", ErrorCode.NONZERO_EXIT, "Exit code: 1"))
            (out,) = children.results()
        finally:
            children.close()
    assert out == {"text": "Exit code: 1", "error": "nonzero_exit"}


def test_wait_gives_up_when_the_owner_process_died(db: Path) -> None:
    with AuditStore(db) as s:
        run = s.start_run()
        children = Children(db, [["claim-and-die", run, "c1"]])
        try:
            children.go()
            assert children.results() == [{"fresh": True}]  # exited without finishing
        finally:
            children.close()
        start = time.monotonic()
        assert s.wait_for_result(run, "c1", 60) is None
        assert time.monotonic() - start < 10
        record = s.get_call(run, "c1")
        assert record is not None
        assert record.state == "claimed"  # never re-run: at most once


# --------------------------------------------------------------------------- performance


def test_claim_plus_finish_p50(store: AuditStore) -> None:
    """Per-call audit overhead on a file-backed WAL database (target: well under 0.3 ms)."""
    run = store.start_run()
    args = '{"command": "ls -la /tmp", "workdir": null, "timeout": 30}'
    samples = []
    for i in range(600):
        result = ToolResult(f"c{i}", "Exit code: 0\nOutput:\n" + "x" * 2000, structured={"exit_code": 0})
        start = time.perf_counter()
        store.claim_call(run, f"c{i}", "shell", args)
        finish(store, run, f"c{i}", result)
        if i >= 100:
            samples.append(time.perf_counter() - start)
    samples.sort()
    p50_ms = samples[len(samples) // 2] * 1000
    print(f"audit claim_call+finish_call p50 = {p50_ms:.3f} ms, p90 = {samples[len(samples) * 9 // 10] * 1000:.3f} ms")
    assert p50_ms < 1.0
