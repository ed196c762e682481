"""The host of one Ray node: a detached, named actor that owns the node's local Docker engine.

Everything a sandbox needs on its node happens here, through the same :class:`DockerEngine`
a single machine uses (every hardened default, the warm pool, lifetime records, snapshots),
so the Ray engine adds placement and transport and changes nothing about what a sandbox is.
The harness reaches each sandbox's agent through the host's relay
(:mod:`harness.engine.ray.relay`): TLS pinned to the host's certificate, one token per
sandbox. The actor's methods take and return plain data (:class:`SandboxHandle`, the Docker
engine's info records), never a live object.

**Node settings** come from the environment of ``ray start`` on the node, which its workers
inherit: ``CALLBOX_NODE_NAME`` (default: the node's address), ``DOCKER_HOST`` (its dockerd,
default the local socket), ``CALLBOX_RUN_ROOT`` (the agents' sockets), ``CALLBOX_STATE_DIR``
(the relay's certificate and tokens, snapshots).

**Restarts.** Every container is labelled with the Ray node id it was started under. A host
that restarts on the same node (its process died, Ray started it again) re-adopts the live
sandboxes: it registers their sockets with the relay again, whose tokens survive in the state
directory, so the harness's connections carry on. A node that died and came back is a new
Ray node: its host removes every sandbox labelled with another node id, because the harness
reported those lost when the node died and will never use them again.

**Orphans.** The host writes down which driver (Ray job) created each sandbox
(:mod:`harness.engine.ray.drivers`); its gc, run every :data:`GC_EVERY_S` seconds and when the
harness asks, removes the sandboxes whose driver's job has ended, unless they are named or kept,
as gc does on one machine for a sandbox whose creating process is gone.

**Raylet gone.** When the node's raylet dies, this process notices that its parent changed
and exits at once, closing the relay, so calls in flight fail now rather than at a timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tenacity

from harness.core.errors import CallboxError
from harness.engine.docker import labels
from harness.engine.docker.cgroup_stats import SandboxStats
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.lifetime import LifetimeRecord
from harness.engine.docker.living import SandboxInfo
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME
from harness.engine.docker.sandbox import Sandbox as DockerSandbox
from harness.engine.docker.snapshot_archive import ExportSummary, HostAccess
from harness.engine.docker.snapshots import SnapshotInfo
from harness.engine.ray.drivers import DriverLedger, ended_jobs
from harness.engine.ray.image_receive import ImageReceiver
from harness.engine.ray.relay import AgentRelay
from harness.engine.ray.snapshot_copy import SnapshotExport, SnapshotImport
from harness.engine.spec import SandboxSpec

log = logging.getLogger("callbox.ray.host")

NODE_ID_LABEL = "callbox.ray.node-id"
"""The Ray node a sandbox's container was started under."""
NODE_ENV = "CALLBOX_NODE"
"""Set in every tool process of a sandbox on a Ray node: the node's name."""
RAYLET_WATCH_S = 0.25
RELAY_BIND_WAIT_S = 20.0
GC_EVERY_S = 30.0
"""How often a host runs gc on its own (expired sandboxes, and the orphans of ended drivers)."""


@dataclass(frozen=True)
class SandboxHandle:
    """What the harness needs to use a sandbox on a node."""

    sandbox_id: str
    container_id: str
    node: str
    node_id: str
    relay_address: str
    certificate_pem: bytes
    token: str
    spec: dict[str, Any]
    """The spec the node ran (``SandboxSpec`` as JSON, with the node's additions)."""
    tool_uid: int
    tool_gid: int
    name: str | None
    owner: str | None
    created_at: float
    expires: float
    paused: bool = False


@dataclass(frozen=True)
class HostInfo:
    """A host as the engine places sandboxes on it."""

    node: str
    node_id: str
    address: str
    relay_address: str
    certificate_pem: bytes
    live: int
    """Sandboxes on this node's engine (running or paused)."""
    sandbox_ids: tuple[str, ...]
    cpus: int | None
    memory: int | None
    pooled: int
    readopted: int
    """Sandboxes this host found alive when it started and registered again."""
    reaped: int
    """Sandboxes of an earlier life of this node it removed when it started."""


class SandboxHost:
    """The actor's body (the engine wraps it with ``ray.remote``); one per node."""

    def __init__(self, *, relay_port: int) -> None:
        import ray

        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        self.address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        self.node = os.environ.get("CALLBOX_NODE_NAME") or self.address
        state = Path(os.environ.get("CALLBOX_STATE_DIR") or "/var/lib/callbox/ray")
        run_root = os.environ.get("CALLBOX_RUN_ROOT")
        state.mkdir(parents=True, mode=0o700, exist_ok=True)
        self.engine = DockerEngine.connect(
            run_root=Path(run_root) if run_root else None, reap_on_start=False, snapshot_dir=state / "snapshots",
            extra_labels={NODE_ID_LABEL: self.node_id},
        )
        # The node, not this process, owns its sandboxes: a host that Ray restarts must not find
        # them orphaned (gc judges them by their expiry; an owner on another "host" is never dead).
        self.engine.owner = labels.Owner(host=f"ray-node-{self.node_id[:16]}", pid=1, started=0.0)
        self.drivers = DriverLedger(state / "drivers")
        self.reaped = self._reap_earlier_lives()
        for sandbox_id in self.engine.gc():
            log.info("reaped leftover sandbox %s", sandbox_id)
        self.relay = AgentRelay(bind_host=self.address, port=relay_port, state_dir=state / "relay")
        # A host restarted by Ray may start while its dying predecessor still holds the port.
        tenacity.Retrying(retry=tenacity.retry_if_exception_type(CallboxError), reraise=True,
                          stop=tenacity.stop_after_delay(RELAY_BIND_WAIT_S),
                          wait=tenacity.wait_fixed(0.25))(self.relay.start)
        self.boxes: dict[str, DockerSandbox] = {}
        self._lock = threading.Lock()
        self.readopted = self._readopt()
        self.images = ImageReceiver(self.engine.client)
        self._exports: dict[str, SnapshotExport] = {}
        self._imports: dict[str, SnapshotImport] = {}
        threading.Thread(target=self._watch_raylet, args=(os.getppid(),), name="callbox-raylet-watch",
                         daemon=True).start()
        threading.Thread(target=self._gc_now_and_then, name="callbox-host-gc", daemon=True).start()
        log.info("host of node %s (%s) ready: relay %s, %d sandbox(es) re-adopted, %d of an earlier life removed",
                 self.node, self.node_id[:12], self.relay.address, self.readopted, self.reaped)

    # ---- start-up ---------------------------------------------------------------------------

    def _reap_earlier_lives(self) -> int:
        """Remove the sandboxes labelled with another Ray node id (this node died and came back)."""
        reaped = 0
        found = self.engine.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
        for container in found:
            lab = container.get("Labels") or {}
            owner_node = lab.get(NODE_ID_LABEL)
            sandbox_id = lab.get(labels.SANDBOX_ID)
            if owner_node and owner_node != self.node_id and sandbox_id:
                log.warning("removing sandbox %s of an earlier life of this node (Ray node %s)", sandbox_id,
                            owner_node[:12])
                self.engine.remove(sandbox_id) if lab.get(labels.NAME) else self.engine.destroy(sandbox_id)
                reaped += 1
        self.engine.drain(30)
        return reaped

    def _readopt(self) -> int:
        """Register every live sandbox of this node with the relay again."""
        count = 0
        for info in self.engine.list_sandboxes(stats=False):
            if info.state not in ("running", "paused"):
                continue
            self.relay.register(info.sandbox_id, str(self.engine.run_root / info.sandbox_id / AGENT_SOCKET_NAME))
            count += 1
        return count

    def _watch_raylet(self, parent: int) -> None:
        while True:
            time.sleep(RAYLET_WATCH_S)
            if os.getppid() != parent:
                log.error("the raylet of node %s is gone: this host exits", self.node)
                os._exit(1)

    def _gc_now_and_then(self) -> None:
        while True:
            time.sleep(GC_EVERY_S)
            try:
                for sandbox_id in self.gc():
                    log.info("gc removed sandbox %s", sandbox_id)
            except Exception as exc:  # the node's dockerd away for a moment: try again next round
                log.warning("gc failed: %s", exc)

    def _reap_orphans(self) -> list[str]:
        """Remove the sandboxes whose creating driver's job has ended (not named, not kept)."""
        recorded = self.drivers.entries()
        ended = ended_jobs() if recorded else None
        if ended is None:
            return []
        present = {info.sandbox_id: info for info in self.engine.list_sandboxes(stats=False)}
        removed = []
        for sandbox_id, job in recorded.items():
            info = present.get(sandbox_id)
            if info is None:
                self.drivers.forget(sandbox_id)
            elif job in ended and info.name is None and self.engine.kept_sandbox(sandbox_id) is None:
                log.warning("removing sandbox %s: the driver that created it (Ray job %s) has ended", sandbox_id, job)
                self.destroy(sandbox_id)
                removed.append(sandbox_id)
        return removed

    # ---- what the engine asks ------------------------------------------------------------------

    def ping(self) -> str:
        return self.node_id

    def info(self) -> HostInfo:
        limits = self.engine.host_limits()
        live = [i.sandbox_id for i in self.engine.list_sandboxes(stats=False) if i.state in ("running", "paused")]
        return HostInfo(
            node=self.node, node_id=self.node_id, address=self.address, relay_address=self.relay.address,
            certificate_pem=self.relay.certificate_pem, live=len(live), sandbox_ids=tuple(live), cpus=limits.cpus,
            memory=limits.memory, pooled=self.engine.pooled_count(), readopted=self.readopted, reaped=self.reaped,
        )

    def _handle(self, box: DockerSandbox) -> SandboxHandle:
        token = self.relay.register(box.id, str(box.socket_dir / AGENT_SOCKET_NAME))
        with self._lock:
            self.boxes[box.id] = box
        return SandboxHandle(
            sandbox_id=box.id, container_id=box.container_id, node=self.node, node_id=self.node_id,
            relay_address=self.relay.address, certificate_pem=self.relay.certificate_pem, token=token,
            spec=box.spec.model_dump(mode="json"), tool_uid=box.tool_uid, tool_gid=box.tool_gid, name=box.name,
            owner=box.owner, created_at=box.created_at, expires=box.expires, paused=box.paused_here,
        )

    def _box(self, sandbox_id: str) -> DockerSandbox:
        with self._lock:
            box = self.boxes.get(sandbox_id)
        if box is None:
            box = self.engine.open(sandbox_id)
            with self._lock:
                self.boxes[sandbox_id] = box
        return box

    def _node_spec(self, spec_json: dict[str, Any]) -> SandboxSpec:
        spec = SandboxSpec.model_validate(spec_json)
        return spec.model_copy(update={"env": {**spec.env, NODE_ENV: self.node}})

    def create(self, spec_json: dict[str, Any], *, name: str | None, ttl_s: float | None,
               owner: str, driver: str | None = None) -> SandboxHandle:
        """A sandbox on this node. Every one gets a lifetime record (``owner``), so a restarted
        host and gc judge it by its expiry, never by the host process that made it; ``driver``
        (the asking driver's Ray job id) makes it an orphan once that job ends."""
        box = self.engine.create(self._node_spec(spec_json), name=name, ttl_s=ttl_s, owner=owner)
        try:
            self.drivers.record(box.id, driver)
            return self._handle(box)
        except BaseException:
            box.destroy()
            raise

    def attach(self, sandbox_id: str) -> SandboxHandle:
        box = self.engine.attach(sandbox_id)
        return self._handle(box)

    def open(self, name_or_id: str) -> SandboxHandle:
        box = self.engine.open(name_or_id)
        return self._handle(box)

    def has(self, name_or_id: str) -> bool:
        """Whether a sandbox of this name or id (live, paused, kept or gone with a record) is here."""
        return any(name_or_id in (i.sandbox_id, i.name) for i in self.engine.list_sandboxes(stats=False))

    def destroy(self, sandbox_id: str, network: str | None = None) -> None:
        with self._lock:
            box = self.boxes.pop(sandbox_id, None)
        if box is not None:
            box.agent.close()
        self.relay.unregister(sandbox_id)
        self.engine.destroy(sandbox_id, network=network)
        self.drivers.forget(sandbox_id)

    def remove(self, name_or_id: str) -> str:
        sandbox_id = self.engine.remove(name_or_id)
        with self._lock:
            box = self.boxes.pop(sandbox_id, None)
        if box is not None:
            box.agent.close()
        self.relay.unregister(sandbox_id)
        self.drivers.forget(sandbox_id)
        return sandbox_id

    def keep(self, sandbox_id: str, run_id: str, until: float | None) -> float:
        return self.engine.keep(self._box(sandbox_id), run_id=run_id, until=until).until

    def lifetime_record(self, sandbox_id: str) -> LifetimeRecord | None:
        return self.engine.lifetime_record(sandbox_id)

    def is_kept(self, sandbox_id: str) -> bool:
        return self.engine.kept_sandbox(sandbox_id) is not None

    def pause(self, sandbox_id: str) -> None:
        self.engine.pause(self._box(sandbox_id))

    def resume(self, sandbox_id: str) -> float:
        return self.engine.resume(self._box(sandbox_id))

    def is_paused(self, sandbox_id: str) -> bool:
        return self.engine.is_paused(self._box(sandbox_id))

    def keep_alive(self, sandbox_id: str, ttl_s: float | None) -> float:
        return self.engine.keep_alive(self._box(sandbox_id), ttl_s)

    def stats(self, sandbox_id: str) -> SandboxStats:
        return self.engine.stats(self._box(sandbox_id))

    def why_gone(self, sandbox_id: str) -> str | None:
        with self._lock:
            box = self.boxes.get(sandbox_id)
        return box.why_gone() if box is not None else None

    def list_sandboxes(self, stats: bool = True) -> list[SandboxInfo]:
        return self.engine.list_sandboxes(stats=stats)

    def census(self) -> tuple[int, int]:
        return self.engine.sandbox_census()

    def gc(self) -> list[str]:
        return self.engine.gc() + self._reap_orphans()

    def enable_pool(self, spec_jsons: list[dict[str, Any]], settings: dict[str, Any]) -> int:
        specs = [self._node_spec(s) for s in spec_jsons]
        self.engine.enable_pool(specs, **settings)
        return len(specs)

    def drain(self, timeout: float | None) -> bool:
        """Wait until the sandboxes destroyed so far are removed; False if ``timeout`` passed."""
        return self.engine.drain(timeout)

    def pooled_count(self) -> int:
        return self.engine.pooled_count()

    def close(self) -> None:
        """Stop the pool and finish pending removals (the sandboxes with records stay)."""
        if self.engine.pool is not None:
            self.engine.pool.close()
            self.engine.pool = None
        self.engine.drain(30)

    # ---- snapshots, forks ------------------------------------------------------------------------

    def snapshot(self, sandbox_id: str, name: str, replace: bool, owner: str | None) -> SnapshotInfo:
        return self.engine.snapshot(self._box(sandbox_id), name, replace=replace, owner=owner)

    def snapshots(self) -> list[SnapshotInfo]:
        return self.engine.snapshots()

    def remove_snapshot(self, name: str) -> None:
        self.engine.remove_snapshot(name)

    def snapshot_spec(self, name: str) -> dict[str, Any]:
        return self.engine.snapshot_spec(name).model_dump(mode="json")

    def restore_snapshot_files(self, sandbox_id: str, name: str) -> None:
        self.engine.restore_snapshot_files(self._box(sandbox_id), name)

    def snapshot_note(self, name: str, file: str) -> bytes | None:
        return self.engine.snapshot_note(name, file)

    def write_snapshot_note(self, name: str, file: str, data: bytes) -> None:
        self.engine.write_snapshot_note(name, file, data)

    def fork(self, source: str, from_snapshot: bool, name: str | None, owner: str | None,
             ttl_s: float | None, driver: str | None = None) -> SandboxHandle:
        box = self.engine.fork(source, from_snapshot=from_snapshot, name=name, owner=owner, ttl_s=ttl_s)
        self.drivers.record(box.id, driver)
        return self._handle(box)

    def restore(self, name: str) -> SandboxHandle:
        return self._handle(self.engine.restore(name))

    def export_snapshot(self, name: str) -> tuple[str, int, ExportSummary]:
        """Start sending snapshot ``name`` as an archive: a transfer id, its size in bytes, and
        what it holds (its hash manifest's digest)."""
        export = SnapshotExport(self.engine.snapshot_store, name)
        self._exports[export.id] = export
        return export.id, export.size, export.summary

    def export_read(self, transfer_id: str, size: int) -> bytes:
        """The next at most ``size`` bytes of an export; empty at its end (the export is then closed)."""
        export = self._exports[transfer_id]
        data = export.read(size)
        if not data:
            self._exports.pop(transfer_id, None)
            export.close()
        return data

    def import_begin(self, name: str | None) -> str:
        imported = SnapshotImport(self.engine.snapshot_store, name)
        self._imports[imported.id] = imported
        return imported.id

    def import_chunk(self, transfer_id: str, seq: int, data: bytes) -> None:
        self._imports[transfer_id].write(seq, data)

    def import_finish(self, transfer_id: str, replace: bool, host_access: HostAccess = "keep",
                      expect_digest: str | None = None) -> SnapshotInfo:
        return self._imports.pop(transfer_id).finish(replace=replace, host_access=host_access,
                                                     expect_digest=expect_digest)

    def import_abort(self, transfer_id: str) -> None:
        imported = self._imports.pop(transfer_id, None)
        if imported is not None:
            imported.abort()

    # ---- the image ---------------------------------------------------------------------------------

    def image_digest(self, name: str) -> str | None:
        return self.images.image_digest(name)

    def image_begin(self, name: str, expected_id: str, total_bytes: int) -> None:
        self.images.begin(name, expected_id, total_bytes)

    def image_chunk(self, seq: int, data: bytes) -> None:
        self.images.chunk(seq, data)

    def image_finish(self) -> str:
        return self.images.finish()

    def image_abort(self) -> None:
        self.images.abort()

