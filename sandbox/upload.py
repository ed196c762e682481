"""Filesystem.Upload: unpack a streamed tar archive into a directory, refusing every unsafe member.

Design
------
The messages' ``data`` fields, concatenated, are one tar archive: uncompressed, or gzip when it
starts with the gzip magic (no other compression: an xz or bzip2 header could make the decoder
allocate far more memory than the data is worth). :class:`ChunkReader` hands the messages to
``tarfile`` in stream mode (``r|``), so the agent holds one message and one member's header at
a time, never the archive, and never seeks.

Every member is checked by :func:`member_parts` before anything is done for it. Only regular
files and directories are accepted; the whole upload is refused when a member

* has an absolute name, or a ``..`` component anywhere (even one that would stay inside):
  PATH_ESCAPE;
* is a symbolic link, a hard link, a character or block device, a FIFO, a sparse file or any
  other type: INVALID_ARGUMENT (the message names the type and, for links, the target);
* would pass through a symlink already in the destination, wherever it points: PATH_ESCAPE.
  Uploads never follow a symlink below the destination; each directory is opened with
  ``O_NOFOLLOW`` relative to its parent's fd, starting from the destination's fd (which was
  resolved like every other Filesystem path, :class:`sandbox.paths.Resolver`).

Nothing becomes visible under its real name until the archive has ended cleanly. Each file is
written to a temporary name (``.callbox-upload-<token>-<n>.tmp``) in its final directory;
directories the upload needs are created as it goes and remembered. After the last member the
stream is read to its end and the files are published, in archive order: with ``overwrite`` by
``rename()`` over the old name, without it by ``link()``, which fails atomically if the name
exists (ALREADY_EXISTS). On any failure (a refused member, a broken or truncated archive, a limit,
the client cancelling) the temporary files, the names already published without ``overwrite`` and
the directories the upload created are removed again, and the error says "The upload wrote
nothing". The one gap: with ``overwrite``, if a publishing ``rename()`` fails after earlier ones
succeeded (only possible if something in the sandbox changes the destination during the upload),
the files already replaced stay replaced; the error then does not claim that nothing was written.

Ownership and modes: everything runs under the tool user's filesystem identity
(:class:`sandbox.identity.FsIdentity`, like every Filesystem RPC), so files and directories are
owned by the tool user whatever the archive says, and no permission is bypassed. File modes are
the member's masked with ``0o755`` (no set-id or sticky bits, no group or other write); new
directories get the same mask plus ``0o700`` (the owner must be able to write into them);
directories that already exist keep their mode. File mtimes are kept; directory mtimes are not.
A member naming an existing directory merges into it; a file member replacing a directory, a
directory member replacing a file, or one name used as both a file and a directory in the same
archive are refused. When a name appears twice, the later member wins.

Limits: at most :data:`MAX_UPLOAD_BYTES` (1 GiB, the default ``fsize`` ulimit) of file content
per upload, or the request's lower ``max_bytes``; a member larger than what is left is refused
before its data is read (TOO_LARGE). At most :data:`MAX_MEMBERS` members, and each pax or GNU
long-name header at most :data:`MAX_HEADER_BYTES` (``tarfile`` reads those whole). The ``fsize``
ulimit and the size of the filesystem apply too (EFBIG, ENOSPC: TOO_LARGE). The archive must end
with tar's end-of-archive marker (a zero block): one cut short anywhere, even between two members,
is refused. At most :data:`MAX_TRAILING_BYTES` may follow the marker.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Self

import grpc

from sandbox.errors import (
    ALREADY_EXISTS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    PATH_ESCAPE,
    TOO_LARGE,
    WRONG_TYPE,
    AgentError,
)
from sandbox.paths import MAX_PATH_LENGTH, Resolver, os_error
from sandbox.v1 import filesystem_pb2

MAX_UPLOAD_BYTES = 1 << 30
MAX_MEMBERS = 100_000
MAX_HEADER_BYTES = 1 << 20
MAX_TRAILING_BYTES = 1 << 20
COPY_CHUNK = 1 << 20
TEMP_PREFIX = ".callbox-upload-"
FILE_MODE_MASK = 0o755
NEW_DIR_MODE = 0o755

_GZIP_MAGIC = b"\x1f\x8b"
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_EXTENSION_TYPES = frozenset(
    {tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK}
)
_ALLOWED_ONLY = "uploads may contain only regular files and directories"


# --- member checks (pure) -------------------------------------------------------------------------


def _show(name: str) -> str:
    """A member name quoted for a message, safe for a proto string."""
    return repr(name.encode("utf-8", "surrogateescape").decode("utf-8", "replace"))


def member_parts(member: tarfile.TarInfo) -> tuple[str, ...]:
    """Check one member's name and type; return its path components below the destination.

    Raises AgentError (PATH_ESCAPE for names that leave the destination, INVALID_ARGUMENT for
    anything else refused). ``()`` means the destination itself (a ``./`` directory member).
    """
    name = member.name
    shown = _show(name)
    if not name:
        raise AgentError(INVALID_ARGUMENT, "Upload refused: a member has an empty name.")
    if "\x00" in name:
        raise AgentError(INVALID_ARGUMENT, f"Upload refused: member {shown} contains a NUL character.")
    if len(name) > MAX_PATH_LENGTH:
        raise AgentError(
            INVALID_ARGUMENT, f"Upload refused: a member name is longer than {MAX_PATH_LENGTH} characters."
        )
    if name.startswith("/"):
        raise AgentError(
            PATH_ESCAPE,
            f"Upload refused: member {shown} is an absolute path; members must be relative to the destination.",
        )
    components = name.split("/")
    if ".." in components:
        raise AgentError(
            PATH_ESCAPE,
            f"Upload refused: member {shown} has a '..' component; members must stay inside the destination.",
        )
    _check_type(member, shown)
    parts = tuple(c for c in components if c not in ("", "."))
    if not parts and not member.isdir():
        raise AgentError(INVALID_ARGUMENT, f"Upload refused: member {shown} names the destination itself.")
    return parts


def _check_type(member: tarfile.TarInfo, shown: str) -> None:
    if member.issym():
        what = f"a symbolic link (to {_show(member.linkname)})"
    elif member.islnk():
        what = f"a hard link (to {_show(member.linkname)})"
    elif member.ischr() or member.isblk():
        what = "a device"
    elif member.isfifo():
        what = "a FIFO"
    elif member.issparse():
        what = "a sparse file"
    elif member.isreg() or member.isdir():
        return
    else:
        what = f"of an unsupported type ({member.type!r})"
    raise AgentError(INVALID_ARGUMENT, f"Upload refused: member {shown} is {what}; {_ALLOWED_ONLY}.")


CUT_SHORT = (
    "Upload refused: the data is not a complete tar archive: it ends before tar's end-of-archive marker "
    "(was it cut short, or did the sender cancel?)."
)


class CheckedTarInfo(tarfile.TarInfo):
    """TarInfo that refuses oversized pax / GNU long-name headers before ``tarfile`` reads them whole,
    and an archive that ends anywhere but at its end-of-archive marker.

    ``tarfile`` takes a missing, short or invalid header after the first member for the end of the
    archive. Here each is an error: a stream cut at a member boundary (a client that cancelled,
    which gRPC may deliver as an ordinary end of stream) would otherwise publish part of an upload.
    Only the zero block ``tarfile`` reports as ``EOFHeaderError`` ends an archive cleanly.
    """

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        if len(buf) != tarfile.BLOCKSIZE:
            raise AgentError(INVALID_ARGUMENT, CUT_SHORT)
        if buf.count(tarfile.NUL) == tarfile.BLOCKSIZE:
            return super().frombuf(buf, encoding, errors)  # the zero block: tarfile ends the archive here
        try:
            info = super().frombuf(buf, encoding, errors)
        except tarfile.HeaderError as exc:
            raise AgentError(
                INVALID_ARGUMENT, f"Upload refused: the data is not a complete tar archive (a bad header: {exc})."
            ) from None
        if info.type in _EXTENSION_TYPES and info.size > MAX_HEADER_BYTES:
            raise AgentError(
                TOO_LARGE,
                f"Upload refused: an extended tar header of {info.size} bytes is larger than the limit "
                f"({MAX_HEADER_BYTES} bytes).",
            )
        return info


# --- the stream ------------------------------------------------------------------------------------


class ChunkReader:
    """A read-only, forward-only file object over a sequence of byte strings (one held at a time)."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buf = b""
        self._pos = 0
        self.received = 0

    def _fill(self) -> bool:
        while self._pos >= len(self._buf):
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            self._buf, self._pos = chunk, 0
            self.received += len(chunk)
        return True

    def read(self, size: int = -1) -> bytes:
        """Up to ``size`` bytes (at most what the current message still holds); ``b""`` at the end."""
        if not self._fill():
            return b""
        end = len(self._buf) if size < 0 else self._pos + size
        piece = self._buf[self._pos : end]
        self._pos += len(piece)
        return piece

    def peek(self, size: int) -> bytes:
        """The next ``size`` bytes (fewer at the end) without consuming them."""
        while len(self._buf) - self._pos < size:
            chunk = next(self._chunks, None)
            if chunk is None:
                break
            self._buf, self._pos = self._buf[self._pos :] + chunk, 0
            self.received += len(chunk)
        return self._buf[self._pos : self._pos + size]

    def drain(self, limit: int) -> int:
        """Consume the rest of the stream; TOO_LARGE if more than ``limit`` bytes were left."""
        left = 0
        while self._fill():
            left += len(self._buf) - self._pos
            self._pos = len(self._buf)
            if left > limit:
                raise AgentError(
                    INVALID_ARGUMENT,
                    f"Upload refused: more than {limit} bytes follow the end of the tar archive.",
                )
        return left


def _data(first: filesystem_pb2.UploadChunk, requests: Iterator[filesystem_pb2.UploadChunk]) -> Iterator[bytes]:
    """The ``data`` of every message; options in a later message are an error."""
    yield first.data
    try:
        for request in requests:
            if request.dest or request.overwrite or request.max_bytes:
                raise AgentError(
                    INVALID_ARGUMENT, "Upload refused: dest, overwrite and max_bytes belong in the first message only."
                )
            yield request.data
    except grpc.RpcError:
        raise AgentError(INVALID_ARGUMENT, "The upload stream broke off (the client cancelled it?).") from None


# --- unpacking ------------------------------------------------------------------------------------


@dataclass
class _Staged:
    parts: tuple[str, ...]
    temp: str
    size: int
    published: bool = False


class _Upload:
    """One upload into the directory ``dest_fd``: stage members, then publish or roll back."""

    def __init__(self, dest_fd: int, display: str, *, overwrite: bool, limit: int) -> None:
        self.dest_fd = dest_fd
        self.display = display.rstrip("/") or "/"
        self.overwrite = overwrite
        self.limit = limit
        self.token = secrets.token_hex(6)
        self.counter = 0
        self.members = 0
        self.bytes = 0
        self.staged: dict[tuple[str, ...], _Staged] = {}
        self.created: list[tuple[str, ...]] = []
        self.replaced = False
        self._cached: tuple[tuple[str, ...], int] | None = None

    def where(self, parts: tuple[str, ...]) -> str:
        return _show("/".join(parts)) + f" in {self.display}"

    # staging

    def add(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        self.members += 1
        if self.members > MAX_MEMBERS:
            raise AgentError(TOO_LARGE, f"Upload refused: the archive has more than {MAX_MEMBERS} members.")
        parts = member_parts(member)
        if not parts:
            return  # "./": the destination itself, which exists
        try:
            if member.isdir():
                self._add_dir(parts, member.mode)
            else:
                self._add_file(tar, member, parts)
        except OSError as exc:
            raise os_error(exc, self.where(parts)) from None

    def _add_dir(self, parts: tuple[str, ...], mode: int) -> None:
        self._refuse_file_as_dir(parts)
        parent = self._walk(parts[:-1], create=True)
        existing = _lstat(parts[-1], parent)
        if existing is not None:
            self._require_dir(existing, parts)
            return
        os.mkdir(parts[-1], 0o700, dir_fd=parent)
        self.created.append(parts)
        fd = os.open(parts[-1], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        try:
            os.fchmod(fd, (mode & FILE_MODE_MASK) | 0o700)
        finally:
            os.close(fd)

    def _add_file(self, tar: tarfile.TarFile, member: tarfile.TarInfo, parts: tuple[str, ...]) -> None:
        previous = self.staged.get(parts)
        committed = self.bytes - (previous.size if previous else 0)
        if committed + member.size > self.limit:
            raise AgentError(
                TOO_LARGE,
                f"Upload refused: member {self.where(parts)} ({member.size} bytes) would take the upload over its "
                f"limit of {self.limit} bytes of file content.",
            )
        parent = self._walk(parts[:-1], create=True)
        existing = _lstat(parts[-1], parent)
        if existing is not None and previous is None:
            if stat.S_ISDIR(existing.st_mode):
                raise AgentError(
                    WRONG_TYPE, f"Upload refused: {self.where(parts)} is a directory; a file cannot replace it."
                )
            if not self.overwrite:
                raise AgentError(
                    ALREADY_EXISTS, f"Upload refused: {self.where(parts)} already exists; set overwrite to replace it."
                )
        if previous is not None:  # the same name again: the later member wins
            del self.staged[parts]
            self.bytes -= previous.size
            _unlink_quietly(previous.temp, parent)
        self.counter += 1
        staged = _Staged(parts, f"{TEMP_PREFIX}{self.token}-{self.counter}.tmp", member.size)
        fd = os.open(staged.temp, _NEW_FILE_FLAGS, 0o600, dir_fd=parent)
        self.staged[parts] = staged
        self.bytes += member.size
        try:
            source = tar.extractfile(member)
            if source is not None:
                _copy(source, fd)
            os.fchmod(fd, member.mode & FILE_MODE_MASK)
            with contextlib.suppress(OSError, OverflowError, ValueError):
                mtime_ns = int(member.mtime * 1_000_000_000)
                os.utime(fd, ns=(mtime_ns, mtime_ns))
        finally:
            os.close(fd)

    def _refuse_file_as_dir(self, parts: tuple[str, ...]) -> None:
        for end in range(1, len(parts) + 1):
            if parts[:end] in self.staged:
                raise AgentError(
                    INVALID_ARGUMENT,
                    f"Upload refused: {self.where(parts[:end])} is both a file and a directory in the archive.",
                )

    def _require_dir(self, st: os.stat_result, parts: tuple[str, ...]) -> None:
        if stat.S_ISLNK(st.st_mode):
            raise AgentError(
                PATH_ESCAPE,
                f"Upload refused: {self.where(parts)} is a symbolic link already in the destination; "
                "uploads never go through symbolic links.",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise AgentError(WRONG_TYPE, f"Upload refused: {self.where(parts)} exists and is not a directory.")

    def _walk(self, parts: tuple[str, ...], *, create: bool) -> int:
        """An fd of the directory ``parts`` below the destination, reached without following symlinks.

        The fd is cached until the next walk (members of one directory usually come together);
        do not close it.
        """
        if self._cached is not None and self._cached[0] == parts:
            return self._cached[1]
        self._drop_cache()
        if create:
            self._refuse_file_as_dir(parts)
        fds = [self.dest_fd]
        try:
            for end in range(1, len(parts) + 1):
                fds.append(self._enter(fds[-1], parts[:end], create=create))
        except BaseException:
            for fd in fds[1:]:
                os.close(fd)
            raise
        for fd in fds[1:-1]:
            os.close(fd)
        if len(fds) > 1:
            self._cached = (parts, fds[-1])
        return fds[-1]

    def _enter(self, parent: int, parts: tuple[str, ...], *, create: bool) -> int:
        name = parts[-1]
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except FileNotFoundError:
            if not create:
                raise
        except OSError as exc:
            if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
                raise
            existing = _lstat(name, parent)
            if existing is None:
                raise
            self._require_dir(existing, parts)
            raise
        try:
            os.mkdir(name, NEW_DIR_MODE, dir_fd=parent)
            self.created.append(parts)
        except FileExistsError:
            pass  # created meanwhile; the open below checks what it is
        return self._enter(parent, parts, create=False)

    def _drop_cache(self) -> None:
        if self._cached is not None:
            os.close(self._cached[1])
            self._cached = None

    # publishing and rolling back

    def publish(self) -> None:
        for staged in self.staged.values():
            try:
                parent = self._walk(staged.parts[:-1], create=False)
                name = staged.parts[-1]
                if self.overwrite:
                    os.rename(staged.temp, name, src_dir_fd=parent, dst_dir_fd=parent)
                    self.replaced = True
                else:
                    try:
                        os.link(staged.temp, name, src_dir_fd=parent, dst_dir_fd=parent, follow_symlinks=False)
                    except FileExistsError:
                        raise AgentError(
                            ALREADY_EXISTS,
                            f"Upload refused: {self.where(staged.parts)} was created during the upload; "
                            "set overwrite to replace it.",
                        ) from None
                    staged.published = True
                    os.unlink(staged.temp, dir_fd=parent)
            except OSError as exc:
                raise os_error(exc, self.where(staged.parts)) from None
        self._drop_cache()

    def roll_back(self) -> bool:
        """Remove what this upload wrote; True if nothing it wrote is left in place."""
        clean = not self.replaced
        for staged in reversed(self.staged.values()):
            try:
                parent = self._walk(staged.parts[:-1], create=False)
            except (AgentError, OSError):
                clean = False
                continue
            if not staged.published:
                _unlink_quietly(staged.temp, parent)
            elif not self.overwrite:
                _unlink_quietly(staged.parts[-1], parent)
        for parts in reversed(self.created):
            try:
                parent = self._walk(parts[:-1], create=False)
                os.rmdir(parts[-1], dir_fd=parent)
            except FileNotFoundError:
                pass
            except (AgentError, OSError):
                clean = False  # not empty any more: something else wrote into it meanwhile
        self._drop_cache()
        return clean

    def response(self) -> filesystem_pb2.UploadResponse:
        return filesystem_pb2.UploadResponse(
            files_written=len(self.staged), dirs_created=len(self.created), bytes_written=self.bytes
        )


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def _copy(source: IO[bytes], fd: int) -> None:
    while chunk := source.read(COPY_CHUNK):
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]


def _open_dest(resolver: Resolver, dest: str) -> int:
    try:
        with resolver.resolve(dest, follow_final=True) as res:
            return os.open(res.name, _DIR_FLAGS, dir_fd=res.dir_fd)
    except FileNotFoundError:
        raise AgentError(
            NOT_FOUND, f"The upload destination {dest} does not exist; create it first."
        ) from None
    except NotADirectoryError:
        raise AgentError(WRONG_TYPE, f"The upload destination {dest} is not a directory.") from None
    except OSError as exc:
        raise os_error(exc, dest) from None


def receive(resolver: Resolver, requests: Iterator[filesystem_pb2.UploadChunk]) -> filesystem_pb2.UploadResponse:
    """Run one Upload (see the module docstring); raises AgentError. Run it as the tool user."""
    try:
        first = next(requests, None)
    except grpc.RpcError:
        first = None
    if first is None:
        raise AgentError(INVALID_ARGUMENT, "The upload stream is empty; the first message names the destination.")
    limit = min(first.max_bytes or MAX_UPLOAD_BYTES, MAX_UPLOAD_BYTES)
    dest_fd = _open_dest(resolver, first.dest)
    upload = _Upload(dest_fd, first.dest, overwrite=first.overwrite, limit=limit)
    try:
        reader = ChunkReader(_data(first, requests))
        _unpack(upload, reader)
        reader.drain(MAX_TRAILING_BYTES)
        upload.publish()
        return upload.response()
    except BaseException as exc:
        clean = upload.roll_back()
        if isinstance(exc, AgentError) and clean:
            raise AgentError(exc.reason, f"{exc.message} The upload wrote nothing.") from None
        raise
    finally:
        os.close(dest_fd)


def _unpack(upload: _Upload, reader: ChunkReader) -> None:
    mode = "r|gz" if reader.peek(2) == _GZIP_MAGIC else "r|"
    try:
        with tarfile.open(fileobj=reader, mode=mode, tarinfo=CheckedTarInfo) as tar:  # type: ignore[call-overload]
            while (member := tar.next()) is not None:
                upload.add(tar, member)
                tar.members.clear()  # a stream-mode TarFile would keep every TarInfo otherwise
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise AgentError(
            INVALID_ARGUMENT, f"Upload refused: the data is not a complete tar archive ({exc or type(exc).__name__})."
        ) from None
