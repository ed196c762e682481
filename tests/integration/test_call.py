"""`callbox call` and approvals end to end: real engine, real audit store, separate processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker


@pytest.fixture
def audit_env(tmp_path: Path) -> dict[str, str]:
    return {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}


def _policy(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(body))
    return path


def _shared_dir(tmp_path: Path) -> Path:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 1000, 1000) if os.geteuid() == 0 else None
    return shared


def test_call_shell_end_to_end_in_each_format(engine, audit_env):
    expected_keys = {
        "openai": {"type", "call_id", "output"},
        "chat": {"role", "tool_call_id", "content"},
        "anthropic": {"type", "tool_use_id", "content", "is_error"},
        "mcp": {"content", "structuredContent", "isError"},
    }

    def call(fmt: str) -> Any:
        return callbox("call", "shell", '{"command": "echo from-the-sandbox; id -u"}', "--call-id", f"c-{fmt}",
                       "--format", fmt, "--image", IMAGE, env=audit_env)

    with ThreadPoolExecutor(len(expected_keys)) as pool:  # four processes, four sandboxes, at once
        done = dict(zip(expected_keys, pool.map(call, expected_keys), strict=True))
    for fmt, keys in expected_keys.items():
        proc = done[fmt]
        assert proc.returncode == 0, proc.stderr
        item = json.loads(proc.stdout)
        assert set(item) == keys
        text = json.dumps(item)
        assert "from-the-sandbox" in text and "1000" in text
        assert "Exit code: 0" in text


def test_nonzero_exit_is_an_error_result(engine, audit_env):
    proc = callbox("call", "shell", '{"command": "echo oops >&2; exit 4"}', "--format", "anthropic",
                   "--image", IMAGE, env=audit_env)
    assert proc.returncode == 1
    item = json.loads(proc.stdout)
    assert item["is_error"] is True
    assert "Exit code: 4" in item["content"] and "oops" in item["content"]


def _containers_created_by(engine, pid: int, since: float) -> list[str]:  # type: ignore[no-untyped-def]
    events = engine.client.api.events(since=int(since) - 1, until=int(time.time()) + 1, decode=True,
                                      filters={"type": "container", "event": "create"})
    return [e["id"] for e in events
            if f"/{pid}/" in e.get("Actor", {}).get("Attributes", {}).get("callbox.owner", "")]


def test_a_denied_call_starts_no_container(engine, audit_env, tmp_path):
    policy = _policy(tmp_path, """
        [[tools.shell.rules]]
        action = "deny"
        command = "*rm -rf*"
        reason = "deleting trees is not allowed here"
    """)
    started = time.time()
    denied = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "call", "shell", '{"command": "rm -rf /workspace"}',
         "--policy", str(policy), "--format", "openai", "--image", IMAGE],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **audit_env},
    )
    stdout, _ = denied.communicate(timeout=120)
    assert denied.returncode == 1
    output = json.loads(stdout)["output"]
    assert "tools.shell.rules[0]" in output and "deleting trees is not allowed here" in output
    assert _containers_created_by(engine, denied.pid, started) == []
    # and the same harness does create one for an allowed call (so the check above can fail)
    allowed = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "call", "shell", '{"command": "true"}', "--policy", str(policy),
         "--image", IMAGE], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **audit_env},
    )
    allowed.communicate(timeout=120)
    assert len(_containers_created_by(engine, allowed.pid, started)) == 1


def test_ask_is_approved_from_another_process_then_runs_exactly_once(engine, audit_env, tmp_path):
    shared = _shared_dir(tmp_path)
    policy = _policy(tmp_path, """
        [tools.shell]
        decision = "ask"
    """)
    call = ["call", "shell", '{"command": "echo ran >> /data/side-effect"}', "--run-id", "run-ask",
            "--call-id", "c1", "--policy", str(policy), "--mount", f"{shared}:/data:rw", "--image", IMAGE]
    first = callbox(*call, env=audit_env)
    assert first.returncode == 3  # waiting for a person
    assert "approval_pending" in first.stdout.decode() or "pending as approval" in first.stdout.decode()
    approval_id = re.search(rb"pending approval (\S+)", first.stderr).group(1).decode()  # type: ignore[union-attr]
    assert not (shared / "side-effect").exists()

    listed = callbox("approvals", "list", "--json", env=audit_env)
    pending = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [p["id"] for p in pending] == [approval_id]
    assert callbox("approvals", "approve", approval_id, env=audit_env).returncode == 0

    second = callbox(*call, env=audit_env)
    assert second.returncode == 0, second.stdout
    assert (shared / "side-effect").read_text() == "ran\n"

    third = callbox(*call, env=audit_env)  # replay: the recorded result, no second run
    assert third.stdout == second.stdout
    assert (shared / "side-effect").read_text() == "ran\n"
    assert callbox("approvals", "approve", approval_id, env=audit_env).returncode == 5  # already resolved


def test_a_denied_approval_is_a_result_the_model_reads(engine, audit_env, tmp_path):
    policy = _policy(tmp_path, """
        [tools.shell]
        decision = "ask"
    """)
    call = ["call", "shell", '{"command": "echo hi"}', "--run-id", "run-deny", "--call-id", "c1",
            "--policy", str(policy), "--format", "anthropic", "--image", IMAGE]
    first = callbox(*call, env=audit_env)
    approval_id = re.search(rb"pending approval (\S+)", first.stderr).group(1).decode()  # type: ignore[union-attr]
    assert callbox("approvals", "deny", approval_id, "--reason", "not today", env=audit_env).returncode == 0
    second = callbox(*call, env=audit_env)
    item = json.loads(second.stdout)
    assert item["is_error"] is True
    assert "denied" in item["content"] and "not today" in item["content"]


def test_replaying_a_call_id_does_not_run_the_command_again(engine, audit_env, tmp_path):
    shared = _shared_dir(tmp_path)
    call = ["call", "shell", '{"command": "echo once >> /data/count"}', "--run-id", "run-replay",
            "--call-id", "same", "--mount", f"{shared}:/data:rw", "--image", IMAGE]
    first = callbox(*call, env=audit_env)
    assert first.returncode == 0, first.stderr
    for _ in range(2):
        again = callbox(*call, env=audit_env)
        assert again.stdout == first.stdout
    assert (shared / "count").read_text() == "once\n"
    other = callbox("call", "shell", '{"command": "echo different"}', "--run-id", "run-replay",
                    "--call-id", "same", "--image", IMAGE, env=audit_env)
    assert b"already used in this run for a different call" in other.stdout


def test_two_harness_processes_writing_the_audit_store_lose_nothing(engine, audit_env):
    script = textwrap.dedent("""
        import sys
        from harness.audit.store import AuditStore
        from harness.core.calls import ToolCall
        from harness.core.session import Session
        from harness.core.policy import load_policy
        from harness.tools import builtin_registry
        worker = sys.argv[1]
        with AuditStore() as audit:
            harness = Session(builtin_registry(), load_policy(None), audit, run_id=f"run-{worker}")
            for i in range(100):
                # invalid arguments: recorded like every call, and no sandbox is needed
                result = harness.call(ToolCall("shell", '{"command": 1}', f"c{i}"))
                assert result.is_error
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script, str(n)], env={**os.environ, **audit_env})
               for n in range(2)]
    assert [w.wait(120) for w in workers] == [0, 0]
    for n in range(2):
        audit = callbox("audit", "--run", f"run-{n}", "--json", env=audit_env)
        calls = json.loads(audit.stdout)
        assert sorted(c["call_id"] for c in calls) == sorted(f"c{i}" for i in range(100))


def _callbox_failed(proc: subprocess.CompletedProcess[bytes]) -> dict[str, object]:
    """Exit 125 with one `callbox:` line on stderr, and the result item still on stdout."""
    assert proc.returncode == 125, (proc.returncode, proc.stderr)
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("callbox: the sandbox is unavailable: "), proc.stderr
    assert b"Traceback" not in proc.stderr
    item: dict[str, object] = json.loads(proc.stdout)
    return item


@pytest.mark.parametrize("fmt", ["openai", "anthropic"])
def test_call_with_the_engine_unreachable_exits_125(audit_env, tmp_path, fmt):
    proc = callbox("call", "shell", '{"command": "ls"}', "--format", fmt,
                   env={**audit_env, "DOCKER_HOST": f"unix://{tmp_path}/no-such-docker.sock"})
    item = _callbox_failed(proc)
    assert "cannot reach the Docker engine" in proc.stderr.decode()
    assert "cannot reach the Docker engine" in json.dumps(item)


def test_call_with_a_missing_image_exits_125(engine, audit_env):
    proc = callbox("call", "shell", '{"command": "ls"}', "--image", "callbox-no-such-image:latest", env=audit_env)
    _callbox_failed(proc)
    assert b"callbox image build" in proc.stderr


def test_audit_of_a_mistyped_database_is_refused_and_call_creates_it(engine, tmp_path):
    db = tmp_path / "audit.sqlite3"
    typo = tmp_path / "audit.sqlite"
    state = tmp_path / "state"
    env = {"XDG_STATE_HOME": str(state), "CALLBOX_AUDIT_DB": ""}
    for argv in (["audit", "--audit-db", str(typo)], ["approvals", "list", "--audit-db", str(typo)],
                 ["audit", "--audit-db", "/mistyped/path.sqlite3"]):
        refused = callbox(*argv, env=env)
        assert refused.returncode == 4 and refused.stdout == b"", argv
        where = argv[-1]
        assert refused.stderr.decode().startswith(
            f"callbox: the audit database {where} does not exist; check the path, or leave --audit-db out for the "
            "default, $CALLBOX_AUDIT_DB, else $XDG_STATE_HOME/callbox/audit.sqlite3, else "
            f"~/.local/state/callbox/audit.sqlite3 (here {state}/callbox/audit.sqlite3)"), refused.stderr
    assert not typo.exists() and not os.path.exists("/mistyped")
    # A command that records creates it; then reading it works.
    ran = callbox("call", "shell", '{"command": "true"}', "--image", IMAGE, "--run-id", "run-typo",
                  "--audit-db", str(db), env=env)
    assert ran.returncode == 0, ran.stderr
    listed = callbox("audit", "--audit-db", str(db), env=env)
    assert listed.returncode == 0 and "run-typo" in listed.stdout.decode()
