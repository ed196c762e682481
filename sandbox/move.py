"""Filesystem.Move: rename a file or directory inside the roots.

Design
------
Both paths are resolved with :class:`sandbox.paths.Resolver` without following a final symlink
(a symlink is moved as itself), and the move is one ``renameat`` between the two parent
directory fds, so it is atomic and never leaves the roots. Roots cannot be moved or replaced,
and neither can a directory that contains a root (a mount point).

``overwrite``: without it the rename uses ``renameat2(RENAME_NOREPLACE)``, which fails atomically
if the destination exists (ALREADY_EXISTS). (A filesystem without RENAME_NOREPLACE gets an
``lstat`` check followed by a plain rename.) With it an existing destination is replaced the way
``rename(2)`` replaces: a file or symlink by anything but a directory, an empty directory by a
directory; a non-empty directory is never replaced (WRONG_TYPE), and a file never replaces a
directory.

Across filesystems (``/tmp`` and ``/workspace`` are separate tmpfs mounts; a mount may sit below
the workspace) a rename fails with EXDEV. A regular file or a symlink is then copied into a
temporary name beside the destination (content, permission bits without set-id bits, mtime),
published like a rename (``link()`` without overwrite, ``rename()`` with it), and the source is
removed; so the destination appears complete or not at all. A directory is not copied across
filesystems: that is WRONG_TYPE with a message saying to copy it instead (a command such as
``cp -a`` then a remove, or ``mv``, in the sandbox).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat

from sandbox.errors import ALREADY_EXISTS, INVALID_ARGUMENT, PERMISSION_DENIED, WRONG_TYPE, AgentError
from sandbox.paths import Resolved, Resolver, os_error
from sandbox.v1 import filesystem_pb2

RENAME_NOREPLACE = 1
COPY_CHUNK = 1 << 20
_SETID = stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX

_libc = ctypes.CDLL(None, use_errno=True)
_renameat2 = getattr(_libc, "renameat2", None)
if _renameat2 is not None:
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    _renameat2.restype = ctypes.c_int


def move(resolver: Resolver, request: filesystem_pb2.MoveRequest) -> filesystem_pb2.MoveResponse:
    """Run one Move (see the module docstring); raises AgentError. Run it as the tool user."""
    if not request.destination:
        raise AgentError(INVALID_ARGUMENT, "The destination is empty; give the new path.")
    with resolver.resolve(request.source, follow_final=False) as src:
        try:
            st = os.stat(src.name, dir_fd=src.dir_fd, follow_symlinks=False)
        except OSError as exc:
            raise os_error(exc, src.display) from None
        if src.is_root or resolver.roots_under(src.path):
            what = "is" if src.is_root else "contains"
            raise AgentError(PERMISSION_DENIED, f"{src.display} {what} an allowed root and cannot be moved.")
        with resolver.resolve(request.destination, follow_final=False) as dst:
            if dst.is_root:
                raise AgentError(PERMISSION_DENIED, f"{dst.display} is an allowed root and cannot be replaced.")
            try:
                _rename(src, dst, st, overwrite=request.overwrite)
            except OSError as exc:
                raise _move_error(exc, src, dst, st) from None
    return filesystem_pb2.MoveResponse()


def _rename(src: Resolved, dst: Resolved, st: os.stat_result, *, overwrite: bool) -> None:
    try:
        if overwrite:
            _check_replace(dst, st)
            os.rename(src.name, dst.name, src_dir_fd=src.dir_fd, dst_dir_fd=dst.dir_fd)
        else:
            _rename_noreplace(src, dst)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        _copy_across(src, dst, st, overwrite=overwrite)


def _check_replace(dst: Resolved, st: os.stat_result) -> None:
    existing = _lstat(dst.name, dst.dir_fd)
    if existing is None or not stat.S_ISDIR(existing.st_mode):
        return
    if not stat.S_ISDIR(st.st_mode):
        raise AgentError(WRONG_TYPE, f"{dst.display} is a directory; a file cannot replace it.")


def _rename_noreplace(src: Resolved, dst: Resolved) -> None:
    if _renameat2 is not None:
        result = _renameat2(src.dir_fd, os.fsencode(src.name), dst.dir_fd, os.fsencode(dst.name), RENAME_NOREPLACE)
        if result == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS) or _within(dst.path, src.path):
            raise OSError(code, os.strerror(code))
    # No RENAME_NOREPLACE here: check, then rename (not atomic against a concurrent create).
    if _lstat(dst.name, dst.dir_fd) is not None:
        raise OSError(errno.EEXIST, os.strerror(errno.EEXIST))
    os.rename(src.name, dst.name, src_dir_fd=src.dir_fd, dst_dir_fd=dst.dir_fd)


def _move_error(exc: OSError, src: Resolved, dst: Resolved, st: os.stat_result) -> AgentError:
    code = exc.errno
    if code == errno.EEXIST:
        return AgentError(ALREADY_EXISTS, f"{dst.display} already exists; set overwrite to replace it.")
    if code == errno.ENOTEMPTY:
        return AgentError(WRONG_TYPE, f"{dst.display} is a directory that is not empty; it is never replaced.")
    if code == errno.ENOTDIR and stat.S_ISDIR(st.st_mode):
        return AgentError(WRONG_TYPE, f"{dst.display} is not a directory; a directory cannot replace it.")
    if code == errno.EISDIR:
        return AgentError(WRONG_TYPE, f"{dst.display} is a directory; a file cannot replace it.")
    if code == errno.EINVAL and _within(dst.path, src.path):
        return AgentError(INVALID_ARGUMENT, f"{src.display} cannot be moved into itself ({dst.display}).")
    return os_error(exc, f"{src.display} -> {dst.display}")


def _within(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


# --- across filesystems ---------------------------------------------------------------------------------


def _copy_across(src: Resolved, dst: Resolved, st: os.stat_result, *, overwrite: bool) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise AgentError(
            WRONG_TYPE,
            f"{src.display} and {dst.display} are on different filesystems, and Move takes a directory across "
            "filesystems only by copying it: copy it instead (for example `cp -a` and then remove the source, "
            "or `mv`, in a command).",
        )
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise AgentError(
            WRONG_TYPE, f"{src.display} is a special file; it cannot be moved to another filesystem."
        )
    if overwrite:
        _check_replace(dst, st)
    tmp = f".callbox-move-{os.urandom(8).hex()}.tmp"
    try:
        if stat.S_ISLNK(st.st_mode):
            os.symlink(os.readlink(src.name, dir_fd=src.dir_fd), tmp, dir_fd=dst.dir_fd)
        else:
            _copy_file(src, dst.dir_fd, tmp)
        if overwrite:
            os.rename(tmp, dst.name, src_dir_fd=dst.dir_fd, dst_dir_fd=dst.dir_fd)
        else:
            os.link(tmp, dst.name, src_dir_fd=dst.dir_fd, dst_dir_fd=dst.dir_fd, follow_symlinks=False)
            os.unlink(tmp, dir_fd=dst.dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dst.dir_fd)
        raise
    os.unlink(src.name, dir_fd=src.dir_fd)


def _copy_file(src: Resolved, dir_fd: int, tmp: str) -> None:
    source = os.open(src.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src.dir_fd)
    try:
        st = os.fstat(source)
        if not stat.S_ISREG(st.st_mode):
            raise AgentError(WRONG_TYPE, f"{src.display} changed while being moved; try again.")
        target = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                         dir_fd=dir_fd)
        try:
            while piece := os.read(source, COPY_CHUNK):
                view = memoryview(piece)
                while view:
                    view = view[os.write(target, view) :]
            os.fchmod(target, stat.S_IMODE(st.st_mode) & ~_SETID)
            os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(target)
    finally:
        os.close(source)
