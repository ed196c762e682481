"""A call that found no engine runs when it is sent again once the engine is back.

``sandbox_unavailable`` before the command started is a failure that says a retry is safe,
so the same call_id with the same arguments must not be answered with that old failure:
the retry runs the command (once), and later replays return the recorded success. Every
step goes through the real CLI in a child process; the outage is DOCKER_HOST at a unix
socket nobody listens on. A host directory mounted read-write counts how often the command
really ran.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import IMAGE
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

COMMAND = "echo hi; echo ran >> /data/marker"


@pytest.fixture
def closed_socket() -> Iterator[str]:
    """A unix socket file that refuses connections (bound, then closed: no listener)."""
    directory = Path(f"/tmp/cbx-{uuid.uuid4().hex[:8]}")  # short: sun_path is 108 bytes
    directory.mkdir()
    path = directory / "docker.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.close()
    try:
        yield f"unix://{path}"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    directory = tmp_path / "shared"
    directory.mkdir()
    if os.geteuid() == 0:
        os.chown(directory, 1000, 1000)
    return directory


def _call_args(shared: Path, run_id: str, call_id: str) -> list[str]:
    return ["call", "shell", json.dumps({"command": COMMAND}), "--run-id", run_id, "--call-id", call_id,
            "--mount", f"{shared}:/data:rw", "--image", IMAGE]


def _record(env: dict[str, str], run_id: str, call_id: str) -> dict[str, object]:
    proc = callbox("audit", "--run", run_id, "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    (record,) = [c for c in json.loads(proc.stdout) if c["call_id"] == call_id]
    assert isinstance(record, dict)
    return record


def _outage(shared: Path, env: dict[str, str], docker_host: str, run_id: str) -> None:
    """The first attempt, while no engine answers: exit 125, sandbox_unavailable, nothing ran."""
    proc = callbox(*_call_args(shared, run_id, "c1"), env={**env, "DOCKER_HOST": docker_host})
    assert proc.returncode == 125, (proc.stdout, proc.stderr)
    item = json.loads(proc.stdout)
    assert item["call_id"] == "c1"
    assert item["output"].startswith("the sandbox is unavailable: cannot reach the Docker engine"), item
    record = _record(env, run_id, "c1")
    assert (record["state"], record["error_code"], record["attempts"]) == ("done", "sandbox_unavailable", 1)
    assert not (shared / "marker").exists()


def test_a_call_that_found_no_engine_runs_once_the_engine_is_back(engine, tmp_path, shared, closed_socket):
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    _outage(shared, env, closed_socket, "run-outage")

    second = callbox(*_call_args(shared, "run-outage", "c1"), env=env)
    assert second.returncode == 0, (second.stdout, second.stderr)
    item = json.loads(second.stdout)
    assert item["call_id"] == "c1"
    assert "Exit code: 0" in item["output"] and item["output"].endswith("Output:\nhi\n"), item
    assert (shared / "marker").read_text() == "ran\n"

    third = callbox(*_call_args(shared, "run-outage", "c1"), env=env)
    assert third.returncode == 0, third.stderr
    assert third.stdout == second.stdout  # the recorded success, not a new run
    assert (shared / "marker").read_text() == "ran\n"

    record = _record(env, "run-outage", "c1")
    assert (record["state"], record["error_code"], record["exit_code"]) == ("done", None, 0)
    assert record["attempts"] == 2
    earlier = record["earlier_attempts"]
    assert isinstance(earlier, list) and len(earlier) == 1
    assert earlier[0]["attempt"] == 1 and earlier[0]["error_code"] == "sandbox_unavailable"
    assert "cannot reach the Docker engine" in earlier[0]["result_text"]


def test_two_retries_at_the_same_time_run_the_command_once(engine, tmp_path, shared, closed_socket):
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    _outage(shared, env, closed_socket, "run-race")

    argv = [sys.executable, "-m", "harness.cli.main", *_call_args(shared, "run-race", "c1")]
    procs = [subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**os.environ, **env}) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate(timeout=30)
    assert [p.returncode for p in procs] == [0, 0], outs
    assert outs[0][0] == outs[1][0]  # the one that waited prints the result of the one that ran
    assert "Output:\nhi\n" in json.loads(outs[0][0])["output"]
    assert (shared / "marker").read_text() == "ran\n"
    assert _record(env, "run-race", "c1")["attempts"] == 2


def test_an_approved_call_that_found_no_engine_runs_on_the_approval_it_had(engine, tmp_path, shared, closed_socket):
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    policy = tmp_path / "policy.toml"
    policy.write_text('[tools.shell]\ndecision = "ask"\n')
    call = [*_call_args(shared, "run-ask", "c1"), "--policy", str(policy)]
    pending = callbox(*call, env=env)
    assert pending.returncode == 3, pending.stderr
    approval_id = re.search(rb"pending approval (\S+)", pending.stderr).group(1).decode()  # type: ignore[union-attr]
    assert callbox("approvals", "approve", approval_id, env=env).returncode == 0

    outage = callbox(*call, env={**env, "DOCKER_HOST": closed_socket})
    assert outage.returncode == 125, (outage.stdout, outage.stderr)
    assert not (shared / "marker").exists()

    retry = callbox(*call, env=env)  # no second approval: the person approved these arguments
    assert retry.returncode == 0, (retry.stdout, retry.stderr)
    assert "Output:\nhi\n" in json.loads(retry.stdout)["output"]
    assert (shared / "marker").read_text() == "ran\n"
    assert callbox(*call, env=env).stdout == retry.stdout
    assert (shared / "marker").read_text() == "ran\n"
    record = _record(env, "run-ask", "c1")
    assert record["attempts"] == 2 and record["decision"] == "allow"
    assert f"approval {approval_id}" in str(record["rule"])
