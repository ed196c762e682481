"""Acceptance checks on the real engine, through ``callbox run``: a real ``pytest`` in the run's
sandbox rejects a final answer (its output reaches the model), the model fixes the file and
the run ends ``final:accepted`` (checks from ``--config``); a check the policy denies; checks
from ``--accept``, a pause for approval and a resume in another process that keeps the
rejection count until the run ends ``rejected:acceptance``.

The sandbox image has no pytest: the host's own (the test environment's, same Python 3.11)
is copied once per module into a directory mounted read-only at ``/srv/pytest-lib`` and put
on ``PYTHONPATH``; the project under test is a small one, mounted read-write.
"""

from __future__ import annotations

import json
import os
import shutil
import textwrap
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

LIB = "/srv/pytest-lib"
PROJECT = "/workspace/project"
CHECK = "python3 -m pytest -q -p no:cacheprovider"
BROKEN = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"


@pytest.fixture(scope="module")
def pytest_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """pytest and what it imports, from this environment, for the sandbox's python3."""
    import _pytest
    import iniconfig
    import packaging
    import pluggy
    import py
    import pygments

    lib = tmp_path_factory.mktemp("pytest-lib")
    for module in (pytest, _pytest, pluggy, iniconfig, packaging, pygments):
        source = Path(module.__file__ or "").parent
        shutil.copytree(source, lib / source.name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(py.__file__ or "", lib / "py.py")
    for path in (lib, *lib.rglob("*")):
        path.chmod(0o755 if path.is_dir() else 0o644)
    return lib


def _project(tmp_path: Path) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "calc.py").write_text(BROKEN)
    (project / "test_calc.py").write_text("from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n")
    if os.geteuid() == 0:  # the tool user owns what it writes
        for path in (project, *project.iterdir()):
            os.chown(path, 1000, 1000)
    return project


def _transcript(tmp_path: Path, turns: list[dict[str, Any]]) -> Path:
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def _sandbox(lib: Path, project: Path) -> list[str]:
    return ["--image", IMAGE, "--mount", f"{lib}:{LIB}:ro", "--mount", f"{project}:{PROJECT}:rw",
            "--env", f"PYTHONPATH={LIB}"]


def _events(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


FIX_TURNS: list[dict[str, Any]] = [
    {"text": "add() is fine, done."},
    {"text": "The check failed: add subtracts. Fixing it.", "tool_calls": [
        {"call_id": "fix", "name": "write_file", "arguments": {"path": f"{PROJECT}/calc.py", "content": FIXED}}]},
    {"text": "Fixed: add() adds."},
]


def test_a_rejected_answer_is_fixed_and_accepted_with_checks_from_config(engine, tmp_path, pytest_lib) -> None:
    project = _project(tmp_path)
    config = tmp_path / "run.toml"
    config.write_text(textwrap.dedent(f"""
        max_rejections = 1

        [[acceptance]]
        command = "{CHECK}"
        workdir = "{PROJECT}"
        timeout_s = 60
    """))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    transcript = _transcript(tmp_path, FIX_TURNS)
    proc = callbox("run", str(transcript), "--config", str(config), "--json", *_sandbox(pytest_lib, project), env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = _events(proc.stdout)
    checks = [e for e in events if e["event"] == "acceptance_check_finished"]
    assert [(c["passed"], c["exit_code"]) for c in checks] == [(False, 1), (True, 0)]
    (rejected,) = [e for e in events if e["event"] == "answer_rejected"]
    # what the model is told: the check, its exit code and pytest's own output
    assert f"acceptance check 1 (`{CHECK}` in {PROJECT}), 1 of 1, exited with 1, expected 0" in rejected["message"]
    assert "assert -1 == 5" in rejected["message"] and "1 failed" in rejected["message"]
    ended = events[-1]
    assert (ended["reason"], ended["rejections"], ended["turns"], ended["tool_calls"]) == ("final:accepted", 1, 3, 1)
    assert (project / "calc.py").read_text() == FIXED
    # the run's record: the checks are the harness's own calls, and each round is kept
    with AuditStore(tmp_path / "audit.sqlite3") as audit:  # what `callbox audit --run RUN --json` prints
        calls = audit.calls_for_run(ended["run_id"])
    assert [(c["call_id"].split("-")[0], c["tool"], c["origin"], c["exit_code"]) for c in calls] == [
        ("accept", "shell", "acceptance", 1), ("fix", "write_file", None, None), ("accept", "shell", "acceptance", 0)]
    table = callbox("audit", "--run", ended["run_id"], env=env).stdout.decode()
    assert "acceptance: final:accepted after 1 rejected answer" in table
    assert f"turn 1: ✗ check 1 `{CHECK}` exit 1" in table and f"turn 3: ✓ check 1 `{CHECK}` exit 0" in table


def test_a_check_the_policy_denies_ends_the_run_before_the_model_is_asked(tmp_path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[[tools.shell.rules]]\naction = "deny"\ncommand = "python3 *"\nreason = "no python"\n')
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    transcript = _transcript(tmp_path, [{"text": "done"}])
    proc = callbox("run", str(transcript), "--accept", CHECK, "--policy", str(policy), "--image", IMAGE, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert (f"acceptance check 1 (`{CHECK}`) cannot run: the policy denies it (tools.shell.rules[0]"
            in proc.stderr.decode())
    runs = json.loads(callbox("audit", "--json", env=env).stdout)
    assert [(r["end_reason"], r["calls"]) for r in runs] == [("error:config", 0)]


def test_resume_after_an_approval_keeps_the_rejection_count(engine, tmp_path, pytest_lib) -> None:
    project = _project(tmp_path)
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.write_file]\ndecision = "ask"\n')
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    transcript = _transcript(tmp_path, [
        {"text": "done"},
        {"text": "trying again", "tool_calls": [
            {"call_id": "w1", "name": "write_file", "arguments": {"path": f"{PROJECT}/notes.txt", "content": "x"}}]},
        {"text": "done again"},
    ])
    common = ["--policy", str(policy), "--json", "--accept", CHECK, "--accept-workdir", PROJECT,
              "--max-rejections", "1"]
    first = callbox("run", str(transcript), *common, *_sandbox(pytest_lib, project), env=env)
    assert first.returncode == 3, first.stdout + first.stderr
    paused = _events(first.stdout)[-1]
    assert (paused["reason"], paused["rejections"]) == ("approval_pending", 1)
    (approval,) = paused["pending_approvals"]
    assert callbox("approvals", "approve", approval, env=env).returncode == 0
    # resumed in a new process, on the terminal this time
    second = callbox("run", str(transcript), "--resume", paused["run_id"], "--policy", str(policy), env=env)
    out = second.stdout.decode()
    assert second.returncode == 1, out + second.stderr.decode()
    assert (project / "notes.txt").read_text() == "x"
    assert f"acceptance check 1/1: {CHECK} (in {PROJECT})" in out
    assert "✗ failed (exit 1, expected 0)" in out and "assert -1 == 5" in out
    # the second rejected answer is one past max_rejections = 1: the count went on from the pause
    assert "answer rejected (rejection 2, max_rejections 1): the run ends rejected:acceptance" in out
    assert "rejected:acceptance" in out and "rejected answers  2" in out
