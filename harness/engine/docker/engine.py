"""Disposable, hardened sandboxes on a Docker engine (driven through the docker SDK).

``create`` checks the spec against the engine's host (``SandboxSpec.for_host``: cpus,
memory, mounts and their writability, before anything is created), starts a container
with every hardened default, waits until the agent
inside answers its health check on the per-sandbox unix socket, and returns a
``Sandbox`` holding the agent client. ``destroy`` returns at once; the container, its network and socket
directory go in the background (:mod:`harness.engine.docker.teardown`). Labels name the owner and expiry
so ``gc`` can reap leftovers, also after the harness was killed; the engine runs gc when it starts.

Keeping a sandbox past its process (a paused run): ``keep(sandbox, run_id=..., until=...)``
writes a host-side record (:mod:`harness.engine.docker.kept`). ``gc`` consults it: a
kept sandbox is removed when ``until`` has passed, and never for being orphaned (its
creating process may be long gone); a sandbox without a record is reaped exactly as
before (expired, or its owner process dead). A record gc cannot read (another user's run
root) counts as kept until the container's label expiry, so gc stays conservative; a
record whose container is gone is removed. ``attach(sandbox_id)`` (another process,
later) returns a ``Sandbox`` connected to the kept container's agent, or raises
``SandboxExpired`` saying when it expired or that it is gone (removing what is left).
``destroy`` removes the record along with the container.

Living sandboxes (:mod:`harness.engine.docker.living`, records in
:mod:`harness.engine.docker.lifetime`): ``create(spec, name=, ttl_s=, owner=)`` gives a
sandbox a unique name (it then outlives its process, like a kept one), a time-to-live and an
owner string; ``open(name_or_id)`` reconnects from any process; ``pause``/``resume`` freeze
it with the expiry clock stopped; ``keep_alive`` pushes its expiry; ``list_sandboxes``
shows name, owner, state and cgroup CPU and memory; ``snapshot``, ``fork``, ``restore``,
``snapshots``, ``remove_snapshot`` and ``remove`` manage its files and itself.

A warm pool (opt-in, ``enable_pool``: :mod:`harness.engine.docker.pool`) makes a create whose
spec matches a pre-started sandbox a claim; without one every create is cold.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

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
from harness.engine.docker import labels, living, memory_snapshots, reaper, teardown
from harness.engine.docker.cgroup_stats import CgroupReader, SandboxStats
from harness.engine.docker.client import (
    connect_client,
    engine_calls,
    seccomp_profile,
)
from harness.engine.docker.container import AGENT_PIDS_RESERVE, run_container
from harness.engine.docker.kept import (
    KeptSandbox,
    SandboxExpired,
    read_record,
    when,
    write_expiry,
    write_record,
)
from harness.engine.docker.lifetime import (
    LifetimeRecord,
    NameInUse,
    SandboxGone,
    SandboxNotFound,
    SandboxPaused,
    locked,
    release_name,
    validate_name,
    validate_ttl,
)
from harness.engine.docker.lifetime import (
    read_record as read_lifetime,
)
from harness.engine.docker.lifetime import (
    write_record as write_lifetime,
)
from harness.engine.docker.living import SandboxInfo
from harness.engine.docker.netfilter import PacketFilter, lock_path_for
from harness.engine.docker.networks import Attachment, EgressEvent, SandboxNetworks, engine_is_local
from harness.engine.docker.pool import PoolEntry, WarmPool
from harness.engine.docker.sandbox import AGENT_SOCKET_NAME, Sandbox
from harness.engine.docker.snapshots import SnapshotInfo, SnapshotStore
from harness.engine.runsc_network import engine_runsc_stack
from harness.engine.spec import HOME as _HOME
from harness.engine.spec import HostLimits, SandboxSpec
from harness.telemetry import metrics, tracing
from harness.wire import default_run_root
from sandbox.health import SERVING

__all__ = [
    "AGENT_PIDS_RESERVE",
    "HOME",
    "DockerEngine",
    "KeptSandbox",
    "NameInUse",
    "Sandbox",
    "SandboxExpired",
    "SandboxGone",
    "SandboxInfo",
    "SandboxNotFound",
    "SandboxPaused",
    "SandboxStats",
    "SnapshotInfo",
    "connect_client",
    "default_run_root",
    "seccomp_profile",
    "write_expiry",
]

log = logging.getLogger("callbox.engine")

HOME = _HOME
"""The tool user's home directory (the benchmark builds containers with it)."""
READY_TIMEOUT_S = 30.0
ATTACH_TIMEOUT_S = 10.0
STOPPED = ("exited", "dead")
"""Container states gc reaps at once: the agent in it is gone and nothing restarts it."""


class DockerEngine:
    """Creates, lists, destroys and reaps sandboxes on one Docker engine."""

    keeps_snapshots = True

    def __init__(self, client: docker.DockerClient, *, run_root: Path | None = None,
                 reap_on_start: bool = True, egress_test_network: str | None = None,
                 egress_test_hosts: dict[str, str] | None = None, snapshot_dir: Path | None = None,
                 extra_labels: dict[str, str] | None = None, egress_test_ca: str | None = None) -> None:
        self.client = client
        self.extra_labels = dict(extra_labels or {})
        """Labels every container of this engine carries besides callbox's own (a Ray node's
        host marks its sandboxes with the node they belong to)."""
        self.run_root = run_root or default_run_root()
        self.snapshot_store = SnapshotStore(snapshot_dir)
        """Snapshots (``snapshot_dir``, else ``CALLBOX_SNAPSHOT_DIR`` or the state directory)."""
        self.local = engine_is_local(client)
        """The engine runs on this host (its containers' cgroups can be read here)."""
        self.cgroups: CgroupReader | None = None
        self._info: dict[str, Any] | None = None
        self.owner = labels.Owner.current()
        self.hostname = socket.gethostname()
        if egress_test_network is None:
            egress_test_network = os.environ.get("CALLBOX_EGRESS_TEST_NETWORK") or None
        if egress_test_hosts is None:
            egress_test_hosts = _parse_hosts(os.environ.get("CALLBOX_EGRESS_TEST_HOSTS", ""))
        self.networks = SandboxNetworks(
            client, PacketFilter(lock_path_for(self.run_root)), self.run_root / "egress",
            test_network=egress_test_network, test_hosts=egress_test_hosts,
            test_ca=egress_test_ca or os.environ.get("CALLBOX_EGRESS_TEST_CA") or None,
        )
        self._host: HostLimits | None = None
        self.pool: WarmPool | None = None
        """Pre-started sandboxes ``create`` claims from (none unless ``enable_pool``)."""
        self.teardown = teardown.Teardown(self)  # the background remover of ``destroy``
        metrics.watch_engine(self)  # its sandboxes in the gauges /metrics reads
        if reap_on_start:
            for sandbox_id in self.gc():
                log.info("reaped leftover sandbox %s", sandbox_id)

    @classmethod
    def connect(cls, **kwargs: Any) -> DockerEngine:
        """Connect to the engine named by DOCKER_HOST (default socket); fail closed if unreachable."""
        return cls(connect_client(), **kwargs)

    def enable_pool(self, specs: Sequence[SandboxSpec | PoolEntry], **settings: Any) -> WarmPool:
        """Keep pre-started sandboxes of ``specs`` (:class:`WarmPool`'s settings: ``size``, ``max``,
        ...) that matching creates, named ones too, claim; the refill thread is started."""
        if self.pool is None:
            self.pool = WarmPool(self, specs, **settings).start()
        return self.pool

    # ---- create ---------------------------------------------------------------------------

    def docker_info(self) -> dict[str, Any]:
        """``docker info`` (asked once per engine)."""
        if self._info is None:
            self._info = dict(self.client.info())
        return self._info

    @engine_calls
    def host_limits(self) -> HostLimits:
        """The engine host's CPUs, memory and data root (asked once per engine)."""
        if self._host is None:
            info = self.docker_info()
            root = str(info.get("DockerRootDir") or "")
            self._host = HostLimits(
                cpus=int(info["NCPU"]) if info.get("NCPU") else None,
                memory=int(info["MemTotal"]) if info.get("MemTotal") else None,
                where="the Docker engine's host", engine_paths=(root,) if root.startswith("/") else (),
                runsc_network=engine_runsc_stack(info),
            )
        return self._host

    @engine_calls
    def create(self, spec: SandboxSpec, *, name: str | None = None, ttl_s: float | None = None,
               owner: str | None = None, ready_timeout: float = READY_TIMEOUT_S,
               memory_image: Path | None = None) -> Sandbox:
        """Start a sandbox for ``spec``; a spec this host cannot run (``SpecError``: too many
        cpus, a missing or unwritable mount, ...) is refused before any container exists.

        ``name``: unique among this run root's sandboxes (``NameInUse`` names the holder);
        a named sandbox outlives this process until its expiry. ``ttl_s``: its time-to-live
        (default the spec's ``ttl_seconds``). ``owner``: who it belongs to, shown by
        ``list_sandboxes`` (``user:1000``, ``grpc:client``). With any of them the sandbox
        gets a lifetime record, so ``open`` finds it from another process.

        ``memory_image``: the sandbox resumes the processes of this memory image (a snapshot's,
        taken under gVisor with the same spec) instead of starting fresh.

        Each create is counted, and timed, in the metrics by source (``pool`` or ``cold``)."""
        started = time.perf_counter()
        if name is not None:
            validate_name(name)
        ttl = float(spec.ttl_seconds) if ttl_s is None else validate_ttl(ttl_s)
        if ttl_s is not None:
            spec = spec.model_copy(update={"ttl_seconds": math.ceil(ttl)})
        spec = spec.for_host(self.host_limits())
        for note in spec.loosened():
            log.warning("this policy loosens a hardened default: %s", note)
        uid, gid = _tool_identity(spec)
        pool = self.pool if memory_image is None else None  # a restore is never a pool's fresh sandbox
        if pool is not None and (claimed := pool.claim(spec, uid, gid, name=name, owner=owner, ttl=ttl)):
            self._created("pool", started)
            return claimed
        sandbox_id = uuid.uuid4().hex[:12]
        socket_dir = self.run_root / sandbox_id
        self.run_root.mkdir(parents=True, mode=0o700, exist_ok=True)
        if name is not None:
            living.claim(self, name, sandbox_id)
        try:
            sandbox = self._start(spec, sandbox_id, socket_dir, uid, gid, name=name, owner=owner, ttl=ttl,
                                  record=name is not None or owner is not None or ttl_s is not None,
                                  ready_timeout=ready_timeout, memory_image=memory_image)
        except BaseException:
            if name is not None:
                release_name(self.run_root, name, sandbox_id)
            raise
        self._created("cold", started)
        return sandbox

    @staticmethod
    def _created(source: str, started: float) -> None:
        metrics.record_sandbox_created(source, time.perf_counter() - started)
        tracing.annotate("callbox.sandbox.source", source)

    def _start(self, spec: SandboxSpec, sandbox_id: str, socket_dir: Path, uid: int, gid: int, *,
               name: str | None, owner: str | None, ttl: float, record: bool, ready_timeout: float,
               memory_image: Path | None = None) -> Sandbox:
        created = time.time()
        socket_dir.mkdir(mode=0o700)
        write_expiry(socket_dir, created + ttl)
        extra = {labels.NAME: name or "", labels.PRINCIPAL: owner or ""}
        before_start = None
        try:
            if memory_image is not None:
                before_start = memory_snapshots.restore_request(memory_image)
                (socket_dir / memory_snapshots.RESUME_FILE).write_text("1\n")  # the restored agent listens at once
            attachment, container_id = self._run_container(spec, sandbox_id, socket_dir, uid, gid, created,
                                                           {k: v for k, v in extra.items() if v},
                                                           before_start=before_start)
            if memory_image is not None:
                memory_snapshots.check_restored(container_id)
        except BaseException:
            # Also on Ctrl-C mid-request: the engine may have created the container already.
            self.destroy(sandbox_id, network=spec.network)
            raise
        sandbox = Sandbox(self, sandbox_id, container_id, socket_dir, spec, uid, gid, name=name, owner=owner,
                          created_at=created, expires=created + ttl)
        try:
            self._wait_ready(sandbox, ready_timeout)
            if attachment.proxied:
                sandbox.proxy_url, proxy_env = self.networks.finish_proxy(sandbox_id)
                sandbox.spec = spec.model_copy(update={"env": {**spec.env, **proxy_env}})
            if record:
                write_lifetime(self.run_root, living.new_record(sandbox, ttl_s=ttl, owner=owner,
                                                                process=self.owner.label()))
                sandbox.recorded = True
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    def _run_container(self, spec: SandboxSpec, sandbox_id: str, socket_dir: Path, uid: int, gid: int,
                       now: float, extra_labels: dict[str, str], *,
                       before_start: Callable[[str], None] | None = None) -> tuple[Attachment, str]:
        return run_container(self.client, self.networks, self.owner.label(), spec, sandbox_id, socket_dir, uid, gid,
                             now, {**self.extra_labels, **extra_labels}, before_start=before_start)

    def _wait_ready(self, sandbox: Sandbox, timeout: float) -> None:
        """Wait for the agent's socket, then its health check; fail fast if the container dies."""
        deadline = time.monotonic() + timeout
        sock = sandbox.socket_dir / AGENT_SOCKET_NAME
        next_status_check = time.monotonic() + 0.2
        delay = 0.0005
        while time.monotonic() < deadline:
            if sock.exists():
                try:
                    if sandbox.agent.health(timeout=max(0.05, min(2.0, deadline - time.monotonic()))) == SERVING:
                        return
                except AgentCallError as exc:
                    if exc.grpc_code not in (grpc.StatusCode.UNAVAILABLE.name, grpc.StatusCode.DEADLINE_EXCEEDED.name):
                        raise SandboxStartError(f"the sandbox agent failed its health check: {exc}") from None
            if time.monotonic() >= next_status_check:
                self._fail_if_exited(sandbox)
                next_status_check = time.monotonic() + 0.2
            time.sleep(delay)
            delay = min(delay * 2, 0.002)
        self._fail_if_exited(sandbox)
        raise SandboxStartError(f"the sandbox agent did not become ready within {timeout:.0f} s")

    @staticmethod
    def _fail_if_exited(sandbox: Sandbox) -> None:
        api = sandbox.engine.client.api
        try:
            state = api.inspect_container(sandbox.container_id)["State"]
            if state.get("Status") not in STOPPED:
                return
            logs = api.logs(sandbox.container_id, tail=20).decode("utf-8", "replace").strip()
        except docker.errors.NotFound:  # it stopped, and a gc (another process) removed it
            raise SandboxStartError("the sandbox container stopped during start-up and was removed") from None
        raise SandboxStartError(f"the sandbox agent exited during start-up: {logs or 'no output'}")

    # ---- destroy, list, gc -------------------------------------------------------------------

    @engine_calls
    def destroy(self, sandbox_id: str, *, network: str | None = None) -> list[EgressEvent]:
        """Doom the sandbox, return at once: its agent and proxy stop, records and name go; its container,
        network and proxy (unless ``network`` is ``none``) and socket directory go in the background
        (``drain`` waits; a missing one is no error). The egress proxy's decisions so far (all logged)."""
        return self.teardown.destroy(sandbox_id, network)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until the sandboxes destroyed so far are removed; False if ``timeout`` passed."""
        return self.teardown.drain(timeout)

    def close(self, timeout: float | None = teardown.EXIT_DRAIN_S) -> bool:
        """Finish the pending removals (bounded by ``timeout``); later destroys are synchronous."""
        return self.teardown.close(timeout)

    @engine_calls
    def list_sandboxes(self, *, stats: bool = True) -> list[SandboxInfo]:
        """Every sandbox on the engine but those this process destroyed (and each named one of this
        run root whose container is gone), oldest first; with ``stats``, CPU and memory of the live ones."""
        doomed = teardown.removing_anywhere()
        return [i for i in living.list_sandboxes(self, with_stats=stats) if i.sandbox_id not in doomed]

    @engine_calls
    def gc(self, now: float | None = None) -> list[str]:
        """Remove sandboxes that expired, whose owner process is gone or whose container
        stopped (its agent is gone for good: the engine restarted, it was killed, or it
        expired); return their ids. A kept sandbox (``keep``) is removed only once its keep
        has expired (``attach`` removes a stopped one); named and paused ones follow their
        lifetime records (:func:`harness.engine.docker.lifetime.judge`); pending removals first."""
        self.teardown.drain(teardown.EXIT_DRAIN_S)
        return reaper.gc(self, time.time() if now is None else now)

    # ---- keep a sandbox past its process, attach to it later ----------------------------------

    @engine_calls
    def keep(self, sandbox: Sandbox, *, run_id: str, until: float | None = None) -> KeptSandbox:
        """Keep ``sandbox`` for run ``run_id`` after this process exits, until ``until``
        (Unix time; default its label expiry, i.e. creation + the spec's ttl_seconds).
        Keeping it again replaces the record. Returns the record written."""
        if until is None:
            try:
                found = self.client.api.inspect_container(sandbox.container_id)["Config"].get("Labels") or {}
            except docker.errors.DockerException as exc:
                raise EngineUnavailable(f"cannot inspect sandbox {sandbox.id}: {short_reason(exc)}") from None
            until = labels.time_label(found, labels.EXPIRES)
        record = KeptSandbox(
            sandbox_id=sandbox.id, run_id=run_id, until=until, container_id=sandbox.container_id,
            socket_dir=str(sandbox.socket_dir), spec=sandbox.spec.model_dump(mode="json"),
            tool_uid=sandbox.tool_uid, tool_gid=sandbox.tool_gid, kept_at=time.time(),
        )
        write_expiry(sandbox.socket_dir, until)  # the agent stops itself then, harness or not
        self.networks.set_expiry(sandbox.id, until)  # and its egress proxy, if any
        write_record(self.run_root, record)
        if read_lifetime(self.run_root, sandbox.id) is not None:  # a living sandbox: its clock follows
            with locked(self.run_root):
                if (living_record := read_lifetime(self.run_root, sandbox.id)) is not None:
                    write_lifetime(self.run_root, living_record.extended(time.time(), until - time.time()))
        return record

    def sandbox_exists(self, sandbox_id: str) -> bool:
        """Whether a container of ``sandbox_id`` (running or not) is on the engine."""
        try:
            found = self.client.api.containers(all=True, filters={"label": f"{labels.SANDBOX_ID}={sandbox_id}"})
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot look for sandbox {sandbox_id}: {short_reason(exc)}") from None
        return bool(found)

    def lifetime_record(self, sandbox_id: str) -> LifetimeRecord | None:
        """The lifetime record of ``sandbox_id`` (name, owner, expiry, pause clock), if it has one."""
        return read_lifetime(self.run_root, sandbox_id)

    def kept_sandbox(self, sandbox_id: str) -> KeptSandbox | None:
        """The keep record of ``sandbox_id`` under this engine's run root, if any."""
        return read_record(self.run_root, sandbox_id)

    @engine_calls
    def attach(self, sandbox_id: str, *, ready_timeout: float = ATTACH_TIMEOUT_S) -> Sandbox:
        """Reconnect to a kept sandbox (from another process than the one that created it).

        Raises ``SandboxExpired`` if it is not kept, its keep expired (it is then removed),
        or its container is gone or stopped; ``SandboxStartError`` if its agent does not
        answer. The returned Sandbox stays kept until ``destroy``."""
        kept = self.kept_sandbox(sandbox_id)
        if kept is None:
            raise SandboxExpired(
                f"sandbox {sandbox_id} is not kept (it expired and was removed, or was never kept); its files are gone",
                sandbox_id=sandbox_id, expired_at=None,
            )
        expires = when(kept.until)
        if kept.until <= time.time():
            self.destroy(sandbox_id)
            raise SandboxExpired(f"sandbox {sandbox_id} expired at {expires}; its files are gone",
                                 sandbox_id=sandbox_id, expired_at=kept.until)
        try:
            found = self.client.api.inspect_container(kept.container_id)
            state = found["State"]
        except docker.errors.NotFound:
            self.destroy(sandbox_id)
            raise SandboxExpired(
                f"sandbox {sandbox_id} is gone (its container was removed before its expiry at {expires}); "
                "its files are gone", sandbox_id=sandbox_id, expired_at=kept.until,
            ) from None
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot inspect sandbox {sandbox_id}: {short_reason(exc)}") from None
        if not state.get("Running"):
            self.destroy(sandbox_id)
            raise SandboxExpired(f"sandbox {sandbox_id} is gone (its container stopped: {state.get('Status')}); "
                                 "its files are gone", sandbox_id=sandbox_id, expired_at=kept.until)
        if state.get("Paused"):
            raise SandboxPaused(sandbox_id)
        spec = SandboxSpec.model_validate(kept.spec)
        created = labels.time_label(found["Config"].get("Labels") or {}, labels.CREATED)
        sandbox = Sandbox(self, sandbox_id, kept.container_id, Path(kept.socket_dir), spec, kept.tool_uid,
                          kept.tool_gid, created_at=created, expires=kept.until)
        sandbox.proxy_url = spec.env.get("HTTP_PROXY") if spec.network == "allowlist" else None
        sandbox.new_egress_events()  # decisions before this attach belong to the earlier process
        try:
            healthy = sandbox.agent.health(timeout=ready_timeout) == SERVING
        except AgentCallError as exc:
            sandbox.agent.close()
            raise SandboxStartError(f"the agent of kept sandbox {sandbox_id} does not answer: {exc}") from None
        if not healthy:
            sandbox.agent.close()
            raise SandboxStartError(f"the agent of kept sandbox {sandbox_id} is not serving")
        return sandbox

    # ---- living sandboxes: names, the clock, stats, snapshots, forks ---------------------------

    @engine_calls
    def open(self, name_or_id: str, *, ready_timeout: float = ATTACH_TIMEOUT_S) -> Sandbox:
        """Reconnect to a named, recorded or kept sandbox from any process (a paused one is
        returned paused: resume it). ``SandboxNotFound`` if there is none; ``SandboxGone`` if
        its container no longer runs (restore it from a snapshot); ``SandboxExpired`` for a
        kept one past its keep (see ``attach``)."""
        return living.open_sandbox(self, name_or_id, ready_timeout)

    def sandbox_census(self) -> tuple[int, int]:
        """The sandboxes on the engine, running or paused (this process's pooled ones among them),
        and of them paused: for the metrics' gauges (one container list, no stats)."""
        doomed = teardown.removing_anywhere()
        live = paused = 0
        for info in living.list_sandboxes(self, with_stats=False):
            if info.sandbox_id in doomed or info.state not in ("running", "paused"):
                continue
            live += 1
            paused += info.state == "paused"
        return live, paused

    def pooled_count(self) -> int:
        """The warm sandboxes in this engine's pool (0 without one)."""
        return self.pool.pooled() if self.pool is not None else 0

    def is_paused(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox`` is paused, as far as this process or its record knows (cheap)."""
        return living.is_paused(self, sandbox)

    def is_removed(self, sandbox: Sandbox) -> bool:
        """Whether ``sandbox``'s lifetime and keep records are gone (cheap: it was removed)."""
        return living.is_removed(self, sandbox)

    @engine_calls
    def pause(self, sandbox: Sandbox, *, to_disk: bool = False) -> None:
        """Freeze ``sandbox`` (``docker pause``; its egress proxy too); its expiry clock stops.
        ``to_disk``: save its processes to disk and stop its container instead, freeing its
        memory (gVisor only, see :mod:`harness.engine.docker.disk_pause`)."""
        living.pause(self, sandbox, to_disk)

    @engine_calls
    def resume(self, sandbox: Sandbox, *, timeout: float = living.RESUME_TIMEOUT_S) -> float:
        """Thaw ``sandbox`` (paused to disk: restore it) and wait until its agent answers; its
        expiry, moved later by the time it was paused."""
        return living.resume(self, sandbox, timeout)

    @engine_calls
    def keep_alive(self, sandbox: Sandbox, ttl_s: float | None = None) -> float:
        """Set ``sandbox``'s expiry to ``ttl_s`` seconds from now (default its TTL; while
        paused, ``ttl_s`` of running time after the resume); the new expiry (Unix time)."""
        if ttl_s is not None:
            validate_ttl(ttl_s)
        return living.keep_alive(self, sandbox, ttl_s)

    @engine_calls
    def stats(self, sandbox: Sandbox) -> SandboxStats:
        """CPU seconds so far, memory and processes now (its cgroup; paused ones too)."""
        return living.sandbox_stats(self, sandbox)

    @engine_calls
    def snapshot(self, sandbox: Sandbox, name: str, *, replace: bool = False, memory: bool = False,
                 owner: str | None = None) -> SnapshotInfo:
        """Store the writable places and spec of ``sandbox`` as snapshot ``name`` (see
        :mod:`harness.engine.docker.snapshots`); an existing name is ``SnapshotExists``
        unless ``replace``; ``memory``: its processes and memory too (gVisor only, see
        :mod:`harness.engine.docker.memory_snapshots`)."""
        return living.snapshot(self, sandbox, name, replace_existing=replace, owner=owner, memory=memory)

    def snapshots(self) -> list[SnapshotInfo]:
        """The stored snapshots, oldest first."""
        return self.snapshot_store.list()

    def remove_snapshot(self, name: str) -> None:
        self.snapshot_store.remove(name)

    def snapshot_spec(self, name: str) -> SandboxSpec:
        """The spec snapshot ``name`` recorded of its sandbox."""
        return self.snapshot_store.spec(self.snapshot_store.get(name))

    def restore_snapshot_files(self, sandbox: Sandbox, name: str) -> None:
        """Put the files of snapshot ``name`` into ``sandbox`` (a fork made under another spec)."""
        living.restore_files(sandbox, self.snapshot_store.get(name))

    def snapshot_note(self, name: str, file: str) -> bytes | None:
        return self.snapshot_store.note(name, file)

    def write_snapshot_note(self, name: str, file: str, data: bytes) -> None:
        self.snapshot_store.write_note(name, file, data)

    @engine_calls
    def fork(self, source: Sandbox | str, *, from_snapshot: bool = False, name: str | None = None,
             owner: str | None = None, ttl_s: float | None = None) -> Sandbox:
        """A new sandbox with the files of ``source``: a live sandbox (or its name or id),
        snapshotted to a temporary snapshot first, or, with ``from_snapshot``, the snapshot
        named ``source``. It runs the source's spec; ``name``, ``owner`` and ``ttl_s`` as in
        ``create`` (owner default: the source's)."""
        return living.fork(self, source, from_snapshot=from_snapshot, name=name, owner=owner, ttl_s=ttl_s)

    @engine_calls
    def restore(self, name: str) -> Sandbox:
        """Recreate the named sandbox ``name`` (gone, e.g. after the engine restarted) from its
        latest snapshot, under the same name and owner."""
        return living.restore(self, name)

    @engine_calls
    def remove(self, name_or_id: str) -> str:
        """Remove a sandbox by name or id (running, paused or gone), free its name, wait until it is gone; its id."""
        self.teardown.wait(sandbox_id := living.remove(self, name_or_id), teardown.EXIT_DRAIN_S)
        return sandbox_id


def _tool_identity(spec: SandboxSpec) -> tuple[int, int]:
    """The uid/gid tool processes run as: what a rw mount asks for, else the owner of the
    first rw mount not owned by root, else the sandbox user; never 0, and every rw mount
    writable by it (``SandboxSpec.tool_identity`` raises SpecError otherwise)."""
    return spec.tool_identity()


def _parse_hosts(text: str) -> dict[str, str]:
    """``name=ip,name=ip`` (the test-only ``CALLBOX_EGRESS_TEST_HOSTS``)."""
    hosts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise CallboxError(f"CALLBOX_EGRESS_TEST_HOSTS entry {item!r} is not name=ip",
                               code=ErrorCode.INVALID_CONFIG)
        hosts[name] = address
    return hosts
