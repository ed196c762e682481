"""Root-confined, symlink-safe path resolution for the agent's file operations.

Design
------
A request path is absolute or relative to the workspace. It is checked (not empty, no NUL,
not absurdly long), lexically normalised (``.``, ``..`` and duplicate slashes collapse as text),
and matched against the allowed roots: the longest root that contains it wins; no root means
PATH_ESCAPE. From then on nothing ever re-resolves a string path from ``/``:

* Each root is opened once, at construction, as an ``O_PATH|O_DIRECTORY`` file descriptor.
* The remaining components are walked one at a time with ``os.open(name, O_PATH|O_DIRECTORY|
  O_NOFOLLOW, dir_fd=current)``. The walk keeps a stack of the directory fds it went through,
  so a ``..`` (which can only come from a symlink target here) moves to the directory the walk
  really came from and can never climb above the root the walk is in (PATH_ESCAPE).
* A symlink met on the way is read with ``readlink(name, dir_fd=current)`` and expanded by
  hand: a relative target continues from the current directory; an absolute target is
  normalised and matched against the roots again (it may lead into the same or another root,
  never outside). More than :data:`MAX_SYMLINK_HOPS` expansions is an error, like ELOOP.
* The final component is not opened: :meth:`Resolver.resolve` returns a :class:`Resolved`
  holding an fd of the parent directory and the final name, and callers act on that name with
  ``dir_fd=`` calls (plus ``O_NOFOLLOW`` where they open it). With ``follow_final=True`` a
  final symlink is expanded through the same walk first.

Because every step is an ``openat`` relative to an fd that was itself reached without following
any symlink, a concurrent attacker who swaps a directory for a symlink mid-walk only makes the
next ``O_NOFOLLOW`` open fail (and the symlink is then expanded under the same confinement
rules); they cannot redirect the walk outside the roots. That is why this does not use
``os.path.realpath`` followed by a string open, which has a check-to-use race.

``openat2(RESOLVE_BENEATH)`` would let the kernel do the walk in one call, but it is not
available everywhere (older kernels, some seccomp profiles) and cannot express "absolute
symlinks may lead into another root", so the portable walk is the only implementation.

Errors are :class:`sandbox.errors.AgentError` whose messages name the path as the client gave
it (and the configured roots), never a host path or a traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

from sandbox.errors import (
    ALREADY_EXISTS,
    INTERNAL,
    INVALID_ARGUMENT,
    NOT_FOUND,
    PATH_ESCAPE,
    PERMISSION_DENIED,
    TOO_LARGE,
    WRONG_TYPE,
    AgentError,
)

MAX_SYMLINK_HOPS = 40
MAX_PATH_LENGTH = 4096
_RACE_RETRIES = 8
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def os_error(exc: OSError, display: str) -> AgentError:
    """Turn an OSError from an operation on ``display`` into a one-sentence AgentError."""
    code = exc.errno
    if code == errno.ENOENT:
        return AgentError(NOT_FOUND, f"{display} does not exist.")
    if code in (errno.ENOTDIR, errno.EISDIR, errno.ENXIO):
        return AgentError(WRONG_TYPE, f"{display} has the wrong type for this operation.")
    if code in (errno.EACCES, errno.EPERM):
        return AgentError(PERMISSION_DENIED, f"Permission denied for {display}.")
    if code == errno.EROFS:
        return AgentError(PERMISSION_DENIED, f"{display} is on a read-only filesystem.")
    if code == errno.EBUSY:
        return AgentError(PERMISSION_DENIED, f"{display} is in use (for example a mount point).")
    if code == errno.EEXIST:
        return AgentError(ALREADY_EXISTS, f"{display} already exists.")
    if code == errno.ENOTEMPTY:
        return AgentError(WRONG_TYPE, f"{display} is a directory that is not empty.")
    if code == errno.ELOOP:
        return AgentError(PATH_ESCAPE, f"{display} was replaced by a symbolic link during the operation.")
    if code == errno.ENAMETOOLONG:
        return AgentError(INVALID_ARGUMENT, f"{display} is too long, or one of its names is.")
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return AgentError(TOO_LARGE, f"No space left to write {display}.")
    name = errno.errorcode.get(code or 0, "unknown error")
    return AgentError(INTERNAL, f"Operation on {display} failed ({name}).")


def _close(fd: int) -> None:
    with contextlib.suppress(OSError):  # closing a valid fd does not fail in practice
        os.close(fd)


def _readlink(name: str, dir_fd: int) -> str | None:
    """The target of ``name`` if it is a symlink; None if it is not one or does not exist."""
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOENT):
            return None
        raise


@dataclass
class Resolved:
    """A resolved request path: the parent directory's fd plus the final name.

    ``name`` is ``"."`` (and ``dir_fd`` the root's own fd) when the path is a root itself.
    ``path`` is the lexical location inside the sandbox after symlinks were expanded; use
    ``display`` (the path as the client sent it) in messages. Close it, or use ``with``.
    """

    dir_fd: int
    name: str
    display: str
    root: str
    path: str
    is_root: bool
    _owned: bool = field(default=True, repr=False)

    def close(self) -> None:
        if self._owned and self.dir_fd >= 0:
            _close(self.dir_fd)
        self.dir_fd = -1

    def __enter__(self) -> Resolved:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Resolver:
    """Resolves request paths inside a fixed set of roots (see the module docstring)."""

    def __init__(self, roots: Sequence[str], workspace: str) -> None:
        if not roots:
            raise ValueError("at least one root is required")
        normalised = [_normalise_root(r) for r in roots]
        self._roots: tuple[str, ...] = tuple(sorted(set(normalised), key=len, reverse=True))
        self._root_fds: dict[str, int] = {}
        try:
            for root in self._roots:
                self._root_fds[root] = os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            self.close()
            raise ValueError(f"root {root!r} cannot be opened as a directory: {exc.strerror}") from exc
        self.workspace = _normalise_root(workspace)
        if self.match_root(self.workspace) is None:
            self.close()
            raise ValueError(f"workspace {workspace!r} is not inside any root {list(self._roots)}")

    @property
    def roots(self) -> tuple[str, ...]:
        """The configured roots, longest first."""
        return self._roots

    def close(self) -> None:
        """Close the root fds; the resolver cannot be used afterwards."""
        for fd in self._root_fds.values():
            _close(fd)
        self._root_fds.clear()

    def roots_text(self) -> str:
        return ", ".join(sorted(self._roots))

    def absolute(self, path: str) -> str:
        """Validate ``path`` and return it absolute (relative to the workspace) and normalised."""
        if not path:
            raise AgentError(INVALID_ARGUMENT, "The path is empty; give a file or directory path.")
        if "\x00" in path:
            raise AgentError(INVALID_ARGUMENT, f"The path {path!r} contains a NUL character.")
        if len(path) > MAX_PATH_LENGTH:
            raise AgentError(INVALID_ARGUMENT, f"The path is longer than {MAX_PATH_LENGTH} characters.")
        return _normpath(posixpath.join(self.workspace, path))

    def roots_under(self, abs_path: str) -> list[str]:
        """Configured roots strictly inside ``abs_path`` (which must be normalised)."""
        return [r for r in self._roots if r != abs_path and _is_within(r, abs_path)]

    def resolve(self, path: str, *, follow_final: bool, make_parents: bool = False) -> Resolved:
        """Resolve ``path`` to (parent dir fd, final name) without ever leaving the roots.

        ``follow_final`` expands a final symlink (safely); ``make_parents`` creates missing
        intermediate directories (mode 0755, subject to the umask) on the way.
        """
        abs_path = self.absolute(path)
        match = self.match_root(abs_path)
        if match is None:
            raise AgentError(PATH_ESCAPE, f"{path} is outside the allowed roots ({self.roots_text()}).")
        root, rest = match
        walk = _Walk(self, path, root, follow_final=follow_final, make_parents=make_parents)
        return walk.run(rest)

    def match_root(self, abs_path: str) -> tuple[str, list[str]] | None:
        """The longest root containing normalised ``abs_path`` and the components below it."""
        for root in self._roots:  # longest first
            if _is_within(abs_path, root):
                rest = abs_path[len(root) :].strip("/")
                return root, [c for c in rest.split("/") if c]
        return None

    def root_fd(self, root: str) -> int:
        return self._root_fds[root]


class _Walk:
    """One resolution: a stack of directory fds from a root down to the current directory."""

    def __init__(
        self, resolver: Resolver, display: str, root: str, *, follow_final: bool, make_parents: bool
    ) -> None:
        self.resolver = resolver
        self.display = display
        self.follow_final = follow_final
        self.make_parents = make_parents
        self.hops = 0
        self.root = root
        self.fds: list[int] = [resolver.root_fd(root)]  # fds[0] is shared: never closed here
        self.names: list[str] = []

    def run(self, components: list[str]) -> Resolved:
        pending = list(reversed(components))  # a stack: pending[-1] is the next component
        try:
            while pending:
                comp = pending.pop()
                if comp == "..":
                    self._up()
                    continue
                if not pending:
                    resolved = self._final(comp, pending)
                    if resolved is not None:
                        return resolved
                    continue
                self._enter(comp, pending)
            return self._current_dir()
        except OSError as exc:
            self._release(keep=None)
            raise os_error(exc, self.display) from None
        except BaseException:
            self._release(keep=None)
            raise

    def _final(self, comp: str, pending: list[str]) -> Resolved | None:
        if self.follow_final:
            target = _readlink(comp, self.fds[-1])
            if target is not None:
                self._expand(target, pending)
                return None
        return self._result(self.fds[-1], comp, keep=len(self.fds) - 1)

    def _current_dir(self) -> Resolved:
        """The walk ended on a directory itself (a root, or ``..`` at the end of a target)."""
        if len(self.fds) == 1:
            return self._result(self.fds[0], ".", keep=0, is_root=True)
        _close(self.fds.pop())
        name = self.names.pop()
        return self._result(self.fds[-1], name, keep=len(self.fds) - 1)

    def _result(self, dir_fd: int, name: str, *, keep: int, is_root: bool = False) -> Resolved:
        parts = [*self.names, name] if name != "." else list(self.names)
        self._release(keep=keep)
        return Resolved(
            dir_fd=dir_fd,
            name=name,
            display=self.display,
            root=self.root,
            path=posixpath.join(self.root, *parts),
            is_root=is_root,
            _owned=keep != 0,
        )

    def _release(self, keep: int | None) -> None:
        """Close every owned fd on the stack except index ``keep``."""
        for index, fd in enumerate(self.fds):
            if index not in (0, keep):
                _close(fd)
        self.fds = [self.fds[0]]
        self.names = []

    def _up(self) -> None:
        if len(self.fds) == 1:
            raise AgentError(
                PATH_ESCAPE,
                f"{self.display} climbs above the root {self.root} through a symbolic link.",
            )
        _close(self.fds.pop())
        self.names.pop()

    def _enter(self, comp: str, pending: list[str]) -> None:
        opened = self._open_dir_or_link(comp)
        if isinstance(opened, str):
            self._expand(opened, pending)
            return
        self.fds.append(opened)
        self.names.append(comp)

    def _open_dir_or_link(self, comp: str) -> int | str:
        """Open ``comp`` as a directory (an fd) or return its symlink target (a str)."""
        cur = self.fds[-1]
        for _ in range(_RACE_RETRIES):
            try:
                return os.open(comp, _DIR_FLAGS, dir_fd=cur)
            except OSError as exc:
                if exc.errno in (errno.ENOTDIR, errno.ELOOP):
                    target = _readlink(comp, cur)
                    if target is not None:
                        return target
                    if exc.errno == errno.ENOTDIR and _is_other(comp, cur):
                        raise AgentError(
                            WRONG_TYPE, f"A component of {self.display} is not a directory."
                        ) from None
                    continue  # it changed under us (symlink <-> directory); look again
                if exc.errno == errno.ENOENT:
                    self._missing_parent(comp, cur)
                    continue
                raise os_error(exc, self.display) from None
        raise AgentError(PATH_ESCAPE, f"{self.display} kept changing while being resolved; try again.")

    def _missing_parent(self, comp: str, cur: int) -> None:
        if not self.make_parents:
            raise AgentError(NOT_FOUND, f"A parent directory of {self.display} does not exist.")
        try:
            os.mkdir(comp, 0o755, dir_fd=cur)
        except FileExistsError:
            pass  # created concurrently, or a dangling symlink: the next open sorts it out
        except OSError as exc:
            raise os_error(exc, self.display) from None

    def _expand(self, target: str, pending: list[str]) -> None:
        self.hops += 1
        if self.hops > MAX_SYMLINK_HOPS:
            raise AgentError(
                INVALID_ARGUMENT,
                f"{self.display} has too many levels of symbolic links (more than {MAX_SYMLINK_HOPS}).",
            )
        if not target:
            raise AgentError(NOT_FOUND, f"{self.display} contains an empty symbolic link.")
        if target.startswith("/"):
            components = self._rebase(target)
        else:
            components = [c for c in target.split("/") if c not in ("", ".")]
        pending.extend(reversed(components))

    def _rebase(self, target: str) -> list[str]:
        """Restart the walk at the root holding an absolute symlink target."""
        match = self.resolver.match_root(_normpath(target))
        if match is None:
            raise AgentError(
                PATH_ESCAPE,
                f"{self.display} leads outside the allowed roots ({self.resolver.roots_text()}) "
                "through a symbolic link.",
            )
        self._release(keep=None)
        self.root, rest = match
        self.fds = [self.resolver.root_fd(self.root)]
        return rest


def _is_other(name: str, dir_fd: int) -> bool:
    """True if ``name`` exists and is neither a directory nor a symlink."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return not (stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode))


def _normpath(path: str) -> str:
    """Lexical normalisation; also folds POSIX's special leading ``//`` into ``/``."""
    normal = posixpath.normpath(path)
    if normal.startswith("//"):
        normal = "/" + normal.lstrip("/")
    return normal


def _normalise_root(root: str) -> str:
    if not root.startswith("/") or "\x00" in root:
        raise ValueError(f"root and workspace paths must be absolute: {root!r}")
    return _normpath(root)


def _is_within(path: str, root: str) -> bool:
    return root in ("/", path) or path.startswith(root + "/")
