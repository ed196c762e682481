"""The Filesystem gRPC service: Read, Write, List, Stat, Remove, MakeDir, Upload, Download, Move and
Watch inside the roots.

Design
------
Every operation first resolves its path with :class:`sandbox.paths.Resolver`, which returns an
fd of the parent directory and the final name without ever leaving the allowed roots, then acts
on that name only through ``dir_fd=`` calls (``openat``, ``fstatat``, ``renameat``, ``unlinkat``,
``mkdirat``, ...) with ``O_NOFOLLOW``; no string path is ever re-resolved from ``/``. A final
symlink is followed only where the operation means "the file behind it" (Read, Write, List) and
only through the same confined walk; Stat and Remove act on the link itself.

* Read: regular files only; at most 16 MiB per call (the default); ``size`` is the whole file's.
  Opens use ``O_NONBLOCK`` so a FIFO planted in the workspace cannot hang the agent.
* Write: a new file or a replacement is written to a temporary name in the same directory and
  renamed over the target, so readers see the old or the new content, never a mix. A replaced
  file keeps its permission bits (minus set-id bits); a new one gets ``mode`` (default 0644)
  exactly, independent of the umask. ``no_overwrite`` publishes with ``link()``, which fails
  atomically if the name exists. ``append`` opens with ``O_APPEND|O_NOFOLLOW``. There is no
  fsync: sandboxes are disposable, so durability across a host crash is not a goal.
* List: depth-first, each directory's names sorted, so entries come out sorted by path
  component-wise (a directory is directly followed by its contents). Symlinked directories are
  reported (with their target) but never descended into. Depth is capped at
  :data:`MAX_LIST_DEPTH` to bound the fds held open.
* Remove: directories need ``recursive``; the tree is removed through directory fds without
  following symlinks, refuses to cross into another filesystem (a mount point), and roots or
  directories containing a root cannot be removed.
* Upload: a streamed tar archive unpacked into a directory; every unsafe member (absolute,
  ``..``, links, devices, through a symlink in the destination) refuses the whole upload and
  what it wrote is removed again. See :mod:`sandbox.upload`.
* Download (a streamed tar archive out, :mod:`sandbox.download`), Move (:mod:`sandbox.move`) and
  Watch (inotify, :mod:`sandbox.watch`). The two streams hold the tool user's identity only
  while touching the filesystem, never across a ``yield``.

Each RPC runs under the configured :class:`sandbox.identity.FsIdentity` (per-thread
fsuid/fsgid), so permission checks and file ownership are the tool user's. Failures are
:class:`sandbox.errors.AgentError` s turned into a status plus ``ErrorDetail`` by
:func:`sandbox.errors.abort`; unexpected exceptions are logged and reported as INTERNAL without
a traceback. The ``read``/``write``/... methods raise AgentError and can be reused by other
in-agent code (run them inside :meth:`FilesystemService.acting`).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

import grpc

from sandbox.errors import (
    ALREADY_EXISTS,
    INTERNAL,
    INVALID_ARGUMENT,
    PATH_ESCAPE,
    PERMISSION_DENIED,
    TOO_LARGE,
    WRONG_TYPE,
    AgentError,
    abort,
)
from sandbox.identity import FsIdentity, acting_as
from sandbox.paths import Resolved, Resolver, os_error
from sandbox.v1 import filesystem_pb2, filesystem_pb2_grpc

log = logging.getLogger(__name__)

MAX_READ_BYTES = 16 * 1024 * 1024
DEFAULT_LIST_LIMIT = 10_000
MAX_LIST_DEPTH = 64
DEFAULT_FILE_MODE = 0o644
DIR_MODE = 0o755

_R = TypeVar("_R")


class _HasPath(Protocol):
    @property
    def path(self) -> str: ...


_Q = TypeVar("_Q", bound=_HasPath)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_DIR_READ = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SETID = stat.S_ISUID | stat.S_ISGID


def _maps_os_errors(
    method: Callable[[FilesystemService, _Q], _R],
) -> Callable[[FilesystemService, _Q], _R]:
    """Make an operation raise only AgentError: OSErrors become one sentence naming the path."""

    @functools.wraps(method)
    def wrapper(self: FilesystemService, request: _Q) -> _R:
        try:
            return method(self, request)
        except OSError as exc:
            raise _path_error(exc, request.path) from None

    return wrapper


def _path_error(exc: OSError, path: str) -> AgentError:
    """An OSError as one sentence naming the request's path."""
    return os_error(exc, path or "the path")


class FilesystemService(filesystem_pb2_grpc.FilesystemServicer):
    """sandbox.v1.Filesystem, confined to ``roots``; relative paths start at ``workspace``."""

    def __init__(self, roots: Sequence[str], workspace: str, identity: FsIdentity | None) -> None:
        try:
            self._resolver = Resolver(roots, workspace)
        except ValueError:
            if identity is None:
                raise
            # A root inside a directory only the tool user may enter (a private project
            # mounted from the host) is reachable to that user, not to the agent.
            with identity.acting():
                self._resolver = Resolver(roots, workspace)
        self._identity = identity

    @property
    def resolver(self) -> Resolver:
        return self._resolver

    def close(self) -> None:
        """Release the root fds (after the server stopped)."""
        self._resolver.close()

    def acting(self) -> contextlib.AbstractContextManager[None]:
        """Switch this thread to the tool user's filesystem identity (no-op without one)."""
        return acting_as(self._identity)

    # --- gRPC methods -------------------------------------------------------------------------

    def Read(
        self, request: filesystem_pb2.ReadRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.ReadResponse:
        return self._call(context, "Read", request.path, lambda: self.read(request))

    def Write(
        self, request: filesystem_pb2.WriteRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.WriteResponse:
        return self._call(context, "Write", request.path, lambda: self.write(request))

    def List(
        self, request: filesystem_pb2.ListRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.ListResponse:
        return self._call(context, "List", request.path, lambda: self.list_dir(request))

    def Stat(
        self, request: filesystem_pb2.StatRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.StatResponse:
        return self._call(context, "Stat", request.path, lambda: self.stat(request))

    def Remove(
        self, request: filesystem_pb2.RemoveRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.RemoveResponse:
        return self._call(context, "Remove", request.path, lambda: self.remove(request))

    def MakeDir(
        self, request: filesystem_pb2.MakeDirRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.MakeDirResponse:
        return self._call(context, "MakeDir", request.path, lambda: self.make_dir(request))

    def Upload(
        self, request_iterator: Iterator[filesystem_pb2.UploadChunk], context: grpc.ServicerContext
    ) -> filesystem_pb2.UploadResponse:
        # Upload and Download are imported on their first call: with tarfile they add
        # milliseconds to the agent's start-up, before a request that may never come.
        from sandbox import upload

        return self._call(
            context, "Upload", "the upload destination", lambda: upload.receive(self._resolver, request_iterator)
        )

    def Download(
        self, request: filesystem_pb2.DownloadRequest, context: grpc.ServicerContext
    ) -> Iterator[filesystem_pb2.DownloadChunk]:
        from sandbox import download

        return self._stream(context, "Download", request.path,
                            lambda: download.stream(self._resolver, request, self.acting, context.is_active))

    def Move(
        self, request: filesystem_pb2.MoveRequest, context: grpc.ServicerContext
    ) -> filesystem_pb2.MoveResponse:
        from sandbox import move
        return self._call(context, "Move", request.source, lambda: move.move(self._resolver, request))

    def Watch(
        self, request: filesystem_pb2.WatchRequest, context: grpc.ServicerContext
    ) -> Iterator[filesystem_pb2.WatchEvent]:
        from sandbox import watch  # with ctypes, for inotify
        return self._stream(context, "Watch", request.path, lambda: watch.stream(
            self._resolver, request, self.acting, context.is_active, context.add_callback))

    def _stream(
        self, context: grpc.ServicerContext, rpc: str, path: str, op: Callable[[], Iterable[_R]]
    ) -> Iterator[_R]:
        """Like :meth:`_call` for a response stream; ``op`` switches the identity itself."""
        try:
            yield from op()
        except AgentError as exc:
            abort(context, exc)
        except OSError as exc:
            abort(context, _path_error(exc, path))
        except Exception:
            log.exception("Filesystem.%s failed unexpectedly", rpc)
            abort(context, AgentError(INTERNAL, f"The agent failed internally during {rpc}."))

    def _call(self, context: grpc.ServicerContext, rpc: str, path: str, op: Callable[[], _R]) -> _R:
        try:
            with self.acting():
                return op()
        except AgentError as exc:
            abort(context, exc)
        except OSError as exc:  # e.g. from the identity switch; operations map their own
            abort(context, _path_error(exc, path))
        except Exception:
            log.exception("Filesystem.%s failed unexpectedly", rpc)
            abort(context, AgentError(INTERNAL, f"The agent failed internally during {rpc}."))

    # --- operations (raise AgentError; run inside acting()) -----------------------------------

    @_maps_os_errors
    def read(self, request: filesystem_pb2.ReadRequest) -> filesystem_pb2.ReadResponse:
        if request.limit > MAX_READ_BYTES:
            raise AgentError(
                TOO_LARGE,
                f"A read is limited to {MAX_READ_BYTES} bytes; read {request.path} in chunks "
                "using offset and limit.",
            )
        limit = request.limit or MAX_READ_BYTES
        with self._resolver.resolve(request.path, follow_final=True) as res:
            fd = _open_final(res, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            _require_regular(st, res.display)
            data = _pread(fd, limit, request.offset) if request.offset < st.st_size else b""
        finally:
            os.close(fd)
        truncated = request.offset + len(data) < st.st_size
        return filesystem_pb2.ReadResponse(data=data, size=st.st_size, truncated=truncated)

    @_maps_os_errors
    def write(self, request: filesystem_pb2.WriteRequest) -> filesystem_pb2.WriteResponse:
        mode = _file_mode(request.mode)
        with self._resolver.resolve(
            request.path, follow_final=True, make_parents=request.make_parents
        ) as res:
            existing = _lstat_or_none(res)
            if existing is not None:
                _check_write_target(existing, res.display, no_overwrite=request.no_overwrite)
                if not request.append:
                    mode = stat.S_IMODE(existing.st_mode) & ~_SETID
            if request.append:
                written = _append(res, request.data, mode, no_overwrite=request.no_overwrite)
            else:
                written = _replace(res, request.data, mode, no_overwrite=request.no_overwrite)
        return filesystem_pb2.WriteResponse(bytes_written=written)

    @_maps_os_errors
    def list_dir(self, request: filesystem_pb2.ListRequest) -> filesystem_pb2.ListResponse:
        depth = min(request.depth or 1, MAX_LIST_DEPTH)
        limit = request.limit or DEFAULT_LIST_LIMIT
        with self._resolver.resolve(request.path, follow_final=True) as res:
            fd = _open_dir(res)
        lister = _Lister(limit=limit, include_hidden=request.include_hidden, max_depth=depth)
        try:
            lister.run(fd)
        finally:
            os.close(fd)
        return filesystem_pb2.ListResponse(entries=lister.entries, truncated=lister.truncated)

    @_maps_os_errors
    def stat(self, request: filesystem_pb2.StatRequest) -> filesystem_pb2.StatResponse:
        with self._resolver.resolve(request.path, follow_final=False) as res:
            st = os.stat(res.name, dir_fd=res.dir_fd, follow_symlinks=False)
            target = _link_target(res.name, res.dir_fd) if stat.S_ISLNK(st.st_mode) else ""
        return filesystem_pb2.StatResponse(info=_info(request.path, st, target))

    @_maps_os_errors
    def remove(self, request: filesystem_pb2.RemoveRequest) -> filesystem_pb2.RemoveResponse:
        with self._resolver.resolve(request.path, follow_final=False) as res:
            if res.is_root:
                raise AgentError(PERMISSION_DENIED, f"{res.display} is an allowed root and cannot be removed.")
            st = os.stat(res.name, dir_fd=res.dir_fd, follow_symlinks=False)
            if not stat.S_ISDIR(st.st_mode):
                os.unlink(res.name, dir_fd=res.dir_fd)
                return filesystem_pb2.RemoveResponse()
            if not request.recursive:
                raise AgentError(
                    WRONG_TYPE,
                    f"{res.display} is a directory; pass recursive=true to remove it and its contents.",
                )
            if self._resolver.roots_under(res.path):
                raise AgentError(PERMISSION_DENIED, f"{res.display} contains an allowed root and cannot be removed.")
            _remove_tree(res, st.st_dev)
        return filesystem_pb2.RemoveResponse()

    @_maps_os_errors
    def make_dir(self, request: filesystem_pb2.MakeDirRequest) -> filesystem_pb2.MakeDirResponse:
        with self._resolver.resolve(request.path, follow_final=False, make_parents=request.parents) as res:
            try:
                os.mkdir(res.name, DIR_MODE, dir_fd=res.dir_fd)
            except FileExistsError:
                if not request.exist_ok:
                    raise AgentError(ALREADY_EXISTS, f"{res.display} already exists.") from None
                if not self._is_dir(request.path):
                    raise AgentError(ALREADY_EXISTS, f"{res.display} exists and is not a directory.") from None
        return filesystem_pb2.MakeDirResponse()

    def _is_dir(self, path: str) -> bool:
        with self._resolver.resolve(path, follow_final=True) as res:
            st = os.stat(res.name, dir_fd=res.dir_fd, follow_symlinks=False)
        return stat.S_ISDIR(st.st_mode)


# --- helpers ------------------------------------------------------------------------------------


def _text(name: str) -> str:
    """A str safe for a proto string field (undecodable bytes become U+FFFD)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _file_type(mode: int) -> filesystem_pb2.FileType.ValueType:
    if stat.S_ISREG(mode):
        return filesystem_pb2.FILE_TYPE_FILE
    if stat.S_ISDIR(mode):
        return filesystem_pb2.FILE_TYPE_DIRECTORY
    if stat.S_ISLNK(mode):
        return filesystem_pb2.FILE_TYPE_SYMLINK
    return filesystem_pb2.FILE_TYPE_OTHER


def _info(path: str, st: os.stat_result, link_target: str) -> filesystem_pb2.FileInfo:
    return filesystem_pb2.FileInfo(
        path=path,
        type=_file_type(st.st_mode),
        size=st.st_size,
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        mtime_ns=st.st_mtime_ns,
        link_target=link_target,
    )


def _link_target(name: str, dir_fd: int) -> str:
    try:
        return _text(os.readlink(name, dir_fd=dir_fd))
    except OSError:
        return ""


def _file_mode(requested: int) -> int:
    if requested > 0o7777:
        raise AgentError(INVALID_ARGUMENT, f"The mode {requested:#o} is not a permission mode (at most 0o7777).")
    return requested or DEFAULT_FILE_MODE


def _open_final(res: Resolved, flags: int) -> int:
    return os.open(res.name, flags | _NOFOLLOW, dir_fd=res.dir_fd)


def _open_dir(res: Resolved) -> int:
    try:
        return os.open(res.name, _DIR_READ, dir_fd=res.dir_fd)
    except NotADirectoryError:
        raise AgentError(WRONG_TYPE, f"{res.display} is not a directory.") from None


def _require_regular(st: os.stat_result, display: str) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise AgentError(WRONG_TYPE, f"{display} is a directory; list it instead of reading it.")
    if not stat.S_ISREG(st.st_mode):
        raise AgentError(WRONG_TYPE, f"{display} is not a regular file.")


def _lstat_or_none(res: Resolved) -> os.stat_result | None:
    try:
        return os.stat(res.name, dir_fd=res.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _check_write_target(st: os.stat_result, display: str, *, no_overwrite: bool) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise AgentError(WRONG_TYPE, f"{display} is a directory; give the path of a file to write.")
    if stat.S_ISLNK(st.st_mode):
        raise AgentError(PATH_ESCAPE, f"{display} was replaced by a symbolic link during the operation.")
    if not stat.S_ISREG(st.st_mode):
        raise AgentError(WRONG_TYPE, f"{display} is not a regular file.")
    if no_overwrite:
        raise AgentError(ALREADY_EXISTS, f"{display} already exists and no_overwrite was set.")


def _pread(fd: int, limit: int, offset: int) -> bytes:
    chunks: list[bytes] = []
    remaining = limit
    while remaining > 0:
        chunk = os.pread(fd, remaining, offset)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _write_all(fd: int, data: bytes) -> int:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return len(data)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=dir_fd)


def _replace(res: Resolved, data: bytes, mode: int, *, no_overwrite: bool) -> int:
    """Write to a temporary name beside the target, then publish it in one step."""
    tmp = f".callbox-{os.urandom(8).hex()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o600, dir_fd=res.dir_fd)
    try:
        try:
            written = _write_all(fd, data)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        if no_overwrite:
            _publish_new(tmp, res)
        else:
            os.rename(tmp, res.name, src_dir_fd=res.dir_fd, dst_dir_fd=res.dir_fd)
    except BaseException:
        _unlink_quietly(tmp, res.dir_fd)
        raise
    return written


def _publish_new(tmp: str, res: Resolved) -> None:
    try:
        os.link(tmp, res.name, src_dir_fd=res.dir_fd, dst_dir_fd=res.dir_fd, follow_symlinks=False)
    except FileExistsError:
        raise AgentError(ALREADY_EXISTS, f"{res.display} already exists and no_overwrite was set.") from None
    os.unlink(tmp, dir_fd=res.dir_fd)


def _append(res: Resolved, data: bytes, mode: int, *, no_overwrite: bool) -> int:
    flags = os.O_WRONLY | os.O_APPEND | _NOFOLLOW
    try:
        fd = os.open(res.name, flags | os.O_CREAT | os.O_EXCL, 0o600, dir_fd=res.dir_fd)
        created = True
    except FileExistsError:
        if no_overwrite:
            raise AgentError(ALREADY_EXISTS, f"{res.display} already exists and no_overwrite was set.") from None
        fd = os.open(res.name, flags, dir_fd=res.dir_fd)
        created = False
    try:
        _require_regular(os.fstat(fd), res.display)
        if created:
            os.fchmod(fd, mode)
        return _write_all(fd, data)
    finally:
        os.close(fd)


@dataclass
class _Frame:
    fd: int
    prefix: str
    names: Iterator[str]
    level: int
    owned: bool


class _Lister:
    """Depth-first listing through directory fds; never descends through a symlink."""

    def __init__(self, *, limit: int, include_hidden: bool, max_depth: int) -> None:
        self.limit = limit
        self.include_hidden = include_hidden
        self.max_depth = max_depth
        self.entries: list[filesystem_pb2.FileInfo] = []
        self.truncated = False

    def run(self, top_fd: int) -> None:
        frames = [_Frame(top_fd, "", self._names(top_fd), 1, owned=False)]
        try:
            while frames and not self.truncated:
                self._step(frames)
        finally:
            for frame in frames:
                if frame.owned:
                    os.close(frame.fd)

    def _step(self, frames: list[_Frame]) -> None:
        frame = frames[-1]
        name = next(frame.names, None)
        if name is None:
            frames.pop()
            if frame.owned:
                os.close(frame.fd)
            return
        try:
            st = os.stat(name, dir_fd=frame.fd, follow_symlinks=False)
        except FileNotFoundError:
            return  # removed since it was listed
        except OSError:
            st = None
        if len(self.entries) >= self.limit:
            self.truncated = True
            return
        self.entries.append(self._entry(frame, name, st))
        if st is not None and stat.S_ISDIR(st.st_mode) and frame.level < self.max_depth:
            child = self._open_child(frame.fd, name)
            if child is not None:
                rel = f"{frame.prefix}{_text(name)}/"
                frames.append(_Frame(child, rel, self._names(child), frame.level + 1, owned=True))

    def _entry(self, frame: _Frame, name: str, st: os.stat_result | None) -> filesystem_pb2.FileInfo:
        path = frame.prefix + _text(name)
        if st is None:
            return filesystem_pb2.FileInfo(path=path, type=filesystem_pb2.FILE_TYPE_UNSPECIFIED)
        target = _link_target(name, frame.fd) if stat.S_ISLNK(st.st_mode) else ""
        return _info(path, st, target)

    def _names(self, fd: int) -> Iterator[str]:
        try:
            names = os.listdir(fd)
        except OSError:
            return iter(())
        if not self.include_hidden:
            names = [n for n in names if not n.startswith(".")]
        return iter(sorted(names))

    @staticmethod
    def _open_child(dir_fd: int, name: str) -> int | None:
        try:
            return os.open(name, _DIR_READ, dir_fd=dir_fd)
        except OSError:
            return None  # unreadable, or swapped for a symlink/file since the stat


def _remove_tree(res: Resolved, device: int) -> None:
    """Remove directory ``res`` and its contents through fds, never following symlinks."""
    top = _open_dir(res)
    frames: list[tuple[int, Iterator[str]]] = [(top, iter(os.listdir(top)))]
    names: list[str] = []
    try:
        while frames:
            fd, entries = frames[-1]
            child = next(entries, None)
            if child is None:
                frames.pop()
                os.close(fd)
                if frames:
                    os.rmdir(names.pop(), dir_fd=frames[-1][0])
                continue
            sub = _remove_entry(fd, child, device, res.display)
            if sub is not None:
                frames.append((sub, iter(os.listdir(sub))))
                names.append(child)
    finally:
        for fd, _ in frames:
            os.close(fd)
    os.rmdir(res.name, dir_fd=res.dir_fd)


def _remove_entry(dir_fd: int, name: str, device: int, display: str) -> int | None:
    """Unlink a non-directory; for a directory return an fd to descend into."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return None
    if st.st_dev != device:
        raise AgentError(PERMISSION_DENIED, f"{display} contains a mount point; it was not removed completely.")
    try:
        return os.open(name, _DIR_READ, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # swapped for a symlink or file: unlink that
            os.unlink(name, dir_fd=dir_fd)
            return None
        raise
