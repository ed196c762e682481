"""The gRPC executor service end to end: real engine, real image, real gRPC (in-process server)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from harness.audit.store import AuditStore
from harness.client import AsyncExecutorClient, CallResult, ExecutorClient, ExecutorError, OutputEvent
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, ServeError, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.v1 import executor_pb2, executor_pb2_grpc
from sandbox import health
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN_A = "token-of-client-a-0123456789"
TOKEN_B = "token-of-client-b-0123456789"
TOKEN_C = "token-of-client-c-0123456789"
TOKEN_OPS = "token-of-operator-0123456789"
TOKENS = TokenSet({"alice": TOKEN_A, "bob": TOKEN_B, "carol": TOKEN_C, "ops": TOKEN_OPS}, source="test tokens",
                  operators=["ops"])
PROCS = "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for unix sockets (sun_path is 108 bytes; pytest's tmp_path can be longer)."""
    path = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def share(tmp_path: Path) -> Path:
    root = tmp_path / "share"
    (root / "project").mkdir(parents=True)
    (root / "project" / "hello.txt").write_text("hello from the host\n")
    return root


def _policy(share: Path, extra: str = "") -> object:
    text = textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"
        memory = "512m"
        allowed_mount_roots = ["{share}"]

        [[tools.shell.rules]]
        action = "ask"
        command = "*approve-me*"
    """) + extra
    return parse_policy(text)


def _start(short_dir: Path, tmp_path: Path, share: Path, addr: str | None = None, **options: object) -> GrpcServer:
    audit = AuditStore(tmp_path / "audit.sqlite3")
    options.setdefault("tokens", TOKENS)
    return serve_grpc(addr if addr is not None else str(short_dir / "x.sock"), policy=_policy(share), audit=audit,
                      announce=None, reaper_interval_s=0.5, **options)  # type: ignore[arg-type]


@pytest.fixture
def server(engine, short_dir, tmp_path, share) -> Iterator[GrpcServer]:  # type: ignore[no-untyped-def]
    handle = _start(short_dir, tmp_path, share)
    try:
        yield handle
    finally:
        handle.stop(grace=1)


def _client(server: GrpcServer, token: str = TOKEN_A) -> ExecutorClient:
    return ExecutorClient(server.target, token)


def _processes(client: ExecutorClient, sandbox_id: str) -> list[str]:
    result = client.call(sandbox_id, "shell", {"command": PROCS})
    return [line for line in result.text.splitlines() if line.strip()]


def _wait_until_gone(client: ExecutorClient, sandbox_id: str, needle: str, within: float = 10.0) -> list[str]:
    deadline = time.monotonic() + within
    while True:
        procs = _processes(client, sandbox_id)
        if not any(needle in p for p in procs) or time.monotonic() > deadline:
            return procs
        time.sleep(0.2)


def _live_containers(engine) -> set[str]:  # type: ignore[no-untyped-def]
    return {s.sandbox_id for s in engine.list_sandboxes()}


# --- tools and calls ------------------------------------------------------------------------------------


def test_list_tools_in_every_format(server):
    with _client(server) as client:
        openai = client.list_tools("openai")
        assert {t["name"] for t in openai} >= {"shell", "bash", "apply_patch", "read_file"}
        assert all(t["type"] == "function" and t["strict"] is True for t in openai)
        anthropic = client.list_tools("anthropic")
        assert all(set(t) == {"name", "description", "input_schema"} for t in anthropic)
        mcp = client.list_tools("mcp")
        assert all("inputSchema" in t and "annotations" in t for t in mcp)
        chat = client.list_tools("chat")
        assert all(t["function"]["name"] for t in chat)
        # the Struct carries the same definition as the JSON text
        response = client.stub.ListTools(executor_pb2.ListToolsRequest(format=executor_pb2.FORMAT_OPENAI),
                                         metadata=client._metadata)
        first = response.tools[0]
        assert first.definition["name"] == json.loads(first.definition_json)["name"] == first.name


def test_call_streams_output_then_the_result_and_runs_a_call_id_once(server):
    with _client(server) as client:
        box = client.create_sandbox()
        events = list(client.call_tool(box, "shell", {"command": "echo one; echo two >&2; sleep 0.3; echo three"},
                                       call_id="c-1", fmt="anthropic"))
        outputs = [e for e in events if isinstance(e, OutputEvent)]
        result = events[-1]
        assert isinstance(result, CallResult)
        assert all(isinstance(e, OutputEvent) for e in events[:-1])
        assert [e.seq for e in outputs] == list(range(len(outputs)))
        assert b"".join(e.data for e in outputs if e.stream == "stdout") == b"one\nthree\n"
        assert b"".join(e.data for e in outputs if e.stream == "stderr") == b"two\n"
        assert result.item == {"type": "tool_result", "tool_use_id": "c-1", "content": result.text, "is_error": False}
        assert "Exit code: 0" in result.text and result.structured is not None
        assert result.structured["exit_code"] == 0

        # the same call_id again: the recorded result, nothing runs (no output events)
        again = list(client.call_tool(box, "shell", {"command": "echo one; echo two >&2; sleep 0.3; echo three"},
                                      call_id="c-1", fmt="anthropic"))
        assert len(again) == 1 and again[0] == result
        # a model mistake is a result, not an RPC error
        bad = client.call(box, "shell", '{"command": 5', call_id="c-2")
        assert bad.is_error and bad.error_code == "invalid_json" and bad.item["call_id"] == "c-2"
        unknown = client.call(box, "no_such_tool", {}, call_id="c-3", fmt="mcp")
        assert unknown.item["isError"] is True and unknown.error_code == "unknown_tool"
        # a server-chosen call_id when none is given
        auto = client.call(box, "shell", {"command": "true"})
        assert auto.call_id.startswith("call_") and auto.item["call_id"] == auto.call_id

        run = client.get_run(box)
        assert run.live and [c.call_id for c in run.calls] == ["c-1", "c-2", "c-3", auto.call_id]
        assert run.calls[0].exit_code == 0 and run.calls[0].decision == "allow"
        assert box in [r.run_id for r in client.list_runs()]
        assert client.delete_sandbox(box) == 0
        assert client.get_run(box).end_reason == "deleted" and not client.get_run(box).live


def test_concurrent_clients_each_with_their_own_sandboxes(server):
    errors: list[BaseException] = []
    results: dict[str, list[str]] = {}

    def work(name: str, token: str) -> None:
        try:
            with _client(server, token) as client:
                boxes = [client.create_sandbox() for _ in range(2)]
                results[name] = boxes
                threads = []
                outputs: dict[str, str] = {}

                def one(box: str, index: int) -> None:
                    client.call(box, "shell", {"command": f"echo {name}-{index} > mine.txt"}, call_id=f"w{index}")
                    outputs[box] = client.call(box, "shell", {"command": "cat mine.txt; ls"}, call_id=f"r{index}").text

                for index, box in enumerate(boxes):
                    threads.append(threading.Thread(target=one, args=(box, index)))
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                for index, box in enumerate(boxes):
                    assert f"{name}-{index}" in outputs[box]
                    assert outputs[box].count("mine.txt") == 1  # each sandbox has its own workspace
                listed = {r.run_id for r in client.list_runs()}
                assert set(boxes) <= listed
                for box in boxes:
                    client.delete_sandbox(box)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=("alice", TOKEN_A)),
               threading.Thread(target=work, args=("bob", TOKEN_B))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert set(results["alice"]).isdisjoint(results["bob"])
    with _client(server, TOKEN_A) as alice:
        listed = {r.run_id for r in alice.list_runs()}
        assert set(results["alice"]) <= listed and listed.isdisjoint(results["bob"])


# --- tokens and ownership ---------------------------------------------------------------------------------


def _raw_error(call) -> ExecutorError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.RpcError) as info:
        call()
    return ExecutorError.from_rpc(info.value)


def test_token_checks(server):
    channel = grpc.insecure_channel(server.target)
    stub = executor_pb2_grpc.ExecutorStub(channel)
    try:
        missing = _raw_error(lambda: stub.ListTools(executor_pb2.ListToolsRequest()))
        assert missing.code == grpc.StatusCode.UNAUTHENTICATED and missing.reason == "UNAUTHENTICATED"
        assert "no bearer token" in missing.message
        wrong = _raw_error(lambda: stub.ListTools(executor_pb2.ListToolsRequest(),
                                                  metadata=(("authorization", "Bearer not-a-valid-token-at-all"),)))
        assert wrong.code == grpc.StatusCode.UNAUTHENTICATED and "not valid" in wrong.message
        not_bearer = _raw_error(lambda: stub.ListTools(executor_pb2.ListToolsRequest(),
                                                       metadata=(("authorization", f"Basic {TOKEN_A}"),)))
        assert not_bearer.code == grpc.StatusCode.UNAUTHENTICATED
        # a streaming method is refused the same way, before anything runs
        request = executor_pb2.CallToolRequest(sandbox_id="x", name="shell")
        stream_error = _raw_error(lambda: list(stub.CallTool(request)))
        assert stream_error.code == grpc.StatusCode.UNAUTHENTICATED
    finally:
        channel.close()

    with _client(server, TOKEN_A) as alice, _client(server, TOKEN_B) as bob:
        box = alice.create_sandbox()
        alice.call(box, "shell", {"command": "echo secret > s.txt"}, call_id="a1")
        never = "grpc-20000101T000000-000000000000"
        attempts = {
            "call": lambda sid: bob.call(sid, "shell", {"command": "cat s.txt"}, call_id="b1"),
            "delete": lambda sid: bob.delete_sandbox(sid),
            "list_tools": lambda sid: bob.list_tools("openai", sandbox_id=sid),
            "get_run": lambda sid: bob.get_run(sid),
        }
        for what, attempt in attempts.items():
            with pytest.raises(ExecutorError) as theirs:
                attempt(box)
            with pytest.raises(ExecutorError) as nobodys:
                attempt(never)
            assert theirs.value.code == grpc.StatusCode.NOT_FOUND, what
            assert theirs.value.reason == nobodys.value.reason == "NOT_FOUND"
            assert theirs.value.error_code == nobodys.value.error_code == "not_found", what  # the error table's code
            assert theirs.value.message.replace(box, "ID") == nobodys.value.message.replace(never, "ID"), what
        assert box not in {r.run_id for r in bob.list_runs()}
        # still alive and intact for its owner
        assert "secret" in alice.call(box, "shell", {"command": "cat s.txt"}, call_id="a2").text
        alice.delete_sandbox(box)


# --- cancellation -----------------------------------------------------------------------------------------


def test_an_expired_deadline_kills_the_process_in_the_sandbox(server):
    with _client(server) as client:
        box = client.create_sandbox()
        started = time.monotonic()
        with pytest.raises(ExecutorError) as info:
            client.call(box, "shell", {"command": "sleep 1000", "timeout_ms": 600_000}, call_id="slow", timeout=1)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert time.monotonic() - started < 5
        procs = _wait_until_gone(client, box, "sleep 1000")
        assert not any("sleep 1000" in p for p in procs), procs
        assert any("agent.py" in p for p in procs)  # the sandbox itself lives on
        # the call is recorded as finished, so a retry of the call_id does not run it again
        record = next(c for c in client.get_run(box).calls if c.call_id == "slow")
        assert record.state == "done" and record.is_error


def test_closing_the_stream_early_cancels_the_call(server):
    with _client(server) as client:
        box = client.create_sandbox()
        events = client.call_tool(box, "shell", {"command": "echo started; exec sleep 1001"}, call_id="bg")
        first = next(events)
        assert isinstance(first, OutputEvent) and first.data == b"started\n"
        events.close()  # the client walks away mid-call
        procs = _wait_until_gone(client, box, "sleep 1001")
        assert not any("sleep 1001" in p for p in procs), procs


def test_delete_cancels_running_calls(server):
    with _client(server) as client:
        box = client.create_sandbox()
        outcome: list[object] = []

        def long_call() -> None:
            try:
                outcome.append(client.call(box, "shell", {"command": "sleep 1002"}, call_id="long"))
            except ExecutorError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=long_call)
        thread.start()
        time.sleep(1.0)
        assert client.delete_sandbox(box) == 1
        thread.join(timeout=15)
        assert not thread.is_alive() and outcome
        with pytest.raises(ExecutorError) as gone:
            client.call(box, "shell", {"command": "true"})
        assert gone.value.code == grpc.StatusCode.NOT_FOUND


# --- overrides and limits ---------------------------------------------------------------------------------


def test_overrides_tighten_and_anything_looser_is_denied(engine, server, share):
    with _client(server) as client:
        for options, field in (
            ({"memory": "1g"}, "memory_bytes"),
            ({"cpus": 4.0}, "cpus"),
            ({"pids": 100_000}, "pids"),
            ({"network": "open"}, "network"),
            ({"ttl_seconds": 10**6}, "ttl_seconds"),
            ({"mounts": ["/etc:/data"]}, "mounts[0]"),
            ({"mounts": [f"{share}/../..:/data"]}, "mounts[0]"),
            ({"allowed_tools": ["shell", "launch_missiles"]}, "allowed_tools"),
        ):
            with pytest.raises(ExecutorError) as info:
                client.create_sandbox(**options)  # type: ignore[arg-type]
            assert info.value.code == grpc.StatusCode.PERMISSION_DENIED, options
            assert info.value.reason == "PERMISSION_DENIED" and info.value.message.startswith(field), info.value
        with pytest.raises(ExecutorError) as small:
            client.create_sandbox(memory="1m")
        assert small.value.code == grpc.StatusCode.INVALID_ARGUMENT
        if os.geteuid() == 0:  # the share is root's: the tool user cannot write it
            with pytest.raises(ExecutorError) as unwritable:
                client.create_sandbox(mounts=[f"{share}/project:/data:rw"])
            assert unwritable.value.code == grpc.StatusCode.INVALID_ARGUMENT, unwritable.value
            assert unwritable.value.message.startswith("mounts[0].source: "), unwritable.value
            assert "uid 1000" in unwritable.value.message and "chown" in unwritable.value.message

        info = client.create_sandbox_info(memory="256m", pids=64, ttl_seconds=600, env={"GREETING": "hi-there"},
                                          mounts=[f"{share}/project:/data:ro"], allowed_tools=["shell", "bash"])
        assert (info.memory_bytes, info.pids, info.ttl_seconds) == (256 << 20, 64, 600)
        assert info.tools == ("shell", "bash")
        assert [t["name"] for t in client.list_tools("openai", sandbox_id=info.sandbox_id)] == ["shell", "bash"]
        container = server.service.audit.get_run(info.sandbox_id).meta["container"]
        host_config = engine.client.api.inspect_container(f"callbox-{container}")["HostConfig"]
        assert host_config["Memory"] == 256 << 20
        text = client.call(info.sandbox_id, "shell", {"command": "cat /data/hello.txt; touch /data/x"}).text
        assert "hello from the host" in text and "Read-only file system" in text
        assert "hi-there" in client.call(info.sandbox_id, "bash", {"command": "echo $GREETING"}).text
        denied = client.call(info.sandbox_id, "read_file", {"path": "/data/hello.txt"})
        assert denied.is_error and denied.error_code == "tool_not_allowed"
        client.delete_sandbox(info.sandbox_id)


def test_limits_per_client_and_in_total(engine, short_dir, tmp_path, share):
    server = _start(short_dir, tmp_path, share, max_sandboxes_per_client=1, max_sandboxes_total=2)
    try:
        with _client(server, TOKEN_A) as alice, _client(server, TOKEN_B) as bob, _client(server, TOKEN_C) as carol:
            first = alice.create_sandbox()
            with pytest.raises(ExecutorError) as mine:
                alice.create_sandbox()
            assert mine.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert mine.value.reason == "LIMIT_REACHED" and mine.value.retryable
            assert "'alice' already has 1" in mine.value.message
            bob.create_sandbox()
            with pytest.raises(ExecutorError) as total:
                carol.create_sandbox()
            assert total.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "its limit (2)" in total.value.message
            alice.delete_sandbox(first)
            carol.create_sandbox()  # a slot is free again
    finally:
        server.stop(grace=1)


# --- approvals ----------------------------------------------------------------------------------------------


def test_only_an_operator_resolves_an_approval_and_the_call_then_runs_once(server):
    with _client(server, TOKEN_A) as alice, _client(server, TOKEN_B) as bob, _client(server, TOKEN_OPS) as ops:
        box = alice.create_sandbox()
        args = {"command": "echo approve-me ran"}
        pending = alice.call(box, "shell", args, call_id="ask-1")
        assert pending.is_error and pending.error_code == "approval_pending" and pending.retryable
        assert pending.approval_id and pending.approval_id in pending.text
        for client in (alice, bob):  # a client resolves none, not even its own call's
            with pytest.raises(ExecutorError) as refused:
                client.resolve_approval(pending.approval_id, True)
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
            assert f"callbox approvals approve {pending.approval_id}" in refused.value.message
        assert server.service.audit.get_approval(pending.approval_id).state == "pending"
        approved = ops.resolve_approval(pending.approval_id, True, "looks fine")
        assert approved.state == "approved" and approved.resolved_by == "grpc:ops"
        with pytest.raises(ExecutorError) as twice:
            ops.resolve_approval(pending.approval_id, False)
        assert twice.value.code == grpc.StatusCode.FAILED_PRECONDITION and twice.value.reason == "ALREADY_RESOLVED"
        ran = alice.call(box, "shell", args, call_id="ask-1")
        assert not ran.is_error and "approve-me ran" in ran.text
        assert alice.call(box, "shell", args, call_id="ask-1") == ran  # once
        run = alice.get_run(box)
        assert [a.state for a in run.approvals] == ["consumed"]
        assert ops.get_run(box).run_id == run.run_id  # an operator reads any client's run; bob none
        with pytest.raises(ExecutorError) as hidden:
            bob.get_run(box)
        assert hidden.value.code == grpc.StatusCode.NOT_FOUND
        alice.delete_sandbox(box)


def test_a_missing_image_is_a_clear_failed_precondition(engine, short_dir, tmp_path, share):
    audit = AuditStore(tmp_path / "audit.sqlite3")
    server = serve_grpc(str(short_dir / "x.sock"), tokens=TOKENS, audit=audit, announce=None,
                        policy=parse_policy('[sandbox]\nimage = "callbox-no-such-image:latest"\n'))
    try:
        with _client(server) as client:
            with pytest.raises(ExecutorError) as info:
                client.create_sandbox()
            assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert info.value.reason == "SANDBOX_UNAVAILABLE" and "callbox image build" in info.value.message
            assert server.service.live_sandboxes() == {}
            assert server.service._creating == {}  # the failed attempt holds no slot
            (run,) = client.list_runs()
            assert run.end_reason == "sandbox_start_failed"
    finally:
        server.stop(grace=1)


# --- health, reflection, transports ------------------------------------------------------------------------


class _Bearer(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, token: str) -> None:
        self.token = token

    def _details(self, details):  # type: ignore[no-untyped-def]
        metadata = [*(details.metadata or ()), ("authorization", f"Bearer {self.token}")]
        return details._replace(metadata=metadata) if hasattr(details, "_replace") else _Details(details, metadata)

    def intercept_unary_unary(self, continuation, client_call_details, request):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request)

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):  # type: ignore[no-untyped-def]
        return continuation(self._details(client_call_details), request_iterator)


class _Details(grpc.ClientCallDetails):
    def __init__(self, base, metadata) -> None:  # type: ignore[no-untyped-def]
        self.method = base.method
        self.timeout = base.timeout
        self.metadata = metadata
        self.credentials = base.credentials
        self.wait_for_ready = base.wait_for_ready
        self.compression = base.compression


def test_health_and_reflection_answer(server):
    channel = grpc.insecure_channel(server.target)
    try:
        # health needs no token (probes)
        assert health.check(channel, timeout=5) == health.SERVING
        assert health.check(channel, timeout=5, service="harness.v1.Executor") == health.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        with pytest.raises(grpc.RpcError) as info:
            list(stub.ServerReflectionInfo(iter([request])))
        assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
        responses = list(stub.ServerReflectionInfo(iter([request]), metadata=(("authorization", f"Bearer {TOKEN_A}"),)))
        names = {s.name for s in responses[0].list_services_response.service}
        assert names == {"harness.v1.Executor", "harness.v1.Sandboxes", "harness.v1.Undo", "grpc.health.v1.Health",
                         "grpc.reflection.v1alpha.ServerReflection"}
    finally:
        channel.close()
    authed = grpc.intercept_channel(grpc.insecure_channel(server.target), _Bearer(TOKEN_A))
    try:
        pool = descriptor_pool.DescriptorPool(ProtoReflectionDescriptorDatabase(authed))
        executor = pool.FindServiceByName("harness.v1.Executor")
        assert {m.name for m in executor.methods} == {
            "ListTools", "CreateSandbox", "CallTool", "ResolveApproval", "GetRun", "ListRuns", "DeleteSandbox"}
        assert executor.methods_by_name["CallTool"].output_type.full_name == "harness.v1.CallToolEvent"
        assert pool.FindServiceByName("grpc.health.v1.Health").methods_by_name["Check"]
        assert {m.name for m in pool.FindServiceByName("harness.v1.Undo").methods} == {"DiffRun", "RevertRun"}
    finally:
        authed.close()


def test_tcp_without_tls_is_refused_unless_insecure(engine, short_dir, tmp_path, share):
    with pytest.raises(ServeError, match="without TLS"):
        _start(short_dir, tmp_path, share, addr="127.0.0.1:0")
    server = _start(short_dir, tmp_path, share, addr="127.0.0.1:0", insecure=True)
    try:
        assert server.port and server.target == f"127.0.0.1:{server.port}"
        with _client(server) as client:
            assert client.list_tools("openai")
    finally:
        server.stop(grace=1)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def test_tls(engine, short_dir, tmp_path, share):
    cert, key = _self_signed(tmp_path)
    with pytest.raises(ServeError, match="both"):
        _start(short_dir, tmp_path, share, addr="127.0.0.1:0", tls_cert=cert)
    server = _start(short_dir, tmp_path, share, addr="127.0.0.1:0", tls_cert=cert, tls_key=key)
    try:
        with ExecutorClient(server.target, TOKEN_A, tls_ca=cert) as client:
            box = client.create_sandbox()
            assert "over tls" in client.call(box, "shell", {"command": "echo over tls"}).text
            client.delete_sandbox(box)
        with ExecutorClient(f"localhost:{server.port}", TOKEN_A, tls_ca=cert.read_bytes()) as by_name:
            assert by_name.list_tools("chat")
        with ExecutorClient(server.target, TOKEN_A, timeout=5) as plain, pytest.raises(ExecutorError) as info:
            plain.list_tools()  # a plaintext client cannot talk to the TLS port
        assert info.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        server.stop(grace=1)


# --- lifetime ------------------------------------------------------------------------------------------------


def test_shutdown_destroys_the_sandboxes_it_owns(engine, short_dir, tmp_path, share):
    server = _start(short_dir, tmp_path, share)
    socket_path = Path(server.address.value)
    stopped = False
    try:
        with _client(server, TOKEN_A) as alice, _client(server, TOKEN_B) as bob:
            boxes = [alice.create_sandbox(), alice.create_sandbox(), bob.create_sandbox()]
            alice.call(boxes[0], "shell", {"command": "true"})
        audit = server.service.audit
        containers = {audit.get_run(b).meta["container"] for b in boxes}
        assert containers <= _live_containers(engine)
        assert socket_path.exists() and oct(socket_path.stat().st_mode & 0o777) == "0o600"
        destroyed = server.stop(grace=1)
        stopped = True
        assert sorted(destroyed) == sorted(boxes)
        assert containers.isdisjoint(_live_containers(engine))
        assert not socket_path.exists()
        with AuditStore(tmp_path / "audit.sqlite3") as store:
            assert {store.get_run(b).end_reason for b in boxes} == {"server_shutdown"}
    finally:
        if not stopped:
            server.stop(grace=1)


def test_an_expired_sandbox_is_destroyed(engine, short_dir, tmp_path, share):
    server = _start(short_dir, tmp_path, share)
    try:
        with _client(server) as client:
            box = client.create_sandbox(ttl_seconds=10)
            container = server.service.audit.get_run(box).meta["container"]
            assert server.service.reap_expired(now=time.time() + 11) == [box]
            assert container not in _live_containers(engine)
            assert client.get_run(box).end_reason == "expired"
    finally:
        server.stop(grace=1)


def test_a_second_server_on_the_same_socket_is_refused(server, short_dir, tmp_path, share):
    with pytest.raises(ServeError, match="another server"):
        _start(short_dir, tmp_path, share)


# --- the async client ---------------------------------------------------------------------------------------


def test_async_client_streams(server):
    async def scenario() -> None:
        async with AsyncExecutorClient(server.target, TOKEN_B) as client:
            tools = await client.list_tools("anthropic")
            assert any(t["name"] == "bash" for t in tools)
            box = await client.create_sandbox(memory="256m")
            events = [e async for e in client.call_tool(box, "shell", {"command": "for i in 1 2 3; do echo $i; "
                                                                       "sleep 0.1; done"}, call_id="a1", fmt="chat")]
            assert [e.data for e in events if isinstance(e, OutputEvent)] == [b"1\n", b"2\n", b"3\n"]
            result = events[-1]
            assert isinstance(result, CallResult)
            assert result.item["role"] == "tool" and result.item["tool_call_id"] == "a1"
            seen: list[bytes] = []
            again = await client.call(box, "bash", {"command": "echo async-bash"}, call_id="a2",
                                      on_output=lambda e: seen.append(e.data))
            assert "async-bash" in again.text and b"async-bash" in b"".join(seen)
            with pytest.raises(ExecutorError) as info:
                await client.call(box, "shell", {"command": "sleep 1003"}, call_id="a3", timeout=1)
            assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
            run = await client.get_run(box)
            assert [c.call_id for c in run.calls] == ["a1", "a2", "a3"]
            assert box in {r.run_id for r in await client.list_runs()}
            await client.delete_sandbox(box)
            with pytest.raises(ExecutorError) as gone:
                await client.get_run("nope")
            assert gone.value.reason == "NOT_FOUND"

    asyncio.run(scenario())


# --- a real server process: first start, SIGTERM --------------------------------------------------------------

SERVER_SCRIPT = """
import sys
from harness.doors.grpc.server import serve_grpc
from harness.core.policy import parse_policy
server = serve_grpc(sys.argv[1], policy=parse_policy('[sandbox]\\nimage = "%s"\\n'))
print("ready", flush=True)
server.serve_forever(grace=1)
print("stopped", len(server.destroyed), flush=True)
"""


def test_a_server_process_generates_its_token_and_cleans_up_on_sigterm(engine, short_dir, tmp_path):
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "CALLBOX_AUDIT_DB": str(tmp_path / "a.db")}
    for variable in ("CALLBOX_TOKEN", "CALLBOX_TOKEN_FILE"):
        env.pop(variable, None)
    socket_path = short_dir / "server.sock"
    child = subprocess.Popen([sys.executable, "-c", SERVER_SCRIPT % IMAGE, str(socket_path)], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        token_file = tmp_path / "state" / "callbox" / "grpc-tokens"
        token = re.search(r"^default:(\S+)$", token_file.read_text(), re.M)[1]  # type: ignore[index]
        with ExecutorClient(f"unix:{socket_path}", token) as client:
            box = client.create_sandbox()
            assert "alive" in client.call(box, "shell", {"command": "echo alive"}).text
        with AuditStore(tmp_path / "a.db") as store:
            container = store.get_run(box).meta["container"]
        assert container in _live_containers(engine)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        assert out.strip() == "stopped 1"
        assert str(token_file) in err and token not in err  # where it was written, never the token itself
        assert container not in _live_containers(engine)
        assert not socket_path.exists()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
