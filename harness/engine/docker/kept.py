"""Kept sandboxes: the host-side records that let a sandbox outlive its process (a paused
run) and be attached again later, and the expiry file its agent obeys.

Docker cannot change a container's labels after creation, so keeping a sandbox writes a
small record ``<run root>/kept/<sandbox id>.json`` on the host (next to the per-sandbox
socket directories, never inside one: those are mounted into the container). The record
names the owner ``run:<run_id>``, the time it is kept until, and what attaching needs to
reconnect (container id, socket directory, spec, tool uid/gid). gc consults it (see
:meth:`harness.engine.docker.engine.DockerEngine.gc`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.errors import CallboxError, ErrorCode
from harness.core.times import stamp
from harness.engine.base import run_owner
from harness.engine.docker import labels

log = logging.getLogger("callbox.engine")

KEPT_DIR = "kept"
"""Under the run root: one ``<sandbox id>.json`` record per kept sandbox."""
UNREADABLE = (OSError, ValueError, KeyError, TypeError)
"""What reading a record that exists can raise: not ours to read, or not a record."""
STALE_AFTER_S = 60.0
"""A record or socket directory younger than this is never stale: its sandbox may be starting."""


class SandboxExpired(CallboxError):
    """A kept sandbox cannot be attached: it expired or its container is gone."""

    code = ErrorCode.SANDBOX_GONE

    def __init__(self, message: str, *, sandbox_id: str, expired_at: float | None) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.expired_at = expired_at
        """When it expired (or was due to expire), if known."""


@dataclass(frozen=True)
class KeptSandbox:
    """The record ``DockerEngine.keep`` writes: a sandbox that outlives its process."""

    sandbox_id: str
    run_id: str
    until: float
    """Unix time after which gc removes it."""
    container_id: str
    socket_dir: str
    spec: dict[str, Any]
    """The SandboxSpec it was created with (``model_dump(mode="json")``)."""
    tool_uid: int
    tool_gid: int
    kept_at: float

    @property
    def owner(self) -> str:
        return run_owner(self.run_id)

    def to_json(self) -> str:
        return json.dumps({
            "sandbox_id": self.sandbox_id, "owner": self.owner, "run_id": self.run_id, "until": self.until,
            "container_id": self.container_id, "socket_dir": self.socket_dir, "spec": self.spec,
            "tool_uid": self.tool_uid, "tool_gid": self.tool_gid, "kept_at": self.kept_at,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeptSandbox:
        data = json.loads(text)
        return cls(
            sandbox_id=str(data["sandbox_id"]), run_id=str(data["run_id"]), until=float(data["until"]),
            container_id=str(data["container_id"]), socket_dir=str(data["socket_dir"]), spec=dict(data["spec"]),
            tool_uid=int(data["tool_uid"]), tool_gid=int(data["tool_gid"]), kept_at=float(data["kept_at"]),
        )


def kept_path(run_root: Path, sandbox_id: str) -> Path:
    return run_root / KEPT_DIR / f"{sandbox_id}.json"


def _load(path: Path) -> KeptSandbox | None:
    """The record at ``path``, None if there is none; :data:`UNREADABLE` errors pass through."""
    try:
        return KeptSandbox.from_json(path.read_text())
    except FileNotFoundError:
        return None


def read_record(run_root: Path, sandbox_id: str) -> KeptSandbox | None:
    """The keep record of ``sandbox_id`` under ``run_root``, if any (an unreadable one is logged
    and counts as none)."""
    try:
        return _load(kept_path(run_root, sandbox_id))
    except UNREADABLE as exc:
        log.warning("ignoring unreadable keep record of sandbox %s: %s", sandbox_id, exc)
        return None


def kept_sandbox_of_run(run_root: Path, run_id: str) -> str | None:
    """The sandbox kept for run ``run_id`` under ``run_root`` (the latest kept), if any."""
    found: list[KeptSandbox] = []
    with contextlib.suppress(FileNotFoundError):
        for entry in (run_root / KEPT_DIR).glob("*.json"):
            try:
                record = _load(entry)
            except UNREADABLE:
                continue  # not ours to read, or not a record: gc and ``ls`` say so
            if record is not None and record.run_id == run_id:
                found.append(record)
    return max(found, key=lambda r: r.kept_at).sandbox_id if found else None


def record_for_container(lab: dict[str, str]) -> KeptSandbox | None:
    """The keep record of the container with labels ``lab`` (looked up in the run root its
    socket directory lives in). An unreadable record counts as kept until the label
    expiry: gc must not reap as an orphan what it cannot tell is kept."""
    sandbox_id = lab.get(labels.SANDBOX_ID, "")
    socket_dir = lab.get(labels.SOCKET_DIR)
    if not sandbox_id or not socket_dir:
        return None
    path = kept_path(Path(socket_dir).parent, sandbox_id)
    try:
        return _load(path)
    except UNREADABLE as exc:
        # Another user's run root is not readable by design (0700): its sandboxes are
        # that user's to judge, so say nothing. A record we should read but cannot is news.
        report = log.debug if isinstance(exc, PermissionError) else log.warning
        report("cannot read the keep record %s (%s); treating the sandbox as kept until its expiry", path, exc)
        return KeptSandbox(
            sandbox_id=sandbox_id, run_id="?", until=labels.time_label(lab, labels.EXPIRES), container_id="",
            socket_dir=socket_dir, spec={}, tool_uid=-1, tool_gid=-1, kept_at=0.0,
        )


def write_record(run_root: Path, record: KeptSandbox) -> None:
    """Write (or replace) ``record``, atomically: gc never reads half a record."""
    path = kept_path(run_root, record.sandbox_id)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(record.to_json())
    os.replace(temporary, path)


def remove_stale_records(run_root: Path, live_ids: set[str]) -> None:
    """Remove the records of sandboxes that are no longer there."""
    directory = run_root / KEPT_DIR
    if not directory.is_dir():
        return
    for entry in directory.glob("*.json"):
        if entry.stem not in live_ids and time.time() - entry.stat().st_mtime > STALE_AFTER_S:
            entry.unlink(missing_ok=True)


def write_expiry(socket_dir: Path, expires: float) -> None:
    """Tell the sandbox's agent when to stop on its own (read from its socket directory)."""
    temporary = socket_dir / ".expires.tmp"
    temporary.write_text(f"{expires:.0f}\n")
    os.replace(temporary, socket_dir / "expires")


def expiry_passed(socket_dir: str | None, now: float) -> bool:
    """Whether the expiry file the agent obeys (see ``write_expiry``) has passed."""
    if not socket_dir:
        return False
    try:
        return float((Path(socket_dir) / "expires").read_text().strip()) <= now
    except (OSError, ValueError):
        return False


def when(moment: float) -> str:
    """A Unix time as people read it, with its zone (``2025-01-02 03:04:05 UTC``)."""
    return stamp(moment)
