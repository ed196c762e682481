"""Snapshots and forks on the Ray engine.

A snapshot is stored on the node of the sandbox it was taken of, in that node's snapshot
store. Everything that needs it elsewhere gets a copy first (:meth:`RaySnapshots.copy_snapshot`,
chunk by chunk through Ray, as the archive ``export-snapshot`` writes, every hash checked on
arrival): a fork placed on another node, or a sandbox on another node its
files are restored into. Listing asks every node; a name held by several nodes (copies) is
one snapshot. The small notes a door keeps with a snapshot are written to every copy.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from harness.engine.docker.lifetime import SandboxNotFound
from harness.engine.docker.snapshot_archive import ExportSummary, HostAccess
from harness.engine.docker.snapshots import SnapshotInfo, SnapshotNotFound
from harness.engine.placement import Placement
from harness.engine.ray.hosts import Host, HostDirectory, ask
from harness.engine.spec import SandboxSpec

if TYPE_CHECKING:
    from harness.engine.ray.host import SandboxHandle
    from harness.engine.ray.sandbox import RaySandbox

log = logging.getLogger("callbox.ray")

CHUNK_BYTES = 4 << 20
"""Pieces a snapshot moves between nodes in."""


class RaySnapshots:
    """The snapshot half of :class:`~harness.engine.ray.engine.RayEngine`."""

    keeps_snapshots = True
    hosts: HostDirectory
    _lock: threading.Lock
    _pending: dict[str, int]
    driver_job: str | None

    if TYPE_CHECKING:  # the engine's own, which this half uses
        def _require_host(self, name_or_id: str) -> Host: ...

        def _place(self, placement: Placement) -> Host: ...

        def _adopt(self, host: Host, handle: SandboxHandle, *, group: str = "") -> RaySandbox: ...

    def snapshot(self, sandbox: RaySandbox, name: str, *, replace: bool = False,
                 owner: str | None = None) -> SnapshotInfo:
        """Store a snapshot of ``sandbox`` on its node (it moves to another node when a fork there needs it)."""
        info: SnapshotInfo = sandbox._ask("snapshot", sandbox.id, name, replace, owner)
        return info

    def snapshots(self) -> list[SnapshotInfo]:
        found: dict[str, SnapshotInfo] = {}
        for _host, infos in self.hosts.each("snapshots"):
            for info in infos:
                found.setdefault(info.name, info)
        return sorted(found.values(), key=lambda info: info.created_at)

    def snapshot_holders(self, name: str) -> list[Host]:
        return [host for host, infos in self.hosts.each("snapshots") if any(i.name == name for i in infos)]

    def _holders(self, name: str) -> list[Host]:
        holders = self.snapshot_holders(name)
        if not holders:
            raise SnapshotNotFound(name)
        return holders

    def remove_snapshot(self, name: str) -> None:
        for host in self._holders(name):
            ask(host, "remove_snapshot", name)

    def snapshot_spec(self, name: str) -> SandboxSpec:
        """The spec snapshot ``name`` recorded of its sandbox."""
        return SandboxSpec.model_validate(ask(self._holders(name)[0], "snapshot_spec", name))

    def snapshot_note(self, name: str, file: str) -> bytes | None:
        note: bytes | None = ask(self._holders(name)[0], "snapshot_note", name, file)
        return note

    def write_snapshot_note(self, name: str, file: str, data: bytes) -> None:
        for host in self._holders(name):
            ask(host, "write_snapshot_note", name, file, data)

    def restore_snapshot_files(self, sandbox: RaySandbox, name: str) -> None:
        """Put the files of snapshot ``name`` into ``sandbox``, copying the snapshot to its node first if need be."""
        self._bring(name, sandbox.host)
        sandbox._ask("restore_snapshot_files", sandbox.id, name)

    def _bring(self, name: str, target: Host) -> None:
        holders = self._holders(name)
        if target.node_id not in {h.node_id for h in holders}:
            log.info("copying snapshot %s from node %s to node %s", name, holders[0].name, target.name)
            self.copy_snapshot(name, holders[0], target)

    def copy_snapshot(self, name: str, source: Host, target: Host) -> SnapshotInfo:
        """Send snapshot ``name`` from ``source``'s node to ``target``'s (replacing one there)."""
        transfer, _size, _summary = ask(source, "export_snapshot", name)
        receiving = ask(target, "import_begin", name)
        try:
            for seq in itertools.count():
                data = ask(source, "export_read", transfer, CHUNK_BYTES)
                if not data:
                    break
                ask(target, "import_chunk", receiving, seq, data)
            info: SnapshotInfo = ask(target, "import_finish", receiving, True)
        except BaseException:
            target.handle.import_abort.remote(receiving)
            raise
        return info

    def export_snapshot(self, name: str, out: BinaryIO) -> ExportSummary:
        """Write snapshot ``name`` to ``out`` as an archive (``callbox sandbox export-snapshot``),
        read from a node that holds it."""
        holder = self._holders(name)[0]
        transfer, _size, summary = ask(holder, "export_snapshot", name)
        while data := ask(holder, "export_read", transfer, CHUNK_BYTES):
            out.write(data)
        exported: ExportSummary = summary
        return exported

    def export_snapshot_to_file(self, name: str, target: Path) -> ExportSummary:
        """:meth:`export_snapshot` to ``target``, written under a temporary name and renamed when complete."""
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(temporary, "xb") as out:
                summary = self.export_snapshot(name, out)
            temporary.replace(target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
        return summary

    def import_snapshot(self, source: BinaryIO, *, node: str | None = None, name: str | None = None,
                        replace: bool = False, host_access: HostAccess = "refuse",
                        expect_digest: str | None = None) -> SnapshotInfo:
        """Send the archive read from ``source`` to ``node`` (default: the first node), which
        verifies it and stores its snapshot (``callbox sandbox import-snapshot --node``)."""
        target = self.hosts.by_node(node) if node is not None else next(iter(self.hosts.hosts()), None)
        if target is None:
            raise SandboxNotFound(f"node {node}")
        receiving = ask(target, "import_begin", name)
        try:
            for seq in itertools.count():
                data = source.read(CHUNK_BYTES)
                if not data:
                    break
                ask(target, "import_chunk", receiving, seq, data)
            info: SnapshotInfo = ask(target, "import_finish", receiving, replace, host_access, expect_digest)
        except BaseException:
            target.handle.import_abort.remote(receiving)
            raise
        return info

    def fork(self, source: RaySandbox | str, *, from_snapshot: bool = False, name: str | None = None,
             owner: str | None = None, ttl_s: float | None = None, node: str | None = None) -> RaySandbox:
        """A new sandbox with the files of ``source`` (a live sandbox, its name or id: on its own
        node), or with ``from_snapshot`` the snapshot named ``source``: on ``node`` if given, else
        where placement puts it, the snapshot copied there first when that node lacks it."""
        if not from_snapshot:
            host = self._require_host(source) if isinstance(source, str) else source.host
            ident = source if isinstance(source, str) else source.id
            return self._adopt(host, ask(host, "fork", ident, False, name, owner, ttl_s, self.driver_job))
        assert isinstance(source, str)
        self._holders(source)
        if node is not None:
            target = self.hosts.by_node(node)
            if target is None:
                raise SandboxNotFound(f"node {node}")
        else:
            target = self._place(Placement())
            with self._lock:
                self._pending[target.node_id] -= 1  # counted once the fork is adopted
        self._bring(source, target)
        return self._adopt(target, ask(target, "fork", source, True, name, owner, ttl_s, self.driver_job))

    def restore(self, name: str) -> RaySandbox:
        host = self._require_host(name)
        return self._adopt(host, ask(host, "restore", name))


__all__ = ["CHUNK_BYTES", "RaySnapshots"]
