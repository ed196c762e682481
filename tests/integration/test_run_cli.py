"""`callbox run` through the CLI: JSON events, exit codes, pause for approval and --resume."""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
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


# --------------------------------------------------------------------------- the terminal


def _merged(*args: str, env: dict[str, str], cwd: Path | None = None,
            timeout: float = 180) -> subprocess.CompletedProcess[bytes]:
    """The CLI with stdout and stderr in one pipe, unbuffered: the order a terminal shows."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli.main", *args], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1", **env}, cwd=cwd,
        timeout=timeout, check=False,
    )


def test_a_huge_output_is_shown_bounded_as_the_model_sees_it(engine, tmp_path):
    transcript = _transcript(tmp_path, [
        {"text": "counting", "tool_calls": [{"call_id": "c1", "name": "shell",
                                             "arguments": {"command": "seq 1 100000"}}]},
        {"text": "done"},
    ])
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    shown = callbox("run", str(transcript), "--image", IMAGE, env=env)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    numbers = [int(line) for line in lines if line.isdigit()]
    assert len(lines) < 7_000, len(lines)  # the model's 30,000 bytes, not 100,000 lines
    assert numbers[:3] == [1, 2, 3] and numbers[-2:] == [99_999, 100_000]
    assert numbers == sorted(set(numbers))  # head then tail, nothing shown twice
    markers = [line for line in lines if re.search(r"…\d+ chars truncated…", line)]
    assert len(markers) == 1, markers
    # exactly the model's view: its result text ends with what the terminal ends with
    record = json.loads(callbox("audit", "--run", _run_id(shown), "--json", env=env).stdout)
    model_text = record[0]["result_text"]
    tail = model_text[model_text.index("chars truncated…") + len("chars truncated…"):]
    assert "\n".join(lines).find(tail.rstrip("\n")) > 0


def _run_id(proc: subprocess.CompletedProcess[bytes]) -> str:
    found = re.search(r"audit record: run (\S+) in", proc.stdout.decode())
    assert found is not None, proc.stdout
    return found.group(1)


def test_a_loosened_default_is_said_once_before_the_run(engine, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    if os.geteuid() == 0:
        os.chown(project, 1000, 1000)
    transcript = _transcript(tmp_path, [
        {"text": "", "tool_calls": [{"call_id": f"c{n}", "name": "shell", "arguments": {"command": f"echo {n}"}}]}
        for n in range(3)
    ] + [{"text": "done"}])
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    warning = "callbox: this policy loosens a hardened default: read-write mount(s): /workspace/project"
    proc = _merged("run", str(transcript), "--image", IMAGE, "--mount", f"{project}:/workspace/project:rw",
                   env=env)
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.decode().splitlines()
    assert [line for line in lines if "loosens" in line] == [warning]
    assert lines.index(warning) < next(i for i, line in enumerate(lines) if "callbox run" in line)
    assert "DESIGN" not in proc.stdout.decode()
    # the same words from exec and call
    exec_proc = callbox("exec", "--image", IMAGE, "--mount", f"{project}:/workspace/project:rw", "--", "true")
    assert exec_proc.returncode == 0
    assert exec_proc.stderr.decode().splitlines() == [warning]
    call_proc = callbox("call", "shell", '{"command": "true"}', "--image", IMAGE,
                        "--mount", f"{project}:/workspace/project:rw", env=env)
    assert call_proc.returncode == 0, call_proc.stderr
    assert call_proc.stderr.decode().splitlines() == [warning]


# --------------------------------------------------------------------------- pause, resume, audit


ASK_POLICY = """
[[tools.shell.rules]]
action = "ask"
command = "*>> /data/log*"
reason = "appending to the shared log needs a person"
"""


def _paused(tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[bytes], str, str]:
    """A run paused for approval, started from tmp_path with relative paths; returns the
    process, the approval id and the printed resume command."""
    shared = tmp_path / "shared"
    shared.mkdir()
    if os.geteuid() == 0:
        os.chown(shared, 1000, 1000)
    (tmp_path / "my policy.toml").write_text(ASK_POLICY)
    _transcript(tmp_path, [
        {"text": "writing", "tool_calls": [
            {"call_id": "w1", "name": "shell", "arguments": {"command": "echo once >> /data/log"}}]},
        {"text": "written"},
    ])
    first = _merged("run", "transcript.jsonl", "--policy", "my policy.toml", "--audit-db", "audit.sqlite3",
                    "--image", IMAGE, "--mount", f"{shared}:/data:rw", env=env, cwd=tmp_path)
    assert first.returncode == 3, first.stdout
    text = first.stdout.decode()
    approval = re.search(r"callbox approvals approve (\w+)", text)
    assert approval is not None, text
    hint = [line.strip() for line in text.splitlines() if line.strip().startswith("callbox run ")]
    assert len(hint) == 1, text
    return first, approval.group(1), hint[0]


def test_the_printed_resume_command_resumes_the_run_verbatim(engine, tmp_path):
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "XDG_STATE_HOME": str(tmp_path / "x")}
    env_without_db = {k: v for k, v in os.environ.items() if k != "CALLBOX_AUDIT_DB"} | env
    _, approval, hint = _paused(tmp_path, env)
    assert shlex.split(hint)[:2] == ["callbox", "run"]
    assert "--audit-db" in hint and "--policy" in hint
    db = str(tmp_path / "audit.sqlite3")
    assert callbox("approvals", "--audit-db", db, "approve", approval).returncode == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    second = subprocess.run(["sh", "-c", hint], cwd=elsewhere, env=env_without_db, capture_output=True,
                            timeout=180, check=False)  # exactly as printed, from another directory
    assert second.returncode == 0, second.stdout + second.stderr
    assert "final" in second.stdout.decode()
    assert (tmp_path / "shared" / "log").read_text() == "once\n"


def test_audit_shows_a_persons_denial_and_its_reason(engine, tmp_path):
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "XDG_STATE_HOME": str(tmp_path / "x")}
    first, approval, hint = _paused(tmp_path, env)
    run_id = _run_id(first)
    db = str(tmp_path / "audit.sqlite3")
    denied = callbox("approvals", "--audit-db", db, "deny", approval, "--reason", "not on a Friday")
    assert denied.returncode == 0, denied.stderr
    second = subprocess.run(["sh", "-c", hint], cwd=tmp_path, env={**os.environ, **env}, capture_output=True,
                            timeout=180, check=False)
    assert second.returncode == 0, second.stdout + second.stderr
    table = callbox("audit", "--audit-db", db, "--run", run_id).stdout.decode()
    (row,) = [line for line in table.splitlines() if line.startswith("w1 ")]
    assert " deny " in row and " ask " not in row, table
    assert "denied by" in row and "not on a Friday" in row, table
    (call,) = json.loads(callbox("audit", "--audit-db", db, "--run", run_id, "--json").stdout)
    assert (call["decision"], call["state"], call["error_code"]) == ("deny", "done", "approval_denied")
    assert call["approval"]["state"] == "denied" and call["approval"]["resolution_reason"] == "not on a Friday"
    assert not (tmp_path / "shared" / "log").exists()


# --------------------------------------------------------------------------- usage and infrastructure


@pytest.mark.parametrize("options", [
    ["--max-turns", "0"], ["--max-turns", "-3"], ["--max-turns", "many"], ["--tool-choice", "sometimes"],
])
def test_bad_loop_options_are_one_line_usage_errors(tmp_path, options):
    transcript = _transcript(tmp_path, [{"text": "done"}])
    proc = callbox("run", str(transcript), *options, env={"CALLBOX_AUDIT_DB": str(tmp_path / "a.db")})
    assert proc.returncode == 2, proc.stderr
    stderr = proc.stderr.decode()
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("callbox: "), stderr
    assert options[0] in stderr and "Traceback" not in stderr and "pydantic" not in stderr
    assert not (tmp_path / "a.db").exists()  # refused before any run is recorded


def test_with_no_engine_the_run_ends_at_the_first_call_with_sandbox_unavailable(tmp_path):
    closed = tmp_path / "docker.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(closed))
    listener.close()  # the file stays; connecting is refused
    marker = tmp_path / "ran-on-the-host"
    transcript = _transcript(tmp_path, [
        {"text": "t1", "tool_calls": [
            {"call_id": "c1", "name": "shell", "arguments": {"command": f"touch {marker}"}},
            {"call_id": "c2", "name": "write_file", "arguments": {"path": "/workspace/a.txt", "content": "x"}}]},
        {"text": "t2", "tool_calls": [{"call_id": "c3", "name": "bash", "arguments": {"command": "true"}}]},
        {"text": "giving up"},
    ])
    env = {"DOCKER_HOST": f"unix://{closed}", "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = callbox("run", str(transcript), "--json", env=env)
    assert proc.returncode == 125, proc.stdout + proc.stderr
    events = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    results = [e for e in events if e["event"] == "tool_result"]
    assert [(r["call_id"], r["result"]["error"]) for r in results] == [("c1", "sandbox_unavailable")]
    ended = events[-1]
    assert (ended["event"], ended["reason"], ended["turns"]) == ("run_ended", "error:sandbox_unavailable", 1)
    assert f"cannot reach the Docker engine at unix://{closed}" in ended["message"]
    assert "Traceback" not in proc.stderr.decode()
    (run,) = json.loads(callbox("audit", "--json", env=env).stdout)
    assert run["end_reason"] == "error:sandbox_unavailable"
    assert not marker.exists()
    text = callbox("run", str(transcript), env=env)  # the same on the terminal
    assert text.returncode == 125
    assert "error:sandbox_unavailable" in text.stdout.decode()
