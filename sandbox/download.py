"""Filesystem.Download: a file or directory streamed out as one uncompressed tar archive.

Design
------
The archive is produced piece by piece and never held whole: :func:`tar_pieces` turns a walk
into tar blocks (each member's header from ``tarfile.TarInfo.tobuf``, then its data read in
pieces of at most :data:`CHUNK_BYTES`, then the padding to the next 512-byte block, and the
end-of-archive marker last), and :class:`Chunker` packs those pieces into messages of at most
:data:`CHUNK_BYTES`. ``tarfile.TarFile.addfile`` is not used because it copies a whole file in
one call; a 1 GiB file would then sit in memory at once. The agent holds one message (plus one
read) at a time, so a download of any size streams with bounded memory.

Confinement: the path is resolved with :class:`sandbox.paths.Resolver` without following a final
symlink, and everything below it is reached through directory fds with ``O_NOFOLLOW``
(``openat`` relative to the parent's fd), so nothing outside the roots is ever read, even if the
tree changes during the download. A regular file is opened with ``O_NONBLOCK`` and checked with
``fstat`` after the open (a FIFO swapped in after the ``lstat`` cannot hang the agent, and what
is read is what was stat'ed).

Members are named relative to the path's parent (``/workspace/src`` gives ``src``,
``src/a.py``, ...); directories are listed in sorted order, each directory before its contents.
Symlinks are stored as symlinks with their target as written, never followed. A regular file
seen twice (a hard link) is stored twice, as two regular files: Upload accepts those and refuses
hard-link members. Devices, FIFOs and sockets are skipped, and so is what the tool user cannot
read (a directory it may not list, a file it may not open) and anything nested deeper than
:data:`MAX_DEPTH` directories; they are counted in the last message's ``DownloadSummary``, which
names the first :data:`MAX_SKIPPED_PATHS` of them. An entry removed during the walk is left out
without being counted. A file that changes size while it is read is stored with the size it had
when its header was written (cut short, or padded with zero bytes), as GNU tar does.

Identity: every filesystem access runs under the tool user's identity, but never across a
``yield``: the gRPC server sends each message between two steps of the generator, and if the
RPC is cancelled the suspended generator may be closed on another thread. So each step
(:meth:`Download.next_chunk`) enters the identity, produces the next message's bytes, and
leaves it again; between steps the thread is the agent's own.

``max_bytes`` (file content, not archive size) ends the download with TOO_LARGE before the first
file that would pass it; what was already streamed is then not a complete archive.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
import tarfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field

from sandbox.errors import TOO_LARGE, AgentError
from sandbox.paths import Resolver, os_error
from sandbox.v1 import filesystem_pb2

CHUNK_BYTES = 1 << 20
MAX_DEPTH = 128
MAX_SKIPPED_PATHS = 100
BLOCK = tarfile.BLOCKSIZE

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_UNREADABLE = (errno.EACCES, errno.EPERM)
_GONE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


# --- writing tar blocks (pure) ----------------------------------------------------------------------


def header(info: tarfile.TarInfo) -> bytes:
    """The header blocks of one member (pax format: long and non-ASCII names are kept)."""
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def padding(size: int) -> bytes:
    """The zero bytes that follow ``size`` bytes of member data up to the next block."""
    return b"\0" * (-size % BLOCK)


END_OF_ARCHIVE = b"\0" * (2 * BLOCK)


def file_data(fd: int, size: int) -> Iterator[bytes]:
    """Exactly ``size`` bytes of the open file ``fd`` (zero-padded if it shrank), then the padding."""
    left = size
    while left > 0:
        piece = os.read(fd, min(left, CHUNK_BYTES))
        if not piece:
            break
        left -= len(piece)
        yield piece
    while left > 0:  # the file shrank since its header was written
        piece = b"\0" * min(left, CHUNK_BYTES)
        left -= len(piece)
        yield piece
    yield padding(size)


class Chunker:
    """Packs pieces into chunks of exactly ``size`` bytes (the last one shorter).

    Pieces may have any size; with pieces of at most ``size`` bytes (what :func:`file_data` and
    the headers give) at most two chunks' worth is ever buffered.
    """

    def __init__(self, size: int = CHUNK_BYTES) -> None:
        self.size = size
        self._buf = bytearray()
        self._whole: bytes | None = None

    def add(self, piece: bytes) -> None:
        if not self._buf and self._whole is None and len(piece) == self.size:
            self._whole = piece  # the common case while streaming a large file: no copy
        else:
            self._buf += piece

    def take(self) -> bytes | None:
        """A full chunk if one is buffered."""
        if self._whole is not None:
            chunk, self._whole = self._whole, None
            return chunk
        if len(self._buf) < self.size:
            return None
        chunk = bytes(self._buf[: self.size])
        del self._buf[: self.size]
        return chunk

    def rest(self) -> bytes:
        """What is left after the last full chunk was taken (less than a chunk), emptying the buffer."""
        data = bytes(self._buf)
        self._buf.clear()
        return data


# --- the walk -------------------------------------------------------------------------------------------


@dataclass
class Summary:
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    bytes: int = 0
    skipped: int = 0
    skipped_paths: list[str] = field(default_factory=list)

    def skip(self, name: str) -> None:
        self.skipped += 1
        if len(self.skipped_paths) < MAX_SKIPPED_PATHS:
            self.skipped_paths.append(_text(name))

    def message(self) -> filesystem_pb2.DownloadSummary:
        return filesystem_pb2.DownloadSummary(
            files=self.files, dirs=self.dirs, symlinks=self.symlinks, bytes=self.bytes,
            skipped=self.skipped, skipped_paths=self.skipped_paths,
        )


def _text(name: str) -> str:
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _info(name: str, st: os.stat_result, kind: bytes, *, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.mtime = max(int(st.st_mtime), 0)  # an int: a float mtime costs a pax header per member
    info.linkname = link
    return info


class _Walk:
    """Depth-first walk of one entry (below the directory ``dir_fd``) yielding tar pieces."""

    def __init__(self, display: str, max_bytes: int) -> None:
        self.display = display
        self.max_bytes = max_bytes
        self.summary = Summary()

    def entry(self, dir_fd: int, name: str, member: str, depth: int) -> Iterator[bytes]:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            yield from self._failed(exc, member)
            return
        if stat.S_ISDIR(st.st_mode):
            yield from self._directory(dir_fd, name, member, st, depth)
        elif stat.S_ISREG(st.st_mode):
            yield from self._file(dir_fd, name, member, st)
        elif stat.S_ISLNK(st.st_mode):
            yield from self._symlink(dir_fd, name, member, st)
        else:
            self.summary.skip(member)

    def _failed(self, exc: OSError, member: str) -> Iterator[bytes]:
        if exc.errno in _UNREADABLE:
            self.summary.skip(member)
        elif exc.errno not in _GONE:  # gone meanwhile: left out; anything else ends the download
            raise os_error(exc, f"{member} (under {self.display})") from None
        yield from ()

    def _directory(self, dir_fd: int, name: str, member: str, st: os.stat_result, depth: int) -> Iterator[bytes]:
        if depth >= MAX_DEPTH:
            self.summary.skip(member)
            return
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            yield from self._failed(exc, member)
            return
        try:
            try:
                names = sorted(os.listdir(fd))
            except OSError as exc:
                yield from self._failed(exc, member)
                return
            self.summary.dirs += 1
            yield header(_info(member, os.fstat(fd), tarfile.DIRTYPE))
            for child in names:
                yield from self.entry(fd, child, f"{member}/{child}", depth + 1)
        finally:
            os.close(fd)

    def _file(self, dir_fd: int, name: str, member: str, st: os.stat_result) -> Iterator[bytes]:
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            yield from self._failed(exc, member)
            return
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # swapped since the lstat
                self.summary.skip(member)
                return
            size = st.st_size
            if self.max_bytes and self.summary.bytes + size > self.max_bytes:
                raise AgentError(
                    TOO_LARGE,
                    f"Download of {self.display} stopped: {member} would take the file content over "
                    f"max_bytes ({self.max_bytes} bytes).",
                )
            self.summary.files += 1
            self.summary.bytes += size
            yield header(_info(member, st, tarfile.REGTYPE, size=size))
            try:
                yield from file_data(fd, size)
            except OSError as exc:
                raise os_error(exc, f"{member} (under {self.display})") from None
        finally:
            os.close(fd)

    def _symlink(self, dir_fd: int, name: str, member: str, st: os.stat_result) -> Iterator[bytes]:
        try:
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError as exc:
            yield from self._failed(exc, member)
            return
        self.summary.symlinks += 1
        yield header(_info(member, st, tarfile.SYMTYPE, link=target))


# --- the download ---------------------------------------------------------------------------------------


class Download:
    """One Download: resolve once, then :meth:`next_chunk` until it returns None."""

    def __init__(self, resolver: Resolver, request: filesystem_pb2.DownloadRequest) -> None:
        res = resolver.resolve(request.path, follow_final=False)
        try:
            os.stat(res.name, dir_fd=res.dir_fd, follow_symlinks=False)  # a missing path is NOT_FOUND
        except OSError:
            res.close()
            raise
        self._dir_fd = res.dir_fd
        self._owned = res  # closes the parent fd (unless it is a root's shared fd)
        name = res.name
        top = posixpath.basename(res.path) if name == "." else name
        self._walk = _Walk(request.path, request.max_bytes)
        self._pieces = self._archive(name, top or ".")
        self._chunker = Chunker()
        self._done = False

    def _archive(self, name: str, top: str) -> Generator[bytes, None, None]:
        yield from self._walk.entry(self._dir_fd, name, top, 0)
        yield END_OF_ARCHIVE

    def next_chunk(self) -> filesystem_pb2.DownloadChunk | None:
        """The next message (the last carries the summary), or None after the last."""
        if self._done:
            return None
        while (chunk := self._chunker.take()) is None:
            piece = next(self._pieces, None)
            if piece is None:
                self._done = True
                return filesystem_pb2.DownloadChunk(data=self._chunker.rest(), summary=self._walk.summary.message())
            self._chunker.add(piece)
        return filesystem_pb2.DownloadChunk(data=chunk)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._pieces.close()  # runs the walk's finally blocks: its directory and file fds close
        self._owned.close()


def stream(
    resolver: Resolver, request: filesystem_pb2.DownloadRequest,
    acting: Callable[[], contextlib.AbstractContextManager[None]], is_active: Callable[[], bool],
) -> Generator[filesystem_pb2.DownloadChunk, None, None]:
    """The Download RPC's messages; the identity is held only inside each step (see the docstring)."""
    with acting():
        try:
            download = Download(resolver, request)
        except OSError as exc:
            raise os_error(exc, request.path) from None
    try:
        while is_active():
            with acting():
                chunk = download.next_chunk()
            if chunk is None:
                return
            yield chunk
    finally:
        download.close()
