"""The memory tool's files on this host: one scope's tree, reached descriptor by descriptor.

:func:`opened` takes the scope's lock (``flock`` on its ``lock`` file: one command at a time per
scope, across threads and processes), makes its directories on first use, clears what a
stopped write left in ``tmp/``, and hands out a :class:`MemoryTree` for the ``memories/``
directory. Every path below it is a tuple of names already checked by the tool (no ``..``,
no ``/``, no NUL; :func:`harness.tools.memory.memory_parts`), and every step is taken relative
to the directory descriptor before it, with ``O_NOFOLLOW``: a symlink anywhere in the tree
(put there by hand, since no command makes one) is refused, never followed, so nothing
outside the scope is read or written whatever the tree holds. Writes go to a new file in
``tmp/`` (``0600``), are synced, and are renamed over their target: a reader sees the old
file or the new one, never half of one. Directories are made ``0700``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from harness.core.calls import ErrorCode
from harness.core.memory import MemoryScope

__all__ = ["LOCK_WAIT_S", "READ_LIMIT", "Entry", "MemoryRefused", "MemoryTree", "NotFound", "opened", "shown"]

LOCK_WAIT_S = 30.0
"""How long a command waits for another one of its scope to finish."""
READ_LIMIT = 8 << 20
"""The largest memory file read (one written by hand may pass the scope's cap)."""
HIDDEN = "node_modules"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class MemoryRefused(Exception):
    """A command that cannot be done: the text the model reads, its code and a short reason."""

    def __init__(self, message: str, reason: str, code: ErrorCode = ErrorCode.TOOL_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.code = code

    def retold(self, message: str) -> MemoryRefused:
        """The same refusal in a command's own words (each says a missing path its way)."""
        self.message = message
        self.args = (message,)
        return self


class NotFound(MemoryRefused):
    """Nothing at the path (or a file where a directory of it should be)."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        super().__init__(f"The path {shown(parts)} does not exist", "not_found")
        self.parts = parts


def shown(parts: tuple[str, ...]) -> str:
    """The path as the model names it."""
    return "/".join(("/memories", *parts))


@dataclass(frozen=True)
class Entry:
    """One file or directory of a listing."""

    parts: tuple[str, ...]
    size: int
    is_dir: bool


@contextlib.contextmanager
def opened(scope: MemoryScope) -> Iterator[MemoryTree]:
    """The scope's tree while its lock is held (made on first use)."""
    directory = scope.directory
    for sub in ("memories", "tmp"):
        _private_dirs(directory / sub)
    lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        _lock(lock, scope)
        root = os.open(directory / "memories", _DIR_FLAGS)
        try:
            tmp = os.open(directory / "tmp", _DIR_FLAGS)
            try:
                for name in os.listdir(tmp):  # a write stopped half-way (we hold the lock: none runs)
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=tmp)
                yield MemoryTree(scope, root, tmp)
            finally:
                os.close(tmp)
        finally:
            os.close(root)
    finally:
        os.close(lock)  # releases the lock


def _private_dirs(path: Path) -> None:
    """Make ``path`` and its missing parents ``0700`` (``os.makedirs`` gives only the last one the mode)."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for directory in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, 0o700)


def _lock(fd: int, scope: MemoryScope) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise MemoryRefused(f"Error: the memory ({scope.label}) is busy: another command has held it for "
                                    f"{LOCK_WAIT_S:g} seconds; try again", "busy") from None
            time.sleep(0.01)


class MemoryTree:
    """One scope's ``memories/`` directory while its lock is held."""

    def __init__(self, scope: MemoryScope, root: int, tmp: int) -> None:
        self.scope = scope
        self._root = root
        self._tmp = tmp

    # --- looking ---------------------------------------------------------------------------------

    def kind(self, parts: tuple[str, ...]) -> str | None:
        """``"file"``, ``"dir"`` or None (nothing there, or a parent is missing or a file)."""
        if not parts:
            return "dir"
        try:
            with self._dir(parts[:-1]) as parent:
                return self._kind_in(parent, parts)
        except NotFound:
            return None

    def read(self, parts: tuple[str, ...]) -> bytes:
        """A memory file's bytes (NotFound when there is none)."""
        with self._dir(parts[:-1]) as parent:
            if self._kind_in(parent, parts) != "file":
                raise NotFound(parts)
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
        try:
            size = os.fstat(fd).st_size
            if size > READ_LIMIT:
                raise MemoryRefused(f"Error: {shown(parts)} is {size} bytes, more than the {READ_LIMIT} bytes a "
                                    "memory file may be read with", "too_large")
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def listing(self, parts: tuple[str, ...], depth: int = 2) -> tuple[int, list[Entry]]:
        """A directory's own size and its entries ``depth`` levels deep, sorted, without hidden
        names (a leading ``.``) and ``node_modules``."""
        with self._dir(parts) as fd:
            own = os.fstat(fd).st_size
            entries: list[Entry] = []
            self._list(fd, parts, depth, entries)
        return own, entries

    def _list(self, fd: int, parts: tuple[str, ...], depth: int, out: list[Entry]) -> None:
        with os.scandir(fd) as scan:
            items = sorted(scan, key=lambda e: e.name)
        for item in items:
            if item.name.startswith(".") or item.name == HIDDEN:
                continue
            info = item.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                out.append(Entry((*parts, item.name), info.st_size, True))
                if depth > 1:
                    with self._sub(fd, item.name) as sub:
                        self._list(sub, (*parts, item.name), depth - 1, out)
            elif stat.S_ISREG(info.st_mode):
                out.append(Entry((*parts, item.name), info.st_size, False))

    def usage(self) -> tuple[int, int]:
        """The bytes of every file of the scope and how many entries (files, directories, anything) it holds."""
        totals = [0, 0]

        def walk(fd: int) -> None:
            with os.scandir(fd) as scan:
                items = list(scan)
            for item in items:
                info = item.stat(follow_symlinks=False)
                totals[1] += 1
                if stat.S_ISREG(info.st_mode):
                    totals[0] += info.st_size
                elif stat.S_ISDIR(info.st_mode):
                    with self._sub(fd, item.name) as sub:
                        walk(sub)

        walk(self._root)
        return totals[0], totals[1]

    def missing_dirs(self, parts: tuple[str, ...]) -> int:
        """How many of the directories ``parts`` names do not exist yet (a file among them: NotFound)."""
        fd = os.dup(self._root)
        try:
            for index, name in enumerate(parts):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    return len(parts) - index
                except OSError as error:
                    raise self._not_a_dir(fd, parts[: index + 1], error) from None
                os.close(fd)
                fd = sub
            return 0
        finally:
            os.close(fd)

    # --- changing --------------------------------------------------------------------------------

    def write(self, parts: tuple[str, ...], data: bytes) -> None:
        """Put ``data`` at ``parts`` atomically (a file or nothing there; missing parents are made)."""
        name = uuid.uuid4().hex
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self._tmp)
        try:
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            with self._dir(parts[:-1], create=True) as parent:
                if self._kind_in(parent, parts) == "dir":
                    raise MemoryRefused(f"Error: {shown(parts)} is a directory", "is_directory")
                os.rename(name, parts[-1], src_dir_fd=self._tmp, dst_dir_fd=parent)
                os.fsync(parent)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=self._tmp)
            raise

    def delete(self, parts: tuple[str, ...]) -> None:
        """Remove a file, or a directory and everything in it (never following a link)."""
        with self._dir(parts[:-1]) as parent:
            kind = self._kind_in(parent, parts)
            if kind is None:
                raise NotFound(parts)
            if kind == "dir":
                shutil.rmtree(parts[-1], dir_fd=parent)
            else:
                os.unlink(parts[-1], dir_fd=parent)

    def rename(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """Move a file or directory to ``new``, which must not exist (missing parents are made)."""
        with self._dir(old[:-1]) as source:
            kind = self._kind_in(source, old)
            if kind is None:
                raise NotFound(old)
            if kind == "dir" and new[: len(old)] == old:
                raise MemoryRefused(f"Error: cannot move the directory {shown(old)} into itself ({shown(new)})",
                                    "into_itself", ErrorCode.INVALID_ARGUMENTS)
            with self._dir(new[:-1], create=True) as target:
                if self._kind_in(target, new) is not None:
                    raise MemoryRefused(f"Error: The destination {shown(new)} already exists", "exists")
                os.rename(old[-1], new[-1], src_dir_fd=source, dst_dir_fd=target)

    # --- descriptors -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _dir(self, parts: tuple[str, ...], *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory ``parts`` (``create``: made where missing)."""
        fd = os.dup(self._root)
        try:
            for index, name in enumerate(parts):
                try:
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise NotFound(parts[: index + 1]) from None
                    os.mkdir(name, 0o700, dir_fd=fd)
                    sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError as error:
                    raise self._not_a_dir(fd, parts[: index + 1], error) from None
                os.close(fd)
                fd = sub
            yield fd
        finally:
            os.close(fd)

    @contextlib.contextmanager
    def _sub(self, fd: int, name: str) -> Iterator[int]:
        sub = os.open(name, _DIR_FLAGS, dir_fd=fd)
        try:
            yield sub
        finally:
            os.close(sub)

    def _kind_in(self, parent: int, parts: tuple[str, ...]) -> str | None:
        try:
            info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if stat.S_ISDIR(info.st_mode):
            return "dir"
        if stat.S_ISREG(info.st_mode):
            return "file"
        raise _odd(parts, info.st_mode)

    def _not_a_dir(self, parent: int, parts: tuple[str, ...], error: OSError) -> MemoryRefused:
        """Why ``parts`` could not be opened as a directory: a link or odd file is refused, a file is NotFound."""
        if error.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise error
        info = os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
        if stat.S_ISREG(info.st_mode):
            return NotFound(parts)
        return _odd(parts, info.st_mode)


def _odd(parts: tuple[str, ...], mode: int) -> MemoryRefused:
    what = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file or directory"
    return MemoryRefused(f"Error: {shown(parts)} is {what}; the memory tool never follows links or opens "
                         "special files, so it cannot be used", "not_regular", ErrorCode.INVALID_ARGUMENTS)
