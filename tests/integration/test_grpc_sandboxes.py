"""The gRPC Sandboxes service end to end: real engine, real image, real gRPC (an in-process
door with three clients), one sandbox of the module shared by the tests that need one.

Processes (start, attach with replay, a terminal), a background ``python3 -m http.server``
reached through ConnectPort in a network-none sandbox, files both ways as tar streams, Move
and Watch, pause/status/resume (a tool call in between is PAUSED), keep-alive capped at the
server's TTL, snapshots and forks (the fork has the files, counts against the client's
limit, and ends with everything of it on DeleteSandbox), another client's NOT_FOUND for
every RPC, an ask rule on port_forward resolved through Executor.ResolveApproval, streams
the client cancels ending the agent's side, and the README's worked example."""

from __future__ import annotations

import io
import json
import os
import queue
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient, ExecutorError
from harness.core.policy import parse_policy
from harness.doors.grpc.sandboxes_snapshots import SIDECAR
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.v1 import executor_pb2, sandboxes_pb2, sandboxes_pb2_grpc
from harness.wire import DETAIL_METADATA_KEY
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN_A = "token-of-sandboxes-alice-0123"
TOKEN_B = "token-of-sandboxes-bob-012345"
TOKEN_C = "token-of-sandboxes-carol-0123"
TTL = 900
WEB_PORT = 8000
ECHO_PORT = 8001
SITE = "/workspace/site"
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "512m"
    ttl_seconds = {TTL}

    [actions.port_forward]
    decision = "allow"

    [[actions.port_forward.rules]]
    action = "ask"
    ports = [{ECHO_PORT}]
""")
ECHO_SERVER = textwrap.dedent(f"""
    import socket
    listener = socket.create_server(("127.0.0.1", {ECHO_PORT}))
    print("echo ready", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            while chunk := conn.recv(65536):
                conn.sendall(chunk)
""")


def auth(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


A, B = auth(TOKEN_A), auth(TOKEN_B)


@dataclass
class Door:
    server: GrpcServer
    audit: AuditStore
    engine: DockerEngine
    alice: ExecutorClient
    bob: ExecutorClient
    stub: sandboxes_pb2_grpc.SandboxesStub
    """Over alice's channel; pass ``metadata=B`` to ask as bob."""


def detail(error: grpc.RpcError) -> executor_pb2.ErrorDetail:
    for key, value in error.trailing_metadata() or ():  # type: ignore[attr-defined]
        if key == DETAIL_METADATA_KEY:
            return executor_pb2.ErrorDetail.FromString(value)
    raise AssertionError(f"no ErrorDetail in {error!r}")


def refused(call: Any, code: grpc.StatusCode, reason: int) -> executor_pb2.ErrorDetail:
    """Run ``call`` (which consumes a stream if it returns one) and check how it failed."""
    with pytest.raises(grpc.RpcError) as failure:
        result = call()
        if hasattr(result, "__next__"):
            list(result)
    assert failure.value.code() == code, failure.value  # type: ignore[attr-defined]
    found = detail(failure.value)
    assert found.reason == reason, found
    return found


@pytest.fixture(scope="module")
def door(engine: Any) -> Iterator[Door]:
    state = Path(tempfile.mkdtemp(prefix="cbx-sandboxes-"))
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    docker_engine = DockerEngine(engine.client, reap_on_start=False, snapshot_dir=state / "snapshots")
    audit = AuditStore(state / "audit.sqlite3")
    tokens = TokenSet({"alice": TOKEN_A, "bob": TOKEN_B, "carol": TOKEN_C}, source="test tokens", operators=["carol"])
    server = serve_grpc(str(short / "x.sock"), policy=parse_policy(POLICY), audit=audit, tokens=tokens,
                        announce=None, engine_factory=lambda: docker_engine, max_sandboxes_per_client=2)
    alice, bob = ExecutorClient(server.target, TOKEN_A), ExecutorClient(server.target, TOKEN_B)
    try:
        yield Door(server, audit, docker_engine, alice, bob, sandboxes_pb2_grpc.SandboxesStub(alice.channel))
    finally:
        alice.close()
        bob.close()
        server.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def box(door: Door) -> str:
    """Alice's sandbox (network none, as the policy has it; tightened, so forks have something to keep)."""
    return door.alice.create_sandbox(memory="256m", env={"SANDBOXES_MARK": "m1"})


def wait_for_output(door: Door, sandbox_id: str, pid: int, text: bytes) -> bytes:
    """Follow a process's output (replayed from its start) until ``text`` appears."""
    stream = door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(sandbox_id=sandbox_id, pid=pid, follow=True),
                                     metadata=A, timeout=30)
    seen = b""
    try:
        for event in stream:
            seen += event.output.stdout + event.output.stderr
            if text in seen:
                return seen
            assert not event.HasField("exited"), seen
    finally:
        stream.cancel()
    raise AssertionError(f"{text!r} never appeared: {seen!r}")


@pytest.fixture(scope="module")
def servers(door: Door, box: str) -> None:
    """http.server on WEB_PORT and an echo server on ECHO_PORT, background processes of the sandbox."""
    assert door.alice.call(box, "shell", {"command": f"mkdir -p {SITE} && echo hello-web > {SITE}/hello.txt"}) \
        .structured["exit_code"] == 0  # type: ignore[index]
    web = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(
        sandbox_id=box, argv=["python3", "-u", "-m", "http.server", str(WEB_PORT), "--bind", "127.0.0.1",
                              "--directory", SITE], tag="web"), metadata=A)
    echo = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(
        sandbox_id=box, command=f"python3 -u -c '{ECHO_SERVER}'", tag="echo"), metadata=A)
    wait_for_output(door, box, web.pid, b"Serving HTTP")
    wait_for_output(door, box, echo.pid, b"echo ready")


def exchange(door: Door, sandbox_id: str, port: int, payload: bytes, *, approval_id: str = "",
             metadata: Any = A) -> bytes:
    """One tunnelled connection: send ``payload`` and eof, read until the sandbox's eof."""
    first = sandboxes_pb2.PortData(sandbox_id=sandbox_id, port=port, approval_id=approval_id, data=payload, eof=True)
    got, eof = b"", False
    for message in door.stub.ConnectPort(iter([first]), metadata=metadata, timeout=30):
        assert not eof, "data after eof"
        got += message.data
        eof = message.eof
    assert eof
    return got


def helper_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(("callbox-port-", "callbox-terminal-"))]


def wait_until(condition: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.05)


def actions_of(door: Door, run_id: str, tool: str) -> list[executor_pb2.Call]:
    run = door.alice.stub.GetRun(executor_pb2.GetRunRequest(run_id=run_id), metadata=A)
    return [call for call in run.calls if call.tool == tool]


# ---- processes and ports ---------------------------------------------------------------------------


def test_http_server_in_a_network_none_sandbox_through_connect_port(door: Door, box: str, servers: None) -> None:
    reply = exchange(door, box, WEB_PORT, b"GET /hello.txt HTTP/1.0\r\n\r\n")
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), reply
    assert body == b"hello-web\n"
    listed = door.stub.ListProcesses(sandboxes_pb2.ListProcessesRequest(sandbox_id=box), metadata=A).processes
    assert {p.tag for p in listed if p.state == "running"} >= {"web", "echo"}
    recorded = actions_of(door, box, "sandbox.port_forward")
    assert recorded and recorded[-1].state == "done" and recorded[-1].decision == "allow"
    refused(lambda: exchange(door, box, 8999, b""), grpc.StatusCode.FAILED_PRECONDITION,
            executor_pb2.ERROR_REASON_UNSPECIFIED)  # nothing listens there: the agent's CONNECTION_REFUSED
    wait_until(lambda: not helper_threads(), "the tunnels' threads have ended")


def test_attach_replays_then_follows_to_the_end(door: Door, box: str) -> None:
    job = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(
        sandbox_id=box, command="echo one; echo two >&2; read line; echo got-$line", stdin=True), metadata=A)
    wait_for_output(door, box, job.pid, b"two")
    door.stub.SendInput(sandboxes_pb2.SendInputRequest(sandbox_id=box, pid=job.pid, data=b"three\n", close=True),
                        metadata=A)
    events = list(door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(
        sandbox_id=box, pid=job.pid, from_seq=0, follow=True), metadata=A, timeout=30))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[-1] == "exited", kinds  # (no "live" event: it had ended before the replay was over)
    assert events[-1].exited.exit_code == 0 and events[-1].exited.state == "exited"
    stdout = b"".join(e.output.stdout for e in events)
    assert stdout == b"one\ngot-three\n"
    assert b"".join(e.output.stderr for e in events) == b"two\n"
    # The replay alone, from the second chunk on, once it has ended.
    replay = list(door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(
        sandbox_id=box, pid=job.pid, from_seq=1), metadata=A, timeout=30))
    assert next(e.output.seq for e in replay if e.HasField("output")) == 1
    assert replay[-1].HasField("exited")
    refused(lambda: door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(sandbox_id=box, pid=999999),
                                            metadata=A, timeout=30),
            grpc.StatusCode.NOT_FOUND, executor_pb2.ERROR_REASON_NOT_FOUND)


def test_a_terminal_types_and_reads(door: Door, box: str) -> None:
    job = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(
        sandbox_id=box, argv=["bash", "--norc", "--noprofile"], pty=True, rows=30, cols=100), metadata=A)
    inputs: queue.Queue[sandboxes_pb2.TerminalRequest | None] = queue.Queue()
    inputs.put(sandboxes_pb2.TerminalRequest(attach=sandboxes_pb2.AttachProcessRequest(sandbox_id=box, pid=job.pid)))
    inputs.put(sandboxes_pb2.TerminalRequest(data=b"stty size; echo $((6*7))\n"))

    def requests() -> Iterator[sandboxes_pb2.TerminalRequest]:
        while (item := inputs.get()) is not None:
            yield item

    seen, exited = b"", None
    for event in door.stub.Terminal(requests(), metadata=A, timeout=60):
        seen += event.output.stdout
        if b"42" in seen and b"30 100" in seen and inputs.empty():
            inputs.put(sandboxes_pb2.TerminalRequest(data=b"exit 3\n"))
        if event.HasField("exited"):
            exited = event.exited
    inputs.put(None)
    assert exited is not None and exited.exit_code == 3, seen
    recorded = json.loads(actions_of(door, box, "sandbox.attach")[-1].arguments_json)
    assert (recorded["mode"], recorded["pid"], recorded["actor"]) == ("terminal", job.pid, "grpc:alice")


def test_a_cancelled_stream_ends_the_agents_side(door: Door, box: str, servers: None) -> None:
    job = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(sandbox_id=box, argv=["sleep", "600"]),
                                 metadata=A)
    try:
        stream = door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(sandbox_id=box, pid=job.pid, follow=True),
                                         metadata=A)
        assert next(stream).HasField("live")
        stream.cancel()

        def attach_recorded_done() -> bool:
            calls = [c for c in actions_of(door, box, "sandbox.attach")
                     if json.loads(c.arguments_json)["pid"] == job.pid]
            return bool(calls) and calls[-1].state == "done"

        wait_until(attach_recorded_done, "the cancelled attach was recorded as ended")
        # A tunnel the client cancels half-way: its threads end, the server still serves.
        inputs: queue.Queue[sandboxes_pb2.PortData | None] = queue.Queue()
        inputs.put(sandboxes_pb2.PortData(sandbox_id=box, port=WEB_PORT, data=b"GET / HTTP/1.0\r\n"))
        tunnel = door.stub.ConnectPort(iter(inputs.get, None), metadata=A)
        try:
            wait_until(lambda: bool(helper_threads()), "the tunnel is open")
            tunnel.cancel()
            wait_until(lambda: not helper_threads(), "the cancelled tunnel's threads have ended")
        finally:
            inputs.put(None)  # ends the client's request iterator too
        assert exchange(door, box, WEB_PORT, b"GET /hello.txt HTTP/1.0\r\n\r\n").endswith(b"hello-web\n")
    finally:
        door.stub.KillProcess(sandboxes_pb2.KillProcessRequest(sandbox_id=box, pid=job.pid), metadata=A)


def test_an_ask_rule_on_port_forward_is_resolved_through_resolve_approval(door: Door, box: str,
                                                                          servers: None) -> None:
    pending = refused(lambda: exchange(door, box, ECHO_PORT, b"ping"), grpc.StatusCode.FAILED_PRECONDITION,
                      executor_pb2.ERROR_REASON_APPROVAL_PENDING)
    assert pending.approval_id and "actions.port_forward.rules[0]" in pending.message
    for client in (door.bob, door.alice):  # clients, the sandbox's owner included, resolve nothing
        with pytest.raises(ExecutorError) as refusal:
            client.resolve_approval(pending.approval_id, True)
        assert refusal.value.code == grpc.StatusCode.PERMISSION_DENIED
    with ExecutorClient(door.server.target, TOKEN_C) as operator:
        approval = operator.resolve_approval(pending.approval_id, True, "the echo server is fine")
    assert (approval.tool, approval.sandbox_id, approval.state) == ("sandbox.port_forward", box, "approved")
    assert exchange(door, box, ECHO_PORT, b"ping", approval_id=pending.approval_id) == b"ping"
    used = refused(lambda: exchange(door, box, ECHO_PORT, b"ping", approval_id=pending.approval_id),
                   grpc.StatusCode.PERMISSION_DENIED, executor_pb2.ERROR_REASON_PERMISSION_DENIED)
    assert "already used" in used.message


# ---- files -----------------------------------------------------------------------------------------


def test_upload_then_download_round_trip_and_move_seen_by_watch(door: Door, box: str) -> None:
    blob = os.urandom(3 << 20)
    files = {"proj/a.txt": b"alpha\n", "proj/sub/blob.bin": blob}
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    raw = archive.getvalue()
    pieces = [raw[i:i + (256 << 10)] for i in range(0, len(raw), 256 << 10)]
    requests = [sandboxes_pb2.UploadRequest(sandbox_id=box, dest="/workspace")]
    requests += [sandboxes_pb2.UploadRequest(data=piece) for piece in pieces]
    uploaded = door.stub.Upload(iter(requests), metadata=A, timeout=60)
    assert (uploaded.files_written, uploaded.bytes_written) == (2, len(blob) + 6)

    chunks = door.stub.Download(sandboxes_pb2.DownloadRequest(sandbox_id=box, path="/workspace/proj"),
                                metadata=A, timeout=60)
    with tarfile.open(fileobj=io.BytesIO(b"".join(c.data for c in chunks))) as tar:
        back = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}  # type: ignore[union-attr]
    assert back == files
    assert actions_of(door, box, "sandbox.copy_in")[-1].state == "done"
    assert actions_of(door, box, "sandbox.copy_out")[-1].state == "done"

    watch = door.stub.Watch(sandboxes_pb2.WatchRequest(sandbox_id=box, path="/workspace/proj"), metadata=A,
                            timeout=30)
    try:
        assert next(watch).kind == "ready"
        door.stub.Move(sandboxes_pb2.MoveRequest(sandbox_id=box, source="/workspace/proj/a.txt",
                                                 destination="/workspace/proj/b.txt"), metadata=A)
        kinds = {(e.kind, e.path) for e in (next(watch), next(watch))}
        assert kinds == {("moved_from", "/workspace/proj/a.txt"), ("moved_to", "/workspace/proj/b.txt")}
    finally:
        watch.cancel()


# ---- lifetime --------------------------------------------------------------------------------------


def test_pause_status_resume_then_a_call_works(door: Door, box: str) -> None:
    before = door.stub.GetStatus(sandboxes_pb2.GetStatusRequest(sandbox_id=box), metadata=A)
    assert before.state == "running" and before.cpu_seconds > 0 and before.memory_bytes > 0 and before.pids >= 1
    paused_at = time.time()
    paused = door.stub.Pause(sandboxes_pb2.PauseRequest(sandbox_id=box), metadata=A)
    try:
        assert paused.state == "paused"
        assert door.stub.GetStatus(sandboxes_pb2.GetStatusRequest(sandbox_id=box), metadata=A).state == "paused"
        with pytest.raises(ExecutorError) as frozen:
            door.alice.call(box, "shell", {"command": "true"})
        assert (frozen.value.code, frozen.value.reason) == (grpc.StatusCode.FAILED_PRECONDITION, "PAUSED")
        refused(lambda: door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(sandbox_id=box, command="true"),
                                               metadata=A), grpc.StatusCode.FAILED_PRECONDITION,
                executor_pb2.ERROR_REASON_PAUSED)
        session = door.server.service.session_of(box, "alice")
        assert not session.due(time.time() + 10 * TTL)  # the door's reaper leaves a paused sandbox alone
    finally:
        resumed = door.stub.Resume(sandboxes_pb2.ResumeRequest(sandbox_id=box), metadata=A)
    assert resumed.state == "running"
    assert resumed.expires_unix >= before.expires_unix + (time.time() - paused_at) - 2.0
    assert door.alice.call(box, "shell", {"command": "echo awake"}).text.strip().endswith("awake")
    assert [json.loads(c.arguments_json)["op"] for c in actions_of(door, box, "sandbox.pause")] == ["pause", "resume"]


def test_keep_alive_is_capped_at_the_servers_ttl(door: Door, box: str) -> None:
    refused(lambda: door.stub.KeepAlive(sandboxes_pb2.KeepAliveRequest(sandbox_id=box, ttl_seconds=TTL + 1),
                                        metadata=A), grpc.StatusCode.PERMISSION_DENIED,
            executor_pb2.ERROR_REASON_PERMISSION_DENIED)
    refused(lambda: door.stub.KeepAlive(sandboxes_pb2.KeepAliveRequest(sandbox_id=box, ttl_seconds=5), metadata=A),
            grpc.StatusCode.INVALID_ARGUMENT, executor_pb2.ERROR_REASON_INVALID_ARGUMENT)
    status = door.stub.KeepAlive(sandboxes_pb2.KeepAliveRequest(sandbox_id=box), metadata=A)
    assert status.expires_unix == pytest.approx(time.time() + TTL, abs=5)
    session = door.server.service.session_of(box, "alice")
    engine_box = session.harness.active_sandbox
    assert float((engine_box.socket_dir / "expires").read_text()) == pytest.approx(status.expires_unix, abs=1)  # type: ignore[union-attr]
    assert not session.due(status.expires_unix - 1) and session.due(status.expires_unix + 1)  # the door's reaper


# ---- snapshots and forks ---------------------------------------------------------------------------


def test_snapshot_and_forks_have_the_files_and_count_against_the_limit(door: Door, box: str) -> None:
    assert door.alice.call(box, "shell", {"command": "echo kept > /workspace/note.txt"}).structured["exit_code"] == 0  # type: ignore[index]
    snap = door.stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="base"), metadata=A)
    assert (snap.name, snap.source_sandbox_id) == ("base", box) and "/workspace" in snap.captured and snap.bytes > 0
    refused(lambda: door.stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="base"), metadata=A),
            grpc.StatusCode.ALREADY_EXISTS, executor_pb2.ERROR_REASON_INVALID_ARGUMENT)
    door.stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="base", replace=True), metadata=A)
    listed = door.stub.ListSnapshots(sandboxes_pb2.ListSnapshotsRequest(), metadata=A).snapshots
    assert [s.name for s in listed] == ["base"]

    fork = door.stub.Fork(sandboxes_pb2.ForkRequest(snapshot="base"), metadata=A)
    try:
        assert fork.sandbox_id != box and fork.memory_bytes == 256 << 20  # the source's tightening is kept
        shown = door.alice.call(fork.sandbox_id, "shell", {"command": "cat /workspace/note.txt; echo $SANDBOXES_MARK"})
        assert shown.text.split()[-2:] == ["kept", "m1"], shown.text
        assert actions_of(door, fork.sandbox_id, "sandbox.fork")[0].state == "done"  # the fork's own run
        refused(lambda: door.stub.Fork(sandboxes_pb2.ForkRequest(sandbox_id=box), metadata=A),
                grpc.StatusCode.RESOURCE_EXHAUSTED, executor_pb2.ERROR_REASON_LIMIT_REACHED)  # box + fork = 2

        # Deleting the fork ends every stream of it.
        job = door.stub.StartProcess(sandboxes_pb2.StartProcessRequest(sandbox_id=fork.sandbox_id,
                                                                       argv=["sleep", "600"]), metadata=A)
        follow = door.stub.AttachProcess(sandboxes_pb2.AttachProcessRequest(
            sandbox_id=fork.sandbox_id, pid=job.pid, follow=True), metadata=A, timeout=60)
        assert next(follow).HasField("live")
        started = time.monotonic()
    finally:
        door.alice.delete_sandbox(fork.sandbox_id)
    with pytest.raises(grpc.RpcError) as ended:
        next(follow)
    assert ended.value.code() == grpc.StatusCode.NOT_FOUND and time.monotonic() - started < 30  # type: ignore[attr-defined]

    live_fork = door.stub.Fork(sandboxes_pb2.ForkRequest(sandbox_id=box), metadata=A)
    try:
        assert door.alice.call(live_fork.sandbox_id, "shell", {"command": "cat /workspace/note.txt"}) \
            .text.strip().endswith("kept")
        assert actions_of(door, box, "sandbox.fork")[-1].state == "done"  # recorded in the source's run
    finally:
        door.alice.delete_sandbox(live_fork.sandbox_id)

    # A snapshot without the door's notes (another door's, or written before them): its spec decides.
    stored = next(s for s in door.engine.snapshots() if s.name.endswith(".base"))
    (stored.directory / SIDECAR).unlink()
    derived = door.stub.Fork(sandboxes_pb2.ForkRequest(snapshot="base"), metadata=A)
    try:
        assert derived.memory_bytes == 256 << 20
        assert door.alice.call(derived.sandbox_id, "shell", {"command": "cat /workspace/note.txt"}) \
            .text.strip().endswith("kept")
    finally:
        door.alice.delete_sandbox(derived.sandbox_id)
    door.stub.DeleteSnapshot(sandboxes_pb2.DeleteSnapshotRequest(name="base"), metadata=A)
    assert not door.stub.ListSnapshots(sandboxes_pb2.ListSnapshotsRequest(), metadata=A).snapshots


def test_a_fork_of_a_snapshot_asked_for_gets_the_sandbox_id_its_approval_names(door: Door, box: str) -> None:
    """A second door (another server on the same engine and audit store) whose policy asks
    before forks: the pending approval is of the fork's own run, and the repeat gets it."""
    door.stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="asked"), metadata=A)
    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    asking = serve_grpc(str(short / "x.sock"), policy=parse_policy(POLICY + '\n[actions.fork]\ndecision = "ask"\n'),
                        audit=door.audit, announce=None, engine_factory=lambda: door.engine,
                        tokens=TokenSet({"alice": TOKEN_A}, source="test tokens", operators=["alice"]))
    try:
        with ExecutorClient(asking.target, TOKEN_A) as alice:
            stub = sandboxes_pb2_grpc.SandboxesStub(alice.channel)
            pending = refused(lambda: stub.Fork(sandboxes_pb2.ForkRequest(snapshot="asked"), metadata=A),
                              grpc.StatusCode.FAILED_PRECONDITION, executor_pb2.ERROR_REASON_APPROVAL_PENDING)
            approval = alice.resolve_approval(pending.approval_id, True)
            assert approval.tool == "sandbox.fork"
            fork = stub.Fork(sandboxes_pb2.ForkRequest(snapshot="asked", approval_id=pending.approval_id),
                             metadata=A)
            assert fork.sandbox_id == approval.sandbox_id
            assert alice.call(fork.sandbox_id, "shell", {"command": "echo $SANDBOXES_MARK"}).text.strip() \
                .endswith("m1")
            refused(lambda: stub.Fork(sandboxes_pb2.ForkRequest(snapshot="asked", approval_id=pending.approval_id),
                                      metadata=A), grpc.StatusCode.PERMISSION_DENIED,
                    executor_pb2.ERROR_REASON_PERMISSION_DENIED)  # used up (and a new run refused for it)
            alice.delete_sandbox(fork.sandbox_id)
    finally:
        asking.stop(grace=1)
        shutil.rmtree(short, ignore_errors=True)
        door.stub.DeleteSnapshot(sandboxes_pb2.DeleteSnapshotRequest(name="asked"), metadata=A)


def test_health_and_reflection_know_the_service(door: Door) -> None:
    from google.protobuf import descriptor_pool
    from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

    from sandbox import health
    from tests.integration.test_grpc_executor import _Bearer  # the reflection client takes no metadata

    assert health.check(door.alice.channel, timeout=5, service="harness.v1.Sandboxes") == health.SERVING
    database = ProtoReflectionDescriptorDatabase(grpc.intercept_channel(door.alice.channel, _Bearer(TOKEN_A)))
    assert "harness.v1.Sandboxes" in set(database.get_services())
    service = descriptor_pool.DescriptorPool(database).FindServiceByName("harness.v1.Sandboxes")
    assert service.methods_by_name["ConnectPort"].input_type.full_name == "harness.v1.PortData"


# ---- ownership -------------------------------------------------------------------------------------


def test_another_client_gets_not_found_for_every_rpc(door: Door, box: str) -> None:
    door.stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="mine"), metadata=A)
    try:
        s = sandboxes_pb2
        attach = s.AttachProcessRequest(sandbox_id=box, pid=1, follow=True)
        calls: dict[str, Any] = {
            "StartProcess": lambda: door.stub.StartProcess(s.StartProcessRequest(sandbox_id=box, command="true"),
                                                           metadata=B),
            "ListProcesses": lambda: door.stub.ListProcesses(s.ListProcessesRequest(sandbox_id=box), metadata=B),
            "AttachProcess": lambda: door.stub.AttachProcess(attach, metadata=B, timeout=30),
            "Terminal": lambda: door.stub.Terminal(iter([s.TerminalRequest(attach=attach)]), metadata=B, timeout=30),
            "SendInput": lambda: door.stub.SendInput(s.SendInputRequest(sandbox_id=box, pid=1, data=b"x"), metadata=B),
            "SignalProcess": lambda: door.stub.SignalProcess(s.SignalProcessRequest(sandbox_id=box, pid=1, signal=15),
                                                             metadata=B),
            "KillProcess": lambda: door.stub.KillProcess(s.KillProcessRequest(sandbox_id=box, pid=1), metadata=B),
            "Download": lambda: door.stub.Download(s.DownloadRequest(sandbox_id=box, path="/workspace"), metadata=B,
                                                   timeout=30),
            "Upload": lambda: door.stub.Upload(iter([s.UploadRequest(sandbox_id=box, dest="/workspace"),
                                                     s.UploadRequest(data=b"x" * 512)]), metadata=B, timeout=30),
            "Move": lambda: door.stub.Move(s.MoveRequest(sandbox_id=box, source="/a", destination="/b"), metadata=B),
            "Watch": lambda: door.stub.Watch(s.WatchRequest(sandbox_id=box, path="/workspace"), metadata=B,
                                             timeout=30),
            "ConnectPort": lambda: door.stub.ConnectPort(iter([s.PortData(sandbox_id=box, port=WEB_PORT, eof=True)]),
                                                         metadata=B, timeout=30),
            "Pause": lambda: door.stub.Pause(s.PauseRequest(sandbox_id=box), metadata=B),
            "Resume": lambda: door.stub.Resume(s.ResumeRequest(sandbox_id=box), metadata=B),
            "KeepAlive": lambda: door.stub.KeepAlive(s.KeepAliveRequest(sandbox_id=box), metadata=B),
            "GetStatus": lambda: door.stub.GetStatus(s.GetStatusRequest(sandbox_id=box), metadata=B),
            "Snapshot": lambda: door.stub.Snapshot(s.SnapshotRequest(sandbox_id=box, name="theirs"), metadata=B),
            "DeleteSnapshot": lambda: door.stub.DeleteSnapshot(s.DeleteSnapshotRequest(name="mine"), metadata=B),
            "Fork": lambda: door.stub.Fork(s.ForkRequest(sandbox_id=box), metadata=B),
            "Fork(snapshot)": lambda: door.stub.Fork(s.ForkRequest(snapshot="mine"), metadata=B),
            "UpdateNetwork": lambda: door.stub.UpdateNetwork(s.UpdateNetworkRequest(sandbox_id=box, deny=["0.0.0.0/0"]),
                                                             metadata=B),
        }
        served = {m.name for m in s.DESCRIPTOR.services_by_name["Sandboxes"].methods}
        assert served - {name.split("(")[0] for name in calls} == {"ListSnapshots"}
        for name, call in calls.items():
            found = refused(call, grpc.StatusCode.NOT_FOUND, executor_pb2.ERROR_REASON_NOT_FOUND)
            assert "for this client" in found.message, (name, found.message)
        assert not door.stub.ListSnapshots(s.ListSnapshotsRequest(), metadata=B).snapshots
        # Nothing of bob's attempts reached alice's run; her snapshot is still there.
        assert not [c for c in door.alice.get_run(box).calls if "grpc:bob" in c.arguments_json]
        assert [x.name for x in door.stub.ListSnapshots(s.ListSnapshotsRequest(), metadata=A).snapshots] == ["mine"]
    finally:
        door.stub.DeleteSnapshot(sandboxes_pb2.DeleteSnapshotRequest(name="mine"), metadata=A)


# ---- the README's example --------------------------------------------------------------------------

# The Python example of the README's Sandboxes section, as it stands there.
README_EXAMPLE = r'''
import io, os, tarfile
import grpc
from harness.client import ExecutorClient
from harness.v1 import sandboxes_pb2 as sb, sandboxes_pb2_grpc

auth = (("authorization", f"Bearer {os.environ['CALLBOX_TOKEN']}"),)   # every RPC carries the token
with ExecutorClient("unix:/run/callbox/executor.sock") as client:
    sandboxes = sandboxes_pb2_grpc.SandboxesStub(client.channel)      # the same server, the same channel
    box = client.create_sandbox()                                     # network "none"

    # A background process; its output is replayed from the start, then followed.
    web = sandboxes.StartProcess(sb.StartProcessRequest(
        sandbox_id=box, argv=["python3", "-u", "-m", "http.server", "8000", "--bind", "127.0.0.1"]), metadata=auth)
    output = sandboxes.AttachProcess(sb.AttachProcessRequest(sandbox_id=box, pid=web.pid, follow=True),
                                     metadata=auth, timeout=30)
    for event in output:
        if b"Serving HTTP" in event.output.stdout:
            break
    output.cancel()                                                   # detach; the server runs on

    # One TCP connection to it, tunnelled over the RPC (no network needed); eof half-closes.
    request = sb.PortData(sandbox_id=box, port=8000, data=b"GET / HTTP/1.0\r\n\r\n", eof=True)
    try:
        reply = b"".join(m.data for m in sandboxes.ConnectPort(iter([request]), metadata=auth, timeout=30))
        print(reply.split(b"\r\n")[0].decode())                       # HTTP/1.0 200 OK
    except grpc.RpcError as error:                                    # off unless [actions.port_forward] allows it
        print(error.code().name, error.details())                     # PERMISSION_DENIED denied by policy: ...

    # Files in and out as tar streams (in chunks: memory stays bounded on both sides).
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        info = tarfile.TarInfo("notes/hello.txt")
        info.size = 6
        tar.addfile(info, io.BytesIO(b"hello\n"))
    chunks = [sb.UploadRequest(sandbox_id=box, dest="/workspace"), sb.UploadRequest(data=archive.getvalue())]
    print(sandboxes.Upload(iter(chunks), metadata=auth).files_written)                # 1
    tar_stream = sandboxes.Download(sb.DownloadRequest(sandbox_id=box, path="/workspace/notes"), metadata=auth)
    with tarfile.open(fileobj=io.BytesIO(b"".join(c.data for c in tar_stream))) as tar:
        print(tar.getnames())                                                         # ['notes', 'notes/hello.txt']

    # Pause (no CPU; the expiry clock stops), resume, keep alive for the sandbox's TTL.
    print(sandboxes.Pause(sb.PauseRequest(sandbox_id=box), metadata=auth).state)     # paused
    print(sandboxes.Resume(sb.ResumeRequest(sandbox_id=box), metadata=auth).state)   # running
    print(sandboxes.KeepAlive(sb.KeepAliveRequest(sandbox_id=box), metadata=auth).expires_unix)

    # A snapshot, and a new sandbox of this client from it (the source could be `box` itself).
    sandboxes.Snapshot(sb.SnapshotRequest(sandbox_id=box, name="with-notes", replace=True), metadata=auth)
    fork = sandboxes.Fork(sb.ForkRequest(snapshot="with-notes"), metadata=auth)       # an Executor Sandbox
    print(client.call(fork.sandbox_id, "shell", {"command": "cat /workspace/notes/hello.txt"}).text)
    sandboxes.DeleteSnapshot(sb.DeleteSnapshotRequest(name="with-notes"), metadata=auth)
    client.delete_sandbox(fork.sandbox_id)
    client.delete_sandbox(box)                                        # ends its processes and streams too
'''


def test_the_readme_example_runs(door: Door) -> None:
    code = README_EXAMPLE.replace("unix:/run/callbox/executor.sock", door.server.target)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=240, check=False,
                          env={**os.environ, "CALLBOX_TOKEN": TOKEN_C})
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    lines = out.splitlines()
    assert lines[:5] == ["HTTP/1.0 200 OK", "1", "['notes', 'notes/hello.txt']", "paused", "running"], out
    assert float(lines[5]) == pytest.approx(time.time() + TTL, abs=60)
    assert "hello" in lines[6:], out  # the shell tool's text: exit code, wall time, then the output
