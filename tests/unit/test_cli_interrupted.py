"""What the CLI says of interrupted work, without an engine: `audit --run` shows an
interrupted call as such with a line in words; `run --resume` tells an unknown run from one
that never paused; `exec --json` stopped by a signal still prints its object."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.audit.interruptions import PROCESS_STOPPED, interrupted_result
from harness.audit.store import AuditStore
from harness.cli import main as cli
from harness.cli.foreground import print_interrupted
from harness.core.calls import Action, Decision, ToolResult
from harness.engine.exec_result import OutputStreams
from sandbox.v1 import process_pb2

ALLOW = Decision(Action.ALLOW, "tools.shell allow", "")


def _finish(audit: AuditStore, call_id: str, result: ToolResult) -> None:
    audit.finish_call("r", call_id, result, decision=ALLOW, exit_code=None, duration_ms=3.0, bytes_out=0,
                      truncated=False)


def test_audit_shows_an_interrupted_call_as_interrupted_and_says_what_happened(tmp_path, capsys) -> None:
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as audit:
        for call_id in ("ok", "x1"):
            assert audit.claim_and_start("r", call_id, "shell", {"command": "sleep 30"}, lambda _n: ALLOW).running
        _finish(audit, "ok", ToolResult("ok", "Exit code: 0"))
        _finish(audit, "x1", interrupted_result("x1", cause=PROCESS_STOPPED, command_started=None,
                                                owner="box/41/1.00", noticed_by="box/41/1.00", signal="SIGINT"))
    assert cli.main(["audit", "--audit-db", str(db), "--run", "r"]) == 0
    header, ok, x1, said = capsys.readouterr().out.splitlines()
    assert ok.split()[:4] == ["ok", "shell", "allow", "done"]
    assert x1.split()[:4] == ["x1", "shell", "allow", "interrupted"]
    assert header.index("STATE") == ok.index("done") == x1.index("interrupted")
    assert header.index("EXIT") > x1.index("interrupted") + len("interrupted")
    assert said == ("x1 was interrupted: its harness process (pid 41 on box) stopped on SIGINT; whether its "
                    "command ran is unknown; it is not run again under this call_id")
    assert cli.main(["audit", "--audit-db", str(db), "--run", "r", "--json"]) == 0
    calls = {c["call_id"]: c for c in json.loads(capsys.readouterr().out)}
    assert calls["ok"]["interrupted"] is None
    assert calls["x1"]["interrupted"] == {"command_started": None, "interrupted": "process_stopped",
                                          "signal": "SIGINT", "owner": "box/41/1.00", "noticed_by": "box/41/1.00"}


def _resume_error(capsys: pytest.CaptureFixture[str], db: Path, run_id: str, status: int) -> str:
    assert cli.main(["run", "--resume", run_id, "--audit-db", str(db)]) == status
    captured = capsys.readouterr()
    (line,) = captured.err.splitlines()
    return line


def test_resuming_an_unknown_run_names_the_store_not_a_pause(tmp_path, capsys) -> None:
    db = tmp_path / "audit.sqlite3"
    line = _resume_error(capsys, db, "no-such-run", 4)
    assert line.startswith(f"callbox: no run no-such-run in the audit store {db} ")
    assert "never paused" not in line


def test_resuming_a_run_that_never_paused_says_so_and_how_it_ended(tmp_path, capsys) -> None:
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as audit:
        audit.start_run("done-run")
        audit.end_run("done-run", "final")
        audit.start_run("open-run")
    assert _resume_error(capsys, db, "done-run", 5) == ("callbox: run done-run never paused for an approval (it ended: "
                                                     "final): there is nothing to resume")
    assert "(it has not ended)" in _resume_error(capsys, db, "open-run", 5)


def test_exec_json_stopped_by_a_signal_prints_what_it_had(capsys) -> None:
    streams = OutputStreams()
    streams.add(process_pb2.Output(stdout=b"partial\n"))
    print_interrupted(SystemExit(143), streams, began=None)
    printed = json.loads(capsys.readouterr().out)
    assert printed["interrupted"] is True and printed["exit_code"] == 143 and printed["signal"] == 15
    assert printed["stdout"] == "partial\n" and "error" not in printed
    print_interrupted(KeyboardInterrupt())  # before the command started
    printed = json.loads(capsys.readouterr().out)
    assert printed["exit_code"] == 130 and printed["signal"] == 2 and printed["stdout"] == ""
    assert printed["error"] == "interrupted (SIGINT) before the command started"
