"""gc: removing what no longer has a reason to exist (``DockerEngine.gc``).

For each callbox container on the engine the decision comes from its labels, the keep
record of a paused run (:mod:`.kept`) and its lifetime record (:mod:`.lifetime`), through
:func:`harness.engine.docker.lifetime.judge`. Records are looked up in the run root the
container's socket directory lives in, so any engine of this user judges any of its
sandboxes alike; socket directories and records are only removed under this engine's own
run root. A lifetime record whose container is gone is judged too (a named sandbox stays
listed as ``gone`` until its expiry). Then stale socket directories, keep records, name
claims, and networks and egress proxies whose sandbox is gone.
"""

from __future__ import annotations

import logging
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors

from harness.core.errors import EngineUnavailable, short_reason
from harness.engine.docker import disk_pause, labels
from harness.engine.docker.client import remove_container
from harness.engine.docker.kept import (
    STALE_AFTER_S,
    UNREADABLE,
    expiry_passed,
    kept_path,
    record_for_container,
    remove_stale_records,
)
from harness.engine.docker.lifetime import (
    LifetimeRecord,
    all_records,
    judge,
    load_record,
    record_path,
    remove_record,
    remove_stale_claims,
)
from harness.engine.docker.networks import ROLE

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

log = logging.getLogger("callbox.engine")


def gc(engine: DockerEngine, now: float) -> list[str]:
    """Remove what is doomed; the ids of the sandboxes removed."""
    removed = []
    try:
        containers = engine.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot list sandboxes: {short_reason(exc)}") from None
    live_ids = set()
    listed = set()
    for c in containers:
        lab = c.get("Labels") or {}
        if ROLE in lab:
            continue  # egress proxies go with their sandbox (networks.gc below)
        sandbox_id = lab.get(labels.SANDBOX_ID, "")
        listed.add(sandbox_id)
        kept = record_for_container(lab)
        record, unreadable = record_for_gc(lab)
        if unreadable and lab.get(labels.NAME):
            live_ids.add(sandbox_id)  # another user's named sandbox: theirs to judge
            continue
        verdict = judge(
            state=c.get("State"), record=record, kept_until=None if kept is None else kept.until, now=now,
            label_expired=labels.is_expired(lab, now), orphaned=labels.is_orphaned(lab, engine.hostname),
            expiry_file_passed=expiry_passed(lab.get(labels.SOCKET_DIR), now),
        )
        if not verdict.remove:
            live_ids.add(sandbox_id)
            continue
        remove_container(engine.client, c["Id"])
        socket_dir = lab.get(labels.SOCKET_DIR) or ""
        if socket_dir and Path(socket_dir).parent == engine.run_root:
            shutil.rmtree(socket_dir, ignore_errors=True)
            disk_pause.remove_image(engine.run_root, sandbox_id)
            if kept is not None:
                kept_path(engine.run_root, sandbox_id).unlink(missing_ok=True)
            if verdict.drop_record:
                remove_record(engine.run_root, sandbox_id)
        log.debug("gc removed sandbox %s: %s", sandbox_id, verdict.why)
        removed.append(sandbox_id or c["Id"][:12])
    removed += gc_records(engine, listed, now)
    _remove_stale_socket_dirs(engine.run_root, live_ids)
    disk_pause.remove_stale_images(engine.run_root, live_ids)
    remove_stale_records(engine.run_root, live_ids)
    remove_stale_claims(engine.run_root, now)
    try:
        engine.networks.gc(live_ids, engine.hostname, now)
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot clean up sandbox networks: {short_reason(exc)}") from None
    return removed


def record_for_gc(lab: dict[str, str]) -> tuple[LifetimeRecord | None, bool]:
    """The lifetime record of the container with labels ``lab`` (in the run root its socket
    directory lives in), and whether one exists that cannot be read (another user's)."""
    sandbox_id, socket_dir = lab.get(labels.SANDBOX_ID, ""), lab.get(labels.SOCKET_DIR)
    if not sandbox_id or not socket_dir:
        return None, False
    try:
        return load_record(record_path(Path(socket_dir).parent, sandbox_id)), False
    except UNREADABLE as exc:
        report = log.debug if isinstance(exc, PermissionError) else log.warning
        report("cannot read the lifetime record of sandbox %s: %s", sandbox_id, exc)
        return None, True


def gc_records(engine: DockerEngine, listed: set[str], now: float) -> list[str]:
    """Judge the records of this run root whose container is not on the engine (``listed``:
    the ids that are): a named one stays (``gone``) until its expiry, others go. A young
    record is spared (its container may have started after the listing)."""
    removed = []
    for record in all_records(engine.run_root):
        if record.sandbox_id in listed or now - record.created_at <= STALE_AFTER_S:
            continue
        if judge(state=None, record=record, kept_until=None, now=now).drop_record:
            if Path(record.socket_dir).parent == engine.run_root:
                shutil.rmtree(record.socket_dir, ignore_errors=True)
                disk_pause.remove_image(engine.run_root, record.sandbox_id)
            remove_record(engine.run_root, record.sandbox_id)
            removed.append(record.sandbox_id)
    return removed


def _remove_stale_socket_dirs(run_root: Path, live_ids: set[str]) -> None:
    if not run_root.is_dir():
        return
    for entry in run_root.iterdir():
        if entry.is_dir() and entry.name not in live_ids and len(entry.name) == 12:
            age = time.time() - entry.stat().st_mtime
            if age > STALE_AFTER_S:  # never race a sandbox being created right now
                shutil.rmtree(entry, ignore_errors=True)
