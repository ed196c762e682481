"""Find and kill every process that belongs to one command, however it detached.

Each command starts with a unique *marker* supplementary group. Tool processes have
no CAP_SETGID, so neither they nor their descendants can drop it: a child that calls
``setsid``, double-forks, or reparents to init still carries it. ``/proc/PID/status``
is world-readable, so the agent finds the whole tree by scanning for the marker.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator

PROC = "/proc"
LOADAVG = "/proc/loadavg"
PID_MAX = "/proc/sys/kernel/pid_max"
TASK_CREATION_FLOOR_NS = 1000
"""No machine creates tasks faster than one per this many nanoseconds per CPU (a fork or
a thread costs several microseconds): bounds how soon the pids can wrap round."""
# Far above any uid/gid a distribution allocates; never owns a file.
MARKER_BASE = 3_000_000_000
MARKER_SPAN = 1_000_000


def random_below(n: int) -> int:
    """A uniformly random integer in [0, n) from the kernel's CSPRNG, as ``secrets.randbelow``
    gives, without importing secrets (and with it random, hashlib and hmac) at start-up."""
    bits = n.bit_length()
    while True:
        value = int.from_bytes(os.urandom((bits + 7) // 8), "big") >> (-bits % 8)
        if value < n:
            return value


class MarkerAllocator:
    """Hands out marker gids, unique among the agent's live commands."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # A random start keeps two agents that can see each other's processes (say, one
        # in a test on the host and one in a container) from sharing markers.
        self._counter = itertools.count(random_below(MARKER_SPAN))
        self._live: set[int] = set()

    def acquire(self) -> int:
        with self._lock:
            while True:
                gid = MARKER_BASE + next(self._counter) % MARKER_SPAN
                if gid not in self._live:
                    self._live.add(gid)
                    return gid

    def release(self, gid: int) -> None:
        with self._lock:
            self._live.discard(gid)


def _status_fields(pid: str) -> tuple[str, list[int]] | None:
    """Return (state letter, supplementary groups) of a process, or None if it is gone."""
    try:
        with open(f"{PROC}/{pid}/status", "rb") as f:
            data = f.read()
    except OSError:
        return None
    # Two fields of some fifty: found directly, since every command's end scans every process.
    at = data.find(b"\nState:")
    state = data[at + 7:at + 9].strip()[:1].decode("ascii", "replace") if at >= 0 else ""
    at = data.find(b"\nGroups:")
    if at < 0:
        return state, []
    end = data.find(b"\n", at + 1)
    return state, [int(g) for g in data[at + 8:end if end >= 0 else None].split() if g.isdigit()]


def marked_pids(marker: int) -> Iterator[int]:
    """Yield the live (non-zombie) processes carrying the marker group."""
    try:
        entries = os.listdir(PROC)
    except OSError:
        return
    own = str(os.getpid())  # the agent never carries a marker
    for entry in entries:
        if not entry.isdigit() or entry == own:
            continue
        fields = _status_fields(entry)
        if fields is None:
            continue
        state, groups = fields
        if state != "Z" and marker in groups:
            yield int(entry)


def signal_marked(marker: int, signum: int) -> int:
    """Send a signal to every live process carrying the marker; return how many got it."""
    delivered = 0
    for pid in marked_pids(marker):
        try:
            os.kill(pid, signum)
            delivered += 1
        except ProcessLookupError:
            continue
    return delivered


def last_pid() -> int:
    """The pid (or thread id) the kernel allocated last in this pid namespace, from
    ``/proc/loadavg``; 0 when it does not say (gVisor writes 0 there).

    Every process and thread is allocated a pid in every pid namespace above its own, so
    while this number stays the same no task was created in the container, whatever
    namespaces the task made for itself. The file is opened once and read with ``pread``
    at offset 0, which the kernel renders afresh.
    """
    fd = _loadavg_fd(LOADAVG)
    if fd is None:
        return 0
    try:
        data = os.pread(fd, 128, 0)
    except OSError:
        return 0
    last = data.rsplit(maxsplit=1)[-1:]
    return int(last[0]) if last and last[0].isdigit() else 0


_open_lock = threading.Lock()
_loadavg_fds: dict[str, int | None] = {}


def _loadavg_fd(path: str) -> int | None:
    with _open_lock:
        if path not in _loadavg_fds:
            try:
                _loadavg_fds[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                _loadavg_fds[path] = None
        return _loadavg_fds[path]


def wrap_window() -> float:
    """Seconds in which the pids of this namespace cannot wrap round: ``pid_max`` creations
    at a rate (one per microsecond per CPU) no machine reaches; 0.0 when ``pid_max`` is
    unknown."""
    try:
        with open(PID_MAX) as f:
            pid_max = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0.0
    return pid_max * TASK_CREATION_FLOOR_NS / 1e9 / (os.cpu_count() or 1)


def no_task_since(pid: int, started: float, window: float) -> bool:
    """Whether no process or thread was created in the container since ``pid`` was (a
    command's leader, started at ``time.monotonic()`` ``started`` or later): then none of
    the command's processes can be left, and the leader's exit needs no sweep.

    ``last_pid`` still being ``pid`` could also mean the pids wrapped round to it; so this
    holds only within ``window`` seconds (``wrap_window``) of ``started``.
    """
    return pid > 0 and last_pid() == pid and time.monotonic() - started < window


def kill_marked(marker: int, max_rounds: int = 200) -> int:
    """SIGKILL every marked process until a scan finds none; return processes killed.

    A fork bomb may fork between scans, so the scan repeats; processes already killed
    cannot fork, so the set shrinks every round and the pids limit bounds it. A process
    forked during a scan by a parent that exits before the scan reads it can be missed
    once, so it takes two empty scans in a row to stop, unless no task at all was
    created in the container while the empty scan ran (``last_pid`` unchanged: a wrap of
    the pids within one scan is out of reach).
    """
    killed = 0
    empty = 0
    for _ in range(max_rounds):
        before = last_pid()
        pids = list(marked_pids(marker))
        if not pids:
            empty += 1
            if empty == 2 or (before != 0 and last_pid() == before):
                return killed
            continue
        empty = 0
        for pid in pids:
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:
                continue
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                continue
    return killed
