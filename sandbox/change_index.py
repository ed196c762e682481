"""The index of a set of writable places that the Changes service compares against.

An index maps every entry below the places (absolute path) to the stat fields that tell a
change (:data:`Key`). Walking 10,000 files to compare them costs far more than a tool call may
spend on its record (each ``fstatat`` is a syscall), so the index keeps an inotify watch on
every directory it holds and, on the next :meth:`PlaceIndex.refresh`, looks again only at the
directories that had an event: their entries are stat'ed afresh, new directories are walked
and watched, entries that vanished are dropped with everything below them. What the kernel
could not tell (its queue overflowed, a place itself was moved, a directory could not be watched
for the per-user watch limit), or a refresh whose report was cut short, makes the next refresh a
full walk, so nothing is missed, only slower. A file written through a memory mapping raises no
event: its change is missed until a full walk.

The walk goes through directory fds (``openat`` with ``O_NOFOLLOW``, ``fstatat`` without
following), never follows a symlink and never crosses into another filesystem (a mount below a
place is a place of its own, or left out). Watches are added on ``/proc/self/fd/N`` before a
directory is listed, so an entry created while it is listed is seen by one or the other. A
directory counts as changed only when its type or bits do (its mtime follows its entries,
which are reported themselves); one replaced by another (a rename over it) by its inode.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Sequence

from sandbox.watch import (
    IN_ATTRIB,
    IN_CLOEXEC,
    IN_CREATE,
    IN_DELETE,
    IN_DELETE_SELF,
    IN_MODIFY,
    IN_MOVE_SELF,
    IN_MOVED_FROM,
    IN_MOVED_TO,
    IN_NONBLOCK,
    IN_ONLYDIR,
    IN_Q_OVERFLOW,
    READ_BYTES,
    _check,
    _inotify_add_watch,
    _inotify_init1,
    parse,
)

_MASK = (IN_MODIFY | IN_ATTRIB | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE | IN_DELETE | IN_DELETE_SELF
         | IN_MOVE_SELF | IN_ONLYDIR)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Key = tuple[int, int, int, int, int, str]
"""What tells a change: (st_mode, size, mtime_ns, ctime_ns, inode, symlink target); a
directory's is (st_mode, 0, 0, 0, 0, "")."""


def key_of(st: os.stat_result, target: str) -> Key:
    if stat.S_ISDIR(st.st_mode):
        return (st.st_mode, 0, 0, 0, 0, "")
    return (st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, target)


def _no_place(path: str) -> int:
    raise OSError(errno.ENOENT, f"no place {path}")


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0] or "/"


class PlaceIndex:
    """The entries below ``places`` (absolute, already confined by the caller), kept fresh by inotify."""

    def __init__(self, places: Sequence[str], skip: Sequence[str]) -> None:
        self.places = tuple(places)
        self.skip = tuple(skip)
        self.entries: dict[str, Key] = {}
        self.unreadable_dirs = 0
        self._children: dict[str, set[str]] = {}
        self._dir_ino: dict[str, int] = {}
        self._wd_paths: dict[int, str] = {}
        self._devices: dict[str, int] = {}
        self._fd = -1
        self._full_next = True
        self._unwatched = False
        """A directory could not be watched (the per-user watch limit): every refresh walks everything."""
        self._open_place: Callable[[str], int] = _no_place

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def invalidate(self) -> None:
        """The last refresh's report did not reach the harness: walk everything next time."""
        self._full_next = True

    def refresh(self, open_place: Callable[[str], int]) -> tuple[dict[str, Key], set[str]]:
        """The entries now and the paths whose key may differ from :attr:`entries` (commit with
        :meth:`commit`). ``open_place(path)`` opens a place as a directory fd."""
        self._open_place = open_place
        if not self._full_next:
            events = self._drain()
            if events is not None:
                return self._partial(events)
        return self._full()

    def commit(self, entries: dict[str, Key]) -> None:
        self.entries = entries
        self._full_next = self._unwatched

    # --- full walk -------------------------------------------------------------------------------

    def _full(self) -> tuple[dict[str, Key], set[str]]:
        self.close()
        self._fd = _check(_inotify_init1(IN_NONBLOCK | IN_CLOEXEC))
        self._children.clear()
        self._dir_ino.clear()
        self._wd_paths.clear()
        self._unwatched = False
        self.unreadable_dirs = 0
        entries: dict[str, Key] = {}
        for place in self.places:
            fd = self._open_place(place)
            try:
                self._devices[place] = os.fstat(fd).st_dev
                self._walk(os.dup(fd), place, self._devices[place], entries, set())
            finally:
                os.close(fd)
        return entries, set(entries) | set(self.entries)

    def _walk(self, top_fd: int, top: str, device: int, entries: dict[str, Key], touched: set[str]) -> None:
        """Watch, list and add to ``entries`` (and ``touched``) everything below the open
        directory ``top_fd`` (closed here)."""
        stack = [(top_fd, top)]
        try:
            while stack:
                fd, path = stack.pop()
                try:
                    self._watch(fd, path)
                except OSError:  # the watch limit: listed all the same, and walked again next time
                    self._unwatched = True
                try:
                    names = os.listdir(fd)
                except OSError:
                    self.unreadable_dirs += 1
                    os.close(fd)
                    continue
                kept = self._children.setdefault(path, set())
                self._dir_ino[path] = os.fstat(fd).st_ino
                for name in names:
                    child = f"{path}/{name}"
                    if self.skip and child.startswith(self.skip):
                        continue
                    st = self._stat(fd, name, child, entries)
                    if st is None:
                        continue
                    kept.add(name)
                    touched.add(child)
                    if stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                        try:
                            stack.append((os.open(name, _DIR_FLAGS, dir_fd=fd), child))
                        except OSError:
                            self.unreadable_dirs += 1
                os.close(fd)
        finally:
            for fd, _ in stack:
                with contextlib.suppress(OSError):
                    os.close(fd)

    def _stat(self, fd: int, name: str, path: str, entries: dict[str, Key]) -> os.stat_result | None:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        target = ""
        if stat.S_ISLNK(st.st_mode):
            with contextlib.suppress(OSError):
                target = os.readlink(name, dir_fd=fd)
        entries[path] = key_of(st, target)
        return st

    def _watch(self, fd: int, path: str) -> None:
        wd = _check(_inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _MASK))
        self._wd_paths[wd] = path

    # --- what inotify told ---------------------------------------------------------------------

    def _drain(self) -> set[str] | None:
        """The directories that had an event since the last refresh (None: walk everything)."""
        dirty: set[str] = set()
        while True:
            try:
                buffer = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                return dirty
            for event in parse(buffer):
                if event.mask & IN_Q_OVERFLOW:
                    return None
                path = self._wd_paths.get(event.wd)
                if path is None:
                    continue
                if event.name:
                    dirty.add(path)
                elif event.mask & (IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB):
                    if path in self.places:
                        if event.mask & IN_ATTRIB:
                            continue
                        return None  # a place itself was moved or removed
                    dirty.add(_parent(path))

    def _partial(self, dirty: set[str]) -> tuple[dict[str, Key], set[str]]:
        entries = dict(self.entries)
        touched: set[str] = set()
        listed: dict[str, tuple[int, list[str]] | None] = {}
        for path in sorted(dirty):
            fd = self._open_dir(path)
            if fd is None:
                listed[path] = None
                continue
            try:
                listed[path] = (fd, os.listdir(fd))
            except OSError:
                os.close(fd)
                listed[path] = None
        for path, found in listed.items():  # drops first: a directory moved away, then back in, is kept
            present = set() if found is None else set(found[1])
            for name in self._children.get(path, set()) - present:
                self._drop(f"{path}/{name}", entries, touched)
        for path, found in listed.items():
            if found is None:
                continue
            fd, names = found
            try:
                self._relist(fd, path, names, entries, touched)
            finally:
                os.close(fd)
        return entries, touched

    def _relist(self, fd: int, path: str, names: list[str], entries: dict[str, Key], touched: set[str]) -> None:
        kept = self._children.setdefault(path, set())
        device = self._device(path)
        for name in names:
            child = f"{path}/{name}"
            if self.skip and child.startswith(self.skip):
                continue
            before = entries.get(child)
            st = self._stat(fd, name, child, entries)
            if st is None:
                if child in kept:
                    self._drop(child, entries, touched)
                continue
            kept.add(name)
            touched.add(child)
            is_dir = stat.S_ISDIR(st.st_mode)
            was_dir = before is not None and stat.S_ISDIR(before[0])
            if was_dir and (not is_dir or self._dir_ino.get(child) != st.st_ino):
                key = entries[child]
                self._drop(child, entries, touched)
                entries[child] = key
            if is_dir and st.st_dev == device and (not was_dir or child not in self._children):
                with contextlib.suppress(OSError):
                    self._walk(os.open(name, _DIR_FLAGS, dir_fd=fd), child, device, entries, touched)

    def _drop(self, path: str, entries: dict[str, Key], touched: set[str]) -> None:
        """Forget ``path`` and, for a directory, everything below it."""
        entries.pop(path, None)
        touched.add(path)
        self._children.get(_parent(path), set()).discard(path.rsplit("/", 1)[1])
        below = [p for p in self._children if p == path or p.startswith(path + "/")]
        for directory in below:
            for name in self._children.pop(directory):
                entries.pop(f"{directory}/{name}", None)
                touched.add(f"{directory}/{name}")
            self._dir_ino.pop(directory, None)
        for wd in [wd for wd, p in self._wd_paths.items() if p == path or p.startswith(path + "/")]:
            del self._wd_paths[wd]

    def _device(self, path: str) -> int:
        place = max((p for p in self.places if path == p or path.startswith(p + "/")), key=len)
        return self._devices[place]

    def _open_dir(self, path: str) -> int | None:
        """An fd of the directory ``path`` reached from its place without following a symlink
        (None: it is gone or no longer a directory)."""
        place = max((p for p in self.places if path == p or path.startswith(p + "/")), key=len, default=None)
        if place is None:
            return None
        fd = self._open_place(place)
        for name in path[len(place):].strip("/").split("/") if path != place else ():
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EACCES):
                    return None
                raise
            os.close(fd)
            fd = child
        return fd
