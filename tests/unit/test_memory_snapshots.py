"""Memory snapshots without an engine: who may take one (gVisor, network none), and the
manifest naming the memory image (read back as written, absent in a files-only snapshot)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.docker import memory_snapshots
from harness.engine.docker.snapshots import MEMORY, MemoryImage, SnapshotStore
from harness.engine.spec import SandboxSpec


def test_runc_is_refused_naming_runsc_and_why_not_criu() -> None:
    with pytest.raises(CallboxError) as refused:
        memory_snapshots.refuse_unless_possible(SandboxSpec(runtime="runc"), "box")
    assert refused.value.code == ErrorCode.NOT_SUPPORTED
    text = str(refused.value)
    assert "box runs under runc" in text and 'runtime = "runsc"' in text and "CRIU" in text


def test_a_networked_gvisor_sandbox_is_refused() -> None:
    with pytest.raises(CallboxError) as refused:
        memory_snapshots.refuse_unless_possible(SandboxSpec(runtime="runsc", network="open"), "box")
    assert refused.value.code == ErrorCode.NOT_SUPPORTED and "network 'open'" in str(refused.value)


def _empty_places(place: str) -> Iterator[bytes]:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        entry = tarfile.TarInfo(place.strip("/").split("/")[-1])
        entry.type = tarfile.DIRTYPE
        tar.addfile(entry)
    yield buffer.getvalue()


def test_the_manifest_names_the_memory_image_and_reads_back(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path)

    def save(directory: Path) -> MemoryImage:
        (directory / MEMORY).mkdir()
        (directory / MEMORY / "checkpoint.img").write_bytes(b"x" * 10)
        return MemoryImage(directory=MEMORY, runtime="runsc", runtime_version="runsc version 1", bytes=10,
                           seconds=0.2, frozen_seconds=0.1)

    spec = SandboxSpec(runtime="runsc")
    info = store.write("with-memory", spec=spec, download=_empty_places, source_sandbox_id="abc", memory=save)
    manifest = json.loads((info.directory / "manifest.json").read_text())
    assert manifest["memory"]["directory"] == MEMORY and manifest["memory"]["bytes"] == 10
    assert (info.directory / MEMORY / "checkpoint.img").exists()
    again = store.get("with-memory")
    assert again.memory == info.memory and again.memory is not None and again.memory.runtime == "runsc"
    assert again.bytes == sum(p.archive_bytes for p in again.places) + 10
    assert not any("running processes" in note for note in again.not_captured)

    plain = store.write("files-only", spec=spec, download=_empty_places, source_sandbox_id="abc")
    assert json.loads((plain.directory / "manifest.json").read_text())["memory"] is None
    assert store.get("files-only").memory is None
