"""A real three-node Ray cluster in network namespaces: what the Ray tests and benchmarks run on.

Layout, all in 10.250.0.0/24 with no route out of it::

    root namespace   bridge cbray0 10.250.0.1/24 and the Ray head (GCS at 10.250.0.1:6379,
                     no ``callbox_sandboxes``), so a driver in this process has a local raylet
    netns cbray-w1   eth0 10.250.0.2/24 (a veth to cbray0), lo; Ray worker w1, its own dockerd
    netns cbray-w2   eth0 10.250.0.3/24, likewise for w2

Each worker advertises ``callbox_sandboxes`` and carries its node settings in the environment of
its ``ray start``, which every Ray worker process on it inherits: CALLBOX_NODE_NAME, DOCKER_HOST,
CALLBOX_RUN_ROOT and CALLBOX_STATE_DIR.

Ray token authentication is on. A driver needs ``driver_env()`` in its environment: Ray reads
RAY_AUTH_MODE when first imported, so set it before ``import ray`` or call ``use_as_driver()``,
which also refreshes Ray's cached settings. Then
``ray.init(address=cluster.address, _node_ip_address=cluster.node_ip)``: without the node address
Ray looks for a raylet on this machine's main address, where there is none.

Why it is built this way:

- worker processes enter their namespace with ``nsenter --net=``, not ``ip netns exec``, which
  remounts /sys and hides the cgroup mounts dockerd and runc need;
- each node has its own ``--temp-dir`` (parallel starts collide on the raylet socket otherwise);
- each extra dockerd has its own data root, exec root, pidfile, socket, cgroup parent, containerd
  namespaces and its own containerd (dockerd starts one under its exec root when no system
  containerd listens at /run/containerd/containerd.sock), so stopping or restarting the main
  dockerd, as some tests do, never touches the workers' engines, nor the reverse;
- there is no NAT and no default route in the namespaces; one iptables rule lets the two
  workers reach each other across the bridge (see ``layout.FORWARD_RULE``);
- every ``up()`` starts from a clean slate, so the workers' dockerds have no image until a test
  loads one (``load_image``) or the engine's own image distribution, which is under test, does.

``python -m tests.ray.cluster up|down|status|env`` runs it by hand; ``up`` leaves it running.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

from tests.ray import leftovers
from tests.ray.layout import (
    BRIDGE,
    FORWARD_RULE,
    GCS_PORT,
    HEAD_IP,
    HEAD_TEMP_DIR,
    MARKER,
    OWNER_FILE,
    RUN_DIR,
    TEMP_DIR,
    TOKEN_FILE,
    WORKERS,
    Worker,
)

if TYPE_CHECKING:
    import docker

RAY = Path(sys.executable).with_name("ray")
"""The venv's ray: its workers import the venv's packages, the editable ``harness`` among them."""
HEALTH_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}
"""The GCS probes every raylet each second and declares it dead after three misses (~3.5 s)."""
START_DEADLINE_S = 60.0


class ClusterUnavailable(RuntimeError):
    """This machine cannot build the cluster (not root, a tool missing); the message says why."""


class ClusterError(RuntimeError):
    """Building, driving or removing the cluster failed; the message says where and how."""


def check_prerequisites() -> None:
    """ClusterUnavailable saying why, unless this process can build the cluster."""
    if os.geteuid() != 0:
        raise ClusterUnavailable("the Ray test cluster needs root (network namespaces, a bridge, dockerds)")
    for tool in ("ip", "nsenter", "dockerd", "docker", "iptables", "umount"):
        if shutil.which(tool) is None:
            raise ClusterUnavailable(f"the Ray test cluster needs `{tool}`, which is not on PATH")
    if not RAY.exists():
        raise ClusterUnavailable(f"no ray at {RAY}: install the ray extra (pip install 'callbox[ray]')")


def _run(*argv: str, check: bool = True, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if check and done.returncode != 0:
        raise ClusterError(f"`{' '.join(argv)}` failed ({done.returncode}): {(done.stderr or done.stdout).strip()}")
    return done


def _wait_until(what: str, ready: Callable[[], bool], deadline_s: float, interval: float = 0.1) -> None:
    end = time.monotonic() + deadline_s
    while not ready():
        if time.monotonic() > end:
            raise ClusterError(f"{what}: not within {deadline_s:.0f} s")
        time.sleep(interval)


class RayTestCluster:
    """The cluster: ``up()`` builds it, ``down()`` removes every trace; also a context manager."""

    address = f"{HEAD_IP}:{GCS_PORT}"
    node_ip = HEAD_IP
    token_file = TOKEN_FILE
    workers: ClassVar[dict[str, Worker]] = {w.name: w for w in WORKERS}

    def __init__(self, *, sandboxes_per_node: int = 8, worker_cpus: int = 2, head_cpus: int = 1,
                 object_store_bytes: int = 1 << 30, progress: bool = True) -> None:
        self.sandboxes_per_node = sandboxes_per_node
        self.worker_cpus = worker_cpus
        self.head_cpus = head_cpus
        self.object_store_bytes = object_store_bytes
        self.progress = progress
        self._started = time.monotonic()
        self._gcs: Any = None

    # -- building and removing -------------------------------------------------------------

    def up(self, *, owner: int | None = None) -> RayTestCluster:
        """Build the cluster (first removing what a crashed earlier run left) and return once
        all three nodes are alive. ``owner``: the pid whose life the cluster belongs to (a test
        session); ``up()`` elsewhere refuses to take the cluster over while that process lives."""
        check_prerequisites()
        self._started = time.monotonic()
        self._refuse_if_owned_by_another()
        if leftovers.anything_left():
            self._say("removing what an earlier run left")
            self.down(quiet=True)
        try:
            self._build(owner)
        except BaseException:
            self._say("start failed: tearing down")
            self.down(quiet=True)
            raise
        self._say(f"ready: head {self.address}, workers " + ", ".join(f"{w.name} {w.ip}" for w in WORKERS))
        return self

    def _build(self, owner: int | None) -> None:
        for directory in (RUN_DIR, TEMP_DIR, *(d for w in WORKERS for d in (w.run_dir, w.state_dir, w.temp_dir))):
            directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        OWNER_FILE.write_text(f"{owner} {leftovers.start_time(owner)}\n" if owner else "cli\n")
        descriptor = os.open(TOKEN_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token:
            token.write(secrets.token_hex(32))  # what `ray get-auth-token --generate` writes
        self._say(f"network: bridge {BRIDGE}, namespaces " + " and ".join(w.netns for w in WORKERS))
        self._build_network()
        self._say("starting the workers' dockerds")
        for worker in WORKERS:
            self._start_dockerd(worker)
        self._say(f"starting the Ray head ({self.address}, token authentication on)")
        self._finish_ray_start("head", self._ray_start(
            "head", ["--head", f"--node-ip-address={HEAD_IP}", f"--port={GCS_PORT}", f"--temp-dir={HEAD_TEMP_DIR}",
                     f"--num-cpus={self.head_cpus}", "--include-dashboard=false"], {}))
        for worker in WORKERS:
            _wait_until(f"dockerd of {worker.name} answering at {worker.docker_host} (log: {worker.dockerd_log})",
                        partial(self.dockerd_answers, worker.name), 30, 0.2)
        self._say("starting Ray workers " + " and ".join(w.name for w in WORKERS) + " in their namespaces")
        self._start_workers(WORKERS)
        leftovers.record_pids()

    def _build_network(self) -> None:
        _run("ip", "link", "add", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{HEAD_IP}/24", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")
        for worker in WORKERS:
            ns, peer = worker.netns, f"{worker.veth}p"
            _run("ip", "netns", "add", ns)
            _run("ip", "link", "add", worker.veth, "type", "veth", "peer", "name", peer)
            _run("ip", "link", "set", peer, "netns", ns)
            _run("ip", "-n", ns, "link", "set", peer, "name", "eth0")
            _run("ip", "-n", ns, "addr", "add", f"{worker.ip}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "link", "set", worker.veth, "master", BRIDGE)
            _run("ip", "link", "set", worker.veth, "up")
        _run("iptables", "-w", "-I", *FORWARD_RULE)

    def _env(self, node: str, extra: dict[str, str]) -> dict[str, str]:
        """The environment of a node's daemons: this process's without any Ray, Docker or
        callbox setting, plus the token, the health check, the node's settings and the marker."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "CALLBOX_", "DOCKER_", MARKER))}
        env.update({**self.driver_env(), **HEALTH_ENV, **extra, MARKER: node})
        return env

    def _start_dockerd(self, worker: Worker) -> None:
        config = worker.run_dir / "daemon.json"
        config.write_text(json.dumps({"storage-driver": "overlay2", "log-driver": "json-file", "live-restore": False}))
        worker.data_root.mkdir(parents=True, exist_ok=True)
        with worker.dockerd_log.open("ab") as log:  # the daemon keeps its own descriptor
            subprocess.Popen(
                ["nsenter", f"--net={worker.netns_path}", "--", "dockerd", f"--config-file={config}",
                 f"--data-root={worker.data_root}", f"--exec-root={worker.exec_root}",
                 f"--pidfile={worker.dockerd_pidfile}", f"--host={worker.docker_host}",
                 f"--cgroup-parent={worker.cgroup_parent}", f"--containerd-namespace=cbray-{worker.name}",
                 f"--containerd-plugins-namespace=cbray-{worker.name}-plugins", "--bridge=none",
                 "--iptables=false", "--ip6tables=false", "--ip-forward=false", "--ip-masq=false"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env=self._env(worker.name, {}),
            )

    def _ray_start(self, node: str, args: list[str], extra_env: dict[str, str],
                   netns: Path | None = None) -> subprocess.Popen[str]:
        """Start ``ray start`` for a node, in its namespace if given; ``_finish_ray_start`` waits."""
        argv = [str(RAY), "start", *args, f"--object-store-memory={self.object_store_bytes}", "--disable-usage-stats"]
        if netns is not None:
            argv = ["nsenter", f"--net={netns}", "--", *argv]
        # A session of its own: a Ctrl-C to the test run stops pytest, whose teardown removes the
        # cluster, and never reaches the daemons half-way.
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, cwd="/", start_new_session=True, env=self._env(node, extra_env))

    @staticmethod
    def _finish_ray_start(node: str, process: subprocess.Popen[str]) -> None:
        try:
            output, _ = process.communicate(timeout=START_DEADLINE_S)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
            raise ClusterError(f"`ray start` of {node} took over {START_DEADLINE_S:.0f} s: {output[-2000:]}") from None
        if process.returncode != 0:
            raise ClusterError(f"`ray start` of {node} failed ({process.returncode}): {output[-2000:]}")

    def _start_workers(self, workers: Iterable[Worker]) -> None:
        started = []
        for worker in workers:
            args = [f"--address={self.address}", f"--node-ip-address={worker.ip}", f"--temp-dir={worker.temp_dir}",
                    f"--num-cpus={self.worker_cpus}",
                    f"--resources={json.dumps({'callbox_sandboxes': self.sandboxes_per_node})}"]
            started.append((worker, self._ray_start(worker.name, args, worker.node_env(), worker.netns_path)))
        for worker, process in started:
            self._finish_ray_start(worker.name, process)
        for worker, _process in started:
            _wait_until(f"Ray node {worker.name} alive in the GCS", partial(self.node_alive, worker.name),
                        START_DEADLINE_S)

    def _refuse_if_owned_by_another(self) -> None:
        owner = (leftovers.read(OWNER_FILE) or b"").decode().split()
        if len(owner) == 2 and owner[0].isdigit() and int(owner[0]) not in leftovers.ancestors() \
                and str(leftovers.start_time(int(owner[0]))) == owner[1]:
            command = (leftovers.read(f"/proc/{owner[0]}/cmdline") or b"").replace(b"\0", b" ").decode(errors="replace")
            raise ClusterError(f"the Ray test cluster belongs to the live process {owner[0]} ({command[:200]}); "
                               "wait for it, or run `python -m tests.ray.cluster down`")

    def down(self, *, quiet: bool = False) -> None:
        """Remove everything: Ray's processes, the containers, the dockerds, then anything left
        by pid or name, cgroups, mounts, the forward rule, namespaces, links and directories.
        Safe on a half-built or already removed cluster and after a crash; ClusterError if
        something could not be removed."""
        say: Callable[[str], None] = (lambda _message: None) if quiet else self._say
        say("tearing down")
        self._gcs = None
        leftovers.kill(leftovers.ray_processes())  # first, so no host actor starts a container meanwhile
        for worker in WORKERS:
            self._remove_containers(worker)
        dockerds = [int(pid) for w in WORKERS if (pid := (leftovers.read(w.dockerd_pidfile) or b"").strip()).isdigit()
                    and leftovers.comm(int(pid)) == "dockerd"]
        leftovers.kill(dockerds, signal.SIGTERM)
        try:
            _wait_until("the workers' dockerds stopping", lambda: not any(map(leftovers.alive, dockerds)), 20)
        except ClusterError:
            say("a dockerd did not stop within 20 s: killing it")
        leftovers.kill_everything()
        left = leftovers.remove_host_state()
        if left:
            raise ClusterError(f"the Ray test cluster's teardown left {', '.join(left)}")
        say("down")

    def _remove_containers(self, worker: Worker) -> None:
        if not self.dockerd_answers(worker.name):
            return
        client = self.docker_client(worker.name)
        try:
            for container in client.containers.list(all=True, ignore_removed=True):
                container.remove(force=True, v=True)
        except Exception as exc:  # its data goes with the data root anyway
            self._say(f"removing the containers of {worker.name}: {exc}")
        finally:
            client.close()

    def __enter__(self) -> RayTestCluster:
        return self.up(owner=os.getpid())

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.down()

    def _say(self, message: str) -> None:
        if self.progress:
            print(f"cbray [{time.monotonic() - self._started:5.1f}s] {message}", file=sys.stderr, flush=True)

    # -- what drivers and tests use -----------------------------------------------------------

    def driver_env(self) -> dict[str, str]:
        """The environment a driver needs to be let in (before its first ``import ray``)."""
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file)}

    def use_as_driver(self) -> None:
        """Make this process able to drive the cluster: ``driver_env()`` into os.environ, and
        Ray's settings, read when ray was first imported, read again (as Ray itself does when
        it turns token authentication on). Then ``ray.init(address=self.address,
        _node_ip_address=self.node_ip)``."""
        os.environ.update(self.driver_env())
        import ray
        from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

        if not ray.is_initialized():  # a connected driver keeps the settings its cluster gave it
            Config.initialize("")
            AuthenticationTokenLoader.instance().reset_cache()

    def worker(self, node: str) -> Worker:
        try:
            return self.workers[node]
        except KeyError:
            raise ClusterError(f"no worker node {node!r}: the workers are {', '.join(self.workers)}") from None

    def _live_node(self, node: str) -> Any:
        """The GCS's record of the live node ``node`` ("head", "w1", "w2"), or None. The GCS
        keeps a record of every node ever registered; a restarted node has a new one."""
        ip = HEAD_IP if node == "head" else self.worker(node).ip
        if self._gcs is None:
            self.use_as_driver()
            from ray._raylet import GcsClient  # type: ignore[attr-defined]

            self._gcs = GcsClient(address=self.address)
        from ray.core.generated import gcs_pb2

        alive = gcs_pb2.GcsNodeInfo.GcsNodeState.ALIVE  # type: ignore[attr-defined]
        for info in self._gcs.get_all_node_info(timeout=5).values():
            if info.node_manager_address == ip and info.state == alive:
                return info
        return None

    def node_id(self, node: str) -> str | None:
        """The Ray node id (hex) of the live node ``node``, or None."""
        info = self._live_node(node)
        return None if info is None else bytes(info.node_id).hex()

    def node_alive(self, node: str) -> bool:
        return self._live_node(node) is not None

    def node_resources(self, node: str) -> dict[str, float]:
        """The total resources the live node ``node`` advertises (empty when it is dead)."""
        info = self._live_node(node)
        return {} if info is None else dict(info.resources_total)

    def raylet_pid(self, node: str) -> int | None:
        for pid, name in leftovers.find_processes().items():
            if name == node and leftovers.comm(pid) == "raylet":
                return pid
        return None

    def kill_raylet(self, node: str) -> int:
        """SIGKILL the raylet of ``node``, as a crashed machine loses it; its pid."""
        self.worker(node)
        pid = self.raylet_pid(node)
        if pid is None:
            raise ClusterError(f"node {node} has no running raylet")
        leftovers.kill([pid])
        return pid

    def restart_node(self, node: str) -> None:
        """Start ``node`` again with the same settings and dockerd (what is left of its Ray
        processes goes first); returns once the GCS has it alive."""
        worker = self.worker(node)
        pids = leftovers.ray_processes(node)
        leftovers.kill(pids)
        _wait_until(f"the Ray processes of {node} exiting", lambda: not any(map(leftovers.alive, pids)), 10)
        self._say(f"restarting Ray node {node}")
        self._start_workers([worker])
        leftovers.record_pids()

    def dockerd_answers(self, node: str) -> bool:
        worker = self.worker(node)
        if not worker.docker_socket.exists():
            return False
        return _run("docker", "-H", worker.docker_host, "version", "--format", "{{.Server.Version}}",
                    check=False, timeout=10).returncode == 0

    def docker_client(self, node: str) -> docker.DockerClient:
        """A client of ``node``'s own dockerd (close it when done)."""
        import docker

        return docker.DockerClient(base_url=self.worker(node).docker_host, timeout=120)

    def load_image(self, node: str, image: str) -> None:
        """``docker save image | docker -H <node's dockerd> load``: a test's shortcut (the
        engine's own image distribution is what puts images on nodes)."""
        worker = self.worker(node)
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert save.stdout is not None
        load = subprocess.run(["docker", "-H", worker.docker_host, "load", "-q"], stdin=save.stdout,
                              capture_output=True, text=True, timeout=600, check=False)
        save.stdout.close()
        _out, save_err = save.communicate(timeout=60)
        if save.returncode != 0 or load.returncode != 0:
            saved = save_err.decode(errors="replace").strip()
            raise ClusterError(f"loading {image} into {node}: docker save {save.returncode} {saved}; "
                               f"docker load {load.returncode} {load.stderr.strip()}")

    def processes(self) -> dict[int, str]:
        """Every running process of the cluster, its containers' included: pid -> node."""
        found = leftovers.find_processes()
        for pid in leftovers.container_processes():
            found.setdefault(pid, "container")
        return found

    def memory(self) -> dict[str, int]:
        """Memory of the whole cluster in bytes: ``rss`` summed over its processes (shared pages
        count once per process) and ``pss`` (shared pages split among their sharers)."""
        totals = {"rss": 0, "pss": 0}
        for pid in self.processes():
            for line in (leftovers.read(f"/proc/{pid}/smaps_rollup") or b"").decode().splitlines():
                key, _, value = line.partition(":")
                if key.lower() in totals:
                    totals[key.lower()] += int(value.split()[0]) * 1024
        return totals


def _status(cluster: RayTestCluster) -> int:
    if not TOKEN_FILE.exists():
        print("the Ray test cluster is down")
        return 1
    for node in ("head", *cluster.workers):
        resources = {k: v for k, v in cluster.node_resources(node).items()
                     if not k.startswith(("node:", "memory", "object"))}
        print(f"{node:5} {'alive' if cluster.node_alive(node) else 'DEAD'}  {resources}")
    for worker in WORKERS:
        answers = "answers" if cluster.dockerd_answers(worker.name) else "does not answer"
        print(f"{worker.name} dockerd at {worker.docker_host}: {answers}")
    memory = cluster.memory()
    print(f"{len(cluster.processes())} processes, RSS {memory['rss'] >> 20} MiB, PSS {memory['pss'] >> 20} MiB")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.ray.cluster",
                                     description="The Ray test cluster (3 nodes in network namespaces).")
    parser.add_argument("command", choices=("up", "down", "status", "env"),
                        help="up: build it and leave it running; down: remove every trace of it; "
                             "status: its nodes, dockerds and memory; env: the exports a driver needs")
    args = parser.parse_args(argv)
    cluster = RayTestCluster()
    try:
        if args.command == "up":
            cluster.up()
            print(f"driver: export {' '.join(f'{k}={v}' for k, v in cluster.driver_env().items())}, then "
                  f"ray.init(address={cluster.address!r}, _node_ip_address={cluster.node_ip!r})")
        elif args.command == "down":
            check_prerequisites()
            cluster.down()
        elif args.command == "status":
            return _status(cluster)
        else:
            for key, value in cluster.driver_env().items():
                print(f"export {key}={value}")
    except (ClusterUnavailable, ClusterError) as exc:
        print(f"cbray: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
