"""Container labels that make every sandbox findable and reapable.

A sandbox carries its id, its owner (host, pid and that process's start time, so a
recycled pid is not mistaken for the owner) and its expiry. ``is_orphaned`` and
``is_expired`` are pure, so gc decisions are unit-tested without a container.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

import psutil

MANAGED = "callbox.managed"
SANDBOX_ID = "callbox.sandbox-id"
OWNER = "callbox.owner"
EXPIRES = "callbox.expires"
CREATED = "callbox.created"
SOCKET_DIR = "callbox.socket-dir"
NAME = "callbox.name"
"""A named sandbox's name (its lifetime record, on the host, is what counts)."""
PRINCIPAL = "callbox.principal"
"""Who the sandbox belongs to, as the door that created it says (``user:1000``, ``grpc:client``)."""


@dataclass(frozen=True)
class Owner:
    host: str
    pid: int
    started: float

    def label(self) -> str:
        return f"{self.host}/{self.pid}/{self.started:.2f}"

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        parts = text.rsplit("/", 2)
        if len(parts) != 3:
            return None
        try:
            owner = cls(parts[0], int(parts[1]), float(parts[2]))
        except ValueError:
            return None
        return owner if owner.pid > 0 else None

    @classmethod
    def current(cls) -> Owner:
        return cls(socket.gethostname(), os.getpid(), psutil.Process().create_time())


def owner_alive(owner: Owner, this_host: str) -> bool | None:
    """True/False when it can be known here; None when the owner is on another host."""
    if owner.host != this_host:
        return None
    try:
        process = psutil.Process(owner.pid)
        return abs(process.create_time() - owner.started) < 0.05
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def is_expired(labels: dict[str, str], now: float) -> bool:
    try:
        return float(labels.get(EXPIRES, "0")) <= now
    except ValueError:
        return True


def is_orphaned(labels: dict[str, str], this_host: str) -> bool:
    owner = Owner.parse(labels.get(OWNER, ""))
    if owner is None:
        return True
    return owner_alive(owner, this_host) is False


def time_label(labels: dict[str, str], key: str) -> float:
    """A Unix-time label (``EXPIRES``, ``CREATED``) as a number; 0.0 when missing or unreadable."""
    try:
        return float(labels.get(key) or 0)
    except ValueError:
        return 0.0
