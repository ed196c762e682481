"""examples/agent_loop_with_client.py, driven by the scripted model against a real executor server."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "agent_loop_with_client.py"
TOKEN = "example-token-0123456789abcdef"
TURNS = [
    {"text": "Let me write and read a note.", "tool_calls": [
        {"call_id": "call_w", "name": "shell", "arguments": {"command": "echo noted > note.txt; echo wrote it"}},
        {"call_id": "call_r", "name": "read_file", "arguments": {"path": "note.txt"}},
    ]},
    {"text": "", "tool_calls": [{"call_id": "call_bad", "name": "shell", "arguments": "{not json"}]},
    {"text": "The note says: noted."},
]


@pytest.fixture
def server(engine, tmp_path) -> Iterator[GrpcServer]:  # type: ignore[no-untyped-def]
    sock_dir = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    handle = serve_grpc(
        str(sock_dir / "x.sock"), tokens=TokenSet({"example": TOKEN}, source="test"),
        policy=parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n'), audit=AuditStore(tmp_path / "audit.sqlite3"),
        announce=None,
    )
    try:
        yield handle
    finally:
        handle.stop(grace=1)
        shutil.rmtree(sock_dir, ignore_errors=True)


@pytest.fixture
def transcript(tmp_path) -> Path:
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps(turn) + "\n" for turn in TURNS))
    return path


def test_the_example_runs_as_a_script(server, transcript):
    env = {**os.environ, "CALLBOX_TOKEN": TOKEN}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--scripted", str(transcript), "--target", server.target, "Keep a note."],
        capture_output=True, env=env, timeout=120, check=False, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode().strip() == "The note says: noted."
    assert b"wrote it" in proc.stderr  # output streamed while the tool ran
    with ExecutorClient(server.target, TOKEN) as client:
        (run,) = client.list_runs()
        assert run.end_reason == "deleted" and not run.live  # the example deleted its sandbox
        calls = client.get_run(run.run_id).calls
        assert [(c.call_id, c.tool, c.is_error) for c in calls] == [
            ("call_w", "shell", False), ("call_r", "read_file", False), ("call_bad", "shell", True)]
    assert server.service.live_sandboxes() == {}


def test_the_loop_feeds_each_result_back_under_its_call_id(server, transcript):
    spec = importlib.util.spec_from_file_location("agent_loop_with_client", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)

    responses = example.ScriptedResponses(str(transcript))
    with ExecutorClient(server.target, TOKEN) as executor:
        answer = example.run_loop(responses, executor, model="scripted", task="Keep a note.")
    assert answer == "The note says: noted."
    last = responses.model.requests[-1].items
    outputs = {item["call_id"]: item for item in last if item.get("type") == "function_call_output"}
    assert set(outputs) == {"call_w", "call_r", "call_bad"}
    assert "wrote it" in outputs["call_w"]["output"] and "noted" in outputs["call_r"]["output"]
    assert "JSON" in outputs["call_bad"]["output"] or "json" in outputs["call_bad"]["output"]
    # every function_call is followed, later in the context, by its output
    order = [(item.get("type"), item.get("call_id")) for item in last]
    for call_id in outputs:
        assert order.index(("function_call", call_id)) < order.index(("function_call_output", call_id))
