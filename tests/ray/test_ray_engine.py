"""The Ray engine on a real three-node cluster (tests/ray/cluster.py): placement over the two
worker nodes, the agent through each node's relay, streaming, names and re-attaching from
another process, snapshots that move between nodes, the warm pool."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import time
import uuid
from typing import TYPE_CHECKING

import pytest

from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.integration.test_agent_relay import RANDOM_WITH_DIGEST

if TYPE_CHECKING:
    from harness.engine.ray.engine import RayEngine
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]


def run(box, command: str, **kwargs):  # type: ignore[no-untyped-def]
    return collect(box.agent.exec(["sh", "-c", command], env=box.spec.env, **kwargs))


def node_containers(cluster: RayTestCluster, node: str) -> set[str]:
    client = cluster.docker_client(node)
    try:
        found = client.api.containers(all=True, filters={"label": "callbox.managed=1"})
        return {str(c["Labels"].get("callbox.sandbox-id")) for c in found}
    finally:
        client.close()


def test_sandboxes_spread_over_the_workers_and_answer_with_their_node(ray_engine: RayEngine,
                                                                      ray_cluster: RayTestCluster) -> None:
    boxes = [ray_engine.create(SandboxSpec()) for _ in range(4)]
    try:
        nodes = [box.node for box in boxes]
        assert sorted(nodes) == ["w1", "w1", "w2", "w2"]
        for box in boxes:
            result = run(box, 'echo "$CALLBOX_NODE"; id -u')
            assert result.exit_code == 0
            assert result.stdout.data().decode().split() == [box.node, str(box.tool_uid)]
            assert box.id in node_containers(ray_cluster, box.node)  # on that node's own dockerd
            assert box.id not in node_containers(ray_cluster, "w2" if box.node == "w1" else "w1")
    finally:
        for box in boxes:
            box.destroy()
    assert ray_engine.drain(60)
    for node in ("w1", "w2"):
        assert not {b.id for b in boxes} & node_containers(ray_cluster, node)


def test_placement_affinity_anti_affinity_and_groups(ray_engine: RayEngine) -> None:
    boxes = []
    try:
        pinned = ray_engine.create(SandboxSpec(placement={"nodes": ["w2"]}))
        boxes.append(pinned)
        assert pinned.node == "w2"
        avoided = ray_engine.create(SandboxSpec(placement={"avoid_nodes": ["w1"]}))
        boxes.append(avoided)
        assert avoided.node == "w2"
        group = f"g{uuid.uuid4().hex[:6]}"
        apart = [ray_engine.create(SandboxSpec(placement={"group": group, "apart": True})) for _ in range(2)]
        boxes += apart
        assert sorted(b.node for b in apart) == ["w1", "w2"]
        from harness.engine.placement import NoNodeFits

        with pytest.raises(NoNodeFits, match="already holds a sandbox of group"):
            boxes.append(ray_engine.create(SandboxSpec(placement={"group": group, "apart": True})))
    finally:
        for box in boxes:
            box.destroy()


def test_a_networked_spec_is_refused_before_anything_starts(ray_engine: RayEngine) -> None:
    from harness.engine.spec import SpecError

    before = ray_engine.sandbox_census()[0]
    with pytest.raises(SpecError, match='network = "open" is not available on the Ray engine'):
        ray_engine.create(SandboxSpec(network="open"))
    assert ray_engine.sandbox_census()[0] == before


def test_100_mb_streamed_from_a_remote_sandbox_arrive_byte_for_byte(ray_engine: RayEngine) -> None:
    box = ray_engine.create(SandboxSpec())
    try:
        size = 100 * 1000 * 1000
        digest = hashlib.sha256()
        received = 0
        started = time.perf_counter()
        for event in box.agent.exec(["python3", "-c", RANDOM_WITH_DIGEST, str(size)], output_cap_bytes=2 * size,
                                    timeout_ms=120_000):
            if not event.HasField("output"):
                continue
            if event.output.HasField("stdout"):
                digest.update(event.output.stdout)
                received += len(event.output.stdout)
            elif event.output.HasField("stderr"):
                inside = event.output.stderr.decode().strip()
        seconds = time.perf_counter() - started
        assert received == size
        assert inside == digest.hexdigest()
        print(f"100 MB from node {box.node} in {seconds:.2f} s ({size / seconds / 1e6:.0f} MB/s)")
    finally:
        box.destroy()


def test_deadlines_and_cancellation_reach_the_remote_agent(ray_engine: RayEngine) -> None:
    box = ray_engine.create(SandboxSpec())
    try:
        result = run(box, "sleep 30", timeout_ms=500)
        assert result.timed_out
        assert run(box, "pgrep -x sleep || echo none").stdout.data().decode().strip() == "none"
    finally:
        box.destroy()


def test_a_named_sandbox_is_found_again_from_another_process(ray_engine: RayEngine,
                                                            ray_cluster: RayTestCluster) -> None:
    name = f"ray-{uuid.uuid4().hex[:8]}"
    script = textwrap.dedent(f"""
        import os, sys
        from tests.ray.cluster import RayTestCluster
        from harness.engine.ray.engine import RayEngine
        from harness.engine.ray.settings import RaySettings
        from harness.engine.spec import SandboxSpec
        from harness.engine.exec_result import collect
        settings = RaySettings.model_validate_json(sys.argv[1])
        engine = RayEngine.connect(settings)
        box = engine.create(SandboxSpec(), name={name!r}, ttl_s=600, owner="test:restart")
        collect(box.agent.exec(["sh", "-c", "echo kept > /workspace/note"]))
        print(box.node, box.id)
        engine.close()
    """)
    settings = ray_engine.settings.model_dump_json()
    env = {**os.environ, **ray_cluster.driver_env()}
    done = subprocess.run([sys.executable, "-c", script, settings], capture_output=True, text=True, env=env,
                          timeout=180, cwd=os.getcwd())
    assert done.returncode == 0, done.stderr[-3000:]
    node, sandbox_id = done.stdout.split()[-2:]
    box = ray_engine.open(name)
    try:
        assert (box.id, box.node, box.name, box.owner) == (sandbox_id, node, name, "test:restart")
        assert run(box, "cat /workspace/note").stdout.data().decode() == "kept\n"
        listed = {info.sandbox_id: info for info in ray_engine.list_sandboxes(stats=False)}
        assert listed[sandbox_id].name == name
    finally:
        ray_engine.remove(name)
    assert ray_engine.drain(60)
    assert sandbox_id not in node_containers(ray_cluster, node)


def test_a_snapshot_taken_on_one_node_is_forked_on_the_other(ray_engine: RayEngine) -> None:
    name = f"snap-{uuid.uuid4().hex[:8]}"
    source = ray_engine.create(SandboxSpec(placement={"nodes": ["w1"]}))
    fork = None
    try:
        assert run(source, "mkdir -p /workspace/d && echo from-w1 > /workspace/d/f").exit_code == 0
        info = source.snapshot(name)
        assert info.name == name
        fork = ray_engine.fork(name, from_snapshot=True, node="w2")
        assert fork.node == "w2"
        assert run(fork, "cat /workspace/d/f").stdout.data().decode() == "from-w1\n"
        holders = sorted(h.name for h in ray_engine.snapshot_holders(name))
        assert holders == ["w1", "w2"]
    finally:
        source.destroy()
        if fork is not None:
            fork.destroy()
        ray_engine.remove_snapshot(name)
    assert ray_engine.snapshot_holders(name) == []


def test_a_snapshots_files_spec_and_notes_reach_a_sandbox_on_another_node(ray_engine: RayEngine) -> None:
    """What the gRPC door's fork of a snapshot does: a sandbox of its own spec, wherever it was
    placed, gets the snapshot's files; the door's note travels with the snapshot."""
    name = f"snap-{uuid.uuid4().hex[:8]}"
    source = ray_engine.create(SandboxSpec(placement={"nodes": ["w1"]}, memory=300 << 20))
    target = None
    try:
        assert run(source, "echo from-w1 > /workspace/f && ln -s f /workspace/link").exit_code == 0
        source.snapshot(name)
        ray_engine.write_snapshot_note(name, "door.json", b'{"source": "w1"}')
        assert ray_engine.snapshot_spec(name).memory == 300 << 20
        target = ray_engine.create(SandboxSpec(placement={"nodes": ["w2"]}))
        ray_engine.restore_snapshot_files(target, name)
        assert run(target, "cat /workspace/link").stdout.data().decode() == "from-w1\n"
        assert sorted(h.name for h in ray_engine.snapshot_holders(name)) == ["w1", "w2"]
        assert ray_engine.snapshot_note(name, "door.json") == b'{"source": "w1"}'
        assert ray_engine.snapshot_note(name, "other.json") is None
    finally:
        source.destroy()
        if target is not None:
            target.destroy()
        ray_engine.remove_snapshot(name)
    assert ray_engine.snapshot_holders(name) == []


def test_pause_resume_keep_alive_and_stats_on_a_remote_sandbox(ray_engine: RayEngine) -> None:
    box = ray_engine.create(SandboxSpec(), ttl_s=300, owner="test:life")
    try:
        box.pause()
        assert box.paused
        expires = box.resume()
        assert not box.paused and expires > time.time()
        assert box.keep_alive(900) > time.time() + 800
        assert run(box, "echo alive").stdout.data().decode() == "alive\n"
        stats = box.stats()
        assert stats.memory_bytes is None or stats.memory_bytes > 0
    finally:
        box.destroy()


def test_a_warm_pool_on_every_node_is_claimed_by_creates(ray_engine: RayEngine) -> None:
    ray_engine.enable_pool([SandboxSpec()], size=1)
    box = None
    try:
        deadline = time.monotonic() + 120
        while ray_engine.pooled_count() < 2:  # one pooled sandbox per node
            assert time.monotonic() < deadline, f"pooled: {ray_engine.pooled_count()}"
            time.sleep(0.2)
        started = time.perf_counter()
        box = ray_engine.create(SandboxSpec())
        claimed_in = time.perf_counter() - started
        assert run(box, "echo warm").stdout.data() == b"warm\n"
        assert claimed_in < 0.3, f"a claim took {claimed_in * 1000:.0f} ms (a cold create takes about 400)"
    finally:
        if box is not None:
            box.destroy()
        ray_engine.disable_pool()
    assert ray_engine.pooled_count() == 0
