"""Snapshots of the gRPC door's clients: names per client, what a fork of one gets.

Snapshots live in the engine's snapshot store (this machine's, or a Ray cluster's nodes'),
shared by everyone using it; a client's
snapshot named ``NAME`` is stored as ``grpc.<8 hex digits of the client's name hash>.NAME``
with owner ``grpc:CLIENT``, so two clients may use the same name and neither sees (or
replaces, or deletes) the other's: anyone else's is NOT_FOUND. A client's names are 1 to 49
of ``[a-z0-9_.-]``, starting with a letter or a digit.

With a snapshot the door keeps a small note of its own (:data:`SIDECAR`): the sandbox id
(run) it was taken from and what the client asked of that sandbox (its
:class:`~harness.doors.grpc.overrides.SandboxOverrides`). A fork of the snapshot gets the
server's policy tightened by those overrides, checked again now (a server whose policy got
tighter since refuses the fork naming the field). A snapshot without the note (taken by
another door) gets the overrides its stored spec implies: its resources, network, mounts
and environment, and every tool the server exposes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import re
from typing import Any

from harness.core.errors import CallboxError
from harness.doors.grpc.errors import invalid, not_found
from harness.doors.grpc.overrides import MountRequest, SandboxOverrides
from harness.engine.base import SnapshotKeeper
from harness.engine.docker.snapshots import PROXY_ENV, SnapshotInfo
from harness.engine.spec import SandboxSpec
from harness.v1 import sandboxes_pb2

__all__ = ["SIDECAR", "ClientSnapshots", "overrides_from_spec"]

log = logging.getLogger("callbox.executor")

SIDECAR = "grpc-door.json"
"""The door's note kept with a snapshot (the source sandbox id and the overrides)."""
_NAME = re.compile(r"[a-z0-9][a-z0-9_.-]{0,48}")


def _prefix(client: str) -> str:
    return f"grpc.{hashlib.sha256(client.encode()).hexdigest()[:8]}."


def owner(client: str) -> str:
    return f"grpc:{client}"


class ClientSnapshots:
    """One client's view of the engine's snapshot store."""

    def __init__(self, engine: SnapshotKeeper, client: str) -> None:
        self.engine = engine
        self.client = client
        self._prefix = _prefix(client)

    def stored_name(self, name: str) -> str:
        """The store's name of the client's snapshot ``name`` (INVALID_ARGUMENT for a bad name)."""
        if not _NAME.fullmatch(name):
            raise invalid(f"snapshot name {name!r} is not valid: use 1 to 49 lowercase letters, digits, '_', '.' "
                          "or '-', starting with a letter or a digit")
        return self._prefix + name

    def mine(self, info: SnapshotInfo) -> bool:
        return info.name.startswith(self._prefix) and info.owner == owner(self.client)

    def get(self, name: str) -> SnapshotInfo:
        """The client's snapshot ``name``; NOT_FOUND if it has none of that name."""
        stored = self.stored_name(name)
        found = next((info for info in self.engine.snapshots() if info.name == stored), None)
        if found is None or not self.mine(found):
            raise not_found("snapshot", name)
        return found

    def list(self) -> list[SnapshotInfo]:
        """The client's snapshots, oldest first."""
        return [info for info in self.engine.snapshots() if self.mine(info)]

    def shown_name(self, info: SnapshotInfo) -> str:
        return info.name.removeprefix(self._prefix)

    def message(self, info: SnapshotInfo) -> sandboxes_pb2.SnapshotInfo:
        source, _ = read_sidecar(self.engine, info)
        return sandboxes_pb2.SnapshotInfo(
            name=self.shown_name(info), source_sandbox_id=source, created_unix=info.created_at, bytes=info.bytes,
            captured=info.captured, not_captured=list(info.not_captured),
        )


def write_sidecar(engine: SnapshotKeeper, info: SnapshotInfo, sandbox_id: str, overrides: SandboxOverrides) -> None:
    """Record the source sandbox and its overrides with the snapshot (atomically)."""
    data = {"source_sandbox_id": sandbox_id, "overrides": dataclasses.asdict(overrides)}
    try:
        engine.write_snapshot_note(info.name, SIDECAR, json.dumps(data, sort_keys=True).encode())
    except (OSError, CallboxError) as exc:
        # The snapshot itself is complete; its forks then get what its spec implies.
        log.warning("cannot record the door's notes of snapshot %s: %s", info.name, exc)


def read_sidecar(engine: SnapshotKeeper, info: SnapshotInfo) -> tuple[str, SandboxOverrides | None]:
    """The source sandbox id ("" if unknown) and the overrides (None if unknown) of a snapshot."""
    try:
        note = engine.snapshot_note(info.name, SIDECAR)
        if note is None:
            return "", None
        data = json.loads(note)
        return str(data.get("source_sandbox_id", "")), _overrides(data["overrides"])
    except (OSError, CallboxError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the unreadable door notes of snapshot %s: %s", info.name, exc)
        return "", None


def _overrides(data: dict[str, Any]) -> SandboxOverrides:
    return SandboxOverrides(
        memory_bytes=data.get("memory_bytes"), cpus=data.get("cpus"), pids=data.get("pids"),
        network=data.get("network"),
        mounts=tuple(MountRequest(str(m["source"]), str(m["target"]), bool(m["read_write"]))
                     for m in data.get("mounts", ())),
        env={str(k): str(v) for k, v in dict(data.get("env", {})).items()},
        ttl_seconds=data.get("ttl_seconds"), allowed_tools=tuple(str(t) for t in data.get("allowed_tools", ())),
    )


def overrides_from_spec(spec: SandboxSpec, server: SandboxSpec) -> SandboxOverrides:
    """What a sandbox running ``spec`` asked of a server whose policy gives ``server``: each
    field that differs (mounts and environment entries the server's spec does not have)."""
    def differs(name: str) -> Any:
        value = getattr(spec, name)
        return None if value == getattr(server, name) else value

    mine = {(m.target, str(m.source), m.read_only) for m in server.mounts}
    mounts = tuple(MountRequest(str(m.source), m.target, not m.read_only) for m in spec.mounts
                   if (m.target, str(m.source), m.read_only) not in mine)
    env = {k: v for k, v in spec.env.items() if k not in PROXY_ENV and server.env.get(k) != v}
    return SandboxOverrides(
        memory_bytes=differs("memory"), cpus=differs("cpus"), pids=differs("pids"),
        network=None if spec.network == server.network else spec.network, mounts=mounts, env=env,
        ttl_seconds=differs("ttl_seconds"),
    )
