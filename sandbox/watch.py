"""Filesystem.Watch: changes under a directory, reported from Linux inotify until the RPC ends.

Design
------
This is inotify only (``inotify_init1`` and ``inotify_add_watch`` from libc through ctypes), with
no polling fallback: the agent runs in a Linux container, where inotify always exists; if it
cannot be set up (the per-user instance or watch limit is reached) the Watch fails with BUSY or
TOO_LARGE instead of quietly degrading to a poller.

Confinement: the directory is resolved with :class:`sandbox.paths.Resolver` (a final symlink is
followed through the confined walk) and opened with ``O_NOFOLLOW``; the watch is then added on
``/proc/self/fd/N``, so the kernel watches exactly the inode that was opened and no string path
is ever resolved from ``/``. Each directory found below it later (``recursive``) is reached the
same way. Everything that touches the filesystem runs as the tool user (its permission to read a
directory is what lets it be watched), but the identity is never held across a ``yield``.

Events, each with the absolute sandbox path and whether it is a directory:

* CREATED (``IN_CREATE``), REMOVED (``IN_DELETE``), MOVED_FROM / MOVED_TO (``IN_MOVED_*``);
* MODIFIED (``IN_MODIFY``: the content) and ATTRIB (``IN_ATTRIB``: metadata, such as the mode
  after a chmod); repeats of the same event read in one batch are reported once, like the
  kernel itself merges identical queued events;
* OVERFLOW: the kernel's queue overflowed (``IN_Q_OVERFLOW``) or a new subdirectory could not be
  watched (the watch limit); events were lost, so the client should rescan.

With ``recursive`` every directory below is watched, and so is each directory created or moved
in later. Entries that a new directory already holds when its watch is added (``mkdir -p a/b``
followed at once by a file in ``a/b``) are reported as CREATED by scanning it, and a regular
file that already has content as MODIFIED too (a watch in place would have seen it written), so
one of them may be reported twice. A directory moved out of the tree stops being watched.

The first message is READY, sent once every watch is in place. The stream ends when the RPC is
cancelled or its deadline passes (a wake pipe the RPC's termination callback writes to interrupts
the ``select``, which also times out every :data:`POLL_S` seconds to re-check the context), or
when the watched directory itself is removed, moved or unmounted (its REMOVED or MOVED_FROM is
the last event). At most :data:`MAX_ACTIVE` Watches run at once (each holds an RPC thread):
BUSY beyond that. At most :data:`MAX_WATCHES` directories per Watch, and none deeper than
:data:`MAX_DEPTH` levels below the watched one (each level holds a descriptor while it is added).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import select
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sandbox.errors import BUSY, TOO_LARGE, WRONG_TYPE, AgentError
from sandbox.paths import Resolver, os_error
from sandbox.v1 import filesystem_pb2

POLL_S = 1.0
MAX_ACTIVE = 8
MAX_WATCHES = 10_000
MAX_DEPTH = 64
READ_BYTES = 64 * 1024

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_UNMOUNT = 0x00002000
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

WATCH_MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE
              | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR | IN_EXCL_UNLINK)

_EVENT = struct.Struct("iIII")
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_KINDS = (
    (IN_CREATE, filesystem_pb2.WATCH_EVENT_KIND_CREATED),
    (IN_DELETE, filesystem_pb2.WATCH_EVENT_KIND_REMOVED),
    (IN_MOVED_FROM, filesystem_pb2.WATCH_EVENT_KIND_MOVED_FROM),
    (IN_MOVED_TO, filesystem_pb2.WATCH_EVENT_KIND_MOVED_TO),
    (IN_MODIFY, filesystem_pb2.WATCH_EVENT_KIND_MODIFIED),
    (IN_ATTRIB, filesystem_pb2.WATCH_EVENT_KIND_ATTRIB),
)

_libc = ctypes.CDLL(None, use_errno=True)
_inotify_init1 = _libc.inotify_init1
_inotify_init1.argtypes = [ctypes.c_int]
_inotify_init1.restype = ctypes.c_int
_inotify_add_watch = _libc.inotify_add_watch
_inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
_inotify_add_watch.restype = ctypes.c_int
_inotify_rm_watch = _libc.inotify_rm_watch
_inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
_inotify_rm_watch.restype = ctypes.c_int

_active = threading.BoundedSemaphore(MAX_ACTIVE)


def _check(result: int) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return result


@dataclass(frozen=True)
class RawEvent:
    wd: int
    mask: int
    cookie: int
    name: str


def parse(buffer: bytes) -> list[RawEvent]:
    """The ``struct inotify_event`` records in one ``read()`` of an inotify fd."""
    events, offset = [], 0
    while offset + _EVENT.size <= len(buffer):
        wd, mask, cookie, length = _EVENT.unpack_from(buffer, offset)
        offset += _EVENT.size
        raw = buffer[offset : offset + length].split(b"\0", 1)[0]
        offset += length
        events.append(RawEvent(wd, mask, cookie, os.fsdecode(raw)))
    return events


def _event(kind: filesystem_pb2.WatchEventKind.ValueType, path: str, is_dir: bool) -> filesystem_pb2.WatchEvent:
    text = path.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    return filesystem_pb2.WatchEvent(kind=kind, path=text, is_dir=is_dir)


class Watcher:
    """One Watch's inotify fd and the directories it watches (wd -> sandbox path)."""

    def __init__(self, resolver: Resolver, path: str, *, recursive: bool) -> None:
        self.resolver = resolver
        self.display = path
        self.recursive = recursive
        self.fd = _check(_inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        self.paths: dict[int, str] = {}
        self.top_wd = -1
        try:
            with resolver.resolve(path, follow_final=True) as res:
                try:
                    dir_fd = os.open(res.name, _DIR_FLAGS, dir_fd=res.dir_fd)
                except NotADirectoryError:
                    raise AgentError(WRONG_TYPE, f"{path} is not a directory; watch a directory.") from None
                self.top = res.path
            self.top_wd = self._add_fd(dir_fd, self.top, None, 0)
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        os.close(self.fd)

    def _add_fd(self, dir_fd: int, path: str, scan: list[filesystem_pb2.WatchEvent] | None, depth: int) -> int:
        """Watch the open directory ``dir_fd`` (closing it) and, if recursive, the ones below it
        (at most :data:`MAX_DEPTH` levels below the watched directory)."""
        try:
            if len(self.paths) >= MAX_WATCHES:
                raise OSError(errno.ENOSPC, "too many watches")
            wd = _check(_inotify_add_watch(self.fd, f"/proc/self/fd/{dir_fd}".encode(), WATCH_MASK))
            self.paths[wd] = path
            if not self.recursive and scan is None:
                return wd
            for name in sorted(os.listdir(dir_fd)):
                self._found(dir_fd, name, f"{path}/{name}", scan, depth)
            return wd
        finally:
            os.close(dir_fd)

    def _found(
        self, dir_fd: int, name: str, path: str, scan: list[filesystem_pb2.WatchEvent] | None, depth: int
    ) -> None:
        """An entry already in a directory being watched: watch it if a directory; report it if scanning."""
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return
        is_dir = stat.S_ISDIR(st.st_mode)
        if scan is not None:
            scan.append(_event(filesystem_pb2.WATCH_EVENT_KIND_CREATED, path, is_dir))
            if stat.S_ISREG(st.st_mode) and st.st_size:  # written before its directory was watched
                scan.append(_event(filesystem_pb2.WATCH_EVENT_KIND_MODIFIED, path, False))
        if is_dir and self.recursive and depth < MAX_DEPTH:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
                    return  # gone, swapped for something else, or not the tool user's to watch
                raise
            self._add_fd(child, path, scan, depth + 1)

    def add_new(self, path: str) -> list[filesystem_pb2.WatchEvent]:
        """Watch a directory that appeared in the tree; what it already holds, as CREATED events."""
        scan: list[filesystem_pb2.WatchEvent] = []
        if self._depth(path) > MAX_DEPTH:
            return scan
        try:
            with self.resolver.resolve(path, follow_final=False) as res:
                dir_fd = os.open(res.name, _DIR_FLAGS, dir_fd=res.dir_fd)
            self._add_fd(dir_fd, res.path, scan, self._depth(res.path))
        except AgentError:
            pass  # gone again, or no longer confined: nothing to watch
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EMFILE):
                scan.append(_event(filesystem_pb2.WATCH_EVENT_KIND_OVERFLOW, path, True))
        return scan

    def _depth(self, path: str) -> int:
        return path[len(self.top) :].count("/")

    def forget(self, path: str) -> None:
        """Stop watching ``path`` and everything below it (it moved out of the tree)."""
        for wd, watched in list(self.paths.items()):
            if watched == path or watched.startswith(path + "/"):
                del self.paths[wd]
                _inotify_rm_watch(self.fd, wd)

    def translate(self, events: list[RawEvent]) -> tuple[list[filesystem_pb2.WatchEvent], list[str], bool]:
        """Messages for ``events``, the new directories to watch, and whether the stream should end."""
        out: list[filesystem_pb2.WatchEvent] = []
        new_dirs: list[str] = []
        for raw in events:
            if raw.mask & IN_Q_OVERFLOW:
                out.append(_event(filesystem_pb2.WATCH_EVENT_KIND_OVERFLOW, self.top, True))
                continue
            base = self.paths.get(raw.wd)
            if base is None:
                continue  # a watch already removed
            if raw.mask & IN_IGNORED:
                del self.paths[raw.wd]
                if raw.wd == self.top_wd:
                    return out, new_dirs, True
                continue
            if raw.wd == self.top_wd and raw.mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_UNMOUNT):
                gone = filesystem_pb2.WATCH_EVENT_KIND_MOVED_FROM if raw.mask & IN_MOVE_SELF else \
                    filesystem_pb2.WATCH_EVENT_KIND_REMOVED
                out.append(_event(gone, self.top, True))
                return out, new_dirs, True
            if not raw.name:
                continue  # a subdirectory's own DELETE_SELF/MOVE_SELF: its parent reports it
            path = f"{base}/{raw.name}"
            is_dir = bool(raw.mask & IN_ISDIR)
            for bits, kind in _KINDS:
                if raw.mask & bits:
                    message = _event(kind, path, is_dir)
                    if not out or out[-1] != message:
                        out.append(message)
                    break
            if is_dir and self.recursive:
                if raw.mask & (IN_CREATE | IN_MOVED_TO):
                    new_dirs.append(path)
                elif raw.mask & (IN_MOVED_FROM | IN_DELETE):
                    self.forget(path)
        return out, new_dirs, False


class _Waker:
    """A pipe the RPC's termination callback writes to, to end the ``select`` at once.

    The callback may run after the stream ended and closed the pipe; the lock and flag keep it
    from writing to a closed descriptor whose number something else may have reused.
    """

    def __init__(self) -> None:
        self.read_fd, self._write_fd = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._lock = threading.Lock()
        self._closed = False

    def wake(self) -> None:
        with self._lock:
            if not self._closed:
                with contextlib.suppress(BlockingIOError):  # already woken
                    os.write(self._write_fd, b"x")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            os.close(self._write_fd)
            os.close(self.read_fd)


def stream(
    resolver: Resolver, request: filesystem_pb2.WatchRequest,
    acting: Callable[[], contextlib.AbstractContextManager[None]],
    is_active: Callable[[], bool], on_end: Callable[[Callable[[], None]], object],
) -> Iterator[filesystem_pb2.WatchEvent]:
    """The Watch RPC's messages; ``on_end`` registers a callback for when the RPC terminates."""
    if not _active.acquire(blocking=False):
        raise AgentError(BUSY, f"At most {MAX_ACTIVE} watches can run at once; end one first.")
    try:
        with acting():
            watcher = _start(resolver, request)
        try:
            waker = _Waker()
            try:
                on_end(waker.wake)
                yield filesystem_pb2.WatchEvent(ready=True)
                yield from _loop(watcher, waker.read_fd, acting, is_active)
            finally:
                waker.close()
        finally:
            watcher.close()
    finally:
        _active.release()


def _start(resolver: Resolver, request: filesystem_pb2.WatchRequest) -> Watcher:
    try:
        return Watcher(resolver, request.path, recursive=request.recursive)
    except OSError as exc:
        if exc.errno == errno.EMFILE:
            raise AgentError(BUSY, "No inotify instance is left (the kernel's per-user limit); end a watch.") from None
        if exc.errno == errno.ENOSPC:
            raise AgentError(
                TOO_LARGE, f"{request.path} has too many directories to watch (the inotify watch limit); "
                "watch a smaller tree or without recursive."
            ) from None
        raise os_error(exc, request.path) from None


def _loop(
    watcher: Watcher, wake_r: int, acting: Callable[[], contextlib.AbstractContextManager[None]],
    is_active: Callable[[], bool],
) -> Iterator[filesystem_pb2.WatchEvent]:
    while is_active():
        ready, _, _ = select.select([watcher.fd, wake_r], [], [], POLL_S)
        if wake_r in ready:
            return
        if not ready:
            continue
        try:
            data = os.read(watcher.fd, READ_BYTES)
        except BlockingIOError:
            continue
        events, new_dirs, end = watcher.translate(parse(data))
        for path in new_dirs:
            with acting():
                events.extend(watcher.add_new(path))
        yield from events
        if end:
            return
