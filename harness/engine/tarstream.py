"""Host-side tar streams for copying files to and from a sandbox: safe extraction and writing.

:class:`Extractor` unpacks a tar stream (``tarfile`` in stream mode ``r|``, one member at a time,
never the archive in memory) below a host directory and refuses what could write outside it:

* :class:`UnsafeArchive` (the copy stops; what was unpacked stays, no temporary files) for a member
  with an empty or absolute name, a ``..`` component, a name outside the archive's one top entry,
  a hard link, a device, a FIFO, a sparse file or another special type, an extended (pax, GNU
  long-name) header over :data:`MAX_HEADER_BYTES`, or a member written through a symlink the
  archive itself made. The agent never sends any of these, so they mean it is not behaving.
* A symlink whose target is absolute or leads out of the copied tree is not created and is
  listed in ``skipped``. The copied tree is the top directory when the top entry is one, else
  the directory unpacked into. The check is made on the target's text as the member arrives,
  and once more at the end on the host (``realpath``) for chains of links that lead out.
* Nothing is written through a symlink: each directory is opened relative to its parent with
  ``O_NOFOLLOW``, so a symlink already in the destination refuses the copy (UsageError naming
  it) instead of redirecting it. Files and symlinks are created under a temporary name beside
  their target and renamed over it, so an existing file or symlink is replaced itself, never
  what a symlink points to; an existing directory is merged into, never replaced.

Modes are the member's without set-id and sticky bits (directories created by the copy also
keep ``0o700`` for the owner, applied after their contents); mtimes are kept; ownership is the
host user's. :class:`HostTar` is the other direction: it writes a tar of a host file or
directory as it walks it (headers and file pieces from :mod:`sandbox.download`), leaving out
symlinks and special files, which the agent's Upload refuses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Self

from harness.core.errors import CallboxError, ErrorCode, UsageError
from sandbox.download import END_OF_ARCHIVE, Chunker, file_data, header

CHUNK_BYTES = 1 << 20
WRITE_BYTES = 256 << 10
"""How much of a file copy_out reads from the stream per write (tarfile joins its 10 KiB reads
into one string of this size, so larger costs memory, not speed)."""
MAX_HEADER_BYTES = 1 << 20
FILE_MODE_MASK = 0o777

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EXTENSION_TYPES = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)


class UnsafeArchive(CallboxError):
    """The archive from the sandbox has a member copy_out refuses to unpack (see the module docstring)."""

    code = ErrorCode.PATH_ESCAPE


class ChunkReader:
    """A forward-only file object over byte strings (one held at a time), for ``tarfile`` ``r|``."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0

    def read(self, size: int = -1) -> bytes:
        while self._pos >= len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return b""
            self._buf, self._pos = chunk, 0
        end = len(self._buf) if size < 0 else self._pos + size
        piece = self._buf[self._pos : end]
        self._pos += len(piece)
        return piece

    def drain(self) -> None:
        for _ in self._chunks:
            pass


class _CheckedInfo(tarfile.TarInfo):
    """Refuses oversized pax / GNU long-name headers before ``tarfile`` reads them whole."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        info = super().frombuf(buf, encoding, errors)
        if info.type in _EXTENSION_TYPES and info.size > MAX_HEADER_BYTES:
            raise UnsafeArchive(f"copy_out refused the archive: an extended header of {info.size} bytes.")
        return info


def member_parts(member: tarfile.TarInfo) -> tuple[str, ...]:
    """The checked path components of a member; UnsafeArchive for a name or type it refuses."""
    name, shown = member.name, repr(member.name)
    if not name or "\x00" in name:
        raise UnsafeArchive(f"copy_out refused the archive: member {shown} has an empty or NUL-containing name.")
    if name.startswith("/"):
        raise UnsafeArchive(f"copy_out refused the archive: member {shown} is an absolute path.")
    components = name.split("/")
    if ".." in components:
        raise UnsafeArchive(f"copy_out refused the archive: member {shown} has a '..' component.")
    if not (member.isreg() or member.isdir() or member.issym()) or member.issparse():
        raise UnsafeArchive(
            f"copy_out refused the archive: member {shown} is a hard link, a device, a FIFO or another special "
            "type; only files, directories and symbolic links are unpacked."
        )
    parts = tuple(c for c in components if c not in ("", "."))
    if not parts:
        raise UnsafeArchive(f"copy_out refused the archive: member {shown} names no file.")
    return parts


def link_escapes(parts: tuple[str, ...], target: str, boundary: tuple[str, ...]) -> bool:
    """Whether a symlink at ``parts`` pointing to ``target`` leads (as text) outside ``boundary``."""
    if not target or target.startswith("/") or "\x00" in target:
        return True
    resolved: list[str] = list(parts[:-1])
    for comp in target.split("/"):
        if comp in ("", "."):
            continue
        if comp == "..":
            if not resolved:
                return True
            resolved.pop()
        else:
            resolved.append(comp)
    return tuple(resolved[: len(boundary)]) != boundary or len(resolved) < len(boundary)


class Extractor:
    """Unpacks a tar stream below the directory ``root_fd`` (see the module docstring).

    All members must lie under one top entry (the first member's first component); ``rename``
    gives that entry another name (``docker cp`` onto a new name). ``root`` is the host path of
    ``root_fd``, used in messages and for the final check of symlinks.
    """

    def __init__(self, root_fd: int, root: Path, *, rename: str | None = None) -> None:
        self.root_fd = root_fd
        self.root = root
        self.rename = rename
        self.top: str | None = None
        self.top_is_dir = False
        self.files = self.dirs = self.symlinks = self.bytes = 0
        self.skipped: list[str] = []
        self._created_dirs: list[tuple[tuple[str, ...], int, float]] = []
        self._links: list[tuple[str, ...]] = []
        self._link_set: set[tuple[str, ...]] = set()
        self._cached: tuple[tuple[str, ...], int] | None = None
        self._token = os.urandom(6).hex()
        self._counter = 0

    def run(self, reader: ChunkReader) -> None:
        try:
            with tarfile.open(fileobj=reader, mode="r|", tarinfo=_CheckedInfo) as tar:  # type: ignore[call-overload]
                while (member := tar.next()) is not None:
                    self.add(tar, member)
                    tar.members.clear()  # a stream-mode TarFile would keep every TarInfo otherwise
        except tarfile.TarError as exc:
            raise UnsafeArchive(f"copy_out refused the archive: it is not a valid tar stream ({exc}).") from None
        finally:
            self._drop_cache()
        self.finish()

    def _where(self, parts: tuple[str, ...]) -> Path:
        return self.root.joinpath(*parts)

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        parts = member_parts(member)
        if self.top is None:
            self.top, self.top_is_dir = parts[0], member.isdir()
        elif parts[0] != self.top:
            raise UnsafeArchive(
                f"copy_out refused the archive: member {member.name!r} is outside its top entry {self.top!r}."
            )
        if self.rename is not None:
            parts = (self.rename, *parts[1:])
        try:
            if member.isdir():
                self._dir(parts, member)
            elif member.issym():
                self._symlink(parts, member)
            else:
                self._file(tar, parts, member)
        except PermissionError as exc:
            raise UsageError(
                f"cannot write {self._where(parts)} ({exc.strerror}); copy to a directory you can write to."
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise UsageError(f"no space left on the host to write {self._where(parts)}; free some space.") from None
            raise UsageError(f"cannot write {self._where(parts)}: {exc.strerror}.") from None

    def _dir(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        parent = self._walk(parts[:-1])
        existing = _lstat(parts[-1], parent)
        self.dirs += 1
        if existing is not None:
            self._require_dir(existing, parts)
            return
        os.mkdir(parts[-1], 0o700, dir_fd=parent)
        self._created_dirs.append((parts, member.mode, member.mtime))

    def _file(self, tar: tarfile.TarFile, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        parent = self._walk(parts[:-1])
        existing = _lstat(parts[-1], parent)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise UsageError(f"{self._where(parts)} is a directory; a file from the sandbox cannot replace it.")
        tmp = self._temp()
        fd = os.open(tmp, _NEW_FILE, 0o600, dir_fd=parent)
        try:
            try:
                source = tar.extractfile(member)
                if source is not None:
                    while piece := source.read(WRITE_BYTES):
                        view = memoryview(piece)
                        while view:
                            view = view[os.write(fd, view) :]
                os.fchmod(fd, member.mode & FILE_MODE_MASK)
                with contextlib.suppress(OSError, OverflowError, ValueError):
                    os.utime(fd, (member.mtime, member.mtime))
            finally:
                os.close(fd)
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        self.files += 1
        self.bytes += member.size

    def _symlink(self, parts: tuple[str, ...], member: tarfile.TarInfo) -> None:
        boundary = parts[:1] if self.top_is_dir else ()
        if link_escapes(parts, member.linkname, boundary):
            self.skipped.append(f"{'/'.join(parts)} -> {member.linkname} (a symbolic link out of the copy)")
            return
        parent = self._walk(parts[:-1])
        existing = _lstat(parts[-1], parent)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            raise UsageError(f"{self._where(parts)} is a directory; a symbolic link cannot replace it.")
        tmp = self._temp()
        os.symlink(member.linkname, tmp, dir_fd=parent)
        try:
            os.rename(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=parent)
            raise
        self.symlinks += 1
        if parts not in self._link_set:
            self._link_set.add(parts)
            self._links.append(parts)

    def _temp(self) -> str:
        self._counter += 1
        return f".callbox-copy-{self._token}-{self._counter}.tmp"

    def _require_dir(self, st: os.stat_result, parts: tuple[str, ...]) -> None:
        if stat.S_ISLNK(st.st_mode):
            if parts in self._link_set:
                raise UnsafeArchive(
                    f"copy_out refused the archive: it writes through its own symbolic link {'/'.join(parts)!r}."
                )
            raise UsageError(
                f"{self._where(parts)} is a symbolic link; copy_out never writes through one: remove it or "
                "copy somewhere else."
            )
        if not stat.S_ISDIR(st.st_mode):
            raise UsageError(f"{self._where(parts)} exists and is not a directory; remove it or copy somewhere else.")

    def _walk(self, parts: tuple[str, ...]) -> int:
        """An fd of the directory ``parts`` below the root, reached without following symlinks
        (missing ones are created); cached until the next walk, do not close it."""
        if not parts:
            return self.root_fd
        if self._cached is not None and self._cached[0] == parts:
            return self._cached[1]
        self._drop_cache()
        fd = self.root_fd
        try:
            for end in range(1, len(parts) + 1):
                child = self._enter(fd, parts[:end])
                if fd != self.root_fd:
                    os.close(fd)
                fd = child
        except BaseException:
            if fd != self.root_fd:
                os.close(fd)
            raise
        self._cached = (parts, fd)
        return fd

    def _enter(self, fd: int, parts: tuple[str, ...]) -> int:
        name = parts[-1]
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            os.mkdir(name, 0o755, dir_fd=fd)
            return os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError as exc:
            if exc.errno in (errno.ENOTDIR, errno.ELOOP) and (existing := _lstat(name, fd)) is not None:
                self._require_dir(existing, parts)
            raise

    def _drop_cache(self) -> None:
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None

    def finish(self) -> None:
        """Directory modes and mtimes (deepest first, after their contents), then the symlink check."""
        for parts, mode, mtime in reversed(self._created_dirs):
            with contextlib.suppress(OSError):
                fd = os.open(parts[-1], _DIR_FLAGS, dir_fd=self._walk(parts[:-1]))
                try:
                    os.fchmod(fd, (mode & FILE_MODE_MASK) | 0o700)
                    os.utime(fd, (mtime, mtime))
                finally:
                    os.close(fd)
        self._drop_cache()
        if not self._links:
            return
        boundary = Path(os.path.realpath(self._where(self._links[0][:1]) if self.top_is_dir else self.root))
        for parts in self._links:
            where = self._where(parts)
            if not Path(os.path.realpath(where)).is_relative_to(boundary):
                # Text-wise inside, but through other links it leads out: remove it again.
                with contextlib.suppress(OSError):
                    target = os.readlink(where)
                    os.unlink(parts[-1], dir_fd=self._walk(parts[:-1]))
                    self.symlinks -= 1
                    self.skipped.append(f"{'/'.join(parts)} -> {target} (a symbolic link out of the copy)")
        self._drop_cache()


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def host_destination(host_dest: Path) -> tuple[Path, str | None]:
    """Where copy_out unpacks (an existing directory) and the top entry's new name, if any."""
    if host_dest.is_dir():
        return host_dest, None
    parent = host_dest.parent
    if not parent.is_dir():
        raise UsageError(f"{parent} does not exist or is not a directory; create it first (copy_out creates "
                         f"only {host_dest.name!r} itself).")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{parent} is not writable; copy to a directory you can write to.")
    return parent, host_dest.name


# --- host side: a tar of host files, written as it is read ------------------------------------------------


class HostTar:
    """Tar pieces of a host file or directory under the name ``top``; skips symlinks and special files."""

    def __init__(self, source: Path, top: str) -> None:
        self.source = source
        self.top = top
        self.skipped: list[str] = []

    def pieces(self) -> Iterator[bytes]:
        source = Path(os.path.realpath(self.source))  # a symlink given as the source is followed
        yield from self._entry(source, self.top, os.stat(source))
        yield END_OF_ARCHIVE

    def _entry(self, path: Path, member: str, st: os.stat_result) -> Iterator[bytes]:
        if stat.S_ISDIR(st.st_mode):
            yield header(_tar_info(member, st, tarfile.DIRTYPE))
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                raise unreadable(path, exc) from None
            for name in names:
                child = path / name
                try:
                    child_st = child.lstat()
                except FileNotFoundError:
                    continue
                yield from self._entry(child, f"{member}/{name}", child_st)
        elif stat.S_ISREG(st.st_mode):
            yield from self._file(path, member)
        elif stat.S_ISLNK(st.st_mode):
            self.skipped.append(f"{member} (a symbolic link: the sandbox accepts only files and directories)")
        else:
            self.skipped.append(f"{member} (a special file)")

    def _file(self, path: Path, member: str) -> Iterator[bytes]:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            raise unreadable(path, exc) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                self.skipped.append(f"{member} (changed while being read)")
                return
            yield header(_tar_info(member, st, tarfile.REGTYPE, size=st.st_size))
            yield from file_data(fd, st.st_size)
        finally:
            os.close(fd)


def _tar_info(name: str, st: os.stat_result, kind: bytes, *, size: int = 0) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mode = kind, size, stat.S_IMODE(st.st_mode)
    info.mtime = max(int(st.st_mtime), 0)
    return info


def unreadable(path: Path, exc: OSError) -> UsageError:
    return UsageError(f"cannot read {path} ({exc.strerror}); fix its permissions or copy without it.")


def chunked(pieces: Iterable[bytes], size: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Pieces of any size regrouped into chunks of ``size`` bytes (the last one shorter)."""
    chunker = Chunker(size)
    for piece in pieces:
        chunker.add(piece)
        while (chunk := chunker.take()) is not None:
            yield chunk
    if rest := chunker.rest():
        yield rest
