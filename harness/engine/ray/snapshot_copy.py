"""Moving a stored snapshot from one node's snapshot store to another's, in chunks.

A snapshot is a directory (manifest, spec, one archive per place). The sending node packs it
into an uncompressed tar in a temporary file and hands it out in pieces; the receiving node
writes the pieces, in order, to a temporary file, unpacks it into a staging directory next to
its store, checks the manifest names the snapshot, and renames it into place. Nothing half
copied is ever visible under the snapshot's name.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tarfile
import tempfile
import uuid
from typing import BinaryIO

from harness.engine.docker.snapshots import (
    MANIFEST,
    SnapshotError,
    SnapshotExists,
    SnapshotInfo,
    SnapshotStore,
)

__all__ = ["SnapshotExport", "SnapshotImport"]


class SnapshotExport:
    """Snapshot ``name`` of ``store`` as a tar stream read in pieces."""

    def __init__(self, store: SnapshotStore, name: str) -> None:
        info = store.get(name)  # SnapshotNotFound names it
        self.id = uuid.uuid4().hex
        self._file: BinaryIO = tempfile.TemporaryFile(prefix="callbox-snapshot-")  # noqa: SIM115 (closed in close)
        with tarfile.open(fileobj=self._file, mode="w") as tar:
            tar.add(str(info.directory), arcname=".")
        self.size = self._file.tell()
        self._file.seek(0)

    def read(self, size: int) -> bytes:
        return self._file.read(size)

    def close(self) -> None:
        self._file.close()


class SnapshotImport:
    """A snapshot arriving as ``name`` in ``store``: pieces in order, then ``finish``."""

    def __init__(self, store: SnapshotStore, name: str) -> None:
        self.store = store
        self.name = name
        self.directory = store.directory(name)  # checks the name
        self.id = uuid.uuid4().hex
        self._next = 0
        self._file: BinaryIO = tempfile.TemporaryFile(prefix="callbox-snapshot-in-")  # noqa: SIM115

    def write(self, seq: int, data: bytes) -> None:
        if seq != self._next:
            raise SnapshotError(f"snapshot {self.name}: piece {seq} arrived, {self._next} was expected")
        self._file.write(data)
        self._next += 1

    def finish(self, *, replace: bool) -> SnapshotInfo:
        root = self.store.root
        root.mkdir(parents=True, mode=0o700, exist_ok=True)
        if not replace and (self.directory / MANIFEST).exists():
            self.abort()
            raise SnapshotExists(self.name)
        staging = root / f".tmp-{self.name}-{uuid.uuid4().hex[:8]}"
        staging.mkdir(mode=0o700)
        try:
            self._file.seek(0)
            with tarfile.open(fileobj=self._file, mode="r") as tar:
                tar.extractall(staging, filter="data")
            manifest = json.loads((staging / MANIFEST).read_text())
            manifest["name"] = self.name
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
            if replace and self.directory.exists():
                shutil.rmtree(self.directory)
            staging.rename(self.directory)
        except (OSError, ValueError, KeyError, tarfile.TarError) as exc:
            shutil.rmtree(staging, ignore_errors=True)
            raise SnapshotError(f"snapshot {self.name} could not be received: {exc}") from None
        finally:
            self._file.close()
        return self.store.get(self.name)

    def abort(self) -> None:
        with contextlib.suppress(OSError):
            self._file.close()
