"""Per-client quotas, fair shares and profile policies in every door, on the real engine.

Two (or three) clients on one server: the one at its quota is refused with the door's error
naming the quota and when it frees up (gRPC RESOURCE_EXHAUSTED with the retry time in its
trailer, E2B 429 with ``Retry-After``, an MCP result with ``isError``) while the other's
creates and calls go through at the same time; a client flooding the gRPC door from many
threads with long calls may go past its share of the server's threads only while a share
stays free (work-conserving), so another client's calls all complete; a client mapped to a
profile that denies ``shell`` is served that policy. The MCP door over HTTP asks for a
bearer token when the server has tokens (401).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import grpc
import httpx
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from harness.audit.store import AuditStore
from harness.client import ExecutorClient, ExecutorError
from harness.core.policy import parse_policy
from harness.doors.e2b.boxes import E2bSandboxes
from harness.doors.e2b.connect import envelope
from harness.doors.e2b.server import serve_e2b
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.tokens import TokenSet
from harness.doors.mcp.http import serve_mcp_http
from harness.doors.quota_ledger import QuotaKeeper
from harness.doors.quotas import Quotas
from harness.engine.docker.engine import DockerEngine
from harness.telemetry import metrics
from harness.tools import registry_for
from harness.v1 import executor_pb2
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdefgh"
CAROL = "carol-token-0123456789abcdef"
TOKENS = TokenSet({"alice": ALICE, "bob": BOB, "carol": CAROL}, source="test tokens")
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "256m"
""")
NO_SHELL = POLICY + textwrap.dedent("""
    [tools.shell]
    decision = "deny"
""")
FLOODERS = 12
MAX_WORKERS = 8
"""The flood test's gRPC threads: a client's share is 2 of them, and a client alone may hold
up to 6 (all but one share, kept free for the others)."""
LONE_MAX = MAX_WORKERS - 2


def refusals(client: str, quota: str, door: str) -> float:
    return metrics.REGISTRY.get_sample_value("callbox_quota_refusals_total",
                                             {"client": client, "quota": quota, "door": door}) or 0.0


@pytest.fixture
def short_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="cbx-q-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _grpc(short_dir: Path, quotas: QuotaKeeper, **options: Any) -> GrpcServer:
    audit = AuditStore(short_dir / "audit.sqlite3")
    default, no_shell = parse_policy(POLICY), parse_policy(NO_SHELL)
    return serve_grpc(str(short_dir / "x.sock"), policy=default, audit=audit, tokens=TOKENS, announce=None,
                      quotas=quotas, policies=lambda client: no_shell if client == "bob" else default, **options)


# ---- gRPC -------------------------------------------------------------------------------------------


def test_grpc_quotas_refuse_one_client_while_the_other_goes_on(engine: Any, short_dir: Path) -> None:
    alice_quotas = Quotas(live_sandboxes=1, calls_per_minute=3)
    keeper = QuotaKeeper(lambda client: alice_quotas if client == "alice" else Quotas(live_sandboxes=4))
    server = _grpc(short_dir, keeper)
    try:
        with ExecutorClient(server.target, ALICE) as alice, ExecutorClient(server.target, BOB) as bob:
            mine = alice.create_sandbox()
            before = refusals("alice", "live_sandboxes", "grpc")
            with pytest.raises(ExecutorError) as refused:
                alice.create_sandbox()
            error = refused.value
            assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.reason == "LIMIT_REACHED"
            assert "live_sandboxes" in error.message and "when one of its sandboxes ends" in error.message
            assert error.retryable
            assert refusals("alice", "live_sandboxes", "grpc") == before + 1
            theirs = [bob.create_sandbox(), bob.create_sandbox()]  # bob's creates go through meanwhile

            for n in range(3):  # alice's policy (the server's) runs shell
                ran = alice.call(mine, "shell", {"command": f"echo out-{n}"})
                assert not ran.is_error and f"out-{n}" in ran.text
            with pytest.raises(ExecutorError) as refused:
                alice.call(mine, "shell", {"command": "echo over"})
            assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "calls_per_minute" in refused.value.message and "frees up in" in refused.value.message
            # The retry time is in the trailer gRPC's retry policy reads.
            stream = alice.stub.CallTool(executor_pb2.CallToolRequest(sandbox_id=mine, name="shell",
                                                                arguments_json='{"command": "true"}'),
                                   metadata=(("authorization", f"Bearer {ALICE}"),))
            with pytest.raises(grpc.RpcError) as raw:
                list(stream)
            pushback = dict(raw.value.trailing_metadata() or ())["grpc-retry-pushback-ms"]
            assert 0 < int(pushback) <= 60_000

            # bob's profile denies shell: his shell call is denied (a result), his bash calls run.
            denied = bob.call(theirs[0], "shell", {"command": "echo hi"})
            assert denied.is_error and denied.error_code == "denied"
            assert "hello" in bob.call(theirs[0], "bash", {"command": "echo hello"}).text

            alice.delete_sandbox(mine)  # its place frees up
            alice.delete_sandbox(alice.create_sandbox())
            assert keeper.usage("alice").live_sandboxes == 0
            assert keeper.usage("bob").live_sandboxes == 2
    finally:
        server.stop(grace=1)
    assert keeper.usage("bob").live_sandboxes == 0


def test_grpc_flood_of_one_client_leaves_the_threads_to_another(engine: Any, short_dir: Path) -> None:
    keeper = QuotaKeeper()
    server = _grpc(short_dir, keeper, max_workers=MAX_WORKERS)
    stop = threading.Event()
    refused: list[str] = []
    lock = threading.Lock()
    try:
        with ExecutorClient(server.target, CAROL) as carol, ExecutorClient(server.target, ALICE) as alice:
            box = carol.create_sandbox()

            def flood() -> None:
                while not stop.is_set():
                    try:
                        carol.call(box, "shell", {"command": "sleep 120", "timeout_ms": 150_000})
                    except ExecutorError as error:
                        with lock:
                            refused.append(error.message)
                        if error.code != grpc.StatusCode.RESOURCE_EXHAUSTED:
                            return  # the sandbox went at the end
                        stop.wait(0.05)

            threads = [threading.Thread(target=flood, daemon=True) for _ in range(FLOODERS)]
            for thread in threads:
                thread.start()
            while True:  # carol holds all but a share and the next ones are refused (or, unbounded, every thread)
                with lock:
                    if any("concurrent_calls" in m for m in refused):
                        break
                if keeper.usage("carol").in_flight.get("grpc", 0) >= MAX_WORKERS:
                    break
                stop.wait(0.05)
            mine = alice.create_sandbox(timeout=60)
            # Without a share kept free carol's 12 sleeping calls would hold all 8 threads and
            # these would wait 120 s, past their deadline.
            results = [alice.call(mine, "shell", {"command": f"echo alice-{n}"}, timeout=60) for n in range(6)]
            assert all(not r.is_error and f"alice-{n}" in r.text for n, r in enumerate(results))
            assert 2 < keeper.usage("carol").in_flight.get("grpc", 0) <= LONE_MAX  # past her share, not all
            stop.set()
            carol.delete_sandbox(box)  # cancels her sleeping calls
            for thread in threads:
                thread.join(30)
            assert not any(thread.is_alive() for thread in threads)
    finally:
        stop.set()
        server.stop(grace=1)
    assert all("concurrent_calls" in m or "sandbox" in m for m in refused)
    assert keeper.usage("carol").in_flight == {}


# ---- E2B ----------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _e2b(engine: Any, keeper: QuotaKeeper, **options: Any) -> Iterator[str]:
    state = Path(tempfile.mkdtemp(prefix="cbx-q-e2b-"))
    docker_engine = DockerEngine(engine.client, reap_on_start=False, snapshot_dir=state / "snapshots")
    audit = AuditStore(state / "audit.sqlite3")
    policy = parse_policy(POLICY)
    executor = ExecutorService(registry=registry_for(policy), policy=policy, audit=audit, tokens=TOKENS,
                               engine_factory=lambda: docker_engine, quotas=keeper)
    server = serve_e2b("127.0.0.1:0", sandboxes=E2bSandboxes(executor), announce=None, **options)
    try:
        yield server.url
    finally:
        server.stop()
        executor.shutdown()
        audit.close()
        shutil.rmtree(state, ignore_errors=True)


def _start(http: httpx.Client, url: str, created: dict[str, Any], command: str) -> httpx.Response:
    """envd's process.Process/Start as the e2b SDK sends it (Connect, JSON), read to the end."""
    body = json.dumps({"process": {"cmd": "/bin/bash", "args": ["-l", "-c", command]}}).encode()
    return http.post(f"{url}/process.Process/Start", content=envelope(body), headers={
        "content-type": "application/connect+json", "connect-protocol-version": "1",
        "e2b-sandbox-id": created["sandboxID"], "x-access-token": created["envdAccessToken"]})


def test_e2b_door_answers_429_with_retry_after_naming_the_quota(engine: Any) -> None:
    keeper = QuotaKeeper(lambda client: Quotas(live_sandboxes=1, calls_per_minute=1) if client == "alice"
                         else Quotas())
    with _e2b(engine, keeper) as url, httpx.Client(timeout=60) as http:
        def create(key: str) -> httpx.Response:
            return http.post(f"{url}/sandboxes", json={"templateID": "base", "timeout": 300},
                             headers={"x-api-key": key})

        first = create(ALICE)
        assert first.status_code == 201, first.text
        over = create(ALICE)
        assert over.status_code == 429
        assert int(over.headers["retry-after"]) >= 1
        assert over.json()["code"] == 429 and "live_sandboxes" in over.json()["message"]
        other = create(BOB)  # bob is not held back
        assert other.status_code == 201, other.text

        ran = _start(http, url, first.json(), "echo started")
        assert ran.status_code == 200 and b'"end"' in ran.content and b'"error"' not in ran.content
        again = _start(http, url, first.json(), "echo again")
        assert again.status_code == 429
        assert 1 <= int(again.headers["retry-after"]) <= 60
        assert again.json()["code"] == "resource_exhausted" and "calls_per_minute" in again.json()["message"]
        assert _start(http, url, other.json(), "echo bob").status_code == 200


def test_e2b_door_streams_of_one_client_leave_a_share_to_others(engine: Any) -> None:
    keeper = QuotaKeeper()
    with _e2b(engine, keeper, workers=MAX_WORKERS) as url, httpx.Client(timeout=60) as http:
        created = http.post(f"{url}/sandboxes", json={"timeout": 300}, headers={"x-api-key": CAROL})
        assert created.status_code == 201, created.text
        box = created.json()
        streams: list[httpx.Response] = []

        def follow() -> None:  # a Start stream that lasts until the sandbox is killed
            streams.append(_start(http, url, box, "sleep 120"))

        # Alone, carol goes past her share (2) up to all but one share of the workers (6).
        threads = [threading.Thread(target=follow, daemon=True) for _ in range(LONE_MAX)]
        for thread in threads:
            thread.start()
        while keeper.usage("carol").in_flight.get("e2b", 0) < LONE_MAX:
            threading.Event().wait(0.05)
        one_more = _start(http, url, box, "echo one-more")
        assert one_more.status_code == 429 and "concurrent_calls" in one_more.json()["message"]
        assert int(one_more.headers["retry-after"]) >= 1
        other = http.post(f"{url}/sandboxes", json={"timeout": 300}, headers={"x-api-key": BOB})
        assert other.status_code == 201  # another client is served meanwhile
        assert _start(http, url, other.json(), "echo bob").status_code == 200
        # Quick requests are not held back: carol at her limit still kills her sandbox.
        killed = http.delete(f"{url}/sandboxes/{box['sandboxID']}", headers={"x-api-key": CAROL})
        assert killed.status_code == 204, killed.text
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads) and len(streams) == LONE_MAX
    assert keeper.usage("carol").in_flight == {}


# ---- MCP over HTTP ------------------------------------------------------------------------------------


def test_mcp_http_door_needs_a_token_and_answers_quotas_with_an_error_result(engine: Any, tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text(POLICY)
    limits = {"alice": Quotas(calls_per_minute=2), "carol": Quotas(live_sandboxes=1)}
    keeper = QuotaKeeper(lambda client: limits.get(client, Quotas()))
    server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=tmp_path / "audit.sqlite3",
                            tokens=TOKENS, quotas=keeper)
    try:
        with httpx.Client(timeout=30) as http:
            hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}
            headers = {"accept": "application/json, text/event-stream"}
            missing = http.post(server.url, json=hello, headers=headers)
            assert missing.status_code == 401 and missing.headers["www-authenticate"].startswith("Bearer")
            assert "Authorization: Bearer" in missing.json()["message"]
            wrong = http.post(server.url, json=hello, headers={**headers, "authorization": "Bearer nope"})
            assert wrong.status_code == 401 and "not valid" in wrong.json()["message"]

        def session(token: str) -> Client:
            transport = streamable_http_client(
                server.url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"}))
            return Client(transport)

        async def flow() -> tuple[list[Any], list[Any], list[Any]]:
            with anyio.fail_after(120):
                async with session(ALICE) as alice, session(BOB) as bob:
                    mine = [await alice.call_tool("shell", {"command": f"echo a{n}"}) for n in range(3)]
                    theirs = [await bob.call_tool("shell", {"command": f"echo b{n}"}) for n in range(3)]
                async with session(CAROL) as first, session(CAROL) as second:
                    hers = [await first.call_tool("shell", {"command": "echo c1"}),
                            await second.call_tool("shell", {"command": "echo c2"})]  # a second sandbox
                return mine, theirs, hers

        mine, theirs, hers = anyio.run(flow)
        text = ["".join(getattr(b, "text", "") for b in r.content) for r in mine]
        assert not mine[0].is_error and not mine[1].is_error and "a1" in text[1]
        assert mine[2].is_error and "calls_per_minute" in text[2] and "frees up in" in text[2]
        assert mine[2].meta["callbox/quota"] == "calls_per_minute"
        assert all(not r.is_error for r in theirs)
        second = "".join(getattr(b, "text", "") for b in hers[1].content)
        assert not hers[0].is_error and hers[1].is_error and "live_sandboxes" in second
        assert "when one of its sandboxes ends" in second
        ended = threading.Event()  # her sessions end (the server closes them as the client leaves)
        for _ in range(600):
            if keeper.usage("carol").live_sandboxes == 0:
                break
            ended.wait(0.05)
        assert keeper.usage("carol").live_sandboxes == 0
    finally:
        server.stop()
    assert [keeper.usage(c).live_sandboxes for c in ("alice", "bob", "carol")] == [0, 0, 0]
