"""The container's memory cgroup counters, read to tell an OOM kill from any other SIGKILL.

cgroup v1 exposes ``oom_kill N`` in ``memory.oom_control``; cgroup v2 in
``memory.events``. Docker mounts the container's own cgroup at /sys/fs/cgroup.

Every command reads the counter as it starts, so the file is opened once and read with
``pread`` at offset 0 (the kernel renders it afresh for each read from the start): a
few microseconds, where opening it as a text file for each read took tens.
"""

from __future__ import annotations

import os
import threading

_CANDIDATES = (
    "/sys/fs/cgroup/memory/memory.oom_control",  # v1
    "/sys/fs/cgroup/memory.events",  # v2
)
_READ_SIZE = 4096
_KEY = b"oom_kill "

_lock = threading.Lock()
_open: dict[tuple[str, ...], int | None] = {}


def _counter_fd(candidates: tuple[str, ...]) -> int | None:
    """The descriptor of the first readable counter file among ``candidates``, opened once."""
    with _lock:
        if candidates in _open:
            return _open[candidates]
        fd: int | None = None
        for path in candidates:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue
            if _parse(_pread(fd)) is not None:
                break
            os.close(fd)
            fd = None
        _open[candidates] = fd
        return fd


def _pread(fd: int) -> bytes:
    try:
        return os.pread(fd, _READ_SIZE, 0)
    except OSError:
        return b""


def _parse(data: bytes) -> int | None:
    at = data.find(_KEY)
    while at > 0 and data[at - 1:at] != b"\n":
        at = data.find(_KEY, at + 1)
    if at < 0:
        return None
    end = data.find(b"\n", at)
    value = data[at + len(_KEY):end if end >= 0 else None].strip()
    return int(value) if value.isdigit() else None


def oom_kill_count(candidates: tuple[str, ...] = _CANDIDATES) -> int | None:
    """Return the cgroup's OOM-kill counter, or None when no counter is readable."""
    fd = _counter_fd(candidates)
    if fd is None:
        return None
    return _parse(_pread(fd))
