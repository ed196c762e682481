"""No engine answers: every way in fails closed with a clear error, and nothing runs on the host.

Each test points DOCKER_HOST at a socket that does not exist and asks for a command that
would leave a marker file on the host if it ran anywhere but in a sandbox. They need no
engine (nothing may reach one), so they carry no ``docker`` marker and run everywhere. They
live here, not in tests/unit, because they go through the real CLI in child processes and
the real gRPC executor server, the way a user or another harness would.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient, ExecutorError
from harness.core.calls import ErrorCode, ToolCall
from harness.core.errors import EngineUnavailable
from harness.core.policy import load_policy, parse_policy
from harness.core.session import Session
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.tools import builtin_registry
from tests.integration.helpers import callbox

NAMES_THE_ENGINE = "cannot reach the Docker engine at unix:///nonexistent/"
NAMES_THE_FIX = "start dockerd"
TOKEN = "token-of-the-unreachable-test-0123"


@pytest.fixture
def no_engine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """DOCKER_HOST at a socket that does not exist (here and in child processes)."""
    env = {
        "DOCKER_HOST": f"unix:///nonexistent/{uuid.uuid4().hex[:8]}.sock",
        "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


@pytest.fixture
def marker() -> Iterator[Path]:
    """A host path that only a command running on the host could create."""
    path = Path(f"/tmp/callbox-should-not-exist-{uuid.uuid4().hex}")
    try:
        yield path
    finally:
        existed = path.exists()
        path.unlink(missing_ok=True)
        assert not existed, f"a command ran on the host: {path} exists"


def _clear(message: str) -> None:
    assert NAMES_THE_ENGINE in message, message
    assert NAMES_THE_FIX in message and "DOCKER_HOST" in message, message
    assert "Traceback" not in message


def test_callbox_exec_fails_closed(no_engine, marker):
    proc = callbox("exec", "--", "touch", str(marker), env=no_engine)
    assert proc.returncode == 125
    stderr = proc.stderr.decode()
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith("callbox: "), stderr
    _clear(stderr)
    assert "No tool runs without a sandbox" in stderr
    assert proc.stdout == b""
    assert not marker.exists()


def test_callbox_call_fails_closed_with_an_error_result(no_engine, marker):
    proc = callbox("call", "shell", json.dumps({"command": f"touch {marker}"}), "--call-id", "c1",
                   "--format", "anthropic", env=no_engine)
    assert proc.returncode != 0
    item = json.loads(proc.stdout)
    assert item["type"] == "tool_result" and item["tool_use_id"] == "c1"
    assert item["is_error"] is True
    assert item["content"].startswith("the sandbox is unavailable: ")
    _clear(item["content"])
    assert not marker.exists()
    audit = json.loads(callbox("audit", "--json", env=no_engine).stdout)
    (run,) = audit
    calls = json.loads(callbox("audit", "--run", run["id"], "--json", env=no_engine).stdout)
    assert [(c["call_id"], c["state"]) for c in calls] == [("c1", "done")]


def test_callbox_run_stops_at_the_first_call_that_finds_no_sandbox(no_engine, marker, tmp_path):
    transcript = tmp_path / "transcript.jsonl"
    turns = [
        {"text": "t1", "tool_calls": [{"call_id": "c1", "name": "shell", "arguments": {"command": f"touch {marker}"}}]},
        {"text": "t2", "tool_calls": [
            {"call_id": "c2", "name": "write_file", "arguments": {"path": "/workspace/a.txt", "content": "x"}},
            {"call_id": "c3", "name": "bash", "arguments": {"command": f"touch {marker}"}},
        ]},
        {"text": "giving up"},
    ]
    transcript.write_text("".join(json.dumps(t) + "\n" for t in turns))
    proc = callbox("run", str(transcript), "--json", env=no_engine)
    events = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    results = {e["call_id"]: e["result"] for e in events if e["event"] == "tool_result"}
    assert sorted(results) == ["c1"], proc.stderr  # nothing after the first unavailable sandbox
    assert results["c1"]["is_error"] is True
    assert results["c1"]["error"] == "sandbox_unavailable"
    _clear(results["c1"]["text"])
    ended = [e for e in events if e["event"] == "run_ended"]
    assert len(ended) == 1 and ended[0]["reason"] == "error:sandbox_unavailable", events
    assert proc.returncode == 125, proc.stderr
    assert not marker.exists()


def test_the_python_harness_returns_a_sandbox_unavailable_result(no_engine, marker, tmp_path):
    with AuditStore(tmp_path / "audit.sqlite3") as audit, \
            Session(builtin_registry(), load_policy(None), audit, run_id="no-engine") as harness:
        result = harness.call(ToolCall("shell", {"command": f"touch {marker}"}, "c1"))
        assert result.is_error and result.error == ErrorCode.SANDBOX_UNAVAILABLE
        _clear(result.text)
        assert harness.active_sandbox is None
        again = harness.call(ToolCall("shell", {"command": f"touch {marker}"}, "c2"))
        assert again.is_error and again.error == ErrorCode.SANDBOX_UNAVAILABLE
    assert not marker.exists()


def test_engine_connect_raises_engine_unavailable(no_engine):
    with pytest.raises(EngineUnavailable) as info:
        DockerEngine.connect()
    _clear(info.value.message)
    assert info.value.exit_code == 125


def test_the_grpc_executor_refuses_to_create_a_sandbox(no_engine, marker, tmp_path):
    socket_dir = Path(f"/tmp/cbx-{uuid.uuid4().hex[:8]}")  # short: sun_path is 108 bytes
    socket_dir.mkdir()
    server = serve_grpc(str(socket_dir / "x.sock"), policy=parse_policy(""), audit=AuditStore(tmp_path / "a.db"),
                        tokens=TokenSet({"alice": TOKEN}, source="test"), announce=None)
    try:
        with ExecutorClient(server.target, TOKEN) as client:
            with pytest.raises(ExecutorError) as info:
                client.create_sandbox()
            assert info.value.reason == "SANDBOX_UNAVAILABLE"
            assert info.value.code == grpc.StatusCode.UNAVAILABLE
            _clear(info.value.message)
            assert server.service.live_sandboxes() == {}
    finally:
        server.stop(grace=1)
        socket_dir.joinpath("x.sock").unlink(missing_ok=True)
        socket_dir.rmdir()
    assert not marker.exists()


@pytest.mark.parametrize("command", [["ps"], ["gc"], ["image", "build"]])
def test_engine_commands_say_the_engine_is_unreachable(no_engine, command):
    proc = callbox(*command, env=no_engine)
    assert proc.returncode == 125
    stderr = proc.stderr.decode()
    assert len(stderr.strip().splitlines()) == 1 and stderr.startswith(f"callbox: {NAMES_THE_ENGINE}")
    assert "start dockerd" in stderr and "DOCKER_HOST" in stderr  # the fix
    assert "Traceback" not in stderr


def test_doctor_reports_in_full_why_no_engine_answers(no_engine):
    """Doctor is the tool for this case: the host checks it can still make, the engine check
    failing with the cause and the fix, every check that needs the engine skipped because of
    it, and the failed-checks status (1), never 125 or a traceback."""
    from harness.doctor.catalog import docker_ids

    proc = callbox("doctor", "--json", env=no_engine)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.decode() == ""
    results = {r["id"]: r for r in json.loads(proc.stdout)}
    assert list(results) == docker_ids()  # the full report, in the catalog's order
    reachable = results["engine.reachable"]
    assert reachable["status"] == "FAIL"
    path = no_engine["DOCKER_HOST"].removeprefix("unix://")
    assert f"there is no socket at {path}" in reachable["reason"]  # the cause
    assert "start dockerd" in reachable["reason"] and "make engine" in reachable["reason"]  # the fix
    assert f"DOCKER_HOST={no_engine['DOCKER_HOST']}" in reachable["reason"]
    made = {"daemon.no-new-privileges", "daemon.runc", "host.pid-max"}  # from this host's files alone
    for check_id, item in results.items():
        if check_id in made:
            assert item["status"] in ("PASS", "WARN", "FAIL") and "skipped" not in item["reason"], item
        elif check_id != "engine.reachable":
            assert (item["status"], item["reason"]) == ("SKIP", "skipped: no Docker engine answers (engine.reachable)")
    text = callbox("doctor", env={**no_engine, "COLUMNS": "100"})
    assert text.returncode == 1 and text.stderr.decode() == ""
    lines = text.stdout.decode().splitlines()
    assert lines[0].startswith("FAIL  engine.reachable  ")
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)
    counts = {s: sum(r["status"] == s for r in results.values()) for s in ("PASS", "WARN", "FAIL", "SKIP")}
    assert lines[-1] == (f"callbox doctor: {len(results)} checks, {counts['PASS']} pass, {counts['WARN']} warn, "
                         f"{counts['FAIL']} fail, {counts['SKIP']} skipped")
