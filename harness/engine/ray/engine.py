"""Sandboxes on many machines: the Ray engine.

The same public surface as :class:`~harness.engine.docker.engine.DockerEngine` (create,
attach, open, keep, pause, resume, snapshots, forks, the warm pool, gc), so sessions, doors
and the CLI use it unchanged. What it adds is where a sandbox runs and how it is reached:

- **Placement.** Each node advertises how many sandboxes it may hold (``callbox_sandboxes``);
  ``create`` picks a node by the spec's ``placement`` (spread by default, pack, node affinity
  and anti-affinity, groups kept apart: :mod:`harness.engine.placement`) among live nodes with
  room, and asks that node's host to start the sandbox on its own Docker engine.
- **Transport.** The agent is reached through the node's relay: gRPC over TLS pinned to the
  host's certificate, with the sandbox's own token; streaming, cancellation, deadlines and
  message limits are the local agent client's.
- **Failure is data.** A node that dies is seen within about a second of the cluster declaring
  it dead; its sandboxes are marked lost, calls on them fail with ``sandbox lost with its
  node``, and a call in flight is recorded with an unknown outcome (never re-run).
- **Images without a registry.** At connect (and when a node joins) each node's sandbox image
  is compared by content hash with this machine's and loaded where missing or stale
  (:mod:`harness.engine.ray.images`), with progress on stderr.

Only ``network = "none"`` sandboxes run on it: an egress proxy's decisions would stay on the
node, out of the audit log, so a networked spec is refused before anything starts.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from harness.core.errors import CallboxError, EngineUnavailable, ImageNotFound
from harness.engine.docker.cgroup_stats import SandboxStats
from harness.engine.docker.kept import SandboxExpired
from harness.engine.docker.lifetime import LifetimeRecord, NameInUse, SandboxNotFound, validate_name, validate_ttl
from harness.engine.docker.living import SandboxInfo
from harness.engine.placement import NodeRoom, Placement, choose_node
from harness.engine.ray.drivers import current_job
from harness.engine.ray.host import SandboxHandle
from harness.engine.ray.hosts import Host, HostDirectory, SandboxLost, ask, call, ray_module
from harness.engine.ray.sandbox import RaySandbox
from harness.engine.ray.snapshots import RaySnapshots
from harness.engine.spec import HostLimits, SandboxSpec, SpecError
from harness.telemetry import metrics

if TYPE_CHECKING:
    from harness.engine.ray.settings import RaySettings

log = logging.getLogger("callbox.ray")

INFO_MAX_AGE_S = 2.0


@dataclass(frozen=True)
class KeptOnNode:
    """A keep on a node (``keep``'s answer): until when."""

    sandbox_id: str
    until: float


class RayEngine(RaySnapshots):
    """Creates and manages sandboxes on the sandbox nodes of a Ray cluster."""

    local = False
    pool = None

    def __init__(self, settings: RaySettings, *, progress: Callable[[Any], None] | None = None) -> None:
        self.settings = settings
        self.owner = f"ray-driver:{os.uname().nodename}/{os.getpid()}"
        self.driver_job = current_job()
        """This driver's Ray job: a node's host removes the unnamed, unkept sandboxes it made once it ends."""
        self._progress = progress
        self._sandboxes: dict[str, RaySandbox] = {}
        self._where: dict[str, str] = {}
        """Sandbox id -> node id, for the sandboxes this engine has seen."""
        self._groups: dict[str, str] = {}
        self._pending: dict[str, int] = {}
        self._lock = threading.Lock()
        self._placing = threading.Lock()
        self._turn = itertools.count()
        self._pool_settings: tuple[list[dict[str, Any]], dict[str, Any]] | None = None
        self.hosts = HostDirectory(relay_port=settings.relay_port,
                                   on_dead=self._node_died, on_new=self._node_joined)
        self.hosts.refresh()
        if not self.hosts.hosts():
            raise EngineUnavailable(
                f"the Ray cluster at {settings.address} has no node with the callbox_sandboxes resource: start "
                "worker nodes with `ray start --resources '{\"callbox_sandboxes\": N}' ...`")
        self.hosts.watch()
        metrics.watch_engine(self)

    @classmethod
    def connect(cls, settings: RaySettings, **kwargs: Any) -> RayEngine:
        """Join the cluster as a driver (token authentication on unless the settings loosen it)
        and find its sandbox nodes; fail closed with the reason when it does not answer."""
        connect_driver(settings)
        return cls(settings, **kwargs)

    # ---- nodes ----------------------------------------------------------------------------------

    def _node_joined(self, hosts: list[Host]) -> None:
        """New sandbox nodes (at connect, or joined since): the image first, then their pool."""
        for host in hosts:
            if host.info is not None and host.info.reaped:
                log.warning("node %s came back: %d sandbox(es) of its earlier life were removed", host.name,
                            host.info.reaped)
        self.sync_images(hosts)
        if self._pool_settings is not None:
            specs, settings = self._pool_settings
            for host in hosts:
                ask(host, "enable_pool", specs, settings)

    def _node_died(self, host: Host) -> None:
        reason = f"sandbox lost with its node {host.name}: Ray declared the node dead"
        with self._lock:
            lost = [box for box in self._sandboxes.values() if box.host.node_id == host.node_id]
        for box in lost:
            box.lost = reason
        if lost:
            log.error("%d sandbox(es) lost with node %s: %s", len(lost), host.name, ", ".join(b.id for b in lost))

    def node_lost(self, host: Host, *, within: float) -> str | None:
        """Why ``host``'s sandboxes are gone for good, if they are: its node died (waiting up to
        ``within`` seconds for the cluster to say), or its host can never run again. None when the
        host answers, or is only restarting (its sandboxes live on and are re-adopted)."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if host.node_id in self.hosts.dead or not host.alive:
                return f"sandbox lost with its node {host.name}: Ray declared the node dead"
            try:
                call(host.handle.ping.remote(), timeout=1.0, node=host.name)  # not ask: this loop is the wait
                return None
            except SandboxLost:
                self.hosts.lose(host)
                return f"sandbox lost with its node {host.name}: its host is gone"
            except EngineUnavailable:
                time.sleep(0.1)  # restarting, or the node is failing: the cluster will say which
        return None

    def nodes(self) -> list[Host]:
        """The live sandbox nodes' hosts."""
        return self.hosts.hosts()

    def sync_images(self, hosts: list[Host] | None = None, image: str | None = None) -> dict[str, str]:
        """Check each node's image by content hash against this machine's; load it where it is
        missing or stale. Per node: ``current`` or ``loaded``."""
        from harness.engine.docker.client import connect_client
        from harness.engine.ray.images import ProgressPrinter, sync_image

        targets = hosts if hosts is not None else self.hosts.hosts()
        if not targets:
            return {}
        ports = {host.name: _ImagePort(host) for host in targets}
        return sync_image(image or self.settings.image, connect_client(), ports,
                          self._progress or ProgressPrinter())

    def image_status(self) -> dict[str, str | None]:
        """Each node's image digest (None: missing), for the doctor."""
        return {host.name: digest for host, digest in self.hosts.each("image_digest", self.settings.image)}

    # ---- create --------------------------------------------------------------------------------

    def host_limits(self) -> HostLimits:
        infos = [h.info for h in self.hosts.hosts() if h.info is not None]
        return HostLimits(cpus=max((i.cpus or 0 for i in infos), default=None) or None,
                          memory=max((i.memory or 0 for i in infos), default=None) or None,
                          where="the largest Ray sandbox node")

    def _fresh_hosts(self) -> list[Host]:
        """The live hosts, each asked again how many sandboxes it holds when its answer is old."""
        hosts = []
        for host in self.hosts.hosts():
            if time.monotonic() - host.info_at > INFO_MAX_AGE_S:
                try:
                    self.hosts.update(host, timeout=10)
                except CallboxError as exc:  # gone (now reported) or slow: place elsewhere
                    log.warning("node %s left out of placement: %s", host.name, exc)
                    continue
            hosts.append(host)
        return hosts

    def _rooms(self, hosts: list[Host]) -> list[NodeRoom]:
        """How full each node is: what its host last said, plus what this engine started there
        since and the creates on their way."""
        rooms = []
        with self._lock:
            for host in hosts:
                assert host.info is not None
                used = host.info.live + host.placed + self._pending.get(host.node_id, 0)
                groups = frozenset(g for sid, g in self._groups.items() if self._where.get(sid) == host.node_id)
                rooms.append(NodeRoom(name=host.name, capacity=host.capacity, used=used, groups=groups))
        return rooms

    def _place(self, placement: Placement) -> Host:
        """The host for a new sandbox, its create counted as on its way there (one placement at a
        time, so creates at once see each other)."""
        hosts = self._fresh_hosts()
        with self._placing:
            node = choose_node(placement, self._rooms(hosts), turn=next(self._turn))
            host = next((h for h in hosts if h.name == node.name), None)
            if host is None or not host.alive:
                raise SandboxLost(f"node {node.name} went away while its sandbox was being placed")
            with self._lock:
                self._pending[host.node_id] = self._pending.get(host.node_id, 0) + 1
        return host

    def create(self, spec: SandboxSpec, *, name: str | None = None, ttl_s: float | None = None,
               owner: str | None = None, ready_timeout: float | None = None) -> RaySandbox:
        """Start a sandbox on the node placement picks; see ``DockerEngine.create`` for ``name``,
        ``ttl_s`` and ``owner``. The node checks the spec against itself (cpus, memory, mounts)."""
        del ready_timeout  # the node's engine waits with its own
        started = time.perf_counter()
        if spec.network != "none":
            raise SpecError("network",
                            f'network = "{spec.network}" is not available on the Ray engine: the egress proxy\'s '
                            'decisions would stay on the node, out of the audit log. Use network = "none", or the '
                            'Docker engine')
        if name is not None:
            validate_name(name)
            if (holder := self._find(name)) is not None:
                raise NameInUse(name, f"on node {holder.name}")
        if ttl_s is not None:
            validate_ttl(ttl_s)
        host = self._place(spec.placement)
        try:
            handle = self._create_on(host, spec, name=name, ttl_s=ttl_s, owner=owner or self.owner)
            box = self._adopt(host, handle, group=spec.placement.group)
        finally:
            with self._lock:
                self._pending[host.node_id] -= 1
        with self._lock:
            host.placed += 1
        metrics.record_sandbox_created("ray", time.perf_counter() - started)
        return box

    def _create_on(self, host: Host, spec: SandboxSpec, *, name: str | None, ttl_s: float | None,
                   owner: str) -> SandboxHandle:
        """Ask ``host`` for the sandbox; a node that lost its image since it was checked (someone
        removed or retagged it) gets it again, once."""
        for attempt in (1, 2):
            try:
                handle: SandboxHandle = ask(host, "create", spec.model_dump(mode="json"), name=name, ttl_s=ttl_s,
                                            owner=owner, driver=self.driver_job)
                return handle
            except ImageNotFound:
                if attempt == 2:
                    raise
                log.warning("node %s no longer has %s: sending it again", host.name, spec.image)
                self.sync_images([host], image=spec.image)
        raise AssertionError("unreachable")

    def _adopt(self, host: Host, handle: SandboxHandle, *, group: str = "") -> RaySandbox:
        box = RaySandbox(self, host, handle)
        with self._lock:
            self._sandboxes[box.id] = box
            self._where[box.id] = host.node_id
            if group:
                self._groups[box.id] = group
        return box

    # ---- finding sandboxes -----------------------------------------------------------------------

    def _host_of(self, sandbox_id: str) -> Host | None:
        with self._lock:
            node_id = self._where.get(sandbox_id)
        if node_id is not None:
            for host in self.hosts.hosts():
                if host.node_id == node_id:
                    return host
            return None
        return self._find(sandbox_id)

    def _find(self, name_or_id: str) -> Host | None:
        for host, found in self.hosts.each("has", name_or_id):
            if found:
                return host
        return None

    def _require_host(self, name_or_id: str) -> Host:
        host = self._host_of(name_or_id)
        if host is None:
            raise SandboxNotFound(name_or_id)
        return host

    def attach(self, sandbox_id: str, *, ready_timeout: float | None = None) -> RaySandbox:
        """Reconnect to a kept sandbox on whichever node holds it (``SandboxExpired`` if none)."""
        del ready_timeout
        host = self._host_of(sandbox_id)
        if host is None:
            raise SandboxExpired(f"sandbox {sandbox_id} is not kept on any live node (it expired, was removed, "
                                 "or was lost with its node); its files are gone", sandbox_id=sandbox_id,
                                 expired_at=None)
        return self._adopt(host, ask(host, "attach", sandbox_id))

    def open(self, name_or_id: str, *, ready_timeout: float | None = None) -> RaySandbox:
        del ready_timeout
        host = self._require_host(name_or_id)
        return self._adopt(host, ask(host, "open", name_or_id))

    def sandbox_exists(self, sandbox_id: str) -> bool:
        """Whether a live node holds ``sandbox_id`` (running, paused or stopped)."""
        return self._host_of(sandbox_id) is not None

    def lifetime_record(self, sandbox_id: str) -> LifetimeRecord | None:
        """The lifetime record of ``sandbox_id`` on its node, if it has one."""
        host = self._host_of(sandbox_id)
        if host is None:
            return None
        record: LifetimeRecord | None = ask(host, "lifetime_record", sandbox_id)
        return record

    def kept_sandbox(self, sandbox_id: str) -> KeptOnNode | None:
        host = self._host_of(sandbox_id)
        if host is None or not ask(host, "is_kept", sandbox_id):
            return None
        return KeptOnNode(sandbox_id, 0.0)

    # ---- lifetime ----------------------------------------------------------------------------------

    def destroy(self, sandbox_id: str, *, network: str | None = None) -> list[Any]:
        with self._lock:
            box = self._sandboxes.pop(sandbox_id, None)
            self._groups.pop(sandbox_id, None)
        if box is not None and box.lost is not None:
            return []  # gone with its node; the node's host removes what is left when it returns
        host = box.host if box is not None else self._host_of(sandbox_id)
        with self._lock:
            self._where.pop(sandbox_id, None)
        if host is None or not host.alive:
            return []
        with contextlib.suppress(SandboxLost):  # its node died meanwhile: nothing left to remove now
            ask(host, "destroy", sandbox_id, network)
        host.info_at = 0.0
        return []

    def remove(self, name_or_id: str) -> str:
        host = self._require_host(name_or_id)
        sandbox_id: str = ask(host, "remove", name_or_id)
        with self._lock:
            self._sandboxes.pop(sandbox_id, None)
            self._where.pop(sandbox_id, None)
        return sandbox_id

    def keep(self, sandbox: RaySandbox, *, run_id: str, until: float | None = None) -> KeptOnNode:
        return KeptOnNode(sandbox.id, sandbox._ask("keep", sandbox.id, run_id, until))

    def is_paused(self, sandbox: RaySandbox) -> bool:
        return sandbox.paused_here

    def pause(self, sandbox: RaySandbox) -> None:
        sandbox._ask("pause", sandbox.id)
        sandbox.paused_here = True

    def resume(self, sandbox: RaySandbox, *, timeout: float | None = None) -> float:
        del timeout
        expires: float = sandbox._ask("resume", sandbox.id)
        sandbox.paused_here = False
        sandbox.expires = expires
        return expires

    def keep_alive(self, sandbox: RaySandbox, ttl_s: float | None = None) -> float:
        if ttl_s is not None:
            validate_ttl(ttl_s)
        expires: float = sandbox._ask("keep_alive", sandbox.id, ttl_s)
        sandbox.expires = expires
        return expires

    def stats(self, sandbox: RaySandbox) -> SandboxStats:
        found: SandboxStats = sandbox._ask("stats", sandbox.id)
        return found

    def list_sandboxes(self, *, stats: bool = True) -> list[SandboxInfo]:
        """Every sandbox on every live node, oldest first."""
        found: list[SandboxInfo] = []
        for _host, infos in self.hosts.each("list_sandboxes", stats):
            found.extend(infos)
        return sorted(found, key=lambda info: info.created)

    def sandbox_census(self) -> tuple[int, int]:
        live = paused = 0
        for _host, (node_live, node_paused) in self.hosts.each("census"):
            live += node_live
            paused += node_paused
        return live, paused

    def pooled_count(self) -> int:
        return sum(count for _host, count in self.hosts.each("pooled_count"))

    def gc(self, now: float | None = None) -> list[str]:
        del now
        return [sid for _host, ids in self.hosts.each("gc") for sid in ids]

    def enable_pool(self, specs: list[SandboxSpec], **settings: Any) -> None:
        """A warm pool of ``specs`` on every node (``size`` and ``max`` per node)."""
        settings.pop("room", None)  # a callable of this process: each node keeps its own ceiling
        self._pool_settings = ([s.model_dump(mode="json") for s in specs], settings)
        for host in self.hosts.hosts():
            ask(host, "enable_pool", *self._pool_settings)

    def disable_pool(self) -> None:
        """Empty and stop every node's warm pool (creates are cold again)."""
        self._pool_settings = None
        for _host, _ in self.hosts.each("close"):
            pass

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the sandboxes destroyed so far are removed on every node; False if one
        node's ``timeout`` passed."""
        return all(done for _host, done in self.hosts.each("drain", timeout))

    def close(self, timeout: float | None = None) -> bool:
        """Stop watching; each node's pool is emptied. Sandboxes with a keep or a name stay."""
        del timeout
        self.hosts.stop()
        if self._pool_settings is not None:
            for _host, _ in self.hosts.each("close"):
                pass
        return True

class _ImagePort:
    """A node's image receiver, through its host (one Ray call per step)."""

    def __init__(self, host: Host) -> None:
        self.host = host

    def image_digest(self, name: str) -> str | None:
        digest: str | None = ask(self.host, "image_digest", name)
        return digest

    def begin(self, name: str, expected_id: str, total_bytes: int) -> None:
        ask(self.host, "image_begin", name, expected_id, total_bytes)

    def chunk(self, seq: int, data: bytes) -> None:
        ask(self.host, "image_chunk", seq, data)

    def finish(self) -> str:
        loaded: str = ask(self.host, "image_finish")
        return loaded

    def abort(self) -> None:
        ask(self.host, "image_abort")


def connect_driver(settings: RaySettings) -> None:
    """``ray.init`` as a driver of the cluster at ``settings.address`` (once per process), after
    a bounded check that the cluster answers, takes the token and has this machine as a node
    (``ray.init`` itself retries a dead address for minutes)."""
    ray = ray_module()
    if ray.is_initialized():
        return
    from harness.engine.ray import preflight

    for note in settings.loosened():
        log.warning("this configuration loosens a hardened default: %s", note)
    preflight.use_token(settings)
    preflight.preflight(settings)
    # Ray's own SIGTERM/SIGSEGV handler would replace this process's (a server's orderly stop)
    # and end it with status 15 after it ran: a driver keeps the handlers it has.
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True
    # ray.init, in the main thread, also sets a Python SIGTERM handler that exits with status
    # 15 at once: a server's own (stop the doors, keep the sandboxes) is put back.
    in_main = threading.current_thread() is threading.main_thread()
    own_sigterm = signal.getsignal(signal.SIGTERM) if in_main else None
    try:
        ray.init(address=settings.address, namespace=settings.namespace,
                 _node_ip_address=preflight.local_address(settings),  # the one preflight found a raylet at
                 log_to_driver=False, logging_level=logging.WARNING, configure_logging=False)
    except Exception as exc:  # ConnectionError, RuntimeError, an auth refusal: all say the same to a user
        raise EngineUnavailable(f"cannot join the Ray cluster at {settings.address}: {exc}") from None
    finally:
        if in_main and own_sigterm is not None:
            signal.signal(signal.SIGTERM, own_sigterm)
