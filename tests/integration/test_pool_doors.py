"""The warm pool through the doors other than gRPC and E2B, on the real engine: a library
Session, the MCP server over streamable HTTP and over stdio. Through each, a create with a
``[pool]`` policy is a claim (the sandbox handed over is one that was pooled, now with the
claimer's owner and clock), concurrent sessions never get the same sandbox, and when the
door closes no sandbox of it is left, pooled or claimed.

Waits are on the pool's condition (``wait_filled``) where the pool is in this process; the
stdio server is another process, so its pool is watched through the lifetime records it
writes (bounded polling, as for any other process's sandboxes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp import Client

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import Policy, parse_policy
from harness.core.session import Session
from harness.core.shared_engine import SharedEngine, close_pooled_engines, pooled_engine
from harness.doors.mcp.http import serve_mcp_http
from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.lifetime import read_record
from harness.engine.docker.pool import POOL_OWNER, WarmPool
from harness.tools import registry_for
from tests.conftest import IMAGE
from tests.integration.helpers import container_exists

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
FILL_TIMEOUT_S = 120.0
TTL_S = 600
POLICY = f'[sandbox]\nimage = "{IMAGE}"\nmemory = "128m"\nttl_seconds = {TTL_S}\n\n[pool]\nsize = 2\n'


@pytest.fixture
def policy_file(tmp_path: Path) -> Path:
    path = tmp_path / "policy.toml"
    path.write_text(POLICY)
    return path


def _filled(shared: SharedEngine) -> tuple[DockerEngine, WarmPool]:
    engine = shared()  # waits for a connect in progress (the door warms in the background)
    assert isinstance(engine, DockerEngine) and engine.pool is not None
    assert engine.pool.wait_filled(FILL_TIMEOUT_S), "the pool did not fill"
    return engine, engine.pool


def _all_gone(engine: DockerEngine, sandbox_ids: Iterable[str], timeout: float = 60.0) -> bool:
    """Whether none of ``sandbox_ids`` has a container, waiting (bounded) for removals still
    under way (a destroy may remove the container in the background)."""
    ids = list(sandbox_ids)
    deadline = time.monotonic() + timeout
    while any(container_exists(engine, i) for i in ids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _owned_by(engine: DockerEngine, process: str) -> list[str]:
    """The ids of the containers whose owner label is ``process``."""
    found = engine.client.api.containers(all=True, filters={"label": f"{labels.OWNER}={process}"})
    return [c["Labels"][labels.SANDBOX_ID] for c in found]


def _check_claimed(engine: DockerEngine, sandbox_id: str, pooled: set[str], before: float) -> None:
    """``sandbox_id`` was pooled and is now the claimer's: its record no longer says pooled
    and its clock runs from the claim (the container's labels keep the pooled start)."""
    assert sandbox_id in pooled
    record = read_record(engine.run_root, sandbox_id)
    assert record is not None and record.owner != POOL_OWNER
    assert record.ttl_s == TTL_S and record.expires >= before + TTL_S
    found = engine.client.api.inspect_container(f"callbox-{sandbox_id}")["Config"]["Labels"]
    assert labels.time_label(found, labels.CREATED) < before  # started before the claim


# ---- the Python library: Session ---------------------------------------------------------------


def test_library_sessions_with_a_pool_policy_claim_and_leave_nothing(tmp_path: Path) -> None:
    policy = parse_policy(POLICY)
    audit = AuditStore(tmp_path / "audit.sqlite3")
    sessions = [Session(registry_for(policy), policy, audit) for _ in range(2)]
    claimed: list[str] = []
    engine: DockerEngine | None = None
    destroyed: list[str] = []
    try:
        shared = pooled_engine(policy.pool, sessions[0].spec)
        assert pooled_engine(policy.pool, sessions[1].spec) is shared  # one per process and spec
        engine, pool = _filled(shared)
        assert sessions[0].connect_engine() is engine
        pooled = set(pool.pooled_ids())
        assert len(pooled) == 2
        before = time.time()
        results: dict[int, str] = {}

        def first_call(index: int) -> None:
            result = sessions[index].call(ToolCall("shell", {"command": "echo pooled"}, f"c{index}"))
            results[index] = result.text

        threads = [threading.Thread(target=first_call, args=(i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all("pooled" in text for text in results.values()), results
        boxes = [s.active_sandbox for s in sessions]
        claimed = [box.id for box in boxes if box is not None]
        assert len(set(claimed)) == 2 and pool.claims == 2  # both claimed, never the same one
        for sandbox_id in claimed:
            _check_claimed(engine, sandbox_id, pooled, before)
            assert sandbox_id not in pool.pooled_ids()
        for session in sessions:
            session.close()
        assert _all_gone(engine, claimed)
    finally:
        for session in sessions:
            session.close()
        destroyed = close_pooled_engines()
        audit.close()
    assert engine is not None and engine.pool is not None and engine.pool.pooled() == 0
    assert _all_gone(engine, destroyed)
    leftovers = [i for i in engine.list_sandboxes(stats=False)
                 if i.owner == POOL_OWNER and i.process == engine.owner.label()]
    assert leftovers == []


def test_a_session_given_its_own_engine_factory_or_no_pool_does_not_pool(tmp_path: Path) -> None:
    plain = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n')
    audit = AuditStore(tmp_path / "audit.sqlite3")
    try:
        unpooled = Session(registry_for(plain), plain, audit)
        engine = unpooled.connect_engine()
        assert isinstance(engine, DockerEngine) and engine.pool is None
        pooled_policy: Policy = parse_policy(POLICY)
        connects: list[DockerEngine] = []

        def own() -> DockerEngine:
            connects.append(DockerEngine(engine.client, run_root=engine.run_root, reap_on_start=False))
            return connects[-1]

        given = Session(registry_for(pooled_policy), pooled_policy, audit, engine_factory=own)
        assert given.connect_engine().pool is None and len(connects) == 1  # type: ignore[attr-defined]
    finally:
        audit.close()


# ---- the MCP server over streamable HTTP ----------------------------------------------------------


def test_mcp_http_sessions_claim_from_the_servers_pool_and_stop_leaves_nothing(
        tmp_path: Path, policy_file: Path) -> None:
    server = serve_mcp_http("127.0.0.1:0", policy_path=policy_file, audit_path=tmp_path / "audit.sqlite3")
    stopped = False
    engine: DockerEngine | None = None
    seen: list[str] = []
    try:
        assert server.service.engine_factory is server.service.shared_engine  # one for every session
        shared = server.service.shared_engine
        assert isinstance(shared, SharedEngine)
        engine, pool = _filled(shared)
        pooled = set(pool.pooled_ids())
        before = time.time()

        async def one_session(engine: DockerEngine = engine) -> None:
            async with Client(server.url) as client:
                result = await client.call_tool("shell", {"command": "echo pooled"})
                assert result.is_error is False
                sandbox_id = str((result.meta or {})["callbox/sandbox_id"])
                seen.append(sandbox_id)
                await anyio.to_thread.run_sync(_check_claimed, engine, sandbox_id, pooled, before)
                again = await client.call_tool("shell", {"command": "true"})  # the same sandbox after
                assert (again.meta or {})["callbox/sandbox_id"] == sandbox_id

        async def two_sessions() -> None:
            with anyio.fail_after(FILL_TIMEOUT_S):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(one_session)
                    tg.start_soon(one_session)

        anyio.run(two_sessions)
        assert len(set(seen)) == 2 and pool.claims == 2  # both claimed, never the same one
        assert _all_gone(engine, seen)  # the sessions ended (DELETE): theirs went
        server.stop()
        stopped = True
    finally:
        if not stopped:
            server.stop()
    assert engine is not None and engine.pool is not None and engine.pool.pooled() == 0
    assert not [i for i in engine.list_sandboxes(stats=False)
                if i.owner == POOL_OWNER and i.process == engine.owner.label()]


# ---- the MCP server over stdio (`callbox mcp`, a child process) -----------------------------------


class _RawStdio:
    """``callbox mcp`` in a child process, spoken to line by line."""

    def __init__(self, policy: Path, audit: Path) -> None:
        code = ("from pathlib import Path; from harness.doors.mcp.stdio import run_mcp_stdio; "
                f"run_mcp_stdio(policy_path=Path({str(policy)!r}), audit_path=Path({str(audit)!r}))")
        self.proc = subprocess.Popen([sys.executable, "-c", code], cwd=str(ROOT), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        started = psutil.Process(self.proc.pid).create_time()
        self.owner = labels.Owner(socket.gethostname(), self.proc.pid, started).label()

    def send(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps(message) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, request_id: int) -> dict[str, Any]:
        assert self.proc.stdout is not None and self.proc.stderr is not None
        while True:
            line = self.proc.stdout.readline()
            assert line, f"server closed stdout; stderr: {self.proc.stderr.read().decode()}"
            message: dict[str, Any] = json.loads(line)
            if message.get("id") == request_id:
                return message

    def close(self) -> int:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()  # the client's shutdown: the session ends
        try:
            return self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait(timeout=10)


def _pooled_by(engine: DockerEngine, process: str, count: int) -> set[str]:
    """Wait (bounded) until ``process`` holds ``count`` pooled sandboxes; their ids."""
    deadline = time.monotonic() + FILL_TIMEOUT_S
    while True:
        ids = {i.sandbox_id for i in engine.list_sandboxes(stats=False)
               if i.owner == POOL_OWNER and i.process == process and i.state == "running"}
        if len(ids) >= count:
            return ids
        assert time.monotonic() < deadline, f"the stdio server's pool holds {len(ids)} of {count}"
        time.sleep(0.1)


def test_mcp_stdio_claims_from_its_pool_and_exit_leaves_nothing(
        engine: DockerEngine, tmp_path: Path, policy_file: Path) -> None:
    server = _RawStdio(policy_file, tmp_path / "audit.sqlite3")
    try:
        pooled = _pooled_by(engine, server.owner, 2)
        server.send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert server.receive(1)["result"]["serverInfo"]["name"] == "callbox"
        server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        before = time.time()
        server.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "shell", "arguments": {"command": "echo pooled"}}})
        result = server.receive(2)["result"]
        assert result["isError"] is False and "pooled" in result["content"][0]["text"]
        sandbox_id = result["_meta"]["callbox/sandbox_id"]
        _check_claimed(engine, sandbox_id, pooled, before)
        assert server.close() == 0
        assert _owned_by(engine, server.owner) == []  # the claimed one and every pooled one
        assert _all_gone(engine, pooled)
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _no_pool_left() -> Iterator[None]:
    """Whatever a test did, this process's library pools go with it."""
    try:
        yield
    finally:
        close_pooled_engines()
