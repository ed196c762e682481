"""The snapshot archive: its format, the hash manifest's checks, and every refusal (each
names the part that fails and leaves nothing in the store)."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness.engine.docker.snapshot_archive import (
    HASHES,
    HEADER,
    ArchiveRefused,
    export_archive,
    export_to_file,
    import_archive,
    import_from_file,
    member_problem,
)
from harness.engine.docker.snapshots import (
    MANIFEST,
    SPEC,
    PlaceArchive,
    SnapshotError,
    SnapshotExists,
    SnapshotInfo,
    SnapshotStore,
)
from harness.engine.spec import Mount, SandboxSpec

Members = list[tuple[tarfile.TarInfo, bytes]]
PLACE = b"a place's tar: " + bytes(range(256)) * 40
MEMORY = b"\x00memory image\xff" * 1000


def _stored(root: Path, name: str = "base", spec: SandboxSpec | None = None) -> SnapshotInfo:
    """A snapshot as the store keeps it, with a note and an extra directory its manifest names
    (as a memory image would be), written by hand: no engine needed."""
    directory = root / name
    (directory / "places").mkdir(parents=True)
    (directory / "places" / "0_workspace.tar").write_bytes(PLACE)
    (directory / "memory").mkdir()
    (directory / "memory" / "pages.img").write_bytes(MEMORY)
    (directory / "memory" / "empty").mkdir()
    (directory / "e2b.json").write_text('{"template": "base"}')
    (directory / ".e2b.json.1234.tmp").write_text("a note being written: not exported")
    info = SnapshotInfo(name=name, created_at=1.0, source_sandbox_id="sb1", source_name="web", owner="user:1",
                        image="callbox-sandbox:latest",
                        places=(PlaceArchive("/workspace", "places/0_workspace.tar", 1, 0, 10, len(PLACE)),))
    (directory / SPEC).write_text((spec or SandboxSpec()).model_dump_json())
    memory = {"directory": "memory", "runtime": "runsc", "runtime_version": "test", "bytes": len(MEMORY),
              "seconds": 0.1, "frozen_seconds": 0.05}
    (directory / MANIFEST).write_text(json.dumps(info.to_json() | {"directory": None, "memory": memory}))
    return SnapshotStore(root).get(name)


def _archive(tmp_path: Path, **spec: object) -> bytes:
    info = _stored(tmp_path / "from", spec=SandboxSpec(**spec) if spec else None)  # type: ignore[arg-type]
    out = io.BytesIO()
    export_archive(info, out)
    return out.getvalue()


def _members(archive: bytes) -> Members:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar]  # type: ignore[union-attr]


def _pack(members: Members, *, rehash: bool = False) -> bytes:
    """The members as an archive; ``rehash``: with a ``HASHES.json`` that agrees with them."""
    if rehash:
        files = {m.name: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                 for m, d in members if m.isreg() and m.name != HASHES}
        hashes = json.loads(dict((m.name, d) for m, d in members)[HASHES])
        hashes.update(files=files, directories=[m.name for m, _ in members if m.isdir()])
        members = [(m, json.dumps(hashes).encode()) if m.name == HASHES else (m, d) for m, d in members]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in members:
            member.size = len(data) if member.isreg() else 0
            tar.addfile(member, io.BytesIO(data) if member.isreg() else None)
    return out.getvalue()


class _Pipe(io.RawIOBase):
    """A source that cannot seek (standard input, a socket): read as a stream."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._data.readinto(buffer)


def _refused(store: SnapshotStore, archive: bytes, part: str, why: str, **options: object) -> None:
    for source in (io.BytesIO(archive), _Pipe(archive)):  # a file is read in place, a pipe as a stream
        with pytest.raises(ArchiveRefused) as caught:
            import_archive(store, source, **options)  # type: ignore[arg-type]
        assert caught.value.part == part, caught.value.message
        assert why in caught.value.message
        assert "nothing was imported" in caught.value.message
        assert list(store.root.iterdir()) == [], "a refused import left something behind"


def test_export_then_import_under_a_new_name_is_byte_identical(tmp_path: Path) -> None:
    info = _stored(tmp_path / "from")
    target = tmp_path / "base.cbxsnap"
    summary = export_to_file(info, target)
    assert summary.bytes == target.stat().st_size and summary.snapshot == "base"
    assert [p.name for p in tmp_path.iterdir() if p.is_file()] == ["base.cbxsnap"]  # no temporary left
    names = [m.name for m, _ in _members(target.read_bytes())]
    assert names[0] == HEADER and names[-1] == HASHES
    assert names[1:3] == ["snapshot/manifest.json", "snapshot/spec.json"]
    assert "snapshot/memory/pages.img" in names and "snapshot/memory/empty" in names  # whatever it holds travels
    assert not any(".tmp" in n for n in names)

    store = SnapshotStore(tmp_path / "to")
    imported = import_from_file(store, target, name="copy", expect_digest=summary.digest)
    assert imported.name == "copy" and imported.source_name == "web" and imported.places == info.places
    for relative in ("places/0_workspace.tar", "memory/pages.img", "e2b.json", SPEC):
        assert (imported.directory / relative).read_bytes() == (info.directory / relative).read_bytes(), relative
    assert (imported.directory / "memory" / "empty").is_dir()
    assert imported.memory is not None and imported.memory.directory == "memory"
    assert sorted(p.name for p in store.root.iterdir()) == ["copy"]
    piped = import_archive(store, _Pipe(target.read_bytes()), name="piped")  # type: ignore[arg-type]
    assert (piped.directory / "memory" / "pages.img").read_bytes() == MEMORY


class _PipeOut(io.RawIOBase):
    """A target that cannot seek (standard output into a pipe): written as a stream."""

    def __init__(self) -> None:
        self.data = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.data += data
        return len(data)


def test_an_export_into_a_pipe_imports(tmp_path: Path) -> None:
    out = _PipeOut()
    summary = export_archive(_stored(tmp_path / "from"), out)  # type: ignore[arg-type]
    assert summary.bytes == len(out.data) and summary.bytes % 10240 == 0
    imported = import_archive(SnapshotStore(tmp_path / "to"), _Pipe(bytes(out.data)),  # type: ignore[arg-type]
                              expect_digest=summary.digest)
    assert (imported.directory / "places" / "0_workspace.tar").read_bytes() == PLACE


def test_a_compressed_archive_imports(tmp_path: Path) -> None:
    import gzip

    imported = import_archive(SnapshotStore(tmp_path / "to"), io.BytesIO(gzip.compress(_archive(tmp_path))))
    assert (imported.directory / "memory" / "pages.img").read_bytes() == MEMORY


def test_the_name_comes_from_the_archive_and_an_existing_one_is_kept_unless_replaced(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    store = SnapshotStore(tmp_path / "to")
    assert import_archive(store, io.BytesIO(archive)).name == "base"
    with pytest.raises(SnapshotExists):
        import_archive(store, io.BytesIO(archive))
    assert import_archive(store, io.BytesIO(archive), replace=True).name == "base"
    assert sorted(p.name for p in store.root.iterdir()) == ["base"]


def _flip(member: str) -> Callable[[bytes], bytes]:
    def edit(archive: bytes) -> bytes:
        with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
            found = tar.getmember(member)
        changed = bytearray(archive)
        changed[found.offset_data + found.size // 2] ^= 0x01
        return bytes(changed)
    return edit


@pytest.mark.parametrize("member", ["snapshot/places/0_workspace.tar", "snapshot/memory/pages.img",
                                    "snapshot/spec.json", "snapshot/e2b.json"])
def test_a_changed_byte_in_a_member_is_refused_naming_it(tmp_path: Path, member: str) -> None:
    _refused(SnapshotStore(tmp_path / "to"), _flip(member)(_archive(tmp_path)), member, "the member was changed")


def test_a_changed_byte_in_the_hash_manifest_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r") as tar:
        data = tar.extractfile(HASHES).read()  # type: ignore[union-attr]
    digest = hashlib.sha256(data).hexdigest()
    store = SnapshotStore(tmp_path / "to")
    _refused(store, _flip(HASHES)(archive), HASHES, "")  # JSON broken or a hash that no longer agrees
    _refused(store, archive, HASHES, "was expected", expect_digest="0" * 64)
    assert import_archive(store, io.BytesIO(archive), expect_digest=digest).name == "base"


def _with(extra: tarfile.TarInfo, data: bytes = b"") -> Callable[[Members], Members]:
    return lambda members: [*members[:-1], (extra, data), members[-1]]


def _file(name: str) -> tarfile.TarInfo:
    return tarfile.TarInfo(name)


def _link(name: str, kind: bytes, target: str) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type, member.linkname = kind, target
    return member


REFUSALS: dict[str, tuple[Callable[[Members], Members], bool, str, str]] = {
    # case: (edit, rehash, the part named, why)
    "added member": (_with(_file("snapshot/extra"), b"x"), False, "snapshot/extra", "does not list (added)"),
    "missing member": (lambda ms: [(m, d) for m, d in ms if m.name != "snapshot/e2b.json"], False,
                       "snapshot/e2b.json", "not in the archive (missing)"),
    "dotdot": (_with(_file("snapshot/../../etc/cron.d/x"), b"x"), True, "snapshot/../../etc/cron.d/x", "escapes"),
    "absolute": (_with(_file("/etc/passwd"), b"x"), True, "/etc/passwd", "escapes"),
    "outside the prefix": (_with(_file("places/x.tar"), b"x"), True, "places/x.tar", "outside snapshot/"),
    "symlink": (_with(_link("snapshot/places/l", tarfile.SYMTYPE, "/etc/passwd")), True, "snapshot/places/l",
                "a symbolic link (to /etc/passwd)"),
    "hard link": (_with(_link("snapshot/h", tarfile.LNKTYPE, "snapshot/spec.json")), True, "snapshot/h",
                  "a hard link"),
    "fifo": (_with(_link("snapshot/f", tarfile.FIFOTYPE, "")), True, "snapshot/f", "special file"),
    "twice": (lambda ms: [*ms[:-1], ms[3], ms[-1]], False, "", "appears twice"),
    "after the hashes": (lambda ms: [*ms, (_file("snapshot/late"), b"x")], False, "snapshot/late",
                         "must be the last"),
    "no header first": (lambda ms: ms[1:], True, "snapshot/manifest.json", f"first member must be {HEADER}"),
    "no hashes": (lambda ms: ms[:-1], False, HASHES, "ends early"),
    "a file under a file": (_with(_file("snapshot/spec.json/x"), b"x"), True, "snapshot/spec.json/x",
                            "a file where another member is"),
    "place missing": (lambda ms: [(m, d) for m, d in ms if not m.name.endswith(".tar")], True,
                      "snapshot/places/0_workspace.tar", "the manifest names it"),
    "memory image missing": (lambda ms: [(m, d) for m, d in ms if not m.name.startswith("snapshot/memory")], True,
                             "snapshot/memory", "the manifest names it"),
    "manifest missing": (lambda ms: [(m, d) for m, d in ms if not m.name.endswith(MANIFEST)], True,
                         "snapshot/manifest.json", "missing"),
    "spec unreadable": (lambda ms: [(m, b"{}x" if m.name.endswith(SPEC) else d) for m, d in ms], True,
                        "snapshot/spec.json", "not a sandbox spec"),
    "another format": (lambda ms: [(m, d.replace(b'"format": 1', b'"format": 9') if m.name == HEADER else d)
                                   for m, d in ms], True, HEADER, "archive format 9"),
    "another kind": (lambda ms: [(m, d.replace(b"callbox-snapshot-archive", b"zip") if m.name == HEADER else d)
                                 for m, d in ms], True, HEADER, "not a callbox snapshot archive"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_every_refusal_names_the_part_and_leaves_nothing(tmp_path: Path, case: str) -> None:
    edit, rehash, part, why = REFUSALS[case]
    members = edit(_members(_archive(tmp_path)))
    archive = _pack(members, rehash=rehash)
    if case == "twice":
        part = members[-2][0].name
    _refused(SnapshotStore(tmp_path / "to"), archive, part, why)


def test_a_truncated_or_foreign_archive_is_refused(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    store = SnapshotStore(tmp_path / "to")
    for source in (io.BytesIO(archive[: len(archive) // 2]), _Pipe(archive[: len(archive) // 2])):
        with pytest.raises(ArchiveRefused) as caught:
            import_archive(store, source)  # type: ignore[arg-type]
        assert "nothing was imported" in caught.value.message
        assert list(store.root.iterdir()) == []
    _refused(store, b"this is not a tar at all" * 100, "the archive", "not a readable tar")
    _refused(store, b"", "the archive", "empty file")


def test_a_spec_that_reaches_host_data_is_refused_dropped_or_kept(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    archive = _archive(tmp_path, mounts=(Mount(source=project, target="/workspace/project", read_only=False),))
    store = SnapshotStore(tmp_path / "to")
    _refused(store, archive, "snapshot/spec.json", f"mount of host {project} at /workspace/project")
    dropped = import_archive(store, io.BytesIO(archive), name="dropped", host_access="drop")
    assert store.spec(dropped).mounts == ()
    assert any("dropped on import" in note for note in dropped.not_captured)
    kept = import_archive(store, io.BytesIO(archive), name="kept", host_access="keep")
    assert store.spec(kept).mounts[0].source == project


@pytest.mark.parametrize(("name", "ok"), [
    ("snapshot/places/0_workspace.tar", True), (HASHES, True), ("snapshot/a/./b", False), ("snapshot//b", False),
    ("snapshot", False), ("snapshot\\..\\x", False), ("x" * 600, False), ("", False),
])
def test_member_names(name: str, ok: bool) -> None:
    assert (member_problem(name) is None) is ok


def test_a_copy_between_ray_nodes_is_the_verified_archive(tmp_path: Path) -> None:
    """What a Ray node sends another (piece by piece) is the archive, checked on arrival."""
    from harness.engine.ray.snapshot_copy import SnapshotExport, SnapshotImport

    _stored(tmp_path / "a")
    for tamper, name in ((False, "moved"), (True, "spoiled")):
        export = SnapshotExport(SnapshotStore(tmp_path / "a"), "base")
        receiving = SnapshotImport(SnapshotStore(tmp_path / "b"), name)
        seq = 0
        while data := export.read(4096):
            if tamper and seq == 2:
                data = bytes([data[0] ^ 1]) + data[1:]
            receiving.write(seq, data)
            seq += 1
        export.close()
        if not tamper:
            assert receiving.finish(replace=True).name == "moved"
            continue
        with pytest.raises(ArchiveRefused) as caught:
            receiving.finish(replace=True)
        again = pickle.loads(pickle.dumps(caught.value))  # as a Ray node's error reaches the driver
        assert (again.message, again.part, again.code) == (caught.value.message, caught.value.part, caught.value.code)
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["moved"]


def test_the_cli_exports_imports_and_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    from harness.cli.main import main

    _stored(tmp_path / "store")
    monkeypatch.setenv("CALLBOX_SNAPSHOT_DIR", str(tmp_path / "store"))
    monkeypatch.setenv("CALLBOX_ENGINE", "docker")
    archive = tmp_path / "base.tar"
    assert main(["sandbox", "export-snapshot", "base", "-o", str(archive), "--json"]) == 0
    exported = json.loads(capsys.readouterr().out)
    assert exported["bytes"] == archive.stat().st_size and len(exported["sha256"]) == 64
    assert main(["sandbox", "import-snapshot", str(archive), "--name", "copy", "--sha256", exported["sha256"]]) == 0
    assert "imported snapshot copy (of sandbox web" in capsys.readouterr().out
    assert (tmp_path / "store" / "copy" / "places" / "0_workspace.tar").read_bytes() == PLACE
    archive.write_bytes(_flip("snapshot/places/0_workspace.tar")(archive.read_bytes()))
    assert main(["sandbox", "import-snapshot", str(archive), "--name", "spoiled"]) != 0
    assert "snapshot/places/0_workspace.tar: its SHA-256 is" in capsys.readouterr().err
    assert not (tmp_path / "store" / "spoiled").exists()
    assert main(["sandbox", "import-snapshot", str(archive), "--node", "w1"]) != 0
    assert "--node names a node of the Ray engine" in capsys.readouterr().err


def test_a_member_larger_than_the_free_disk_is_refused_before_a_byte_is_written(tmp_path: Path) -> None:
    header, data = _members(_archive(tmp_path))[0]
    out = io.BytesIO()
    header.size = len(data)
    out.write(header.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
    out.write(data + b"\0" * (-len(data) % tarfile.BLOCKSIZE))
    huge = tarfile.TarInfo("snapshot/places/huge.tar")
    huge.size = 1 << 60  # the header alone, as a hostile or broken archive would declare it
    out.write(huge.tobuf(tarfile.PAX_FORMAT, tarfile.ENCODING, "surrogateescape"))
    store = SnapshotStore(tmp_path / "to")
    for source in (io.BytesIO(out.getvalue()), _Pipe(out.getvalue())):
        with pytest.raises(SnapshotError) as caught:
            import_archive(store, source)  # type: ignore[arg-type]
        assert "cannot import member snapshot/places/huge.tar" in caught.value.message
        assert f"holds {1 << 60} bytes" in caught.value.message and "nothing was imported" in caught.value.message
        assert list(store.root.iterdir()) == []
