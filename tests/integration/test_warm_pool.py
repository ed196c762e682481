"""The warm pool on the real engine: a claim hands over a running, never-used sandbox made the
claimer's (owner, expiry, name: what gc and ``list_sandboxes`` read), never twice; refill
brings the pool back to its floor; a spec that does not match, or a pooled sandbox whose
agent is dead, goes cold; shutdown leaves no container; without a pool nothing changes.

Waits are on the pool's condition (``wait_filled``), never sleeps; the timeouts only bound
a broken run."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker.errors
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.core.sandbox_settings import PoolSettings
from harness.core.shared_engine import SharedEngine
from harness.doors.e2b.boxes import E2bSandboxes
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.tokens import TokenSet
from harness.engine.base import LivingSandbox, PoolEntry
from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.docker.lifetime import read_record
from harness.engine.docker.pool import POOL_OWNER, PREPARE_FAILURES, WarmPool
from harness.engine.spec import SandboxSpec
from harness.tools import registry_for
from tests.conftest import IMAGE
from tests.integration.helpers import container_exists, run

pytestmark = pytest.mark.docker

FILL_TIMEOUT_S = 120.0
SPEC = SandboxSpec(image=IMAGE, memory=128 << 20, ttl_seconds=600)
TOKEN = "token-of-the-pool-test-0123456789"


@pytest.fixture
def pool_engine(engine: DockerEngine) -> Iterator[DockerEngine]:
    """An engine of its own run root (short: sun_path); its pool and sandboxes go afterwards."""
    root = Path(tempfile.mkdtemp(prefix="cbx-pool-", dir="/tmp"))
    own = DockerEngine(engine.client, run_root=root, reap_on_start=False)
    try:
        yield own
    finally:
        if own.pool is not None:
            own.pool.close()
        for info in own.list_sandboxes(stats=False):
            if Path(_socket_dir(own, info.container_id)).parent == root:
                own.remove(info.sandbox_id)
        shutil.rmtree(root, ignore_errors=True)


def _socket_dir(engine: DockerEngine, container_id: str) -> str:
    try:
        found = engine.client.api.inspect_container(container_id)["Config"].get("Labels") or {}
    except docker.errors.NotFound:
        return ""
    return str(found.get(labels.SOCKET_DIR, ""))


def _filled(engine: DockerEngine, specs: list[SandboxSpec], size: int, **settings: object) -> WarmPool:
    pool = engine.enable_pool(specs, size=size, **settings)
    assert pool.wait_filled(FILL_TIMEOUT_S), "the pool did not fill"
    return pool


def test_a_claim_hands_over_a_running_never_used_sandbox_made_the_claimers(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC], 2)
    pooled = set(pool.pooled_ids())
    listed = {i.sandbox_id: i for i in pool_engine.list_sandboxes(stats=False)}
    assert all(listed[i].owner == POOL_OWNER for i in pooled)
    before = time.time()
    first = pool_engine.create(SPEC.model_copy(update={"env": {"GREETING": "hi"}}), owner="grpc:alice", ttl_s=300)
    second = pool_engine.create(SPEC)
    try:
        assert {first.id, second.id} <= pooled and first.id != second.id
        assert pool.claims == 2
        assert first.id not in pool.pooled_ids() and second.id not in pool.pooled_ids()
        result = run(first, ["sh", "-c", 'echo "$GREETING"; ls -A /workspace'], env=first.spec.env)
        assert result.exit_code == 0 and result.stdout.data() == b"hi\n"  # its env, and nothing left in it
        record = read_record(pool_engine.run_root, first.id)
        assert record is not None and record.owner == "grpc:alice" and record.ttl_s == 300
        assert record.expires >= before + 300 and first.expires == record.expires
        assert float((first.socket_dir / "expires").read_text()) >= before + 300 - 1
        listed = {i.sandbox_id: i for i in pool_engine.list_sandboxes(stats=False)}
        assert listed[first.id].owner == "grpc:alice" and listed[first.id].expires == record.expires
        assert listed[second.id].owner == pool_engine.owner.label()  # as a cold create without an owner
        assert first.id not in pool_engine.gc() and second.id not in pool_engine.gc()
        assert container_exists(pool_engine, first.id) and container_exists(pool_engine, second.id)
        # The label expiry (the pooled start) is not what gc goes by: past it, the record still keeps it.
        label_expiry = labels.time_label(
            pool_engine.client.api.inspect_container(first.container_id)["Config"]["Labels"], labels.EXPIRES)
        assert first.id not in pool_engine.gc(now=min(label_expiry + 1, record.expires - 1))
        assert first.id in pool_engine.gc(now=record.expires + 1)  # and it expires like any other
        assert not container_exists(pool_engine, first.id)
    finally:
        first.destroy()
        second.destroy()


def test_refill_brings_the_pool_back_to_its_floor(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC], 2)
    claimed = [pool_engine.create(SPEC) for _ in range(2)]
    try:
        assert pool.claims == 2
        assert pool.wait_filled(FILL_TIMEOUT_S)
        assert pool.pooled(SPEC) == 2
        assert not set(pool.pooled_ids()) & {box.id for box in claimed}
    finally:
        for box in claimed:
            box.destroy()


def test_a_burst_past_the_floor_raises_the_target_up_to_the_ceiling(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC], 1, max=2)
    boxes = [pool_engine.create(SPEC) for _ in range(2)]  # the second finds it empty: cold
    try:
        assert pool.claims == 1 and pool.misses == 1
        assert pool.wait_filled(FILL_TIMEOUT_S)
        assert pool.pooled(SPEC) == 2
    finally:
        for box in boxes:
            box.destroy()


def test_a_spec_that_does_not_match_starts_cold(pool_engine: DockerEngine, tmp_path: Path) -> None:
    pool = _filled(pool_engine, [SPEC], 1)
    pooled = set(pool.pooled_ids())
    others = [SPEC.model_copy(update={"memory": 256 << 20}), SPEC.model_copy(update={"workdir": "/tmp"})]
    boxes: list[Sandbox] = []
    try:
        for other in others:
            boxes.append(pool_engine.create(other))
        assert not {box.id for box in boxes} & pooled
        assert pool.claims == 0 and set(pool.pooled_ids()) == pooled
        assert run(boxes[1], ["pwd"], cwd="/tmp").stdout.data() == b"/tmp\n"
    finally:
        for box in boxes:
            box.destroy()


def test_a_named_create_claims_and_takes_the_name(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC], 1)
    pooled = set(pool.pooled_ids())
    box = pool_engine.create(SPEC, name="t-pooled")
    try:
        assert box.id in pooled and box.name == "t-pooled"
        reopened = pool_engine.open("t-pooled")
        assert reopened.id == box.id
        reopened.agent.close()
        assert run(box, ["true"]).exit_code == 0
    finally:
        pool_engine.remove("t-pooled")


def test_a_pooled_sandbox_whose_agent_died_is_destroyed_and_the_create_goes_cold(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC], 1)
    (dead,) = pool.pooled_ids()
    pool_engine.client.api.kill(f"callbox-{dead}")
    box = pool_engine.create(SPEC)
    try:
        assert box.id != dead and pool.claims == 0
        assert not container_exists(pool_engine, dead)
        assert run(box, ["echo", "cold"]).stdout.data() == b"cold\n"
    finally:
        box.destroy()


def test_shutdown_leaves_no_container(pool_engine: DockerEngine) -> None:
    pool = _filled(pool_engine, [SPEC, SPEC.model_copy(update={"memory": 96 << 20})], 2)
    pooled = pool.pooled_ids()
    assert len(pooled) == 4
    assert sorted(pool.close()) == sorted(pooled)
    assert not any(container_exists(pool_engine, i) for i in pooled)
    assert not any(read_record(pool_engine.run_root, i) for i in pooled)
    assert pool.pooled() == 0
    box = pool_engine.create(SPEC)  # a closed pool: every create is cold
    try:
        assert box.id not in pooled and pool.claims == 0
    finally:
        box.destroy()


def test_the_servers_shared_engine_pools_only_when_the_policy_asks(engine: DockerEngine) -> None:
    root = Path(tempfile.mkdtemp(prefix="cbx-pool-", dir="/tmp"))
    try:
        off = SharedEngine(lambda: DockerEngine(engine.client, run_root=root, reap_on_start=False),
                           pool=PoolSettings(), pool_specs=[SPEC])
        plain = off()
        assert isinstance(plain, DockerEngine) and plain.pool is None
        box = plain.create(SPEC)
        try:
            assert read_record(root, box.id) is None  # exactly as before: no record for a plain create
        finally:
            box.destroy()
        assert off.close() == []

        on = SharedEngine(lambda: DockerEngine(engine.client, run_root=root, reap_on_start=False),
                          pool=PoolSettings(size=1), pool_specs=[SPEC], room=lambda: 1)
        pooled_engine = on()
        assert isinstance(pooled_engine, DockerEngine) and pooled_engine.pool is not None
        assert pooled_engine.pool.wait_filled(FILL_TIMEOUT_S)
        ids = pooled_engine.pool.pooled_ids()
        assert len(ids) == 1
        assert on.close() == ids and not container_exists(pooled_engine, ids[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_room_bounds_what_the_pool_holds(pool_engine: DockerEngine) -> None:
    room = [1]
    pool = pool_engine.enable_pool([SPEC], size=3, room=lambda: room[0])
    assert pool.wait_settled(FILL_TIMEOUT_S)
    assert pool.pooled() == 1  # the floor is 3, but the server's limit leaves room for one
    room[0] = 2
    with pool._lock:
        pool._lock.notify_all()
    assert pool.wait_settled(FILL_TIMEOUT_S)
    assert pool.pooled() in (1, 2)  # never more than room allows


def test_the_grpc_server_claims_from_the_pool_its_policy_asks_for() -> None:
    short = Path(tempfile.mkdtemp(prefix="cbx-pool-", dir="/tmp"))
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\nmemory = "128m"\n\n[pool]\nsize = 1\n')
    server = serve_grpc(str(short / "x.sock"), policy=policy, audit=AuditStore(short / "audit.sqlite3"),
                        announce=None, tokens=TokenSet({"alice": TOKEN}, source="test tokens"))
    pooled: list[str] = []
    try:
        shared = server.service.engine_factory
        assert isinstance(shared, SharedEngine)
        engine = shared()
        assert isinstance(engine, DockerEngine) and engine.pool is not None
        assert engine.pool.wait_filled(FILL_TIMEOUT_S)
        (first,) = engine.pool.pooled_ids()
        with ExecutorClient(server.target, TOKEN) as client:
            box = client.create_sandbox()
            assert client.call(box, "shell", {"command": "echo pooled"}).text.strip().endswith("pooled")
            assert engine.pool.claims == 1
            client.delete_sandbox(box)
        assert engine.pool.wait_filled(FILL_TIMEOUT_S)
        pooled = engine.pool.pooled_ids()
        assert first not in pooled
    finally:
        server.stop(grace=1)
        shutil.rmtree(short, ignore_errors=True)
    assert pooled and not any(container_exists(engine, i) for i in pooled)


def test_the_e2b_door_claims_its_base_template_with_a_timeout_and_envs() -> None:
    short = Path(tempfile.mkdtemp(prefix="cbx-pool-", dir="/tmp"))
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\nmemory = "128m"\n\n[pool]\nsize = 1\n')
    audit = AuditStore(short / "audit.sqlite3")
    executor = ExecutorService(registry=registry_for(policy), policy=policy, audit=audit,
                               tokens=TokenSet({"alice": TOKEN}, source="test tokens"))
    sandboxes = E2bSandboxes(executor)
    pooled: list[str] = []
    engine: DockerEngine | None = None
    try:
        shared = executor.engine_factory
        assert isinstance(shared, SharedEngine) and len(shared.pool_specs) == 2  # the server's and E2B's base
        found = shared()
        assert isinstance(found, DockerEngine) and found.pool is not None
        engine = found
        assert found.pool.wait_filled(FILL_TIMEOUT_S)
        pooled = found.pool.pooled_ids()
        assert len(pooled) == 2
        box = sandboxes.create("alice", overrides=SandboxOverrides(ttl_seconds=60, env={"GREETING": "e2b"}))
        assert box.sandbox_id and found.pool.claims == 1
        sandbox = box.session.harness.active_sandbox
        assert sandbox is not None and sandbox.id in pooled and sandbox.spec.workdir == "/home/user"
        result = run(sandbox, ["sh", "-c", 'echo "$GREETING $HOME"; pwd'], env=sandbox.spec.env,
                     cwd=sandbox.spec.workdir)
        assert result.stdout.data() == b"e2b /home/user\n/home/user\n"
        assert sandbox.expires - time.time() <= 60
    finally:
        executor.shutdown()
        audit.close()
        shutil.rmtree(short, ignore_errors=True)
    assert engine is not None and not any(container_exists(engine, i) for i in pooled)


def test_an_entry_whose_image_is_missing_is_dropped_with_one_warning(pool_engine: DockerEngine,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    missing = SPEC.model_copy(update={"image": "callbox-test/not-on-this-host:none"})
    with caplog.at_level("WARNING", logger="callbox.engine.pool"):
        pool = pool_engine.enable_pool([PoolEntry(missing, 1, 1, label="missing-image")], size=0)
        assert pool.wait_settled(FILL_TIMEOUT_S)  # settled: nothing more to start, so no more warnings
    warnings = [r.getMessage() for r in caplog.records if r.name == "callbox.engine.pool"]
    assert len(warnings) == 1, warnings
    assert "no longer keeps missing-image sandboxes" in warnings[0]
    assert "callbox-test/not-on-this-host:none" in warnings[0]
    assert pool.pooled() == 0


def test_an_entry_added_later_is_prepared_before_it_is_pooled_and_failing_prepares_drop_it(
        pool_engine: DockerEngine) -> None:
    prepared: list[str] = []
    failed: list[str] = []

    def prepare(box: LivingSandbox) -> None:
        assert read_record(pool_engine.run_root, box.id) is None  # not pooled yet
        prepared.append(box.id)

    def refuse(box: LivingSandbox) -> None:
        failed.append(box.id)
        raise RuntimeError("not this one")

    pool = pool_engine.enable_pool([], size=0)
    assert pool.add(PoolEntry(SPEC, 1, 1, prepare=prepare, label="prepared"))
    assert not pool.add(PoolEntry(SPEC, 2, 2, label="again"))  # that fingerprint is pooled already
    assert pool.wait_filled(FILL_TIMEOUT_S)
    assert pool.pooled_ids() == prepared
    assert pool.add(PoolEntry(SPEC.model_copy(update={"memory": 96 << 20}), 1, 1, prepare=refuse, label="refused"))
    assert pool.wait_settled(FILL_TIMEOUT_S)
    assert len(failed) == PREPARE_FAILURES  # then dropped: no fourth try
    assert pool.pooled_ids() == prepared
    assert pool_engine.drain(60)
    assert not any(container_exists(pool_engine, i) for i in failed)
