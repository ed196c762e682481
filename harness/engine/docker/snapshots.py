"""Snapshots of a sandbox's files on the host, and restoring them into a new sandbox.

A snapshot holds every *writable place* of a sandbox: its scratch tmpfs (``/workspace``,
``/tmp``, the home directory, a separate workdir: ``SandboxSpec.scratch_tmpfs()``), each as
one tar archive of its contents, with the spec the sandbox ran with and a manifest. They
live in a persistent state directory (not the run root, a tmpfs lost at reboot):
``$CALLBOX_SNAPSHOT_DIR``, else ``$XDG_STATE_HOME/callbox/snapshots``, else
``~/.local/state/callbox/snapshots``::

    <snapshot dir>/<name>/
        manifest.json         name, created_at, owner, source sandbox, places with their sizes,
                              links, what was skipped and what a snapshot cannot hold
        spec.json             the SandboxSpec (without the egress proxy's environment)
        places/0_workspace.tar   the contents of /workspace, member names relative to it
        places/1_tmp.tar ...
        memory/               with ``--memory`` (gVisor only): the sandbox's processes and memory
                              as runsc saved them (:mod:`harness.engine.docker.memory_image`);
                              the manifest's ``memory`` names it, else it is null

A snapshot is written under ``.tmp-<name>-...`` and renamed into place when complete, so
a listed snapshot is never half written; the archives are streamed from the agent's
Download to disk through a filter (bounded memory: one chunk and one member header).

The filter keeps regular files and directories, which is what the agent's Upload accepts.
Symbolic links and hard links are not put in the archives: the manifest lists each (path
and target) and a fork recreates them with ``ln`` as the tool user after the upload.
Left out, and said so in the manifest: whatever a mount below a place holds (it is the
host's data: a fork mounts the same host directory again), the agent's own runtime files
in ``/tmp`` (``callbox-shell-*``), and special files (the agent's Download skips devices,
FIFOs and sockets itself). Not captured at all: read-write and read-only mounts (named
one by one), running processes and their memory (unless the snapshot has a memory image).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import tarfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

from harness.core.errors import CallboxError, ErrorCode
from harness.core.state_dirs import state_dir
from harness.engine.docker.lifetime import validate_name
from harness.engine.spec import TMP, SandboxSpec

FORMAT = 1
MANIFEST = "manifest.json"
SPEC = "spec.json"
PLACES = "places"
MEMORY = "memory"
"""The memory image's directory in a snapshot."""
PROXY_ENV = ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy")
"""The environment the engine adds for an allowlist sandbox's egress proxy (a fork gets its own)."""
AGENT_RUNTIME = "callbox-shell-"
"""The agent's shell sessions keep private runtime directories ``/tmp/callbox-shell-*``."""
LINK_BATCH = 200
"""Links recreated per ``ln`` script."""
LEFTOVER_AGE_S = 86400.0
"""A staging or temporary snapshot directory this old was left by a killed process."""

Download = Callable[[str], Iterable[bytes]]
"""Streams a sandbox path out as raw tar chunks (``TransferClient.download``)."""


class SnapshotError(CallboxError):
    """A snapshot cannot be made, found or restored."""


class SnapshotNotFound(SnapshotError):
    code = ErrorCode.NOT_FOUND

    def __init__(self, name: str) -> None:
        super().__init__(f"no snapshot named {name}; `callbox sandbox snapshots` lists them")
        self.name = name


class SnapshotExists(SnapshotError):
    code = ErrorCode.ALREADY_EXISTS

    def __init__(self, name: str) -> None:
        super().__init__(f"a snapshot named {name} already exists; pick another name or replace it")
        self.name = name


def default_snapshot_dir() -> Path:
    """``$CALLBOX_SNAPSHOT_DIR``, else ``$XDG_STATE_HOME/callbox/snapshots`` (absolute only),
    else ``~/.local/state/callbox/snapshots``."""
    if chosen := os.environ.get("CALLBOX_SNAPSHOT_DIR"):
        return Path(chosen)
    return state_dir() / "snapshots"


@dataclass(frozen=True)
class PlaceArchive:
    """One writable place of a snapshot."""

    path: str
    """The place in the sandbox (``/workspace``)."""
    file: str
    """Its archive, relative to the snapshot directory."""
    files: int
    dirs: int
    bytes: int
    """Bytes of file content."""
    archive_bytes: int


@dataclass(frozen=True)
class Link:
    """A symbolic or hard link of a snapshot, recreated by a fork after the upload."""

    path: str
    """Absolute path in the sandbox."""
    target: str
    """As stored (a symlink's text; a hard link's absolute path in the sandbox)."""
    hard: bool = False


@dataclass(frozen=True)
class MemoryImage:
    """The processes and memory of a snapshot's sandbox, as its runtime saved them."""

    directory: str
    """Relative to the snapshot directory (``memory``): every file under it belongs to the image."""
    runtime: str
    runtime_version: str
    bytes: int
    seconds: float
    """How long taking it took, the agent's pause included."""
    frozen_seconds: float
    """How long the sandbox stood still while its memory was written."""


@dataclass(frozen=True)
class SnapshotInfo:
    """A stored snapshot (its manifest)."""

    name: str
    created_at: float
    source_sandbox_id: str
    source_name: str | None
    owner: str | None
    image: str
    places: tuple[PlaceArchive, ...]
    links: tuple[Link, ...] = ()
    skipped: tuple[str, ...] = ()
    """Paths left out of the archives, each with why."""
    not_captured: tuple[str, ...] = ()
    """What a snapshot cannot hold, one sentence each."""
    seconds: float = 0.0
    """How long taking it took."""
    memory: MemoryImage | None = None
    """Its processes and memory, when taken with ``--memory``: a restore or fork resumes them."""
    directory: Path = field(default=Path(), compare=False)

    @property
    def bytes(self) -> int:
        """Bytes on disk: the archives and the memory image."""
        return sum(place.archive_bytes for place in self.places) + (self.memory.bytes if self.memory else 0)

    @property
    def captured(self) -> list[str]:
        return [place.path for place in self.places]

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(format=FORMAT, directory=str(self.directory), bytes=self.bytes, captured=self.captured)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any], directory: Path) -> SnapshotInfo:
        return cls(
            name=str(data["name"]), created_at=float(data["created_at"]),
            source_sandbox_id=str(data["source_sandbox_id"]),
            source_name=None if data.get("source_name") is None else str(data["source_name"]),
            owner=None if data.get("owner") is None else str(data["owner"]), image=str(data.get("image", "")),
            places=tuple(PlaceArchive(**p) for p in data["places"]),
            links=tuple(Link(**link) for link in data.get("links", ())),
            skipped=tuple(data.get("skipped", ())), not_captured=tuple(data.get("not_captured", ())),
            seconds=float(data.get("seconds", 0.0)),
            memory=MemoryImage(**data["memory"]) if data.get("memory") else None, directory=directory,
        )


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks (one chunk held at a time)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks: Iterator[bytes] = iter(chunks)
        self._chunk = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._chunk:
            piece = next(self._chunks, None)
            if piece is None:
                return 0
            self._chunk = memoryview(piece)
        n = min(len(buffer), len(self._chunk))
        buffer[:n] = self._chunk[:n]
        self._chunk = self._chunk[n:]
        return n


@dataclass
class _Filtered:
    files: int = 0
    dirs: int = 0
    bytes: int = 0
    links: list[Link] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _excluded(relative: str, excluded: tuple[str, ...]) -> str | None:
    for prefix in excluded:
        if relative == prefix or relative.startswith(prefix + "/"):
            return prefix
    return None


def filter_place(chunks: Iterable[bytes], place: str, out: BinaryIO, *, mounts: tuple[str, ...] = ()) -> _Filtered:
    """Copy the Download archive of ``place`` to ``out`` as an archive of its contents
    (members renamed relative to the place), regular files and directories only; links are
    returned, mounts below the place (container paths) and agent runtime files left out."""
    top = PurePosixPath(place).name
    excluded = tuple(str(PurePosixPath(m).relative_to(place)) for m in mounts)
    result = _Filtered()
    with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as source, \
            tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as target:
        for member in source:
            source.members.clear()  # type: ignore[attr-defined]  # a stream-mode TarFile keeps every member
            name = member.name.rstrip("/")
            if name == top:
                continue  # the place itself: a fork has it already
            if not name.startswith(top + "/"):
                result.skipped.append(f"{name} (outside {place})")
                continue
            relative = name[len(top) + 1:]
            full = f"{place.rstrip('/')}/{relative}"
            if (mount := _excluded(relative, excluded)) is not None:
                if relative == mount:
                    result.skipped.append(f"{full} (a mount: the host's data, not copied)")
                continue
            if place == TMP and relative.split("/")[0].startswith(AGENT_RUNTIME):
                continue  # the agent's own shell runtime directory
            if member.issym():
                result.links.append(Link(full, member.linkname))
                continue
            if member.islnk():
                linked = member.linkname.rstrip("/")
                if not linked.startswith(top + "/"):
                    result.skipped.append(f"{full} (a hard link to {linked}, outside {place})")
                    continue
                result.links.append(Link(full, f"{place.rstrip('/')}/{linked[len(top) + 1:]}", hard=True))
                continue
            if not (member.isreg() or member.isdir()):
                result.skipped.append(f"{full} (a special file)")
                continue
            member.name = relative
            member.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in ("path", "linkpath")}
            if member.isreg():
                target.addfile(member, source.extractfile(member))
                result.files += 1
                result.bytes += member.size
            else:
                target.addfile(member)
                result.dirs += 1
            target.members.clear()  # type: ignore[attr-defined]  # nor should the writer
    return result


def _not_captured(spec: SandboxSpec, running: Sequence[str], memory: bool) -> list[str]:
    notes = []
    for mount in spec.mounts:
        if mount.read_only:
            notes.append(f"read-only mount {mount.target} (host {mount.source}): not copied; a fork mounts the "
                         "same host directory again")
        else:
            notes.append(f"read-write mount {mount.target} (host {mount.source}): its host data is not copied; "
                         "a fork mounts the same host directory again and shares whatever it holds then")
    jobs = f" ({len(running)} running job(s): {'; '.join(running[:10])})" if running else ""
    if memory:
        notes.append("calls under way and connections to the agent: a restore resumes every process, but a call "
                     "that ran while the memory image was taken ended")
        return notes
    notes.append(f"running processes and their memory{jobs}: a fork starts with no processes (background jobs, "
                 "shell sessions and terminals are not copied)")
    return notes


def snapshot_spec(spec: SandboxSpec) -> SandboxSpec:
    """The spec a fork is created from: the egress proxy's environment removed (a fork's
    proxy is its own)."""
    if spec.network != "allowlist":
        return spec
    return spec.model_copy(update={"env": {k: v for k, v in spec.env.items() if k not in PROXY_ENV}})


def note_file(file: str) -> str:
    """``file`` if it may name a note kept with a snapshot: a plain ``NAME.json`` that is not
    one of the snapshot's own files."""
    if (not file.endswith(".json") or file in (MANIFEST, SPEC) or "/" in file or file.startswith(".")
            or len(file) > 64):
        raise SnapshotError(f"{file!r} cannot name a snapshot's note: use NAME.json (not {MANIFEST} or {SPEC})")
    return file


class SnapshotStore:
    """The snapshots under one directory."""

    def __init__(self, root: Path | None = None) -> None:
        self._root = root

    @property
    def root(self) -> Path:
        """The directory (``default_snapshot_dir()`` read at use, unless one was given)."""
        return self._root if self._root is not None else default_snapshot_dir()

    def directory(self, name: str) -> Path:
        return self.root / validate_name(name, "snapshot")

    def get(self, name: str) -> SnapshotInfo:
        return self._load(self.directory(name), name)

    def _load(self, directory: Path, name: str) -> SnapshotInfo:
        try:
            return SnapshotInfo.from_json(json.loads((directory / MANIFEST).read_text()), directory)
        except FileNotFoundError:
            raise SnapshotNotFound(name) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise SnapshotError(f"snapshot {name} cannot be read ({directory / MANIFEST}: {exc})") from None

    def list(self) -> list[SnapshotInfo]:
        """Every readable snapshot, oldest first (temporary ones left out)."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            try:
                found.append(self._load(entry, entry.name))
            except SnapshotError:
                continue
        return sorted(found, key=lambda info: info.created_at)

    def spec(self, info: SnapshotInfo) -> SandboxSpec:
        try:
            return SandboxSpec.model_validate_json((info.directory / SPEC).read_text())
        except (OSError, ValueError) as exc:
            raise SnapshotError(f"the spec of snapshot {info.name} cannot be read: {exc}") from None

    def note(self, name: str, file: str) -> bytes | None:
        """A caller's own small file kept with snapshot ``name`` (None when it has none)."""
        try:
            return (self.directory(name) / note_file(file)).read_bytes()
        except FileNotFoundError:
            if not (self.directory(name) / MANIFEST).exists():
                raise SnapshotNotFound(name) from None
            return None

    def write_note(self, name: str, file: str, data: bytes) -> None:
        """Keep ``data`` as the file ``file`` with snapshot ``name``, atomically; it travels with
        the snapshot (a copy to another node takes the whole directory)."""
        directory = self.directory(name)
        if not (directory / MANIFEST).exists():
            raise SnapshotNotFound(name)
        path = directory / note_file(file)
        temporary = directory / f".{path.name}.{uuid.uuid4().hex[:8]}.tmp"
        try:
            temporary.write_bytes(data)
            temporary.replace(path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()

    def remove(self, name: str) -> None:
        directory = self.directory(name)
        if not (directory / MANIFEST).exists():
            raise SnapshotNotFound(name)
        self._discard(directory)

    def _sweep(self) -> None:
        """Remove what a killed process left: staging, temporary and half-removed snapshots
        older than a day (never one being written now)."""
        for entry in self.root.iterdir():
            if entry.name.startswith((".tmp-", ".fork-", ".rm-")):
                with contextlib.suppress(OSError):
                    if time.time() - entry.stat().st_mtime > LEFTOVER_AGE_S:
                        shutil.rmtree(entry, ignore_errors=True)

    def _discard(self, directory: Path) -> None:
        """Remove a snapshot directory: renamed aside first, so it vanishes at once."""
        doomed = directory.with_name(f".rm-{directory.name}-{uuid.uuid4().hex[:8]}")
        try:
            directory.rename(doomed)
        except FileNotFoundError:
            return
        shutil.rmtree(doomed, ignore_errors=True)

    def write(self, name: str, *, spec: SandboxSpec, download: Download, source_sandbox_id: str,
              source_name: str | None = None, owner: str | None = None, replace: bool = False,
              temporary: bool = False, running: Sequence[str] = (),
              memory: Callable[[Path], MemoryImage] | None = None) -> SnapshotInfo:
        """Snapshot the places of a sandbox running ``spec`` through ``download``.
        ``temporary``: a hidden snapshot (a fork of a live sandbox), named as given;
        ``running``: the sandbox's running jobs, for the manifest; ``memory``: saves the
        sandbox's memory image into the (staging) snapshot directory it is given."""
        directory = self.root / (name if temporary else validate_name(name, "snapshot"))
        if not replace and (directory / MANIFEST).exists():
            raise SnapshotExists(name)
        started = time.monotonic()
        self.root.mkdir(parents=True, mode=0o700, exist_ok=True)
        self._sweep()
        staging = self.root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        (staging / PLACES).mkdir(parents=True, mode=0o700)
        try:
            info = self._fill(staging, name, spec, download, source_sandbox_id, source_name, owner, started,
                              running, memory)
            self._publish(staging, directory, name, replace)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return SnapshotInfo.from_json(info.to_json(), directory)

    def _fill(self, staging: Path, name: str, spec: SandboxSpec, download: Download, source_sandbox_id: str,
              source_name: str | None, owner: str | None, started: float, running: Sequence[str],
              memory: Callable[[Path], MemoryImage] | None) -> SnapshotInfo:
        places, links, skipped = [], [], []
        for index, place in enumerate(sorted(spec.scratch_tmpfs())):
            below = tuple(m.target for m in spec.mounts if m.target.startswith(place.rstrip("/") + "/"))
            file = f"{PLACES}/{index}{place.replace('/', '_')}.tar"
            with open(staging / file, "wb") as out:
                result = filter_place(download(place), place, out, mounts=below)
                out.flush()
                os.fsync(out.fileno())
            links += result.links
            skipped += result.skipped
            places.append(PlaceArchive(path=place, file=file, files=result.files, dirs=result.dirs,
                                       bytes=result.bytes, archive_bytes=(staging / file).stat().st_size))
        image = memory(staging) if memory is not None else None
        info = SnapshotInfo(
            name=name, created_at=time.time(), source_sandbox_id=source_sandbox_id, source_name=source_name,
            owner=owner, image=spec.image, places=tuple(places), links=tuple(links), skipped=tuple(skipped),
            not_captured=tuple(_not_captured(spec, running, image is not None)),
            seconds=round(time.monotonic() - started, 3), memory=image, directory=staging,
        )
        (staging / SPEC).write_text(snapshot_spec(spec).model_dump_json(indent=2))
        (staging / MANIFEST).write_text(json.dumps(info.to_json() | {"directory": None}, indent=2))
        return info

    def publish(self, staging: Path, name: str, *, replace: bool = False) -> None:
        """Store a complete snapshot directory written elsewhere under the root (an import's
        ``.tmp-*`` staging directory) as ``name``."""
        self._publish(staging, self.directory(name), name, replace)

    def _publish(self, staging: Path, directory: Path, name: str, replace: bool) -> None:
        """Rename the complete snapshot into place; an existing one is replaced only if asked."""
        if replace and directory.exists():
            self._discard(directory)
        try:
            staging.rename(directory)
        except OSError as exc:
            if directory.exists():
                raise SnapshotExists(name) from None  # another process published it first
            raise SnapshotError(f"cannot store snapshot {name} in {self.root}: {exc.strerror or exc}") from None


LINK_SCRIPT = (
    'while [ "$#" -gt 0 ]; do '
    'if [ "$1" = hard ]; then ln -f -- "$2" "$3" || exit 1; else ln -sfn -- "$2" "$3" || exit 1; fi; '
    "shift 3; done"
)
"""Recreates links given as ``kind target path`` triples (kind ``hard`` or ``sym``)."""


def link_commands(links: Iterable[Link]) -> Iterator[list[str]]:
    """argv of the ``sh`` commands that recreate ``links`` (in batches, hard links last so
    their targets exist)."""
    ordered = sorted(links, key=lambda link: link.hard)
    for start in range(0, len(ordered), LINK_BATCH):
        argv = ["sh", "-c", LINK_SCRIPT, "sh"]
        for link in ordered[start:start + LINK_BATCH]:
            argv += ["hard" if link.hard else "sym", link.target, link.path]
        yield argv
