"""Per-thread filesystem identity: do file operations as the unprivileged tool user.

In the container the agent runs as root with only CAP_SETUID, CAP_SETGID and CAP_KILL. It has
no CAP_DAC_OVERRIDE or CAP_CHOWN, so it could neither bypass permissions nor give files it
creates to the tool user afterwards. Instead each file RPC runs, on its serving thread, with the
filesystem uid/gid switched to the tool user's: the kernel then checks permissions as that user
and new files are owned by it.

Linux keeps the filesystem ids (fsuid/fsgid) per thread, and glibc's ``setfsuid``/``setfsgid``
are plain syscall wrappers (unlike ``setuid``, glibc does not broadcast them to every thread),
so switching on one gRPC worker thread does not affect the others; ``tests/unit/test_fs.py``
checks this through ``/proc/thread-self/status``. The calls cannot report errors: they return
the previous value whether or not the change happened, so :meth:`FsIdentity.acting` confirms
each switch by calling again with ``-1`` (an invalid id, which changes nothing and returns the
current value) and raises :class:`IdentityError` if the switch did not take effect.

gVisor has no ``setfsuid``/``setfsgid`` (ENOSYS). There the effective ids stand in for them:
the kernel checks file access against the fsuid, which follows the effective uid, and
``setresuid``/``setresgid`` made as raw system calls (not through glibc, which would
broadcast them) change only the calling thread. Only the effective id changes; the real and
saved ids stay 0, so the thread can take root back, and a tool process (which may signal
only processes whose real or saved uid is its own) cannot signal the agent meanwhile.

Supplementary groups are not per-thread and setfsgid does not touch them; the agent should
call :func:`drop_supplementary_groups` once at start-up (before serving) so that root's
groups do not leak into permission checks made as the tool user.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext

_INVALID_ID = 0xFFFFFFFF  # (uid_t)-1: rejected by the kernel, so the call only reports the current id
_MAX_ID = _INVALID_ID - 1


class IdentityError(RuntimeError):
    """The filesystem identity could not be switched or restored."""


def _load() -> tuple[Callable[[int], int], Callable[[int], int]]:
    libc = ctypes.CDLL(None, use_errno=True)
    setfsuid = libc.setfsuid
    setfsgid = libc.setfsgid
    for fn in (setfsuid, setfsgid):
        fn.argtypes = [ctypes.c_uint32]
        fn.restype = ctypes.c_int
    return setfsuid, setfsgid


_SYSCALLS = {"x86_64": (117, 119), "aarch64": (147, 149)}
"""(setresuid, setresgid) system call numbers by machine."""


def _effective_id_setters() -> tuple[Callable[[int], int], Callable[[int], int]]:
    """``setfsuid``/``setfsgid``'s contract (return the previous id; -1 only asks) on the
    calling thread's effective ids, for kernels without filesystem-id calls."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    numbers = _SYSCALLS.get(os.uname().machine)
    if numbers is None:
        raise IdentityError(f"no filesystem-id calls, and no known setresuid number on {os.uname().machine}")
    keep = ctypes.c_long(-1)

    def setter(number: int, current: Callable[[], int]) -> Callable[[int], int]:
        def switch(value: int) -> int:
            previous = current()
            if value != _INVALID_ID:
                libc.syscall(ctypes.c_long(number), keep, ctypes.c_long(value), keep)
            return previous
        return switch

    return setter(numbers[0], os.geteuid), setter(numbers[1], os.getegid)


def _fs_id_calls_missing(setfsuid: Callable[[int], int]) -> bool:
    ctypes.set_errno(0)
    return setfsuid(_INVALID_ID) == -1 and ctypes.get_errno() == 38  # ENOSYS


_setfsuid, _setfsgid = _load()
if _fs_id_calls_missing(_setfsuid):
    _setfsuid, _setfsgid = _effective_id_setters()


def current_fsuid() -> int:
    """The calling thread's filesystem uid."""
    return _setfsuid(_INVALID_ID)


def current_fsgid() -> int:
    """The calling thread's filesystem gid."""
    return _setfsgid(_INVALID_ID)


def _switch(setter: Callable[[int], int], value: int, what: str) -> int:
    """Set one filesystem id on this thread, verify it, and return the previous value."""
    previous = setter(value)
    now = setter(_INVALID_ID)
    if now != value:
        raise IdentityError(f"could not set the filesystem {what} to {value} (it is still {now})")
    return previous


def drop_supplementary_groups() -> None:
    """Clear the process's supplementary groups (needs CAP_SETGID; all threads)."""
    os.setgroups([])


class FsIdentity:
    """The uid/gid file operations run as; see :meth:`acting`."""

    def __init__(self, uid: int, gid: int) -> None:
        for name, value in (("uid", uid), ("gid", gid)):
            if not 0 <= value <= _MAX_ID:
                raise ValueError(f"{name} {value} is out of range")
        self.uid = uid
        self.gid = gid
        self._local = threading.local()

    def __repr__(self) -> str:
        return f"FsIdentity(uid={self.uid}, gid={self.gid})"

    @contextmanager
    def acting(self) -> Iterator[None]:
        """Run the block with this thread's fsuid/fsgid set to this identity, then restore.

        The gid is switched first and restored last, while the thread still has its original
        fsuid. Re-entering on the same thread is a no-op.
        """
        if getattr(self._local, "depth", 0):
            self._local.depth += 1
            try:
                yield
            finally:
                self._local.depth -= 1
            return
        old_gid = _switch(_setfsgid, self.gid, "gid")
        try:
            old_uid = _switch(_setfsuid, self.uid, "uid")
        except BaseException:
            _switch(_setfsgid, old_gid, "gid")
            raise
        self._local.depth = 1
        try:
            yield
        finally:
            self._local.depth = 0
            try:
                _switch(_setfsuid, old_uid, "uid")
            finally:
                _switch(_setfsgid, old_gid, "gid")


def acting_as(identity: FsIdentity | None) -> AbstractContextManager[None]:
    """``identity.acting()``, or nothing at all without an identity (the agent's own ids stay)."""
    return identity.acting() if identity is not None else nullcontext()
