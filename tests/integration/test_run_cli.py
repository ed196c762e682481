"""`callbox run` through the CLI: JSON events, exit codes, pause for approval and --resume."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker


def _transcript(tmp_path: Path, turns: list[dict]) -> Path:  # type: ignore[type-arg]
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def test_run_json_events_and_final_exit_code(engine, tmp_path):
    transcript = _transcript(tmp_path, [
        {"text": "checking", "tool_calls": [{"call_id": "c1", "name": "shell", "arguments": {"command": "echo hi"}}]},
        {"text": "done: it printed hi"},
    ])
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = callbox("run", str(transcript), "--json", "--image", IMAGE, env=env)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert kinds[0] == "run_started" and kinds[-1] == "run_ended"
    assert "tool_call_started" in kinds and "tool_result" in kinds
    result = next(e for e in events if e["event"] == "tool_result")
    assert result["call_id"] == "c1" and "hi" in json.dumps(result)
    assert events[-1]["reason"] == "final" and events[-1]["final_text"] == "done: it printed hi"


def test_run_usage_errors_exit_2(tmp_path):
    assert callbox("run").returncode == 2
    assert callbox("run", "--model", "openai:x").returncode == 2
    missing = callbox("run", "--model", "nosuch:model", "--task", "t")
    assert missing.returncode == 2 and b"Traceback" not in missing.stderr


def test_run_pauses_for_approval_and_resumes_in_a_new_process(engine, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    if os.geteuid() == 0:
        os.chown(shared, 1000, 1000)
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent("""
        [[tools.shell.rules]]
        action = "ask"
        command = "*>> /data/log*"
    """))
    transcript = _transcript(tmp_path, [
        {"text": "writing", "tool_calls": [
            {"call_id": "w1", "name": "shell", "arguments": {"command": "echo once >> /data/log"}}]},
        {"text": "written"},
    ])
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    common = ["--policy", str(policy), "--json", "--image", IMAGE]
    first = callbox("run", str(transcript), *common, "--mount", f"{shared}:/data:rw", env=env)
    assert first.returncode == 3, first.stdout
    ended = json.loads(first.stdout.splitlines()[-1])
    assert ended["reason"] == "approval_pending"
    run_id = ended["run_id"]
    assert not (shared / "log").exists()
    (approval,) = ended["pending_approvals"]
    assert callbox("approvals", "approve", approval, env=env).returncode == 0
    second = callbox("run", str(transcript), "--resume", run_id, *common, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    assert json.loads(second.stdout.splitlines()[-1])["reason"] == "final"
    assert (shared / "log").read_text() == "once\n"
