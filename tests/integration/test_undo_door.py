"""Undo through the gRPC door and the model's ``undo`` tool, on the real engine.

The door (one in-process server, one sandbox of alice's, ``[checkpoints] mode = "changes"``): calls
write, edit and delete files in /workspace; ``Undo.DiffRun`` shows each call's changes; a revert while
a call runs is refused naming it; ``Undo.RevertRun`` to the first changing call puts /workspace back
byte for byte (modes and symlinks included), checked against a listing with hashes taken before, and
is recorded in the run as the action ``sandbox.revert``; bob reaches neither; once the sandbox is
deleted, the run's revert is of its mounts alone. The tool: `callbox run` with the scripted model and
a policy that names ``undo`` writes a file, undoes the call, and the file is gone.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.audit.store import AuditStore
from harness.client import CallResult, ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.v1 import executor_pb2, undo_pb2, undo_pb2_grpc
from harness.wire import DETAIL_METADATA_KEY
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN_A = "token-of-undo-alice-0123456"
TOKEN_B = "token-of-undo-bob-0123456789"
A = (("authorization", f"Bearer {TOKEN_A}"),)
B = (("authorization", f"Bearer {TOKEN_B}"),)
WAIT_S = 120.0
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "256m"

    [checkpoints]
    mode = "changes"
""")
SEED = ("mkdir -p /workspace/p/sub && cd /workspace/p && printf 'one\\ntwo\\nthree\\n' > a.txt"
        " && printf 'bee\\n' > sub/b.txt && printf '#!/bin/sh\\necho tool\\n' > tool.sh && chmod 755 tool.sh"
        " && printf '\\000\\001\\002' > blob.bin && ln -s a.txt link")
LISTING = ("cd /workspace && find . -path ./started -prune -o -path ./go -prune -o -printf '%y %m %p %l\\n' | sort"
           " && find . -type f ! -name started ! -name go -exec sha256sum {} + | sort")
EDIT = ("cd /workspace/p && sed -i 's/two/TWO/' a.txt && rm -r sub && chmod 600 tool.sh && ln -sfn new.txt link"
        " && printf '\\003' > blob.bin")
WAITING = "echo started && while [ ! -e /workspace/go ]; do sleep 0.05; done"


@dataclass
class Door:
    server: GrpcServer
    audit: AuditStore
    alice: ExecutorClient
    undo: undo_pb2_grpc.UndoStub


def _detail(error: grpc.RpcError) -> executor_pb2.ErrorDetail:
    for key, value in error.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == DETAIL_METADATA_KEY:
            return executor_pb2.ErrorDetail.FromString(value)
    raise AssertionError(f"no ErrorDetail in {error!r}")


def _refused(call: Any, code: grpc.StatusCode) -> executor_pb2.ErrorDetail:
    with pytest.raises(grpc.RpcError) as failure:
        call()
    assert failure.value.code() == code, failure.value  # type: ignore[attr-defined]
    return _detail(failure.value)


@pytest.fixture(scope="module")
def door(engine: Any) -> Iterator[Door]:
    state = Path(tempfile.mkdtemp(prefix="cbx-undo-"))
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    docker_engine = DockerEngine(engine.client, reap_on_start=False, snapshot_dir=state / "snapshots")
    audit = AuditStore(state / "audit.sqlite3")
    tokens = TokenSet({"alice": TOKEN_A, "bob": TOKEN_B}, source="test tokens")
    server = serve_grpc(str(short / "x.sock"), policy=parse_policy(POLICY), audit=audit, tokens=tokens,
                        announce=None, engine_factory=lambda: docker_engine)
    alice = ExecutorClient(server.target, TOKEN_A)
    try:
        yield Door(server, audit, alice, undo_pb2_grpc.UndoStub(alice.channel))
    finally:
        alice.close()
        server.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def _ok(result: CallResult) -> str:
    assert not result.is_error, result.text
    return result.text


def test_diff_and_revert_of_a_live_run_through_the_door(door: Door) -> None:
    box = door.alice.create_sandbox()
    alice = door.alice
    _ok(alice.call(box, "shell", {"command": SEED}, "c0"))
    before = _ok(alice.call(box, "shell", {"command": LISTING}, "list0"))
    assert "l 777 ./p/link a.txt" in before and "f 755 ./p/tool.sh" in before
    _ok(alice.call(box, "write_file", {"path": "/workspace/p/new.txt", "content": "hello\n"}, "c1"))
    _ok(alice.call(box, "shell", {"command": EDIT}, "c2"))
    _ok(alice.call(box, "write_file", {"path": "/workspace/p/a.txt", "content": "rewritten\n"}, "c3"))

    diff = door.undo.DiffRun(undo_pb2.DiffRunRequest(run_id=box), metadata=A, timeout=30)
    counts = {c.call_id: (c.tool, c.created, c.changed, c.removed) for c in diff.calls}
    assert counts["c1"] == ("write_file", 1, 0, 0) and counts["list0"] == ("shell", 0, 0, 0)
    assert counts["c2"][0] == "shell" and counts["c2"][3] == 2  # sub/b.txt and sub
    assert "+hello" in diff.diff and "-two" in diff.diff and "+TWO" in diff.diff and not diff.truncated
    assert "mode /workspace/p/tool.sh: 755 -> 600" in diff.diff
    assert "symlink /workspace/p/link -> new.txt (was a.txt)" in diff.diff
    one = door.undo.DiffRun(undo_pb2.DiffRunRequest(run_id=box, call_id="c3"), metadata=A, timeout=30)
    assert [c.call_id for c in one.calls] == ["c3"] and "+rewritten" in one.diff and "+hello" not in one.diff

    started = threading.Event()
    waited: list[CallResult] = []
    waiter = threading.Thread(target=lambda: waited.append(alice.call(
        box, "shell", {"command": WAITING}, "cwait", on_output=lambda _: started.set())))
    waiter.start()
    try:
        assert started.wait(WAIT_S), "the waiting call never started"
        busy = _refused(lambda: door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="c1"),
                                                    metadata=A, timeout=30), grpc.StatusCode.FAILED_PRECONDITION)
        assert busy.code == "conflict" and "call cwait of run" in busy.message and "is running" in busy.message
    finally:
        _ok(alice.call(box, "shell", {"command": "touch /workspace/go"}, "cgo"))
        waiter.join(WAIT_S)
    assert waited and not waited[0].is_error

    reverted = door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="c1"), metadata=A, timeout=60)
    assert reverted.how == "live" and not reverted.not_restored
    assert "/workspace/p/new.txt" in reverted.removed and "/workspace/p/sub/b.txt" in reverted.recreated
    assert "/workspace/p/a.txt" in reverted.restored and "/workspace/p/tool.sh" in reverted.modes
    assert _ok(alice.call(box, "shell", {"command": LISTING}, "list1")) == before
    actions = [c for c in alice.stub.GetRun(executor_pb2.GetRunRequest(run_id=box), metadata=A).calls
               if c.tool == "sandbox.revert"]
    assert [a.state for a in actions] == ["done", "done"]  # the refused one, and the revert

    for rpc in (lambda: door.undo.DiffRun(undo_pb2.DiffRunRequest(run_id=box), metadata=B, timeout=30),
                lambda: door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="c1"), metadata=B,
                                            timeout=30)):
        assert _refused(rpc, grpc.StatusCode.NOT_FOUND).code == "not_found"
    unknown = _refused(lambda: door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="nope"),
                                                   metadata=A, timeout=30), grpc.StatusCode.INVALID_ARGUMENT)
    assert "no change record" in unknown.message and "c1" in unknown.message

    alice.delete_sandbox(box)  # an ended run: only its mounts (it has none) can be put back
    lost = _refused(lambda: door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="c1"), metadata=A,
                                                timeout=30), grpc.StatusCode.INVALID_ARGUMENT)
    assert "/workspace" in lost.message and "mounts_only" in lost.message
    mounts = door.undo.RevertRun(undo_pb2.RevertRunRequest(run_id=box, to_call="c1", mounts_only=True),
                                 metadata=A, timeout=30)
    assert mounts.how == "mounts" and list(mounts.not_restored) == ["/workspace: only the run's sandbox holds it"]


def test_the_model_undoes_its_own_write_with_the_undo_tool(engine: Any, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('[checkpoints]\nmode = "changes"\n\n[tools.undo]\ndecision = "allow"\n')
    turns = [
        {"tool_calls": [{"call_id": "w1", "name": "write_file",
                         "arguments": {"path": "/workspace/x.txt", "content": "oops\n"}}]},
        {"tool_calls": [{"call_id": "u1", "name": "undo", "arguments": {"steps": 1}}]},
        {"tool_calls": [{"call_id": "t1", "name": "shell",
                         "arguments": {"command": "test -e /workspace/x.txt && echo still-there || echo gone"}}]},
        {"text": "done"},
    ]
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(t) + "\n" for t in turns))
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    run = subprocess.run([sys.executable, "-m", "harness.cli.main", "run", str(transcript), "--json", "--image",
                          IMAGE, "--policy", str(policy)], capture_output=True, env=env, timeout=WAIT_S, check=False)
    assert run.returncode == 0, run.stderr.decode()
    results = {e["call_id"]: e["result"] for e in map(json.loads, run.stdout.splitlines())
               if e.get("event") == "tool_result"}
    assert not results["u1"]["is_error"], results["u1"]
    assert "undone: w1" in results["u1"]["text"] and "/workspace/x.txt" in results["u1"]["text"]
    assert "gone" in results["t1"]["text"] and "still-there" not in results["t1"]["text"]
