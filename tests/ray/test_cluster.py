"""The Ray test cluster itself, checked against the real thing: its nodes and their settings,
the workers' own dockerds, the isolation of their namespaces, token authentication, and the
failure control the engine's tests rely on."""

from __future__ import annotations

import os
import secrets
import stat
import subprocess
import sys
import time
from typing import Any

import pytest

from tests.conftest import IMAGE, unavailable
from tests.ray.cluster import RayTestCluster
from tests.ray.layout import NETWORK, WORKERS, Worker

DETECT_DEADLINE_S = 10.0


def in_namespace(worker: Worker, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net={worker.netns_path}", "--", *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_the_workers_are_alive_with_their_resources_and_the_head_holds_no_sandbox(ray_cluster: RayTestCluster) -> None:
    for worker in WORKERS:
        resources = ray_cluster.node_resources(worker.name)
        assert resources.get("callbox_sandboxes") == 8, resources
        assert resources.get("CPU") == 2, resources
    head = ray_cluster.node_resources("head")
    assert head and "callbox_sandboxes" not in head, head


NODE_FACTS = """
import os, harness
from pathlib import Path
def facts():
    import ray
    return {"env": {k: os.environ.get(k) for k in
                    ("CALLBOX_NODE_NAME", "DOCKER_HOST", "CALLBOX_RUN_ROOT", "CALLBOX_STATE_DIR")},
            "ip": ray.util.get_node_ip_address(), "netns": os.stat("/proc/self/ns/net").st_ino,
            "harness": harness.__file__}
"""


def test_tasks_on_each_worker_see_its_settings_namespace_and_the_harness_package(
        ray_cluster: RayTestCluster, ray_driver: Any) -> None:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    import harness

    scope: dict[str, Any] = {}
    exec(NODE_FACTS, scope)  # defined here so the workers run it by value, not by importing tests
    facts = ray_driver.remote(scope["facts"])
    for worker in WORKERS:
        node_id = ray_cluster.node_id(worker.name)
        assert node_id is not None, f"{worker.name} is not alive"
        pinned = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
        seen = ray_driver.get(facts.options(scheduling_strategy=pinned, num_cpus=0).remote(), timeout=120)
        assert seen["env"] == worker.node_env()
        assert seen["ip"] == worker.ip
        assert seen["netns"] == worker.netns_path.stat().st_ino  # its process runs in the worker's namespace
        assert seen["harness"] == harness.__file__  # the workers import this checkout's harness


def test_each_worker_has_its_own_dockerd_in_its_namespace_apart_from_the_main_one(
        ray_cluster: RayTestCluster) -> None:
    import docker

    try:
        main = docker.from_env(timeout=30)
        main_root = main.info()["DockerRootDir"]
        main.close()
    except docker.errors.DockerException as exc:
        unavailable(f"no main Docker engine to compare with: {exc}")
    # Not info()["ID"]: dockerd 20.10 derives it from /etc/docker/key.json, which all share.
    roots = {main_root}
    for worker in WORKERS:
        client = ray_cluster.docker_client(worker.name)
        try:
            info = client.info()
        finally:
            client.close()
        assert info["DockerRootDir"] == str(worker.data_root) and info["DockerRootDir"] not in roots
        roots.add(info["DockerRootDir"])
        pid = int(worker.dockerd_pidfile.read_text())
        assert os.stat(f"/proc/{pid}/ns/net").st_ino == worker.netns_path.stat().st_ino
        assert os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
        children = subprocess.run(["ps", "-o", "args=", "--ppid", str(pid)], capture_output=True, text=True,
                                  check=True).stdout
        # Its own containerd, under its own exec root: the main dockerd's restarts never reach it.
        assert f"--config {worker.exec_root}/containerd/containerd.toml" in children, children


def test_a_loaded_image_runs_on_its_worker_in_the_workers_cgroup_and_nowhere_else(
        ray_cluster: RayTestCluster) -> None:
    import docker

    one, other = WORKERS
    client, other_client = ray_cluster.docker_client(one.name), ray_cluster.docker_client(other.name)
    had_image = bool(other_client.images.list(name=IMAGE))
    one_had_image = bool(client.images.list(name=IMAGE))  # the session's engine may have sent it already
    try:
        ray_cluster.load_image(one.name, IMAGE)
        output = client.containers.run(IMAGE, ["/proc/self/cgroup"], entrypoint=["cat"], network_mode="none",
                                       remove=True)
        assert f"/{one.cgroup_parent}/" in output.decode(), output
        if not had_image:
            with pytest.raises(docker.errors.ImageNotFound):
                other_client.images.get(IMAGE)
    finally:
        if not one_had_image:
            client.images.remove(IMAGE, force=True)  # as the test found it
        client.close()
        other_client.close()


def test_nothing_outside_the_cluster_network_is_routable_from_a_worker(ray_cluster: RayTestCluster) -> None:
    one, other = WORKERS
    routes = in_namespace(one, "ip", "-4", "route", "show").stdout.splitlines()
    assert [r.split()[0] for r in routes] == [NETWORK], routes  # no default route
    for outside in ("1.1.1.1", "8.8.8.8", "169.254.169.254", "172.17.0.1"):
        probe = in_namespace(one, "ip", "route", "get", outside)
        assert probe.returncode != 0 and "unreachable" in probe.stderr, (outside, probe)
    assert in_namespace(one, "ip", "-6", "route", "get", "2001:4860:4860::8888").returncode != 0
    # The host's own addresses other than the bridge's are outside too, even where a port of
    # the head listens on every address (the GCS).
    host_addresses = [line.split()[3].split("/")[0] for line in subprocess.run(
        ["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True, check=True,
    ).stdout.splitlines() if line.split()[1] != "cbray0"]
    connect = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)"
               "\n    print('connected')\nexcept OSError as exc:\n    print(type(exc).__name__, exc.errno)")
    for address in host_addresses:
        outcome = in_namespace(one, sys.executable, "-c", connect, address, "6379").stdout.strip()
        assert outcome != "connected", (address, outcome)
    assert in_namespace(one, sys.executable, "-c", connect, ray_cluster.node_ip, "6379").stdout.strip() == "connected"
    # The workers reach each other across the bridge (Ray moves objects between them).
    server = subprocess.Popen(
        ["nsenter", f"--net={other.netns_path}", "--", sys.executable, "-c",
         "import socket, sys\ns = socket.create_server((sys.argv[1], 0))\nprint(s.getsockname()[1], flush=True)\n"
         "s.settimeout(30)\nc, _ = s.accept()\nc.sendall(b'hello')", other.ip],
        stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = server.stdout.readline().strip()
        assert in_namespace(one, sys.executable, "-c", connect, other.ip, port).stdout.strip() == "connected"
    finally:
        server.kill()
        server.wait()


DRIVER = """
import sys, ray
ray.init(address=sys.argv[1], _node_ip_address=sys.argv[2], log_to_driver=False)
print("connected", ray.cluster_resources().get("callbox_sandboxes"))
"""


def _driver(cluster: RayTestCluster, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    clean.update(env, RAY_gcs_server_port_wait_time_s="2")  # a refused driver gives up after 2 s, not 20
    return subprocess.run([sys.executable, "-c", DRIVER, cluster.address, cluster.node_ip], env=clean,
                          capture_output=True, text=True, timeout=120, check=False, cwd="/")


def test_a_driver_without_the_token_is_refused_and_one_with_it_is_let_in(ray_cluster: RayTestCluster) -> None:
    mode = stat.S_IMODE(ray_cluster.token_file.stat().st_mode)
    assert mode == 0o600, oct(mode)
    refused = "Authentication token is missing or incorrect"
    without = _driver(ray_cluster, {})
    assert without.returncode != 0 and refused in without.stderr, without.stderr[-2000:]
    wrong = _driver(ray_cluster, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    assert wrong.returncode != 0 and refused in wrong.stderr, wrong.stderr[-2000:]
    right = _driver(ray_cluster, ray_cluster.driver_env())
    assert right.returncode == 0 and right.stdout.strip() == "connected 16.0", right.stderr[-2000:]


def test_a_killed_raylet_is_detected_within_10_s_and_restart_node_brings_it_back(
        ray_cluster: RayTestCluster, record_property: Any) -> None:
    node = WORKERS[-1].name
    old_id = ray_cluster.node_id(node)
    assert old_id is not None
    try:
        pid = ray_cluster.kill_raylet(node)
        killed = time.monotonic()
        while ray_cluster.node_alive(node):
            assert time.monotonic() - killed < DETECT_DEADLINE_S, f"node {node} still alive after its raylet died"
            time.sleep(0.05)
        detected = time.monotonic() - killed
        record_property("dead_node_detected_s", round(detected, 2))
        assert not os.path.exists(f"/proc/{pid}/stat") or ray_cluster.raylet_pid(node) is None
    finally:
        ray_cluster.restart_node(node)
    assert ray_cluster.node_alive(node)
    assert ray_cluster.node_id(node) != old_id  # a new node to Ray, on the same machine and dockerd
    assert ray_cluster.node_resources(node).get("callbox_sandboxes") == 8
    assert ray_cluster.dockerd_answers(node)
