"""`callbox run --config` with two scripted agents on the real engine: the second agent's
tool call runs in the sandbox the first one used, the audit shows the handoff, and a run
that pauses for an approval after the handoff resumes, in a new process, under the second
agent."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

PLAN = "echo the plan ran\n"


def _write(path: Path, *turns: dict[str, Any]) -> None:
    path.write_text("".join(json.dumps(turn) + "\n" for turn in turns))


def _team(tmp_path: Path, coder_turns: list[dict[str, Any]]) -> Path:
    """A run config of two agents in ``tmp_path``, each with its own transcript beside it."""
    _write(tmp_path / "planner.jsonl",
           {"tool_calls": [{"name": "write_file", "arguments": {"path": "/workspace/plan.sh", "content": PLAN}}]},
           {"text": "over to the coder", "tool_calls": [{"name": "transfer_to_coder"}]})
    _write(tmp_path / "coder.jsonl", *coder_turns)
    config = tmp_path / "run.toml"
    config.write_text(textwrap.dedent("""
        [[agents]]
        name = "planner"
        instructions = "Write the plan, then hand off."
        model = "scripted:planner.jsonl"
        tools = ["write_file"]
        handoffs = ["coder"]

        [[agents]]
        name = "coder"
        instructions = "Run the plan."
        model = "scripted:coder.jsonl"
        tools = ["shell"]
    """))
    return config


def _events(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.decode().splitlines()]


def test_the_second_agent_works_in_the_first_ones_sandbox_and_the_audit_shows_the_handoff(engine, tmp_path):
    config = _team(tmp_path, [
        {"tool_calls": [{"name": "shell", "arguments": {"command": "sh /workspace/plan.sh; cat /workspace/plan.sh"}}]},
        {"text": "done"},
    ])
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = callbox("run", "--config", str(config), "--json", "--image", IMAGE, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = _events(proc.stdout)
    assert (events[0]["event"], events[0]["agent"]) == ("run_started", "planner")
    (handoff,) = [e for e in events if e["event"] == "handoff"]
    assert (handoff["from_agent"], handoff["to_agent"], handoff["turn"]) == ("planner", "coder", 2)
    assert handoff["model"] == f"scripted:{tmp_path / 'coder.jsonl'}"
    offered = [e["tools"] for e in events if e["event"] == "turn_started"]
    assert offered == [["write_file", "transfer_to_coder"]] * 2 + [["shell"]] * 2
    (ran,) = [e["result"] for e in events if e["event"] == "tool_result" and e["name"] == "shell"]
    assert ran["text"].endswith("the plan ran\n" + PLAN), ran  # the file the planner wrote, in the same sandbox
    assert events[-1]["reason"] == "final"

    run_id = events[-1]["run_id"]
    calls = json.loads(callbox("audit", "--run", run_id, "--json", env=env).stdout)
    assert [(c["call_id"], c["tool"], c["decision"], c["rule"]) for c in calls] == [
        ("call_planner_1_1", "write_file", "allow", "default_decision"),
        ("call_planner_2_1", "transfer_to_coder", "allow", "handoff: planner -> coder"),
        ("call_coder_1_1", "shell", "allow", "default_decision"),
    ]
    table = callbox("audit", "--run", run_id, env=env).stdout.decode()
    assert "transfer_to_coder" in table and "handoff: planner -> coder" in table


def test_a_run_paused_after_a_handoff_resumes_under_the_second_agent(engine, tmp_path):
    config = _team(tmp_path, [
        {"tool_calls": [{"call_id": "ask1", "name": "shell", "arguments": {"command": "sh /workspace/plan.sh"}}]},
        {"text": "the coder finished"},
    ])
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent("""
        [[tools.shell.rules]]
        action = "ask"
        command = "sh /workspace/plan.sh"
    """))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    first = callbox("run", "--config", str(config), "--policy", str(policy), "--json", "--image", IMAGE, env=env)
    assert first.returncode == 3, first.stdout + first.stderr
    paused = _events(first.stdout)[-1]
    try:
        assert paused["reason"] == "approval_pending"
        (approval,) = paused["pending_approvals"]
        assert callbox("approvals", "approve", approval, env=env).returncode == 0

        words = shlex.split(paused["resume_command"])
        assert words[:2] == ["callbox", "run"] and "--resume" in words and "--config" not in words
        second = callbox(*words[1:], env=env)  # exactly as printed: no transcript, the agents are in the checkpoint
        assert second.returncode == 0, second.stdout + second.stderr
        events = _events(second.stdout)
        started = events[0]
        assert (started["resumed"], started["agent"], started["model"]) == (True, "coder",
                                                                             f"scripted:{tmp_path / 'coder.jsonl'}")
        (ran,) = [e for e in events if e["event"] == "tool_result"]
        assert (ran["call_id"], ran["decision"]) == ("ask1", "approved")
        assert ran["result"]["text"].endswith("Output:\nthe plan ran\n"), ran  # the plan from before the pause
        assert [e["event"] for e in events].count("model_turn") == 1  # the coder's second turn, not the planner's
        assert (events[-1]["reason"], events[-1]["final_text"]) == ("final", "the coder finished")
    finally:  # a run that did not end keeps its sandbox until its expiry: remove it now
        _remove_kept_sandbox(tmp_path / "audit.sqlite3", paused["run_id"])


def _remove_kept_sandbox(audit_path: Path, run_id: str) -> None:
    from harness.audit.store import AuditStore
    from harness.loop import checkpoint

    with AuditStore(audit_path) as audit:
        saved = checkpoint.load(audit, run_id)
        ended = audit.get_run(run_id).end_reason not in (None, "approval_pending")
    if saved is not None and saved.sandbox is not None and not ended:
        callbox("sandbox", "rm", saved.sandbox.id, "--audit-db", str(audit_path))
