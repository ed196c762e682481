"""Moving a stored snapshot from one node's snapshot store to another's, in chunks.

A snapshot moves as the archive ``callbox sandbox export-snapshot`` writes
(:mod:`harness.engine.docker.snapshot_archive`): the sending node writes it to a temporary
file and hands it out in pieces; the receiving node writes the pieces, in order, to a
temporary file, then imports it, which checks every member's SHA-256 before anything is
stored and renames the snapshot into place. Nothing half copied, and nothing changed on
the way, is ever visible under the snapshot's name.
"""

from __future__ import annotations

import contextlib
import tempfile
import uuid
from typing import BinaryIO

from harness.engine.docker.snapshot_archive import ExportSummary, HostAccess, export_archive, import_archive
from harness.engine.docker.snapshots import SnapshotError, SnapshotInfo, SnapshotStore

__all__ = ["SnapshotExport", "SnapshotImport"]


class SnapshotExport:
    """Snapshot ``name`` of ``store`` as an archive read in pieces."""

    def __init__(self, store: SnapshotStore, name: str) -> None:
        info = store.get(name)  # SnapshotNotFound names it
        self.id = uuid.uuid4().hex
        self._file: BinaryIO = tempfile.TemporaryFile(prefix="callbox-snapshot-")  # noqa: SIM115 (closed in close)
        try:
            self.summary: ExportSummary = export_archive(info, self._file)
        except BaseException:
            self._file.close()
            raise
        self.size = self.summary.bytes
        self._file.seek(0)

    def read(self, size: int) -> bytes:
        return self._file.read(size)

    def close(self) -> None:
        self._file.close()


class SnapshotImport:
    """A snapshot archive arriving in ``store`` (as ``name``, else the name it was exported
    under): pieces in order, then ``finish``."""

    def __init__(self, store: SnapshotStore, name: str | None) -> None:
        self.store = store
        self.name = name
        if name is not None:
            store.directory(name)  # checks the name
        self.id = uuid.uuid4().hex
        self._next = 0
        self._file: BinaryIO = tempfile.TemporaryFile(prefix="callbox-snapshot-in-")  # noqa: SIM115

    def write(self, seq: int, data: bytes) -> None:
        if seq != self._next:
            raise SnapshotError(f"snapshot {self.name}: piece {seq} arrived, {self._next} was expected")
        self._file.write(data)
        self._next += 1

    def finish(self, *, replace: bool, host_access: HostAccess = "keep",
               expect_digest: str | None = None) -> SnapshotInfo:
        """Verify and store it. ``host_access``: a copy between nodes keeps the spec as it is."""
        try:
            self._file.seek(0)
            return import_archive(self.store, self._file, name=self.name, replace=replace, host_access=host_access,
                                  expect_digest=expect_digest)
        finally:
            self._file.close()

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
