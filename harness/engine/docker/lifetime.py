"""Living sandboxes on the host: names, time-to-live, the pause clock, and what gc decides.

A sandbox created with a name, an owner string or a TTL (``DockerEngine.create(spec, name=,
ttl_s=, owner=)``), and any sandbox that was paused or kept alive, has a *lifetime record*
``<run root>/lifetime/<sandbox id>.json`` on the host: its name, owner, creation time, TTL,
expiry, pause state, and what reconnecting needs (container, socket directory, spec, tool
uid/gid). Records sit next to the per-sandbox socket directories (never inside one: those
are mounted into the container), like the keep records of paused runs (:mod:`.kept`).

Names. A name (``[a-z0-9][a-z0-9_.-]{0,62}``) is claimed before the container exists by
creating ``<run root>/names/<name>`` (holding the sandbox id) exclusively, so two processes
never both get it. A name stays taken while its record exists, also when the container is
gone (the Docker engine restarted): ``callbox sandbox rm NAME`` or the record's expiry
frees it.

The clock. A record's ``expires`` is when gc removes the sandbox (and when its agent stops
on its own: the engine writes the same time to the agent's expiry file). While the sandbox
is paused (``docker pause``, the cgroup freezer) the clock stands still: the record keeps
``paused_at`` and the time that was left (``paused_remaining_s``); resuming sets the expiry
to now plus that time, so the expiry moves later by exactly the time spent paused. A pause
to disk (gVisor) stops the container instead of freezing it; its record says so
(``paused_to_disk``) and the stopped container is judged as a paused one. gc never reaps a
paused sandbox for its expiry, but a pause has a hard limit: a sandbox paused for longer
than its spec's ``paused_ttl_seconds`` (the policy's ``sandbox.paused_ttl_seconds``, 24 h by
default) is removed.

What gc does with a sandbox (``judge``, pure so it is unit-tested without a container):

* no record: as before (label expiry, expiry file, owner process gone, container stopped);
  a keep record of a paused run: only its ``until`` counts;
* a named sandbox never dies with the process that created it; it is removed at its expiry.
  If its container stops or disappears before that, the container and socket directory go
  but the record stays, so ``list`` shows the sandbox as ``gone`` (its files can come back
  from a snapshot) until the expiry passes;
* an unnamed sandbox with a record: removed (record and all) at its expiry, when its
  container stops, or when the process that created it is gone and no run keeps it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import math
import os
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from harness.core.errors import CallboxError, ErrorCode, UsageError
from harness.engine.base import owner_run, run_owner
from harness.engine.docker.kept import STALE_AFTER_S, UNREADABLE, SandboxExpired, kept_sandbox_of_run

log = logging.getLogger("callbox.engine")

LIFETIME_DIR = "lifetime"
"""Under the run root: one ``<sandbox id>.json`` record per living sandbox."""
NAMES_DIR = "names"
"""Under the run root: one file per claimed name, holding the sandbox id."""
NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_.-]{0,62}")
MIN_TTL_S = 10.0
"""The shortest time-to-live (the spec's ``ttl_seconds`` has the same floor)."""
PAUSE_LIMIT_FACTOR = 24
"""A sandbox whose record has no ``paused_ttl_seconds`` (written before specs had it) is removed
by gc once paused for more than this many times its TTL."""
STOPPED = ("exited", "dead")
"""Container states whose agent is gone for good."""


class NameInUse(CallboxError):
    """A live (or gone but still recorded) sandbox already has this name."""

    code = ErrorCode.ALREADY_EXISTS

    def __init__(self, name: str, sandbox_id: str) -> None:
        super().__init__(
            f"a sandbox named {name} already exists (sandbox {sandbox_id}); use it, remove it with "
            f"`callbox sandbox rm {name}`, or pick another name")
        self.name = name
        self.sandbox_id = sandbox_id


class SandboxNotFound(CallboxError):
    """No sandbox (live, kept or recorded) has this name or id."""

    code = ErrorCode.NOT_FOUND

    def __init__(self, name_or_id: str) -> None:
        super().__init__(f"no sandbox named {name_or_id} (nor with that id); `callbox sandbox ls` lists them")
        self.name_or_id = name_or_id


class SandboxPaused(CallboxError):
    """The sandbox is paused: its agent cannot answer until it is resumed."""

    code = ErrorCode.PAUSED

    def __init__(self, name_or_id: str) -> None:
        super().__init__(f"sandbox {name_or_id} is paused; resume it with `callbox sandbox resume {name_or_id}`")
        self.name_or_id = name_or_id


class SandboxGone(SandboxExpired):
    """A recorded sandbox whose container no longer runs (the engine restarted, or it was
    removed): its name is still taken, its files are gone unless a snapshot has them."""


def validate_name(name: str, what: str = "sandbox") -> str:
    """``name`` if it is a valid sandbox (or snapshot) name, else ``UsageError``."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise UsageError(f"{what} name {name!r} is not valid: use 1 to 63 lowercase letters, digits, "
                         "'_', '.' or '-', starting with a letter or a digit")
    return name


def validate_ttl(ttl_s: float) -> float:
    if not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s) or ttl_s < MIN_TTL_S:
        raise UsageError(f"a time-to-live of {ttl_s!r} s is not valid: give at least {MIN_TTL_S:g} s")
    return float(ttl_s)


@dataclass(frozen=True)
class LifetimeRecord:
    """What the host keeps about a living sandbox (see the module docstring)."""

    sandbox_id: str
    name: str | None
    owner: str | None
    """Who it belongs to, as the door that created it says (``user:1000``, ``grpc:client``)."""
    created_at: float
    ttl_s: float
    expires: float
    """Unix time gc removes it (while paused: when it was due when the pause began)."""
    container_id: str
    socket_dir: str
    spec: dict[str, Any]
    """The SandboxSpec it runs with (``model_dump(mode="json")``)."""
    tool_uid: int
    tool_gid: int
    process: str = ""
    """The creating process (``labels.Owner`` label)."""
    paused_at: float | None = None
    paused_remaining_s: float | None = None
    """While paused: the time that was left on the clock when the pause began."""
    paused_total_s: float = 0.0
    """Time spent paused so far (earlier pauses)."""
    paused_to_disk: bool = False
    """While paused: its processes were saved to disk and its container stopped (a pause to
    disk, :mod:`harness.engine.docker.disk_pause`), rather than frozen in memory."""

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None

    def expires_at(self, now: float) -> float:
        """When it expires if resumed now (its expiry as shown while paused)."""
        if self.paused_at is not None and self.paused_remaining_s is not None:
            return now + self.paused_remaining_s
        return self.expires

    @property
    def pause_limit_s(self) -> float:
        """How long a pause may last: its spec's ``paused_ttl_seconds`` (a record written
        before specs had it: ``PAUSE_LIMIT_FACTOR`` times its TTL)."""
        limit = self.spec.get("paused_ttl_seconds")
        return float(limit) if isinstance(limit, int | float) else PAUSE_LIMIT_FACTOR * self.ttl_s

    @property
    def pause_deadline(self) -> float | None:
        """While paused: when gc removes it anyway (the hard limit on a pause)."""
        return None if self.paused_at is None else self.paused_at + self.pause_limit_s

    def paused(self, now: float) -> LifetimeRecord:
        """This record once a pause begins at ``now``: the clock stops."""
        if self.paused_at is not None:
            return self
        return replace(self, paused_at=now, paused_remaining_s=max(0.0, self.expires - now))

    def resumed(self, now: float) -> LifetimeRecord:
        """This record once resumed at ``now``: the expiry moves later by the paused time."""
        if self.paused_at is None:
            return self
        remaining = self.paused_remaining_s if self.paused_remaining_s is not None else self.expires - self.paused_at
        return replace(self, expires=now + max(0.0, remaining), paused_at=None, paused_remaining_s=None,
                       paused_to_disk=False, paused_total_s=self.paused_total_s + max(0.0, now - self.paused_at))

    def extended(self, now: float, ttl_s: float | None = None) -> LifetimeRecord:
        """Kept alive at ``now`` for ``ttl_s`` (default its TTL) more seconds of running time
        (while paused, that is the time it will have once resumed)."""
        ttl = self.ttl_s if ttl_s is None else ttl_s
        if self.paused_at is not None:
            return replace(self, paused_remaining_s=ttl, expires=now + ttl)
        return replace(self, expires=now + ttl)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LifetimeRecord:
        data = json.loads(text)
        keys = ("process", "paused_at", "paused_remaining_s", "paused_total_s", "paused_to_disk")
        optional = {key: data[key] for key in keys if data.get(key) is not None}
        return cls(
            sandbox_id=str(data["sandbox_id"]), name=None if data.get("name") is None else str(data["name"]),
            owner=None if data.get("owner") is None else str(data["owner"]),
            created_at=float(data["created_at"]), ttl_s=float(data["ttl_s"]), expires=float(data["expires"]),
            container_id=str(data["container_id"]), socket_dir=str(data["socket_dir"]), spec=dict(data["spec"]),
            tool_uid=int(data["tool_uid"]), tool_gid=int(data["tool_gid"]), **optional,
        )


# ---- records on disk --------------------------------------------------------------------------


def record_path(run_root: Path, sandbox_id: str) -> Path:
    return run_root / LIFETIME_DIR / f"{sandbox_id}.json"


def name_path(run_root: Path, name: str) -> Path:
    return run_root / NAMES_DIR / name


def load_record(path: Path) -> LifetimeRecord | None:
    """The record at ``path``, None if there is none; :data:`UNREADABLE` errors pass through."""
    try:
        return LifetimeRecord.from_json(path.read_text())
    except FileNotFoundError:
        return None


def read_record(run_root: Path, sandbox_id: str) -> LifetimeRecord | None:
    """The record of ``sandbox_id``, if any (an unreadable one is logged and counts as none)."""
    try:
        return load_record(record_path(run_root, sandbox_id))
    except UNREADABLE as exc:
        log.warning("ignoring unreadable lifetime record of sandbox %s: %s", sandbox_id, exc)
        return None


def write_record(run_root: Path, record: LifetimeRecord) -> None:
    """Write (or replace) ``record`` atomically: nobody reads half a record."""
    path = record_path(run_root, record.sandbox_id)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(record.to_json())
    os.replace(temporary, path)


def all_records(run_root: Path) -> list[LifetimeRecord]:
    """Every readable record under ``run_root`` (unreadable ones are logged and left out)."""
    directory = run_root / LIFETIME_DIR
    records = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(directory.glob("*.json")):
            try:
                if (record := load_record(entry)) is not None:
                    records.append(record)
            except UNREADABLE as exc:
                log.warning("ignoring unreadable lifetime record %s: %s", entry, exc)
    return records


def sandbox_of_run(run_root: Path, run: str) -> str | None:
    """The id of the sandbox that serves run ``run`` (a run id, or its owner string
    ``run:<run id>``): the newest recorded one whose owner is that run (a server's sandbox, whose
    run id is the id its clients know), else a paused run's kept one; None if none."""
    owner = run if owner_run(run) is not None else run_owner(run)
    serving = sorted((r for r in all_records(run_root) if r.owner == owner), key=lambda r: r.created_at)
    if serving:
        return serving[-1].sandbox_id
    return kept_sandbox_of_run(run_root, owner_run(owner) or run)


def remove_record(run_root: Path, sandbox_id: str) -> None:
    """Remove the record of ``sandbox_id`` and release its name (if it still holds it)."""
    record = read_record(run_root, sandbox_id)
    if record is not None and record.name is not None:
        release_name(run_root, record.name, sandbox_id)
    record_path(run_root, sandbox_id).unlink(missing_ok=True)


@contextlib.contextmanager
def locked(run_root: Path) -> Iterator[None]:
    """Serialize read-modify-write of records between processes (an advisory lock file)."""
    directory = run_root / LIFETIME_DIR
    directory.mkdir(parents=True, mode=0o700, exist_ok=True)
    fd = os.open(directory / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


# ---- names ------------------------------------------------------------------------------------


def claim_name(run_root: Path, name: str, sandbox_id: str) -> bool:
    """Claim ``name`` for ``sandbox_id``; False if another sandbox holds it. Atomic: the
    claim file is written complete under a temporary name, then hard-linked into place,
    which fails if the name exists."""
    path = name_path(run_root, name)
    path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
    temporary = path.with_name(f".{name}.{sandbox_id}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(sandbox_id)
    try:
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)
    return True


def name_holder(run_root: Path, name: str) -> str | None:
    """The sandbox id holding ``name``, if it is claimed."""
    try:
        return name_path(run_root, name).read_text().strip() or None
    except (FileNotFoundError, NotADirectoryError):
        return None


def release_name(run_root: Path, name: str, sandbox_id: str) -> None:
    """Free ``name`` if ``sandbox_id`` holds it."""
    if name_holder(run_root, name) == sandbox_id:
        name_path(run_root, name).unlink(missing_ok=True)


def remove_stale_claims(run_root: Path, now: float | None = None) -> None:
    """Free names whose sandbox has no record (its creation failed or its record was
    removed); a young claim is spared, its sandbox may be starting."""
    now = time.time() if now is None else now
    directory = run_root / NAMES_DIR
    if not directory.is_dir():
        return
    for entry in directory.iterdir():
        if entry.name.startswith("."):
            continue
        with contextlib.suppress(OSError):
            holder = entry.read_text().strip()
            if not record_path(run_root, holder).exists() and now - entry.stat().st_mtime > STALE_AFTER_S:
                entry.unlink(missing_ok=True)


# ---- what gc does -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    """gc's decision about one sandbox."""

    remove: bool
    """Remove its container (if any), socket directory and network."""
    drop_record: bool
    """Remove its lifetime record and release its name."""
    why: str


KEEP = Verdict(remove=False, drop_record=False, why="live")


def judge(*, state: str | None, record: LifetimeRecord | None, kept_until: float | None, now: float,
          label_expired: bool = False, orphaned: bool = False, expiry_file_passed: bool = False) -> Verdict:
    """What gc does with a sandbox whose container is in ``state`` (None: no container).

    ``kept_until``: the keep record of a paused run, if any; ``label_expired``,
    ``orphaned`` (its creating process is gone) and ``expiry_file_passed`` are what the
    container's labels and socket directory say."""
    stopped = state is None or state in STOPPED
    if record is None:
        if kept_until is not None:
            return Verdict(True, False, "keep expired") if kept_until <= now else KEEP
        if label_expired or expiry_file_passed:
            return Verdict(True, False, "expired")
        if orphaned:
            return Verdict(True, False, "its creating process is gone")
        return Verdict(True, False, "stopped") if stopped else KEEP
    named = record.name is not None
    # A pause to disk stopped the container on purpose: it waits, stopped, for its resume (and
    # runs again, its record still paused, while a pause or a resume is under way).
    on_disk = record.paused_to_disk and state is not None
    if (state == "paused" or on_disk) and record.paused_at is not None:
        deadline = record.pause_deadline
        if deadline is not None and deadline < now:
            return Verdict(True, True, f"paused for more than its paused TTL ({record.pause_limit_s:.0f} s)")
        if orphaned and not named and kept_until is None:
            return Verdict(True, True, "its creating process is gone")
        return KEEP
    expires = record.expires if kept_until is None else max(record.expires, kept_until)
    if expires <= now:
        return Verdict(True, True, "expired")
    if named:
        return Verdict(True, False, "its container is gone") if stopped else KEEP
    if stopped:
        return Verdict(True, True, "stopped")
    if orphaned and kept_until is None:
        return Verdict(True, True, "its creating process is gone")
    return KEEP
