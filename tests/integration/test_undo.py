"""Undo end to end: `callbox run` with the scripted model and ``[checkpoints] mode = "changes"`` changes
files in a read-write mount over several calls (write_file, shell, apply_patch), then `callbox diff`
shows each call's changes and `callbox revert --to` puts the mount back byte for byte, deleted files,
modes and symlinks included, checked against a copy taken before the run. One run, one sandbox: its
last call waits (on a file the test creates) while a revert is tried and refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox
from tests.support.file_trees import listing, make_project

pytestmark = pytest.mark.docker

WAIT_S = 120.0


PATCH = "*** Begin Patch\n*** Update File: /data/new.txt\n@@\n-hello\n+hello, patched\n*** End Patch\n"


def test_diff_and_revert_of_a_run_in_a_read_write_mount(engine: object, tmp_path: Path) -> None:
    project = tmp_path / "project"
    make_project(project, binary=True)
    before = listing(project)
    policy = tmp_path / "policy.toml"
    policy.write_text('[checkpoints]\nmode = "changes"\n')
    shell_edit = ("sed -i 's/two/TWO/' /data/a.txt && rm -r /data/sub && chmod 600 /data/tool.sh"
                  " && ln -sfn new.txt /data/link && printf '\\000\\001' > /data/blob.bin"
                  " && echo scratch > /workspace/scratch.txt")
    waiting = "touch /data/started && while [ ! -e /data/go ]; do sleep 0.05; done"
    turns = [
        {"tool_calls": [{"call_id": "c1", "name": "write_file",
                         "arguments": {"path": "/data/new.txt", "content": "hello\n"}}]},
        {"tool_calls": [{"call_id": "c2", "name": "shell", "arguments": {"command": shell_edit}}]},
        {"tool_calls": [{"call_id": "c3", "name": "read_file", "arguments": {"path": "/data/a.txt"}}]},
        {"tool_calls": [{"call_id": "c4", "name": "apply_patch", "arguments": {"patch": PATCH}}]},
        {"tool_calls": [{"call_id": "c5", "name": "shell", "arguments": {"command": waiting}}]},
        {"text": "done"},
    ]
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(t) + "\n" for t in turns))
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "run", str(transcript), "--json", "--image", IMAGE,
         "--policy", str(policy), "--mount", f"{project}:/data:rw"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        run_id = json.loads(proc.stdout.readline())["run_id"] if proc.stdout else ""
        deadline = time.monotonic() + WAIT_S
        while not (project / "started").exists():  # c5 runs: its command made the file
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its last call"
            time.sleep(0.05)
        refused = callbox("revert", run_id, "--to", "c1", env=env)
        assert refused.returncode != 0 and b"call c5 of run" in refused.stderr and b"is running" in refused.stderr
        (project / "go").touch()
        out, err = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err.decode()
    results = {e["call_id"]: e for e in map(json.loads, out.splitlines()) if e.get("event") == "tool_result"}
    assert set(results) == {"c1", "c2", "c3", "c4", "c5"}
    assert all(not results[c]["result"]["is_error"] for c in results), results

    diff = callbox("diff", run_id, env=env)
    assert diff.returncode == 0, diff.stderr
    text = diff.stdout.decode()
    assert "# call c1 (write_file): 1 created, 0 changed, 0 removed" in text and "+hello" in text
    assert "-two" in text and "+TWO" in text and "removed /data/sub/b.txt" in text and "-bee" in text
    assert "mode /data/tool.sh: 755 -> 600" in text and "symlink /data/link -> new.txt (was a.txt)" in text
    assert "changed /data/blob.bin: binary, 256 bytes sha256" in text and "-> 2 bytes sha256" in text
    assert "# call c3" not in text  # read_file is read-only: no record
    assert "-hello\n+hello, patched" in callbox("diff", run_id, "--call", "c4", env=env).stdout.decode()
    none = callbox("diff", run_id, "--call", "c3", env=env)
    assert none.returncode != 0 and b"no change record" in none.stderr

    lost = callbox("revert", run_id, "--to", "c1", env=env)
    assert lost.returncode != 0 and b"/workspace" in lost.stderr and b"--mounts-only" in lost.stderr
    assert (project / "new.txt").exists()  # refused: nothing touched
    reverted = callbox("revert", run_id, "--to", "c1", "--mounts-only", "--json", env=env)
    assert reverted.returncode == 0, reverted.stderr
    report = json.loads(reverted.stdout)
    assert "/data/new.txt" in report["removed"] and "/data/sub/b.txt" in report["recreated"]
    assert "/workspace: only the run's sandbox holds it" in report["not_restored"]
    assert all(line.endswith("only the run's sandbox holds it") for line in report["not_restored"])
    assert listing(project) == before
