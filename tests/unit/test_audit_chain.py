"""The audit chain: real database files under tmp_path; tampering done as an attacker with
file access would, through the ``sqlite3`` module outside the store; real processes and
threads for the races; an older store built with the older schema for the migration."""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from harness.audit import schema
from harness.audit.chain import GENESIS, content_json, entry_hash
from harness.audit.chain_export import export_lines, parse_since
from harness.audit.chain_verify import parse_anchor, verify
from harness.audit.store import AuditError, AuditStore
from harness.cli.main import main
from harness.core.calls import Action, Decision, ErrorCode, ToolResult
from harness.telemetry import metrics

REPO = Path(__file__).resolve().parents[2]
ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.sqlite3"


def _call(store: AuditStore, run: str, call_id: str, text: str = "ok") -> None:
    store.claim_and_start(run, call_id, "shell", {"command": f"echo {call_id}"}, lambda _n: ALLOW)
    store.finish_call(run, call_id, ToolResult(call_id, text), decision=None, exit_code=0, duration_ms=1.0,
                      bytes_out=len(text), truncated=False)


def _fill(db: Path) -> None:
    """Records of every kind: runs of two clients, calls (one retried), an approval resolved,
    egress records, a checkpoint, a run ended and its meta updated."""
    with AuditStore(db) as store:
        store.start_run("run-ci", {"client": "ci"})
        store.start_run("run-ops", {"client": "ops"})
        _call(store, "run-ci", "c1")
        _call(store, "run-ops", "c1", "ops secret-free output")
        retry = ToolResult("c2", "no engine", is_error=True, error=ErrorCode.ENGINE_UNAVAILABLE,
                           structured={"command_started": False})
        store.claim_call("run-ci", "c2", "shell", {"command": "ls"})
        store.finish_call("run-ci", "c2", retry, decision=ALLOW, exit_code=None, duration_ms=1.0, bytes_out=0,
                          truncated=False)
        assert store.claim_call("run-ci", "c2", "shell", {"command": "ls"}).fresh  # the attempt moves away
        approval = store.create_approval("run-ci", "c3", "shell", {"command": "make deploy"}, "rule", "why")
        store.resolve_approval(approval.id, True, by="console:ops", reason="fine")
        store.record_egress("run-ops", "c1", "sbx-1", [{"ts": 1.0, "decision": "deny", "host": "evil.example"}])
        store.save_checkpoint("run-ops", '{"state": 1}')
        store.update_run_meta("run-ci", {"killed_by": "console:ops"})
        store.end_run("run-ci", "done")


def _attacker(db: Path, *statements: str) -> None:
    conn = sqlite3.connect(db)
    try:
        for statement in statements:
            conn.execute(statement)
        conn.commit()
    finally:
        conn.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    return code, capsys.readouterr().out


# ---- the chain as written -----------------------------------------------------------------------------------


def test_every_table_and_every_update_enters_the_chain_and_verifies(db: Path) -> None:
    _fill(db)
    verdict = verify(db)
    assert verdict.ok, [p.text for p in verdict.problems]
    conn = sqlite3.connect(db)
    entries = conn.execute("SELECT seq, tbl, op, note FROM audit_chain ORDER BY seq").fetchall()
    assert [e[0] for e in entries] == list(range(1, len(entries) + 1))
    assert entries[0][2:] == ("note", "chain started on a new store")
    tables = {e[1] for e in entries}
    assert tables >= {"runs", "calls", "call_attempts", "approvals", "egress", "checkpoints"}, tables
    assert "call_counts" not in tables
    ops = {(e[1], e[2]) for e in entries}
    assert ("approvals", "update") in ops and ("calls", "update") in ops and ("runs", "update") in ops
    assert verdict.rows == sum(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables if t)
    assert verdict.head.seq == len(entries)


def test_a_claim_and_start_is_one_entry_of_the_committed_row(db: Path) -> None:
    with AuditStore(db) as store:
        store.start_run("r", {})
        before = store.chain_head().seq
        store.claim_and_start("r", "c", "shell", {"command": "true"}, lambda _n: ALLOW)  # insert + update
        assert store.chain_head().seq == before + 1


def test_a_write_rolled_back_leaves_no_entry(db: Path) -> None:
    with AuditStore(db) as store:
        store.start_run("r", {})
        head = store.chain_head()

        def refuse(_n: int) -> Decision:
            raise RuntimeError("policy blew up")

        with pytest.raises(RuntimeError):
            store.claim_and_start("r", "c", "shell", {"command": "true"}, refuse)
        assert store.chain_head() == head
    assert verify(db).ok


def test_each_entry_hash_is_sha256_of_its_canonical_fields(db: Path) -> None:
    _fill(db)
    conn = sqlite3.connect(db)
    prev = GENESIS
    for seq, ts, tbl, key, op, run_id, actor, digest, note, prev_stored, stored in conn.execute(
            "SELECT seq, ts, tbl, key, op, run_id, actor, digest, note, prev, hash FROM audit_chain ORDER BY seq"):
        body = json.dumps([seq, ts, tbl, key, op, run_id, actor, digest, note, prev], separators=(",", ":"))
        assert prev_stored == prev
        assert stored == hashlib.sha256(body.encode()).hexdigest() == entry_hash(
            seq, ts, tbl, key, op, run_id, actor, digest, note, prev)
        prev = stored


# ---- tampering through sqlite3 --------------------------------------------------------------------------------


def test_a_row_changed_with_sqlite3_fails_verify_naming_it(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    seq = sqlite3.connect(db).execute(
        "SELECT max(seq) FROM audit_chain WHERE tbl = 'approvals'").fetchone()[0]
    _attacker(db, "UPDATE approvals SET resolved_by = 'console:someone-else'")
    verdict = verify(db)
    assert verdict.first is not None and verdict.first.kind == "changed"
    assert (verdict.first.table, verdict.first.seq, verdict.first.run_id) == ("approvals", seq, "run-ci")
    code, out = _cli(capsys, "audit", "verify", "--audit-db", str(db))
    assert code == 1
    first = out.splitlines()[0]
    assert first.startswith("audit chain BROKEN: approvals row [")
    assert f"(seq {seq}, update)" in first and "changed outside the store" in first and "run-ci" in first


def test_a_row_deleted_with_sqlite3_fails_verify_naming_it(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    _attacker(db, "DELETE FROM egress")
    verdict = verify(db)
    assert [(p.kind, p.table, p.run_id) for p in verdict.problems] == [("removed", "egress", "run-ops")]
    code, out = _cli(capsys, "audit", "verify", "--audit-db", str(db))
    assert code == 1 and "egress row [1] (run run-ops) was removed outside the store" in out


def test_a_row_inserted_with_sqlite3_fails_verify_naming_it(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    _attacker(db, "INSERT INTO runs (id, created, meta) VALUES ('forged', 1.0, '{\"client\": \"ci\"}')")
    verdict = verify(db)
    assert [(p.kind, p.table, p.key) for p in verdict.problems] == [("inserted", "runs", '["forged"]')]
    code, out = _cli(capsys, "audit", "verify", "--audit-db", str(db))
    assert code == 1 and 'runs row ["forged"] (run forged) was inserted outside the store' in out


def test_the_first_finding_is_the_earliest_in_the_chain(db: Path) -> None:
    _fill(db)
    _attacker(db, "UPDATE egress SET host = 'fine.example'",
              "UPDATE calls SET exit_code = 1 WHERE run_id = 'run-ci' AND call_id = 'c1'")
    verdict = verify(db)
    assert {p.table for p in verdict.problems} == {"egress", "calls"}
    assert verdict.first is not None and verdict.first.table == "calls"  # last chained before the egress record


def test_a_chain_entry_changed_removed_or_inserted_fails_verify(db: Path) -> None:
    _fill(db)
    original = db.read_bytes()
    _attacker(db, "UPDATE audit_chain SET op = 'insert' WHERE seq = 5")
    assert [(p.kind, p.seq) for p in verify(db).problems][:1] == [("entry_changed", 5)]
    db.write_bytes(original)
    _attacker(db, "DELETE FROM audit_chain WHERE seq = 4")
    kinds = {(p.kind, p.seq) for p in verify(db).problems}
    assert ("entry_removed", 4) in kinds
    db.write_bytes(original)
    _attacker(db, "UPDATE audit_chain SET seq = -seq WHERE seq >= 6",  # room for a forged entry at 6
              "UPDATE audit_chain SET seq = 1 - seq WHERE seq < 0")
    forged = entry_hash(6, 1.0, "", "[]", "note", None, None, None, "forged", "0" * 64)
    _attacker(db, f"INSERT INTO audit_chain VALUES (6, 1.0, '', '[]', 'note', NULL, NULL, NULL, 'forged', "
                  f"'{'0' * 64}', '{forged}')")
    assert verify(db).first is not None and verify(db).first.kind == "entry_link"  # type: ignore[union-attr]


def test_a_rewritten_chain_is_caught_by_an_anchored_head(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    with AuditStore(db) as store:
        anchor = store.chain_head()
    # The attacker changes a row and recomputes every digest and hash after it: the chain holds.
    _attacker(db, "UPDATE calls SET result_text = 'nothing to see' WHERE run_id = 'run-ops'")
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    row = dict(conn.execute("SELECT * FROM calls WHERE run_id = 'run-ops'").fetchone())
    digest = hashlib.sha256(content_json(row).encode()).hexdigest()
    conn.execute("UPDATE audit_chain SET digest = ? WHERE seq = (SELECT max(seq) FROM audit_chain "
                 "WHERE tbl = 'calls' AND key = ?)", (digest, f"[{row['id']}]"))
    prev = GENESIS
    for entry in conn.execute("SELECT * FROM audit_chain ORDER BY seq").fetchall():
        fields = [entry[k] for k in ("seq", "ts", "tbl", "key", "op", "run_id", "actor", "digest", "note")]
        new = entry_hash(*fields, prev)  # type: ignore[arg-type]
        conn.execute("UPDATE audit_chain SET prev = ?, hash = ? WHERE seq = ?", (prev, new, entry["seq"]))
        prev = new
    conn.commit()
    conn.close()
    assert verify(db).ok  # without an anchor, a whole rewrite is consistent
    verdict = verify(db, [anchor])
    assert [p.kind for p in verdict.problems] == ["anchor"] and str(anchor) in verdict.problems[0].text
    code, out = _cli(capsys, "audit", "verify", "--audit-db", str(db), "--anchor", str(anchor))
    assert code == 1 and "is not in the chain" in out


def test_an_anchor_is_seq_colon_hash() -> None:
    assert parse_anchor(f"7:{'a' * 64}").seq == 7
    with pytest.raises(AuditError, match="SEQ:HASH"):
        parse_anchor("7:xyz")


# ---- concurrency ------------------------------------------------------------------------------------------------

WORKER = """
import sys
from harness.audit.store import AuditStore
from harness.core.calls import Action, Decision, ToolResult
allow = Decision(Action.ALLOW, "r", "")
with AuditStore(sys.argv[1]) as store:
    print("ready", flush=True)
    sys.stdin.readline()
    for i in range(int(sys.argv[3])):
        call_id = f"{sys.argv[2]}-{i}"
        store.claim_and_start(sys.argv[2], call_id, "shell", {"i": i}, lambda _n: allow)
        store.finish_call(sys.argv[2], call_id, ToolResult(call_id, "x"), decision=None, exit_code=0,
                          duration_ms=1.0, bytes_out=1, truncated=False)
"""


def test_threads_and_processes_writing_at_once_keep_one_valid_chain(db: Path) -> None:
    calls_each = 40
    AuditStore(db).close()  # the chain exists before the race
    children = [subprocess.Popen([sys.executable, "-c", WORKER, str(db), f"proc-{n}", str(calls_each)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
                for n in range(2)]
    try:
        for child in children:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        with AuditStore(db) as store:
            go = threading.Event()

            def thread_calls(name: str) -> None:
                go.wait()
                for i in range(calls_each):
                    _call(store, name, f"{name}-{i}")

            threads = [threading.Thread(target=thread_calls, args=(f"thread-{n}",)) for n in range(2)]
            for thread in threads:
                thread.start()
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            go.set()
            for thread in threads:
                thread.join()
        for child in children:
            assert child.wait(timeout=120) == 0
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
    verdict = verify(db)
    assert verdict.ok, [p.text for p in verdict.problems]
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM calls").fetchone()[0] == 4 * calls_each
    # each call: one entry for its claim (claimed and running in one transaction), one for its result
    assert conn.execute("SELECT count(*) FROM audit_chain WHERE tbl = 'calls'").fetchone()[0] == 8 * calls_each
    assert len({actor for (actor,) in conn.execute("SELECT DISTINCT actor FROM audit_chain")}) == 3


# ---- older stores ------------------------------------------------------------------------------------------


def _older_store(db: Path) -> None:
    """A store as a callbox without the chain left it: schema version 1, its added columns and
    call counts, a call, an approval and egress records."""
    conn = sqlite3.connect(db, isolation_level=None)
    schema.migrate(conn, db)
    schema.add_columns(conn, db)
    schema.ensure_call_counts(conn)
    conn.execute(schema.EGRESS_TABLE)
    conn.execute("INSERT INTO runs (id, created, meta) VALUES ('old-run', 1.0, '{\"client\": \"ci\"}')")
    conn.execute("INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, bytes_in, owner, started, state) "
                 "VALUES ('old-run', 'c1', 'shell', 'd', '{}', 2, 'host/1/1.0', 1.0, 'done')")
    conn.execute("INSERT INTO approvals (id, run_id, call_id, tool, args_digest, arguments, rule, created) "
                 "VALUES ('appr1', 'old-run', 'c2', 'shell', 'd', '{}', 'rule', 1.0)")
    conn.execute("INSERT INTO egress (run_id, sandbox_id, ts, decision, record) VALUES ('old-run', 's', 1, 'allow', "
                 "'{}')")
    conn.close()


def test_an_older_store_is_chained_once_and_the_migration_is_noted(db: Path) -> None:
    _older_store(db)
    with AuditStore(db) as store:
        head = store.chain_head()
    with AuditStore(db) as store:  # opening it again chains nothing twice
        assert store.chain_head() == head
    conn = sqlite3.connect(db)
    entries = conn.execute("SELECT seq, tbl, op, note FROM audit_chain ORDER BY seq").fetchall()
    assert entries[0][2] == "note"
    assert entries[0][3] == ("chain started on a store written before it: 4 existing records chained once "
                             "(approvals 1, calls 1, egress 1, runs 1)")
    assert sorted((e[1], e[2]) for e in entries[1:]) == [
        ("approvals", "existing"), ("calls", "existing"), ("egress", "existing"), ("runs", "existing")]
    assert verify(db).ok
    _attacker(db, "UPDATE calls SET tool = 'python'")  # the migrated records are protected from then on
    assert verify(db).first is not None and verify(db).first.table == "calls"  # type: ignore[union-attr]


def test_a_column_added_with_a_default_re_records_the_rows_it_changed(db: Path) -> None:
    _fill(db)
    _attacker(db, "ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'call'",
              "ALTER TABLE runs ADD COLUMN note_added TEXT")  # nullable: no row changes
    with AuditStore(db) as store:
        store.start_run("after", {})
    conn = sqlite3.connect(db)
    notes = [n for (n,) in conn.execute("SELECT note FROM audit_chain WHERE op = 'note' ORDER BY seq")]
    assert any("columns of approvals changed (added: kind" in n for n in notes), notes
    migrated = dict(conn.execute("SELECT tbl, count(*) FROM audit_chain WHERE op = 'migrate' GROUP BY tbl"))
    assert migrated == {"approvals": 1}
    assert verify(db).ok


# ---- export ----------------------------------------------------------------------------------------------------


def test_an_export_of_one_client_holds_none_of_another(db: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    lines = [json.loads(line) for line in export_lines(db, client="ci")]
    assert lines and {e["run_id"] for e in lines} == {"run-ci"}
    assert "run-ops" not in json.dumps(lines) and "ops secret-free output" not in json.dumps(lines)
    everything = [json.loads(line) for line in export_lines(db)]
    assert {e["run_id"] for e in everything} == {None, "run-ci", "run-ops"}
    code, out = _cli(capsys, "audit", "export", "--client", "ops", "--audit-db", str(db))
    assert code == 0
    assert {json.loads(line)["run_id"] for line in out.splitlines()} == {"run-ops"}


def test_an_export_carries_the_hashes_and_the_records_they_cover(db: Path) -> None:
    _fill(db)
    entries = [json.loads(line) for line in export_lines(db)]
    prev = GENESIS
    for entry in entries:
        fields = [entry[k] for k in ("seq", "ts", "table", "key", "op", "run_id", "actor", "digest", "note")]
        assert entry["prev"] == prev and entry["hash"] == entry_hash(*fields, prev)
        prev = entry["hash"]
        if "record" in entry:
            assert hashlib.sha256(content_json(entry["record"]).encode()).hexdigest() == entry["digest"]
    with_record = {(e["table"], e["key"]) for e in entries if "record" in e}
    assert len(with_record) == sum(1 for e in entries if "record" in e)  # the latest entry of each row only
    assert prev == str(verify(db).head).split(":")[1]


def test_export_since_keeps_the_later_entries(db: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _fill(db)
    cut = time.time()
    with AuditStore(db) as store:
        store.start_run("later", {"client": "ci"})
    later = [json.loads(line) for line in export_lines(db, since=cut)]
    assert [e["key"] for e in later] == ['["later"]']
    out_file = tmp_path / "export.jsonl"
    code, _ = _cli(capsys, "audit", "export", "--since", "1970-01-01T00:00:00Z", "--audit-db", str(db),
                   "-o", str(out_file))
    assert code == 0 and len(out_file.read_text().splitlines()) == len(list(export_lines(db)))
    assert out_file.stat().st_mode & 0o777 == 0o600
    assert parse_since("2026-12-06") == parse_since("2026-12-06T00:00:00Z")
    with pytest.raises(AuditError, match="ISO 8601"):
        parse_since("yesterday")


# ---- the head in /metrics --------------------------------------------------------------------------------


def test_the_head_is_a_metric(db: Path) -> None:
    with AuditStore(db) as store:
        store.start_run("r", {})
        metrics.watch_audit_chain(str(db), store)
        head = store.chain_head()
        text = metrics.exposition()[0].decode()
    assert f'callbox_audit_chain_seq{{db="{db}"}} {float(head.seq)}' in text
    assert f'callbox_audit_chain_head_info{{db="{db}",hash="{head.hash}",seq="{head.seq}"}} 1.0' in text


def test_the_head_is_logged_every_so_many_entries_and_by_a_server(db: Path, caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.audit import chain
    from harness.cli import serve

    monkeypatch.setattr(chain, "LOG_EVERY", 3)
    with caplog.at_level(logging.INFO, logger="callbox"), AuditStore(db) as store:
        for n in range(4):
            store.start_run(f"r{n}", {})
        metrics.watch_audit_chain(str(db), store)
        serve._log_chain_heads("at stop")
        head = store.chain_head()
    passed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("audit chain head: ")]
    assert [m.split()[-1].split(":")[0] for m in passed] == ["3"]  # seq 1 (the note) .. 5: passes 3 once
    assert f"audit chain head at stop: {head} ({db})" in caplog.messages


def test_a_chain_removed_and_started_again_fails_verify(db: Path) -> None:
    _fill(db)
    _attacker(db, "DROP TABLE audit_chain", "DROP TABLE audit_chain_tables")
    AuditStore(db).close()  # the next process finds a marked store without its chain
    verdict = verify(db)
    assert [(p.kind, p.seq) for p in verdict.problems] == [("restarted", 1)]
    assert "this store had a chain and it was removed outside callbox" in verdict.problems[0].text


def test_the_chain_table_dropped_alone_is_a_restart_too(db: Path) -> None:
    _fill(db)
    _attacker(db, "DROP TABLE audit_chain")
    AuditStore(db).close()
    assert [p.kind for p in verify(db).problems] == ["restarted"]
