"""Who holds a call's claim, and when that process is provably gone.

A call is claimed by one harness process and stays ``claimed`` or ``running`` until that
process records its result. When the process stops first (SIGKILL, the OOM killer, a crash,
a reboot), nothing is recorded, so the next process that sends the same call_id must tell
for itself whether the owner is gone for good. Besides the owner label (``host/pid/start``,
:class:`harness.engine.docker.labels.Owner`) the claim records:

* the owner's **pid** and its **start time** (``psutil``'s ``create_time``, seconds since
  the epoch): a pid that is in use again by a process that started at another time is not
  the owner;
* the machine's **boot id** (``/proc/sys/kernel/random/boot_id``, new at every boot): after a
  reboot no process of the last boot is alive, whatever pid it had;
* the owner's **pid namespace** (``/proc/self/ns/pid``): two containers on one kernel share
  the boot id but not their pids, so a pid is only looked up in the namespace it belongs to.

The rule (:func:`owner_gone`) answers True only when the owner is gone for certain:

* same host name, same boot id, same pid namespace: the pid does not exist, is a zombie, or
  belongs to a process that started at another time;
* same host name, another boot id: the machine rebooted.

Anything else counts as possibly alive and is waited for as before: another host (a
database shared over the network), another pid namespace on this kernel (another
container), a process whose start time cannot be read (``hidepid``), and a record made
before these columns existed whose label does not prove it (the label rule of
:func:`harness.engine.docker.labels.owner_alive` decides those).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from harness.engine.docker.labels import Owner

__all__ = ["BOOT_ID_PATH", "ClaimOwner", "ProcessFacts", "boot_id", "owner_gone", "probe", "this_process"]

BOOT_ID_PATH = Path("/proc/sys/kernel/random/boot_id")
_PID_NS_PATH = "/proc/self/ns/pid"
START_TOLERANCE_S = 0.05
"""Start times closer than this are the same process (they are kept to 1/100 s)."""


def boot_id() -> str | None:
    """This machine's boot id; None where the kernel does not say (not Linux)."""
    try:
        return BOOT_ID_PATH.read_text().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink(_PID_NS_PATH)
    except OSError:
        return None


@dataclass(frozen=True)
class ClaimOwner:
    """The process holding a claim, as the store records it."""

    label: str
    """``host/pid/start``: the ``owner`` column."""
    host: str
    pid: int
    started: float
    boot_id: str | None = None
    """None: a record made before the column existed, or a system without one."""
    pid_ns: str | None = None

    @classmethod
    def from_columns(cls, label: str, pid: int | None, boot: str | None, started: float | None,
                     pid_ns: str | None) -> ClaimOwner | None:
        """The owner of a stored claim: its columns, or for an older record only its label
        (None when even that cannot be read)."""
        parsed = Owner.parse(label or "")
        if parsed is None:
            return None
        if pid is None or started is None or pid <= 0:
            return cls(label, parsed.host, parsed.pid, parsed.started)
        return cls(label, parsed.host, int(pid), float(started), boot, pid_ns)

    def columns(self) -> tuple[str, int, str | None, float, str | None]:
        """``owner, owner_pid, owner_boot_id, owner_started, owner_pid_ns``."""
        return self.label, self.pid, self.boot_id, self.started, self.pid_ns


_this: list[ClaimOwner] = []
"""This process as a claim's owner, once made."""


def this_process() -> ClaimOwner:
    """The calling process as a claim's owner (made once per process; a forked child makes
    its own)."""
    if not _this or _this[0].pid != os.getpid():
        started = psutil.Process().create_time()
        label = Owner(socket.gethostname(), os.getpid(), started)
        _this[:] = [ClaimOwner(label.label(), label.host, label.pid, started, boot_id(), _pid_namespace())]
    return _this[0]


@dataclass(frozen=True)
class ProcessFacts:
    """What this machine says of a pid."""

    exists: bool
    started: float | None = None
    """Its start time; None when it cannot be read."""
    zombie: bool = False


def probe(pid: int) -> ProcessFacts:
    """Look up ``pid`` here: ``kill(pid, 0)`` says whether it exists (also for another user's
    process hidden from ``/proc``), ``psutil`` when it started."""
    if pid <= 0:
        return ProcessFacts(exists=True)  # never a process of its own: cannot be judged
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return ProcessFacts(exists=False)
    except OSError:  # EPERM: it exists, owned by someone else
        pass
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        with process.oneshot():
            return ProcessFacts(True, process.create_time(), process.status() == psutil.STATUS_ZOMBIE)
    return ProcessFacts(exists=True)


def _pid_gone(facts: ProcessFacts, started: float) -> bool:
    if not facts.exists or facts.zombie:
        return True
    return facts.started is not None and abs(facts.started - started) >= START_TOLERANCE_S


def owner_gone(owner: ClaimOwner, here: ClaimOwner | None = None,
               look: Callable[[int], ProcessFacts] = probe) -> bool:
    """Whether ``owner`` is provably gone, judged from ``here`` (default: this process), with
    ``look`` to look a pid up on this machine (see the module docstring)."""
    here = here if here is not None else this_process()
    if owner.host != here.host:
        return False
    if owner.boot_id is not None and here.boot_id is not None:
        if owner.boot_id != here.boot_id:
            return True
        if owner.pid_ns != here.pid_ns:
            return False
    elif owner.pid_ns is not None and owner.pid_ns != here.pid_ns:
        return False
    if owner.label == here.label:
        return False  # this very process
    return _pid_gone(look(owner.pid), owner.started)
