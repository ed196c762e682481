"""A stored snapshot as one archive that travels to another host or node, verified before use.

The archive is an uncompressed tar, written and read as a stream (bounded memory: one
chunk at a time), with three kinds of member, in this order::

    ARCHIVE.json              {kind, format, snapshot}: what this is, checked first
    snapshot/...              every file and directory of the snapshot's directory as stored
                              (manifest.json, spec.json, places/*.tar, notes, and whatever
                              else the snapshot holds, such as a memory image), byte for byte
    HASHES.json               {kind, format, snapshot, files: {member: {size, sha256}},
                              directories: [member, ...]}: the last member

An import also reads the archive compressed (gzip, bzip2, xz: ``gzip -c`` on the way is
fine). It writes the members into a hidden staging directory next to the store, hashing as
it goes, and stores nothing until all of it holds: ``HASHES.json`` names every member with
its size and SHA-256, no member is missing or added, none escapes (absolute, ``..``, ``.``
or empty parts), every member is a regular file or a directory (a symbolic or hard link,
a device or a FIFO is refused), the snapshot's manifest and spec read, and every file the
manifest names is there. Only then is the staging directory renamed to the snapshot's name,
so a refused or interrupted import leaves nothing behind. A refusal names the member that fails.

The hashes prove the archive is what was exported, not who exported it: whoever can change
a member can rewrite ``HASHES.json`` too. ``ExportSummary.digest`` (the SHA-256 of
``HASHES.json``) is what to compare out of band, and ``expect_digest`` checks it on import.

An imported spec comes from elsewhere: one that reaches host data (mounts of host
directories, secrets read from the host) is refused unless the caller keeps it
(``host_access="keep"``: the archive is trusted) or drops it (``"drop"``: the snapshot is
stored without them, which its manifest says).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from harness.core.errors import ErrorCode, UsageError
from harness.engine.docker.lifetime import validate_name
from harness.engine.docker.snapshots import (
    MANIFEST,
    SPEC,
    SnapshotError,
    SnapshotExists,
    SnapshotInfo,
    SnapshotStore,
)
from harness.engine.spec import SandboxSpec

KIND = "callbox-snapshot-archive"
ARCHIVE_FORMAT = 1
HEADER = "ARCHIVE.json"
HASHES = "HASHES.json"
PREFIX = "snapshot"
CHUNK = 1 << 20
"""Bytes copied at a time."""
MAX_MEMBER_NAME = 512
MAX_JSON_BYTES = 16 << 20
"""The largest ``ARCHIVE.json`` or ``HASHES.json`` read into memory."""
DISK_RESERVE = 256 << 20
"""Free bytes an import leaves on the snapshot store's disk: a member that would take the disk
below it is refused before a byte of it is written."""

HostAccess = Literal["refuse", "drop", "keep"]


class ArchiveRefused(SnapshotError):
    """An archive that is not an intact snapshot archive; nothing of it was stored."""

    code = ErrorCode.INVALID_REQUEST

    def __init__(self, part: str, why: str = "") -> None:
        # ``why`` has a default so that unpickling (a Ray node's refusal, rebuilt from its
        # message, then its attributes) works.
        super().__init__(f"snapshot archive refused: {part}: {why}; nothing was imported")
        self.part = part


@dataclass(frozen=True)
class ExportSummary:
    snapshot: str
    bytes: int
    """Bytes of the archive."""
    members: int
    digest: str
    """SHA-256 of the archive's ``HASHES.json``: one value that stands for every member."""
    seconds: float


@dataclass
class _Received:
    files: dict[str, tuple[int, str]] = field(default_factory=dict)
    directories: set[str] = field(default_factory=set)
    header: dict[str, Any] | None = None
    hashes: dict[str, Any] | None = None
    digest: str = ""


# ---- export ----------------------------------------------------------------------------------------


class _HashingReader:
    """Reads a file for ``tarfile.addfile``, hashing what passes."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.sha256 = hashlib.sha256()

    def read(self, size: int = -1) -> bytes:
        data = self._file.read(size)
        self.sha256.update(data)
        return data


def _walk(directory: Path) -> Iterator[tuple[str, Path, bool]]:
    """``(relative name, path, is a directory)`` of everything under ``directory``, the manifest
    and spec first, then sorted; hidden files (a note being written) left out. A link or a
    special file in a stored snapshot is an error (a snapshot holds none)."""
    first = [MANIFEST, SPEC]
    for root, dirs, files in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        here = Path(root)
        relative_root = here.relative_to(directory)
        names = sorted(f for f in files if not f.startswith("."))
        if relative_root == Path():
            names = [f for f in first if f in names] + [f for f in names if f not in first]
        for name in [*names, *dirs]:
            path = here / name
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                raise SnapshotError(f"snapshot directory {directory} holds {path}, which is not a regular file or a "
                                    "directory: it cannot be exported")
            yield (relative_root / name).as_posix(), path, path.is_dir()


def _json_member(tar: tarfile.TarFile, name: str, data: dict[str, Any]) -> dict[str, Any]:
    """Add ``data`` as the member ``name``; its size and SHA-256."""
    raw = json.dumps(data, indent=2, sort_keys=True).encode()
    member = tarfile.TarInfo(name)
    member.size, member.mode, member.mtime = len(raw), 0o600, int(time.time())
    tar.addfile(member, _BytesReader(raw))
    return {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


class _BytesReader:
    def __init__(self, data: bytes) -> None:
        self._data = memoryview(data)

    def read(self, size: int = -1) -> bytes:
        size = len(self._data) if size < 0 else size
        piece, self._data = self._data[:size], self._data[size:]
        return bytes(piece)


class _CountingWriter:
    def __init__(self, out: BinaryIO) -> None:
        self._out = out
        self.bytes = 0

    def write(self, data: bytes) -> int:
        self._out.write(data)
        self.bytes += len(data)
        return len(data)

    def flush(self) -> None:
        self._out.flush()


def export_archive(info: SnapshotInfo, out: BinaryIO) -> ExportSummary:
    """Write snapshot ``info`` (read from its directory) to ``out`` as an archive."""
    try:
        return _export(info, out)
    except OSError as exc:  # the snapshot removed meanwhile, the disk full, the reader gone
        where = f" ({exc.filename})" if exc.filename else ""
        raise SnapshotError(f"cannot export snapshot {info.name}: {exc.strerror or exc}{where}") from None


def _export(info: SnapshotInfo, out: BinaryIO) -> ExportSummary:
    started = time.monotonic()
    files: dict[str, dict[str, Any]] = {}
    directories: list[str] = []
    # A file is written in place; a pipe through tarfile's stream buffer (a copy more per chunk).
    seekable = out.seekable()
    start = out.tell() if seekable else 0
    counter = _CountingWriter(out)
    with tarfile.open(fileobj=out if seekable else counter, mode="w" if seekable else "w|",  # type: ignore[call-overload]
                      format=tarfile.PAX_FORMAT, bufsize=CHUNK) as tar:
        tar.copybufsize = CHUNK
        header = {"kind": KIND, "format": ARCHIVE_FORMAT, "snapshot": info.name}
        files[HEADER] = _json_member(tar, HEADER, header)
        for relative, path, is_dir in _walk(info.directory):
            name = f"{PREFIX}/{relative}"
            if is_dir:
                member = tarfile.TarInfo(name)
                member.type, member.mode, member.mtime = tarfile.DIRTYPE, 0o700, int(path.stat().st_mtime)
                tar.addfile(member)
                directories.append(name)
                continue
            with open(path, "rb") as file:
                stat = os.fstat(file.fileno())
                member = tarfile.TarInfo(name)
                member.size, member.mode, member.mtime = stat.st_size, 0o600, int(stat.st_mtime)
                reader = _HashingReader(file)
                tar.addfile(member, reader)
            files[name] = {"size": stat.st_size, "sha256": reader.sha256.hexdigest()}
        hashes = {"kind": KIND, "format": ARCHIVE_FORMAT, "snapshot": info.name, "files": files,
                  "directories": directories}
        digest = _json_member(tar, HASHES, hashes)["sha256"]
    out.flush()
    written = out.tell() - start if seekable else counter.bytes
    return ExportSummary(snapshot=info.name, bytes=written, members=len(files) + len(directories) + 1,
                         digest=digest, seconds=round(time.monotonic() - started, 3))


def export_to_file(info: SnapshotInfo, target: Path) -> ExportSummary:
    """Export to ``target``, written under a temporary name beside it and renamed when complete."""
    temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with open(temporary, "xb") as out:
            summary = export_archive(info, out)
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(target)
    except OSError as exc:  # creating, syncing or renaming the file
        raise SnapshotError(f"cannot write the archive {target}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
    return summary


# ---- import ----------------------------------------------------------------------------------------


def member_problem(name: str) -> str | None:
    """Why ``name`` may not be a member of an archive (None if it may)."""
    if not name or len(name) > MAX_MEMBER_NAME:
        return "an empty or overlong member name"
    if name.startswith("/") or "\\" in name or "\x00" in name:
        return "a path that escapes (absolute, or with a backslash or NUL)"
    parts = name.rstrip("/").split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "a path that escapes (an empty, '.' or '..' part)"
    if name in (HEADER, HASHES):
        return None
    if parts[0] != PREFIX or len(parts) < 2:
        return f"a member outside {PREFIX}/"
    return None


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"a symbolic link (to {member.linkname})"
    if member.islnk():
        return f"a hard link (to {member.linkname})"
    return "a device, FIFO or other special file"


def _read_json(tar: tarfile.TarFile, member: tarfile.TarInfo, received: _Received) -> dict[str, Any]:
    if member.size > MAX_JSON_BYTES:
        raise ArchiveRefused(member.name, f"{member.size} bytes is too large for it")
    source = tar.extractfile(member)
    assert source is not None
    raw = source.read()
    received.files[member.name] = (len(raw), hashlib.sha256(raw).hexdigest())
    if member.name == HASHES:
        received.digest = hashlib.sha256(raw).hexdigest()
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ArchiveRefused(member.name, f"not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ArchiveRefused(member.name, f"not a callbox snapshot archive (its kind is not {KIND})")
    if data.get("format") != ARCHIVE_FORMAT:
        raise ArchiveRefused(member.name, f"archive format {data.get('format')!r}; this callbox reads format "
                                          f"{ARCHIVE_FORMAT}")
    return data


def _write_member(tar: tarfile.TarFile, member: tarfile.TarInfo, target: Path) -> tuple[int, str]:
    """Write a regular member to ``target`` (a new file, synced to disk); its size and SHA-256."""
    source = tar.extractfile(member)
    assert source is not None
    digest, size = hashlib.sha256(), 0
    try:
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except (FileExistsError, NotADirectoryError, IsADirectoryError):
        raise ArchiveRefused(member.name, "a file where another member is a file or a directory") from None
    except OSError as exc:
        raise SnapshotError(f"cannot write {target}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(CHUNK):
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())  # on disk before the snapshot's rename publishes it
    except OSError as exc:
        raise SnapshotError(f"cannot write {target} (member {member.name}): {exc.strerror or exc}") from None
    return size, digest.hexdigest()


def _check_room(member: tarfile.TarInfo, staging: Path) -> None:
    """Refuse a member the store's disk has no room for, before writing any of it."""
    free = shutil.disk_usage(staging).free
    if member.size > free - DISK_RESERVE:
        raise SnapshotError(
            f"cannot import member {member.name}: it holds {member.size} bytes and the disk of the snapshot "
            f"store ({staging.parent}) has {free} bytes free, {DISK_RESERVE} of which an import leaves; "
            "free space there, or point CALLBOX_STATE_DIR at a larger disk; nothing was imported")


def _receive(tar: tarfile.TarFile, staging: Path, *, stream: bool) -> _Received:
    """Write the members of ``tar`` under ``staging``, checking each as it comes."""
    received = _Received()
    for member in tar:
        if stream:
            tar.members.clear()  # type: ignore[attr-defined]  # a stream-mode TarFile keeps every member
        name = member.name
        if received.hashes is not None:
            raise ArchiveRefused(name, f"a member after {HASHES}, which must be the last")
        if problem := member_problem(name):
            raise ArchiveRefused(name, problem)
        if not (member.isreg() or member.isdir()):
            raise ArchiveRefused(name, f"{_member_kind(member)}: an archive holds only regular files and directories")
        name = name.rstrip("/")
        if name in received.files or name in received.directories:
            raise ArchiveRefused(name, "a member that appears twice")
        if received.header is None and name != HEADER:
            raise ArchiveRefused(name, f"the first member must be {HEADER}")
        if name in (HEADER, HASHES):
            if member.isdir():
                raise ArchiveRefused(name, "a directory where a file belongs")
            data = _read_json(tar, member, received)
            if name == HEADER:
                received.header = data
            else:
                received.hashes = data
            continue
        target = staging / name[len(PREFIX) + 1:]
        if member.isdir():
            try:
                target.mkdir(parents=True, exist_ok=True, mode=0o700)
            except (FileExistsError, NotADirectoryError):
                raise ArchiveRefused(name, "a directory where another member is a file") from None
            received.directories.add(name)
            continue
        _check_room(member, staging)
        received.files[name] = _write_member(tar, member, target)
    if received.header is None:
        raise ArchiveRefused(HEADER, "missing: the archive is empty or not a snapshot archive")
    if received.hashes is None:
        raise ArchiveRefused(HASHES, "missing: the archive ends early (truncated?)")
    return received


def _check_hashes(received: _Received) -> None:
    hashes = received.hashes
    assert hashes is not None and received.header is not None
    listed, dirs = hashes.get("files"), hashes.get("directories", [])
    if not isinstance(listed, dict) or not isinstance(dirs, list):
        raise ArchiveRefused(HASHES, "its files or directories are not a table and a list")
    if hashes.get("snapshot") != received.header.get("snapshot"):
        raise ArchiveRefused(HASHES, f"it names snapshot {hashes.get('snapshot')!r}, {HEADER} "
                                     f"{received.header.get('snapshot')!r}")
    for name in sorted(set(received.files) - {HASHES} - set(listed)):
        raise ArchiveRefused(name, f"a member {HASHES} does not list (added)")
    for name in sorted(set(listed) - set(received.files)):
        raise ArchiveRefused(name, f"listed in {HASHES} but not in the archive (missing)")
    for name in sorted(received.directories ^ set(dirs)):
        raise ArchiveRefused(name, "a directory " + ("added" if name in received.directories else "missing"))
    for name, expected in sorted(listed.items()):
        size, sha256 = received.files[name]
        if not isinstance(expected, dict):
            raise ArchiveRefused(HASHES, f"its entry for {name} is not a table")
        if expected.get("size") != size:
            raise ArchiveRefused(name, f"{size} bytes where {HASHES} says {expected.get('size')}")
        if expected.get("sha256") != sha256:
            raise ArchiveRefused(name, f"its SHA-256 is {sha256}, {HASHES} says {expected.get('sha256')} "
                                       "(the member was changed)")


def _host_access(spec: SandboxSpec) -> list[str]:
    reaches = [f"mount of host {m.source} at {m.target}" for m in spec.mounts]
    reaches += [f"secret {s.name} (read from the host)" for s in spec.secrets]
    return reaches


def _check_snapshot(staging: Path, name: str, host_access: HostAccess) -> None:
    """The staged snapshot reads, names only files it has, and is renamed ``name``."""
    manifest_member = f"{PREFIX}/{MANIFEST}"
    try:
        manifest = json.loads((staging / MANIFEST).read_text())
        info = SnapshotInfo.from_json(manifest, staging)
    except FileNotFoundError:
        raise ArchiveRefused(manifest_member, "missing") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ArchiveRefused(manifest_member, f"not a snapshot manifest ({exc})") from None
    for place in info.places:
        if member_problem(f"{PREFIX}/{place.file}") or not (staging / place.file).is_file():
            raise ArchiveRefused(f"{PREFIX}/{place.file}", f"the manifest names it for {place.path}, the archive "
                                                          "does not hold it")
    if info.memory is not None and (member_problem(f"{PREFIX}/{info.memory.directory}")
                                    or not (staging / info.memory.directory).is_dir()):
        raise ArchiveRefused(f"{PREFIX}/{info.memory.directory}", "the manifest names it for the memory image, the "
                                                                 "archive does not hold it")
    try:
        spec = SandboxSpec.model_validate_json((staging / SPEC).read_text())
    except FileNotFoundError:
        raise ArchiveRefused(f"{PREFIX}/{SPEC}", "missing") from None
    except ValueError as exc:
        raise ArchiveRefused(f"{PREFIX}/{SPEC}", f"not a sandbox spec ({exc})") from None
    if (reaches := _host_access(spec)) and host_access != "keep":
        if host_access == "refuse":
            raise ArchiveRefused(f"{PREFIX}/{SPEC}", f"its spec reaches host data ({'; '.join(reaches)}); "
                                                     "import it with its host access dropped or kept "
                                                     "(--host-access drop|keep)")
        (staging / SPEC).write_text(spec.model_copy(update={"mounts": (), "secrets": ()}).model_dump_json(indent=2))
        manifest["not_captured"] = [*manifest.get("not_captured", ()),
                                    *(f"{what}: dropped on import" for what in reaches)]
    manifest["name"] = name
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))


def import_archive(store: SnapshotStore, source: BinaryIO, *, name: str | None = None, replace: bool = False,
                   host_access: HostAccess = "refuse", expect_digest: str | None = None) -> SnapshotInfo:
    """Verify the archive read from ``source`` and store its snapshot as ``name`` (default the
    name it was exported under); see the module's docstring for what is checked."""
    if name is not None:
        validate_name(name, "snapshot")
    store.root.mkdir(parents=True, mode=0o700, exist_ok=True)
    staging = store.root / f".tmp-import-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staging.mkdir(mode=0o700)
    try:
        try:
            # A file is read in place (no copies through tarfile's stream buffer); a pipe as a stream.
            seekable = source.seekable()
            with tarfile.open(fileobj=source, mode="r:*" if seekable else "r|*", bufsize=CHUNK) as tar:
                received = _receive(tar, staging, stream=not seekable)
        except tarfile.TarError as exc:
            raise ArchiveRefused("the archive", f"not a readable tar ({exc})") from None
        _check_hashes(received)
        if expect_digest is not None and received.digest != expect_digest.lower():
            raise ArchiveRefused(HASHES, f"its SHA-256 is {received.digest}, {expect_digest} was expected")
        assert received.header is not None
        final = name or str(received.header.get("snapshot", ""))
        try:
            validate_name(final, "snapshot")
        except UsageError:
            raise ArchiveRefused(HEADER, f"it names snapshot {final!r}, not a snapshot name; import it with a "
                                         "name of your own (--name)") from None
        directory = store.directory(final)
        if not replace and (directory / MANIFEST).exists():
            raise SnapshotExists(final)
        _check_snapshot(staging, final, host_access)
        store.publish(staging, final, replace=replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return store.get(final)


def open_archive(path: Path) -> BinaryIO:
    """The archive file ``path``, open for reading (a ``SnapshotError`` naming it if it cannot be)."""
    try:
        return open(path, "rb")
    except OSError as exc:
        raise SnapshotError(f"cannot read the archive {path}: {exc.strerror or exc}",
                            code=ErrorCode.NOT_FOUND if isinstance(exc, FileNotFoundError) else None) from None


def import_from_file(store: SnapshotStore, path: Path, **options: Any) -> SnapshotInfo:
    with open_archive(path) as source:
        return import_archive(store, source, **options)

