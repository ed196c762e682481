"""The harness's view of a Ray cluster's hosts: which nodes may hold sandboxes, the host actor
of each, and which nodes died.

A node may hold sandboxes when it advertises the custom resource ``callbox_sandboxes`` (how
many). Its host is a detached actor named after the node's Ray id, pinned to that node (hard
affinity), restarted by Ray if its process dies (``max_restarts=-1``) and never asked to
repeat a method (``max_task_retries=0``: a call in flight when it died may or may not have
happened, and is reported so). Being detached, a host outlives the harness: a harness that
restarts finds the same hosts by name.

A watcher thread asks the cluster's control store for the nodes' liveness twice a second. A
node that stops being alive is reported to the listeners (the engine marks its sandboxes
lost); a node that appears (a new worker, or one that died and came back under a new id) gets
its host.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from harness.core.errors import CallboxError, EngineUnavailable, ErrorCode
from harness.engine.ray.host import HostInfo, SandboxHost

log = logging.getLogger("callbox.ray")

CAPACITY_RESOURCE = "callbox_sandboxes"
"""The custom resource a node advertises to hold sandboxes: how many."""
HOST_PREFIX = "callbox-host-"
HOSTS_NAMESPACE = "callbox-hosts"
WATCH_S = 0.5
HOST_CALL_TIMEOUT_S = 120.0
"""The longest a host method may take (a cold create with an image check is seconds)."""
HOST_START_TIMEOUT_S = 60.0
RESTART_WAIT_S = 60.0
"""How long a method that only reads waits for its host to finish restarting."""
RESTART_POLL_S = 0.25

READS = frozenset({
    "ping", "info", "attach", "open", "has", "lifetime_record", "is_kept", "is_paused", "stats", "why_gone",
    "list_sandboxes", "census", "pooled_count", "snapshots", "snapshot_spec", "snapshot_note", "image_digest",
})
"""Host methods that change nothing (``attach`` and ``open`` only hand out the relay token a
sandbox already has): asked again while their host restarts."""

REPEATABLE = READS | frozenset({"destroy"})
"""Methods asked again while their host restarts: the reads, and ``destroy``, whose second asking
finds nothing left to remove and is no error. Any other method caught by a restart is reported
as may-or-may-not-have-happened, never repeated."""

T = TypeVar("T")


class SandboxLost(CallboxError):
    """A sandbox's node died (or its host cannot be reached): the sandbox is gone with it."""

    code = ErrorCode.SANDBOX_GONE


class HostRestarting(EngineUnavailable):
    """A host's actor is unavailable for now: its process is being restarted, or its node is
    failing (the node watcher tells which)."""


@dataclass
class Host:
    """One node's host as the harness knows it."""

    node_id: str
    address: str
    capacity: int
    handle: Any
    """The actor handle."""
    info: HostInfo | None = None
    info_at: float = 0.0
    alive: bool = True
    ready: bool = False
    """Its image is checked (and its pool asked for): placement may use it."""
    placed: int = 0
    """Sandboxes this engine started on it since ``info`` was read (placement counts them)."""

    @property
    def name(self) -> str:
        return self.info.node if self.info is not None else self.address


def ray_module() -> Any:
    """``ray``, or the error that names how to get it."""
    try:
        import ray
    except ImportError:
        raise CallboxError("the Ray engine needs Ray: pip install 'callbox[ray]'",
                           code=ErrorCode.ENGINE_UNAVAILABLE) from None
    return ray


def call(ray_ref: Any, *, timeout: float = HOST_CALL_TIMEOUT_S, node: str = "?") -> Any:
    """``ray.get`` of a host method: the host's own error as itself (a CallboxError stays one),
    a host that died as ``SandboxLost``, a slow one as ``EngineUnavailable``."""
    ray = ray_module()
    from ray import exceptions as rx

    try:
        return ray.get(ray_ref, timeout=timeout)
    except rx.RayTaskError as exc:
        cause = exc.cause
        if isinstance(cause, BaseException):
            raise cause from None
        raise EngineUnavailable(f"the host of node {node} failed: {exc}") from None
    except rx.ActorUnavailableError:  # restarting (its process died), or its node is failing
        raise HostRestarting(f"the host of node {node} is unavailable (restarting, or its node is failing); "
                             "what it was asked may or may not have happened") from None
    except (rx.ActorDiedError, rx.ActorUnschedulableError, rx.RayActorError, rx.NodeDiedError,
            rx.ObjectLostError, rx.OwnerDiedError) as exc:
        raise SandboxLost(f"sandbox lost with its node {node}: its host is gone ({type(exc).__name__}); "
                          "whatever it was doing may or may not have happened") from None
    except rx.GetTimeoutError:
        raise EngineUnavailable(f"the host of node {node} did not answer within {timeout:.0f} s") from None


def ask(host: Host, method: str, *args: Any, timeout: float = HOST_CALL_TIMEOUT_S, **kwargs: Any) -> Any:
    """Call ``host``'s ``method`` (as :func:`call`). A method that may be asked twice
    (:data:`REPEATABLE`) waits out a host that is restarting, up to :data:`RESTART_WAIT_S`, unless
    its node is declared dead meanwhile; any other method fails at once with ``HostRestarting``."""
    deadline = time.monotonic() + RESTART_WAIT_S
    while True:
        try:
            return call(getattr(host.handle, method).remote(*args, **kwargs), timeout=timeout, node=host.name)
        except HostRestarting:
            if method not in REPEATABLE or not host.alive or time.monotonic() >= deadline:
                raise
            log.info("the host of node %s is restarting: asking %s again", host.name, method)
            time.sleep(RESTART_POLL_S)


class HostDirectory:
    """The hosts of the cluster's sandbox nodes; finds new ones and watches for dead ones."""

    def __init__(self, *, relay_port: int, on_dead: Callable[[Host], None],
                 on_new: Callable[[list[Host]], None]) -> None:
        self.relay_port = relay_port
        self._on_dead = on_dead
        self._on_new = on_new
        self._hosts: dict[str, Host] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dead: dict[str, float] = {}
        """Node ids seen dying, and when (monotonic)."""

    # ---- discovery ------------------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = ray_module().nodes()
        return nodes

    def refresh(self, *, welcome_in_background: bool = False) -> list[Host]:
        """Bring the directory in line with the cluster: hosts for new sandbox nodes, dead ones out.
        New hosts are welcomed (``on_new``: their image) before placement uses them; in a thread
        of their own with ``welcome_in_background``, so the watcher goes on watching meanwhile.
        Returns the hosts that are new."""
        fresh: list[Host] = []
        died: list[Host] = []
        nodes = self.nodes()
        listed = {str(node["NodeID"]) for node in nodes}
        with self._lock:
            died += [h for h in self._hosts.values() if h.node_id not in listed and h.alive]
        for node in nodes:
            node_id = str(node["NodeID"])
            with self._lock:
                known = self._hosts.get(node_id)
            if not node.get("Alive"):  # (a dead node is listed with no resources at all)
                if known is not None and known.alive:
                    died.append(known)
                continue
            capacity = int((node.get("Resources") or {}).get(CAPACITY_RESOURCE, 0))
            if capacity <= 0:
                continue
            if known is None:
                host = Host(node_id=node_id, address=str(node.get("NodeManagerAddress", "?")), capacity=capacity,
                            handle=self._start_host(node_id))
                with self._lock:
                    self._hosts[node_id] = host
                fresh.append(host)
        for host in died:
            self.lose(host)
        started = []
        for host in fresh:
            try:
                self.update(host, timeout=HOST_START_TIMEOUT_S)
            except CallboxError as exc:
                log.error("the host of node %s does not start: %s", host.address, exc)
                with self._lock:
                    self._hosts.pop(host.node_id, None)
                continue
            started.append(host)
        if started and welcome_in_background:
            threading.Thread(target=self._welcome, args=(started,), name="callbox-ray-welcome", daemon=True).start()
        elif started:
            self._welcome(started)
        return started

    def _welcome(self, hosts: list[Host]) -> None:
        try:
            self._on_new(hosts)
        except Exception as exc:
            log.error("node(s) %s left out of placement: %s", ", ".join(h.name for h in hosts), exc)
            with self._lock:
                for host in hosts:
                    self._hosts.pop(host.node_id, None)  # the next refresh tries again
            if not self._thread:
                raise
            return
        for host in hosts:
            host.ready = True

    def _start_host(self, node_id: str) -> Any:
        ray = ray_module()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # One host per node and relay port, whichever callbox process asks: the hosts live in a
        # namespace of their own, so servers and CLI commands on one cluster share them (a second
        # host on the node could not listen on the port anyway).
        actor = ray.remote(SandboxHost).options(
            name=f"{HOST_PREFIX}{node_id}", namespace=f"{HOSTS_NAMESPACE}-{self.relay_port}", lifetime="detached",
            get_if_exists=True,
            max_restarts=-1, max_task_retries=0, max_concurrency=64, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        )
        return actor.remote(relay_port=self.relay_port)

    def update(self, host: Host, *, timeout: float = HOST_CALL_TIMEOUT_S) -> HostInfo:
        """Ask ``host`` how it is; a host found gone is reported dead at once (``SandboxLost``)."""
        try:
            info: HostInfo = ask(host, "info", timeout=timeout)
        except SandboxLost:
            self.lose(host)
            raise
        host.info, host.info_at, host.placed = info, time.monotonic(), 0
        return info

    def lose(self, host: Host) -> None:
        """``host``'s node is gone (the cluster said so, or its actor can no longer run)."""
        with self._lock:
            known = self._hosts.pop(host.node_id, None)
        if known is None or not known.alive:
            return
        known.alive = False
        self.dead[host.node_id] = time.monotonic()
        log.error("node %s (%s) died: its sandboxes are lost", host.name, host.node_id[:12])
        self._on_dead(host)

    def hosts(self) -> list[Host]:
        with self._lock:
            return [h for h in self._hosts.values() if h.alive and h.ready and h.info is not None]

    def by_node(self, name_or_id: str) -> Host | None:
        for host in self.hosts():
            if name_or_id in (host.node_id, host.name):
                return host
        return None

    def each(self, method: str, *args: Any, **kwargs: Any) -> Iterable[tuple[Host, Any]]:
        """Ask every live host the same thing, concurrently; a host that fails is logged and left out."""
        hosts = self.hosts()
        refs = [(host, getattr(host.handle, method).remote(*args, **kwargs)) for host in hosts]
        for host, ref in refs:
            try:
                try:
                    answer = call(ref, node=host.name)
                except HostRestarting:
                    if method not in REPEATABLE:
                        raise
                    answer = ask(host, method, *args, **kwargs)
                yield host, answer
            except (EngineUnavailable, SandboxLost) as exc:
                log.warning("node %s left out: %s", host.name, exc)

    # ---- watching ----------------------------------------------------------------------------

    def watch(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="callbox-ray-nodes", daemon=True)
            self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_S):
            if not ray_module().is_initialized():  # this process left the cluster: nothing to watch
                return
            try:
                self.refresh(welcome_in_background=True)
            except Exception as exc:  # the cluster's control store is away: try again next tick
                log.warning("cannot read the Ray cluster's nodes: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
