"""What a Docker engine does for living sandboxes: named ones reopened from another process,
the pause clock, keep-alive, stats, listing, snapshots, forks and restores.

The records and the rules are in :mod:`harness.engine.docker.lifetime`, the stored files in
:mod:`harness.engine.docker.snapshots`; here they meet the containers. ``DockerEngine`` and
``Sandbox`` offer all of it as methods (these functions take the engine first).

Pause: ``docker pause`` freezes every process of the sandbox (and of its egress proxy, if it
has one, so the proxy's own expiry clock stands still too). The record gets ``paused_at``
before the freeze, so gc in any process sees the pause. Resume writes the moved expiry (the
record, the agent's expiry file, the proxy's) before thawing, then waits for the agent's
health check. A pause to disk (gVisor) is :mod:`harness.engine.docker.disk_pause`'s.

Restoring after the engine restarted: the containers are gone, a named sandbox's record
stays (``list`` shows it ``gone``); ``restore(name)`` creates a new sandbox under the same
name from the latest snapshot of it (``fork(snapshot, from_snapshot=True, name=...)`` does
the same under any name). Without a snapshot its files are lost.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import docker.errors
import grpc

from harness.core.errors import (
    AgentCallError,
    CallboxError,
    EngineUnavailable,
    ErrorCode,
    SandboxStartError,
    short_reason,
)
from harness.engine.docker import disk_pause, labels, memory_snapshots
from harness.engine.docker.cgroup_stats import CgroupReader, SandboxStats, stats_from_api
from harness.engine.docker.kept import (
    STALE_AFTER_S,
    UNREADABLE,
    kept_path,
    record_for_container,
    when,
    write_expiry,
)
from harness.engine.docker.kept import (
    read_record as read_kept,
)
from harness.engine.docker.kept import (
    write_record as write_kept,
)
from harness.engine.docker.lifetime import (
    STOPPED,
    LifetimeRecord,
    NameInUse,
    SandboxGone,
    SandboxNotFound,
    all_records,
    claim_name,
    load_record,
    locked,
    name_holder,
    name_path,
    read_record,
    record_path,
    release_name,
    remove_record,
    sandbox_of_run,
    validate_name,
    write_record,
)
from harness.engine.docker.networks import ROLE, proxy_name
from harness.engine.docker.sandbox import Sandbox
from harness.engine.docker.snapshots import SnapshotError, SnapshotInfo, link_commands
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from sandbox.health import SERVING

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

log = logging.getLogger("callbox.engine")

RESUME_TIMEOUT_S = 10.0
SANDBOX_ID = re.compile(r"[0-9a-f]{12}")
"""What ``create`` names a sandbox (anything else given as an id is no sandbox's)."""
UNPAUSED = ("running", "restarting")


@dataclass(frozen=True)
class SandboxInfo:
    """A sandbox as ``callbox ps`` and ``callbox sandbox ls`` show it."""

    sandbox_id: str
    container_id: str
    status: str
    """The container's own state as Docker says it (``gone``: no container)."""
    owner: str
    """Who it belongs to: the owner string it was created with (``user:1000``), a paused run
    keeping it (``run:<id>``), else the creating process (``host/pid/start``)."""
    expires: float
    created: float
    image: str
    name: str | None = None
    state: str = "running"
    """``running``, ``paused``, ``exited`` (stopped, gc removes it) or ``gone`` (a record whose
    container no longer exists)."""
    cpu_usage_s: float | None = None
    """Cumulative CPU seconds, from the cgroup (None when not running)."""
    memory_bytes: int | None = None
    pids: int | None = None
    paused_at: float | None = None
    paused_to_disk: bool = False
    """Paused to disk: its processes saved, its container stopped (state ``paused``)."""
    process: str = ""
    """The creating process (``host/pid/start``)."""

    @property
    def created_at(self) -> float:
        return self.created


def state_of(docker_state: str | None) -> str:
    """The lifetime state of a container in Docker state ``docker_state`` (None: none)."""
    if docker_state is None:
        return "gone"
    if docker_state == "paused":
        return "paused"
    return "running" if docker_state in UNPAUSED else "exited"


# ---- creating and finding -----------------------------------------------------------------------


def claim(engine: DockerEngine, name: str, sandbox_id: str) -> None:
    """Claim ``name`` for a sandbox about to be created; ``NameInUse`` if a recorded sandbox
    has it. A holder whose record expired is removed first (gc would remove it anyway)."""
    for _ in range(2):
        if claim_name(engine.run_root, name, sandbox_id):
            return
        holder = name_holder(engine.run_root, name)
        if holder is None:
            continue  # released meanwhile
        record = read_record(engine.run_root, holder)
        if record is None and not record_path(engine.run_root, holder).exists():
            # No record: its creation failed, or is under way right now (then the claim is young).
            if _claim_age(engine, name) <= STALE_AFTER_S:
                raise NameInUse(name, holder)
            release_name(engine.run_root, name, holder)
            continue
        if record is not None and not record.is_paused and record.expires <= time.time():
            engine.destroy(holder)  # expired: gc would remove it anyway
            continue
        raise NameInUse(name, holder)
    raise NameInUse(name, name_holder(engine.run_root, name) or "?")


def _claim_age(engine: DockerEngine, name: str) -> float:
    try:
        return time.time() - name_path(engine.run_root, name).stat().st_mtime
    except OSError:
        return 0.0


def new_record(sandbox: Sandbox, *, ttl_s: float, owner: str | None, process: str) -> LifetimeRecord:
    return LifetimeRecord(
        sandbox_id=sandbox.id, name=sandbox.name, owner=owner, created_at=sandbox.created_at, ttl_s=ttl_s,
        expires=sandbox.expires, container_id=sandbox.container_id, socket_dir=str(sandbox.socket_dir),
        spec=sandbox.spec.model_dump(mode="json"), tool_uid=sandbox.tool_uid, tool_gid=sandbox.tool_gid,
        process=process,
    )


def _ensure_record(engine: DockerEngine, sandbox: Sandbox) -> LifetimeRecord:
    """The sandbox's record; a plain sandbox gets one now (call under ``locked``)."""
    record = read_record(engine.run_root, sandbox.id)
    if record is None:
        record = new_record(sandbox, ttl_s=float(sandbox.spec.ttl_seconds), owner=sandbox.owner,
                            process=engine.owner.label())
        if record.expires <= 0:  # built by hand: its expiry is on its container
            found = engine.client.api.inspect_container(sandbox.container_id)["Config"].get("Labels") or {}
            record = replace(record, created_at=labels.time_label(found, labels.CREATED),
                             expires=labels.time_label(found, labels.EXPIRES))
        write_record(engine.run_root, record)
    sandbox.recorded = True
    return record


def resolve(engine: DockerEngine, name_or_id: str) -> str:
    """The sandbox id a name or id stands for (a name first, then a sandbox id, then the id
    of the run it serves: a server's sandbox by the id its client knows, ``e2b-...``);
    ``SandboxNotFound`` if none."""
    with contextlib.suppress(CallboxError):
        holder = name_holder(engine.run_root, validate_name(name_or_id))
        if holder is not None:
            return holder
    if SANDBOX_ID.fullmatch(name_or_id):
        if record_path(engine.run_root, name_or_id).exists() or read_kept(engine.run_root, name_or_id) is not None:
            return name_or_id
        if engine.client.api.containers(all=True, filters={"name": f"^/callbox-{name_or_id}$"}):
            return name_or_id
    serving = sandbox_of_run(engine.run_root, name_or_id)
    if serving is not None:
        return serving
    raise SandboxNotFound(name_or_id)


def open_sandbox(engine: DockerEngine, name_or_id: str, ready_timeout: float) -> Sandbox:
    """Reconnect to a named, recorded or kept sandbox from any process (see ``DockerEngine.open``)."""
    sandbox_id = resolve(engine, name_or_id)
    record = read_record(engine.run_root, sandbox_id)
    if record is None:
        if read_kept(engine.run_root, sandbox_id) is not None:
            return engine.attach(sandbox_id, ready_timeout=ready_timeout)
        raise SandboxNotFound(name_or_id)
    shown = record.name or sandbox_id
    state = _docker_state(engine, record.container_id)
    if record.paused_to_disk and state in STOPPED:
        sandbox = from_record(engine, record)
        sandbox.paused_here = True
        return sandbox
    if state is None or state in STOPPED:
        raise SandboxGone(
            f"sandbox {shown} is gone: its container {'stopped' if state else 'no longer exists'} (the Docker "
            f"engine restarted, or it was removed); its files are gone unless a snapshot has them "
            f"(`callbox sandbox restore {shown}`); `callbox sandbox rm {shown}` frees the name",
            sandbox_id=sandbox_id, expired_at=record.expires)
    sandbox = from_record(engine, record)
    if state == "paused":
        sandbox.paused_here = True
        return sandbox
    wait_healthy(sandbox, ready_timeout)
    return sandbox


def from_record(engine: DockerEngine, record: LifetimeRecord) -> Sandbox:
    spec = SandboxSpec.model_validate(record.spec)
    sandbox = Sandbox(engine, record.sandbox_id, record.container_id, Path(record.socket_dir), spec,
                      record.tool_uid, record.tool_gid, name=record.name, owner=record.owner,
                      created_at=record.created_at, expires=record.expires_at(time.time()))
    sandbox.proxy_url = spec.env.get("HTTP_PROXY") if spec.network == "allowlist" else None
    sandbox.new_egress_events()  # decisions before this process opened it belong to the earlier one
    sandbox.recorded = True
    return sandbox


def _docker_state(engine: DockerEngine, container_id: str) -> str | None:
    try:
        return str(engine.client.api.inspect_container(container_id)["State"]["Status"])
    except docker.errors.NotFound:
        return None
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot inspect container {container_id[:12]}: {short_reason(exc)}") from None


def wait_healthy(sandbox: Sandbox, timeout: float) -> None:
    """Wait until the agent answers its health check (it may be thawing)."""
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        left = deadline - time.monotonic()
        try:
            if sandbox.agent.health(timeout=max(0.05, min(1.0, left))) == SERVING:
                return
        except AgentCallError as exc:
            if exc.grpc_code not in (grpc.StatusCode.UNAVAILABLE.name, grpc.StatusCode.DEADLINE_EXCEEDED.name):
                raise SandboxStartError(
                    f"the agent of sandbox {sandbox.label} failed its health check: {exc}") from None
            if left <= 0:
                raise SandboxStartError(f"the agent of sandbox {sandbox.label} does not answer: {exc}") from None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def is_paused(engine: DockerEngine, sandbox: Sandbox) -> bool:
    """Its record's word (any process pauses through it), else what this process saw (``docker pause``)."""
    record = read_record(engine.run_root, sandbox.id)
    return record.is_paused if record is not None else sandbox.paused_here


def is_removed(engine: DockerEngine, sandbox: Sandbox) -> bool:
    """Whether neither a lifetime record nor a keep record of ``sandbox`` is left: whoever
    removes a sandbox (``destroy`` in any process, gc) removes both first."""
    return not record_path(engine.run_root, sandbox.id).exists() and not kept_path(engine.run_root, sandbox.id).exists()


# ---- the clock --------------------------------------------------------------------------------


def _set_expiry(engine: DockerEngine, sandbox_id: str, socket_dir: str, expires: float) -> None:
    """Tell the agent and the egress proxy; a keep record of a paused run moves along."""
    with contextlib.suppress(FileNotFoundError):
        write_expiry(Path(socket_dir), expires)
    engine.networks.set_expiry(sandbox_id, expires)
    kept = read_kept(engine.run_root, sandbox_id)
    if kept is not None and kept.until < expires:
        write_kept(engine.run_root, replace(kept, until=expires))


def keep_alive(engine: DockerEngine, sandbox: Sandbox, ttl_s: float | None) -> float:
    now = time.time()
    with locked(engine.run_root):
        record = _ensure_record(engine, sandbox).extended(now, ttl_s)
        write_record(engine.run_root, record)
        _set_expiry(engine, sandbox.id, record.socket_dir, record.expires)
    sandbox.expires = record.expires
    return record.expires


THAW_RETRY_S = 5.0
"""How long a thaw keeps retrying an unpause that Docker refuses while the cgroup is frozen."""


def _freeze(engine: DockerEngine, container: str, *, thaw: bool) -> None:
    api = engine.client.api
    deadline = time.monotonic() + THAW_RETRY_S
    while True:
        try:
            (api.unpause if thaw else api.pause)(container)
            return
        except docker.errors.APIError as exc:
            text = str(exc)
            if not thaw:
                if "already paused" in text:
                    return
                # runc's cgroup v1 freezer gives up ("unable to freeze") when tasks of the
                # container are in the middle of starting or exiting; the freeze is undone
                # and may be tried again once they are done.
                if "unable to freeze" not in text or time.monotonic() > deadline:
                    raise
                log.warning("pausing %s: %s; trying again", container[:12], short_reason(exc))
                time.sleep(0.05)
                continue
            if "not paused" not in text:
                raise
            # Docker 20.10 can answer "not paused" to an unpause sent soon after a pause
            # while the container is still frozen (a late containerd event flipped its
            # state flag); a later unpause thaws it. Only a container that really runs is done.
            if not api.inspect_container(container)["State"].get("Paused"):
                return
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def pause(engine: DockerEngine, sandbox: Sandbox, to_disk: bool = False) -> None:
    if to_disk:
        disk_pause.pause(engine, sandbox, lambda: _ensure_record(engine, sandbox), wait_healthy)
        return
    now = time.time()
    with locked(engine.run_root):
        before = _ensure_record(engine, sandbox)
        write_record(engine.run_root, before.paused(now))
    try:
        _freeze(engine, sandbox.container_id, thaw=False)
    except docker.errors.DockerException as exc:
        with locked(engine.run_root):
            write_record(engine.run_root, before)
        if isinstance(exc, docker.errors.NotFound) or "not running" in str(exc):
            raise SandboxGone(f"sandbox {sandbox.label} is not running, so it cannot be paused: {short_reason(exc)}",
                              sandbox_id=sandbox.id, expired_at=None) from None
        raise CallboxError(f"cannot pause sandbox {sandbox.label}: {short_reason(exc)}") from None
    if sandbox.spec.network == "allowlist":
        with contextlib.suppress(docker.errors.DockerException):
            _freeze(engine, proxy_name(sandbox.id), thaw=False)
    sandbox.paused_here = True


def resume(engine: DockerEngine, sandbox: Sandbox, timeout: float) -> float:
    """Thaw the sandbox (or restore it from disk); its new expiry."""
    now = time.time()
    with locked(engine.run_root):
        record = read_record(engine.run_root, sandbox.id)
        if record is not None and not record.paused_to_disk:
            record = record.resumed(now)
            write_record(engine.run_root, record)
            _set_expiry(engine, sandbox.id, record.socket_dir, record.expires)
            sandbox.expires = record.expires
    if record is not None and record.paused_to_disk:
        socket_dir = record.socket_dir
        return disk_pause.resume(engine, sandbox, record,
                                 lambda expires: _set_expiry(engine, sandbox.id, socket_dir, expires),
                                 wait_healthy, timeout)
    if sandbox.spec.network == "allowlist":
        with contextlib.suppress(docker.errors.DockerException):
            _freeze(engine, proxy_name(sandbox.id), thaw=True)
    try:
        _freeze(engine, sandbox.container_id, thaw=True)
    except docker.errors.DockerException as exc:
        raise CallboxError(f"cannot resume sandbox {sandbox.label}: {short_reason(exc)}") from None
    sandbox.paused_here = False
    wait_healthy(sandbox, timeout)
    return sandbox.expires


# ---- stats and listing ----------------------------------------------------------------------------


def cgroup_reader(engine: DockerEngine) -> CgroupReader | None:
    """The engine's cgroup reader, None when its containers' cgroups are not on this host."""
    if engine.cgroups is None and engine.local:
        info = engine.docker_info()
        engine.cgroups = CgroupReader(driver=str(info.get("CgroupDriver") or "cgroupfs"),
                                      version=str(info.get("CgroupVersion") or "2"))
    return engine.cgroups


def container_stats(engine: DockerEngine, container_id: str, *, find_pid: bool = True) -> SandboxStats | None:
    reader = cgroup_reader(engine)
    if reader is not None:
        found = reader.read(container_id)
        if found is None and find_pid:
            with contextlib.suppress(docker.errors.DockerException):
                pid = int(engine.client.api.inspect_container(container_id)["State"].get("Pid") or 0)
                found = reader.read(container_id, pid) if pid else None
        if found is not None:
            return found
    return stats_from_api(engine.client, container_id)


def sandbox_stats(engine: DockerEngine, sandbox: Sandbox) -> SandboxStats:
    found = container_stats(engine, sandbox.container_id)
    if found is None and (record := read_record(engine.run_root, sandbox.id)) is not None and record.paused_to_disk:
        return SandboxStats(cpu_usage_s=0.0, memory_bytes=0, pids=0, source="paused to disk")
    if found is None:
        raise SandboxGone(f"sandbox {sandbox.label} is not running: it has no stats", sandbox_id=sandbox.id,
                          expired_at=None)
    return found


def list_sandboxes(engine: DockerEngine, *, with_stats: bool = True) -> list[SandboxInfo]:
    infos = []
    seen: set[str] = set()
    now = time.time()
    for c in engine.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"}):
        lab: dict[str, str] = c.get("Labels") or {}
        if ROLE in lab:
            continue  # an egress proxy, not a sandbox
        sandbox_id = lab.get(labels.SANDBOX_ID, "?")
        seen.add(sandbox_id)
        kept = record_for_container(lab)
        record = _record_of(lab)
        docker_state = str(c.get("State", "?"))
        on_disk = record is not None and record.paused_to_disk and docker_state in STOPPED
        state = "paused" if on_disk else state_of(docker_state)
        stats = container_stats(engine, str(c["Id"])) if with_stats and state in ("running", "paused") else None
        expires = record.expires_at(now) if record is not None else (
            kept.until if kept is not None else labels.time_label(lab, labels.EXPIRES))
        owner = (record.owner if record is not None and record.owner else None) or lab.get(labels.PRINCIPAL) or (
            kept.owner if kept is not None else lab.get(labels.OWNER, "?"))
        infos.append(SandboxInfo(
            sandbox_id=sandbox_id, container_id=str(c["Id"])[:12], status=docker_state, owner=owner,
            expires=expires, created=labels.time_label(lab, labels.CREATED), image=str(c.get("Image", "?")),
            name=record.name if record is not None else (lab.get(labels.NAME) or None), state=state,
            cpu_usage_s=stats.cpu_usage_s if stats else None, memory_bytes=stats.memory_bytes if stats else None,
            pids=stats.pids if stats else None, paused_at=record.paused_at if record is not None else None,
            paused_to_disk=on_disk,
            process=lab.get(labels.OWNER, ""),
        ))
    for record in all_records(engine.run_root):
        if record.sandbox_id not in seen and record.name is not None:
            infos.append(SandboxInfo(
                sandbox_id=record.sandbox_id, container_id=record.container_id[:12], status="gone",
                owner=record.owner or record.process, expires=record.expires_at(now), created=record.created_at,
                image=str(record.spec.get("image", "?")), name=record.name, state="gone", process=record.process,
            ))
    return sorted(infos, key=lambda i: i.created)


def _record_of(lab: dict[str, str]) -> LifetimeRecord | None:
    sandbox_id, socket_dir = lab.get(labels.SANDBOX_ID, ""), lab.get(labels.SOCKET_DIR)
    if not sandbox_id or not socket_dir:
        return None
    with contextlib.suppress(*UNREADABLE):
        return load_record(record_path(Path(socket_dir).parent, sandbox_id))
    return None


# ---- remove -------------------------------------------------------------------------------------


def remove(engine: DockerEngine, name_or_id: str) -> str:
    """Remove a sandbox by name or id, live, paused or gone; its id."""
    sandbox_id = resolve(engine, name_or_id)
    record = read_record(engine.run_root, sandbox_id)
    network = None if record is None else str(record.spec.get("network", "none"))
    engine.destroy(sandbox_id, network=network)
    remove_record(engine.run_root, sandbox_id)
    return sandbox_id


# ---- snapshots, forks, restores ----------------------------------------------------------------


def snapshot(engine: DockerEngine, sandbox: Sandbox, name: str, *, replace_existing: bool = False,
             owner: str | None = None, temporary: bool = False, memory: bool = False) -> SnapshotInfo:
    """``memory``: with the processes and memory too (gVisor only; see ``memory_image``)."""
    sandbox.require_running()
    if memory:
        memory_snapshots.refuse_unless_possible(sandbox.spec, sandbox.label)
    try:
        running = [f"pid {job.pid} {' '.join(job.command)[:60]}" for job in sandbox.agent.jobs.list()
                   if job.state == "running"]
    except AgentCallError as exc:
        log.debug("cannot list the jobs of sandbox %s for its snapshot: %s", sandbox.label, exc)
        running = []
    return engine.snapshot_store.write(
        name, spec=sandbox.spec, download=sandbox.transfer.download, source_sandbox_id=sandbox.id,
        source_name=sandbox.name, owner=owner if owner is not None else sandbox.owner, replace=replace_existing,
        temporary=temporary, running=running,
        memory=(lambda directory: memory_snapshots.save(engine, sandbox, directory, wait_healthy)) if memory else None,
    )


def restore_files(sandbox: Sandbox, info: SnapshotInfo) -> None:
    """Upload each place's archive into ``sandbox``, then recreate the links."""
    for place in info.places:
        if place.files or place.dirs:
            sandbox.agent.upload_tar(place.path, info.directory / place.file, overwrite=True)
    for argv in link_commands(info.links):
        result = collect(sandbox.agent.exec_buffered(argv, timeout_ms=60_000))
        if result.exit_code != 0:
            raise SnapshotError(f"cannot recreate the links of snapshot {info.name} in sandbox {sandbox.label}: "
                                f"{result.stderr.data().decode('utf-8', 'replace').strip()[-300:]}")


def fork(engine: DockerEngine, source: Sandbox | str, *, from_snapshot: bool, name: str | None,
         owner: str | None, ttl_s: float | None) -> Sandbox:
    store = engine.snapshot_store
    if from_snapshot:
        if not isinstance(source, str):
            raise CallboxError("fork(from_snapshot=True) takes a snapshot name, not a sandbox",
                               code=ErrorCode.INVALID_REQUEST)
        return _fork_from(engine, store.get(source), name=name, owner=owner, ttl_s=ttl_s)
    live = engine.open(source) if isinstance(source, str) else source
    temporary = f".fork-{live.id}-{uuid.uuid4().hex[:8]}"
    info = snapshot(engine, live, temporary, temporary=True)
    try:
        return _fork_from(engine, info, name=name, owner=owner if owner is not None else live.owner, ttl_s=ttl_s)
    finally:
        shutil.rmtree(info.directory, ignore_errors=True)


def _fork_from(engine: DockerEngine, info: SnapshotInfo, *, name: str | None, owner: str | None,
               ttl_s: float | None) -> Sandbox:
    spec = engine.snapshot_store.spec(info)
    if info.memory is not None:
        # The processes resume from the memory image, the writable places with them.
        return engine.create(spec, name=name, owner=owner if owner is not None else info.owner, ttl_s=ttl_s,
                             memory_image=info.directory / info.memory.directory)
    forked = engine.create(spec, name=name, owner=owner if owner is not None else info.owner, ttl_s=ttl_s)
    try:
        restore_files(forked, info)
    except BaseException:
        forked.destroy()
        raise
    return forked


def not_gone(name: str, state: str, snapshot: str | None) -> CallboxError:
    """Why sandbox ``name``, ``running`` or ``paused``, is not restored, and what to do
    instead: restore is for a sandbox that is gone; this one still has its files."""
    back = (f"to take it back to its latest snapshot ({snapshot}), remove it (`callbox sandbox rm {name}`), "
            f"then restore it" if snapshot is not None
            else f"it has no snapshot (`callbox sandbox snapshot {name} SNAPSHOT` takes one)")
    thaw = f"; `callbox sandbox resume {name}` thaws it" if state == "paused" else ""
    return CallboxError(
        f"sandbox {name} is {state}, not gone: restore recreates a gone sandbox (its container stopped or removed, "
        f"e.g. when the Docker engine restarted) from its latest snapshot, and {name} still has its files{thaw}; "
        f"{back}; `callbox sandbox fork {name} --name NEW` starts a copy of it", code=ErrorCode.CONFLICT)


def restore(engine: DockerEngine, name: str) -> Sandbox:
    """Recreate the named sandbox ``name`` from its latest snapshot, under the same name."""
    validate_name(name)
    taken = name_holder(engine.run_root, name)
    record = read_record(engine.run_root, taken) if taken is not None else None
    candidates = [s for s in engine.snapshot_store.list() if s.source_name == name]
    if record is not None:
        state = _docker_state(engine, record.container_id)
        if state is not None and state not in STOPPED:
            raise not_gone(name, state_of(state), candidates[-1].name if candidates else None)
    if not candidates:
        raise SnapshotError(f"sandbox {name} has no snapshot to restore from (its files are gone); "
                            f"`callbox sandbox rm {name}` frees the name", code=ErrorCode.NOT_FOUND)
    latest = candidates[-1]
    owner = record.owner if record is not None else latest.owner
    ttl = record.ttl_s if record is not None else None
    if taken is not None:
        engine.destroy(taken)
    log.info("restoring sandbox %s from snapshot %s (taken %s)", name, latest.name, when(latest.created_at))
    return _fork_from(engine, latest, name=name, owner=owner, ttl_s=ttl)
