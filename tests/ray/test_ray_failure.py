"""Failure is data on the Ray engine: a node that dies mid-call, a host that restarts, a node that
comes back, a node whose image went stale. On the real three-node cluster."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from tests.ray.test_ray_engine import node_containers, run

if TYPE_CHECKING:
    from harness.engine.ray.engine import RayEngine
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]


def wait_for(what: str, ready: Callable[[], bool], within: float) -> float:
    """Poll ``ready`` (a cluster state, which has no event to wait on) until it holds; seconds taken."""
    started = time.monotonic()
    while not ready():
        if time.monotonic() - started > within:
            raise AssertionError(f"{what}: not within {within:.0f} s")
        time.sleep(0.1)
    return time.monotonic() - started


def live_nodes(engine: RayEngine) -> list[str]:
    return sorted(host.name for host in engine.nodes())


def test_a_node_killed_mid_call_is_reported_lost_and_its_call_is_never_run_again(
        ray_engine: RayEngine, ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    policy = parse_policy('[sandbox.placement]\nnodes = ["w1"]\n')
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        session = Session(builtin_registry(), policy, audit, run_id="lost-node", engine_factory=lambda: ray_engine)
        started = threading.Event()
        results: list[ToolResult] = []
        caller = threading.Thread(target=lambda: results.append(session.call(
            ToolCall("shell", {"command": "echo started; sleep 120; echo never"}, "c1"),
            on_output=lambda _s, data: started.set() if b"started" in data else None)))
        caller.start()
        assert started.wait(120)
        box = session.active_sandbox
        assert box is not None and box.node == "w1"
        killed_at = time.monotonic()
        ray_cluster.kill_raylet("w1")
        caller.join(30)
        took = time.monotonic() - killed_at
        (result,) = results
        assert took < 10, f"the call ended {took:.1f} s after its node died"
        assert (result.is_error, result.error) == (True, ErrorCode.SANDBOX_UNAVAILABLE), result.text
        assert "sandbox lost with its node w1" in result.text
        assert result.structured is not None
        assert result.structured["outcome"] == "unknown" and result.structured["command_started"] is True
        recorded = audit.get_call("lost-node", "c1")
        assert recorded is not None and recorded.result is not None
        assert recorded.result.structured is not None and recorded.result.structured["outcome"] == "unknown"
        again = session.call(ToolCall("shell", {"command": "echo started; sleep 120; echo never"}, "c1"))
        assert again.text == result.text  # the ledger's answer: the call is not run a second time
        lost_id = box.id
        session.close()

    wait_for("w1 left out of placement", lambda: live_nodes(ray_engine) == ["w2"], 10)
    survivors = [ray_engine.create(SandboxSpec()) for _ in range(2)]
    try:
        assert [b.node for b in survivors] == ["w2", "w2"]
        assert all(run(b, "echo ok").exit_code == 0 for b in survivors)
    finally:
        for survivor in survivors:
            survivor.destroy()

    ray_cluster.restart_node("w1")
    wait_for("w1 back in placement", lambda: live_nodes(ray_engine) == ["w1", "w2"], 120)
    assert ray_engine.drain(60)
    assert lost_id not in node_containers(ray_cluster, "w1")  # its host reaped what its earlier life left
    back = ray_engine.create(SandboxSpec(placement={"nodes": ["w1"]}))
    try:
        assert run(back, "echo back").stdout.data() == b"back\n"
    finally:
        back.destroy()


def test_a_host_that_restarts_readopts_its_sandboxes(ray_engine: RayEngine) -> None:
    import ray

    box = ray_engine.create(SandboxSpec(placement={"nodes": ["w2"]}))
    try:
        assert run(box, "echo before > /workspace/f").exit_code == 0
        ray.kill(box.host.handle, no_restart=False)  # the host's process dies; Ray starts it again

        def answers() -> bool:
            try:
                return collect(box.agent.exec(["cat", "/workspace/f"])).stdout.data() == b"before\n"
            except Exception:
                return False

        wait_for("the sandbox answering through the restarted host", answers, 60)
        info = ray_engine.hosts.update(box.host)
        assert info.readopted >= 1 and box.id in info.sandbox_ids
    finally:
        box.destroy()


ORPHAN_DRIVER = textwrap.dedent("""
    import sys, time
    from harness.engine.ray.engine import RayEngine
    from harness.engine.ray.settings import RaySettings
    from harness.engine.spec import SandboxSpec
    engine = RayEngine.connect(RaySettings.model_validate_json(sys.argv[1]))
    unnamed = engine.create(SandboxSpec(), ttl_s=600)
    named = engine.create(SandboxSpec(), name=sys.argv[2], ttl_s=600)
    kept = engine.create(SandboxSpec(), ttl_s=600)
    engine.keep(kept, run_id="orphan-test")
    for box in (unnamed, named, kept):
        print(box.id, box.node, flush=True)
    time.sleep(600)
""")


def test_a_dead_drivers_unnamed_sandboxes_are_reaped_and_its_named_and_kept_ones_stay(
        ray_engine: RayEngine, ray_cluster: RayTestCluster) -> None:
    name = f"orphan-{uuid.uuid4().hex[:8]}"
    driver = subprocess.Popen([sys.executable, "-c", ORPHAN_DRIVER, ray_engine.settings.model_dump_json(), name],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env={**os.environ, **ray_cluster.driver_env()}, cwd=os.getcwd())
    made: list[tuple[str, str]] = []
    try:
        assert driver.stdout is not None
        for _ in range(3):
            line = driver.stdout.readline()
            assert line, f"the driver exited early (status {driver.wait()})"
            sandbox_id, node = line.split()
            made.append((sandbox_id, node))
        (unnamed, unnamed_node), (named, named_node), (kept, kept_node) = made
        os.kill(driver.pid, signal.SIGKILL)  # no chance to destroy anything
        driver.wait(30)

        def reaped() -> bool:
            ray_engine.gc()
            return unnamed not in node_containers(ray_cluster, unnamed_node)

        wait_for("the dead driver's unnamed sandbox removed by its node's gc", reaped, 60)
        assert named in node_containers(ray_cluster, named_node)
        assert kept in node_containers(ray_cluster, kept_node)
        assert ray_engine.open(name).id == named
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
        if len(made) > 1:
            ray_engine.remove(made[1][0])  # the named one
        if len(made) > 2:
            ray_engine.destroy(made[2][0])  # the kept one


def _junk_image(client) -> str:  # type: ignore[no-untyped-def]
    """A one-file image, tagged as the sandbox image on a node (what a stale node looks like)."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w") as tar:
        info = tarfile.TarInfo("stale")
        payload = b"not the sandbox image\n"
        info.size = len(payload)
        tar.addfile(info, io.BytesIO(payload))
    found = client.api.import_image_from_data(data.getvalue(), repository="callbox-sandbox", tag="latest")
    return str(found)


def test_a_stale_image_on_one_node_is_detected_and_replaced(ray_engine: RayEngine,
                                                           ray_cluster: RayTestCluster) -> None:
    from harness.engine.docker.client import connect_client

    local = connect_client().images.get(ray_engine.settings.image).id
    client = ray_cluster.docker_client("w2")
    try:
        _junk_image(client)
        assert client.images.get("callbox-sandbox:latest").id != local
        assert ray_engine.sync_images() == {"w1": "current", "w2": "loaded"}
        assert client.images.get("callbox-sandbox:latest").id == local
        assert ray_engine.image_status() == {"w1": local, "w2": local}
    finally:
        client.close()
    box = ray_engine.create(SandboxSpec(placement={"nodes": ["w2"]}))
    try:
        assert run(box, "echo fine").exit_code == 0
    finally:
        box.destroy()
