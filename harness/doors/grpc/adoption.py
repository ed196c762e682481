"""A gRPC server that keeps its sandboxes across its own restart (``keep_sandboxes``).

A server started with ``keep_sandboxes=True`` leaves its clients' sandboxes running when it
stops, and the next server on the same state (the same audit store, Docker engine and
runtime directory) *adopts* them when it starts: each client sees its sandboxes again under
the same ids, with the same files, expiry clock, pause state and policy, and its pending
approvals stay resolvable (they live in the audit store). What it takes:

* **Ownership: a keep record, not the owner label.** A container's ``callbox.owner`` label
  names the creating process (host, pid, start time) and Docker cannot change labels after
  creation; gc reaps a sandbox whose owner process is gone. Rather than a second notion of
  "owner" (a server identity whose liveness gc would have to judge), a keeping server
  marks each sandbox it registers with the engine's existing keep record
  (``DockerEngine.keep(sandbox, run_id=...)``, :mod:`harness.engine.docker.kept`): gc
  never reaps a kept sandbox as an orphan, only once its keep expired, i.e. at the
  sandbox's own expiry (a later expiry from a keep-alive or a pause, kept in its lifetime
  record, counts: :func:`harness.engine.docker.lifetime.judge`). The keep is written at
  creation, not at stop, so a server killed with SIGKILL or by the OOM killer keeps its
  sandboxes too; nothing outlives its TTL, and ``destroy`` removes the record with the
  container. The restarted server's own engine runs gc when it connects and leaves them.
* **Which server serves a run.** Each sandbox's run records in its meta the container
  (``container``), whether it is kept (``kept``), the overrides it was created with
  (``overrides``; environment variable *names* only: the values are read back from the
  sandbox's spec, so the audit store holds no secrets) and the serving instance
  (``server``: host/pid/start/nonce). A run is adopted only when its serving instance is
  gone: a dead process, or a stopped server of this very process (a test that stops a
  server and starts another). A second server alive on the same audit store keeps its own.
* **Adoption** (:func:`adopt`, when the server starts): every open run of the door
  (``grpc``, or another door's with its :class:`DoorHooks`) with a container is looked at.
  A kept one whose sandbox the engine can open again (running or paused) becomes a live
  session of its client, with its run's creation time, the expiry (or pause and time left)
  the engine's records hold, and its client's policy (the server's or its profile's; the
  door's hooks may say otherwise) tightened by its recorded overrides (overrides that policy no longer
  allows: the sandbox is destroyed, the run ends ``policy_changed``). One whose container is gone (removed
  while the server was down, the engine restarted, or it expired) has its run ended
  (``sandbox_gone``); so has any run of a dead server whose sandbox was not kept.
* **Calls in flight.** A stopping server cancels its running calls, and each records that
  (``sandbox_unavailable``). A call still ``running`` in the store when its process is gone
  (the server was killed) gets a result saying it was interrupted and that whether its
  command finished is unknown (``server_stopped``, :mod:`harness.audit.interruptions`;
  ``command_started`` is not false, so a re-send of the call_id returns that record and
  never runs it again). A call pending approval stays
  pending; once approved, a re-send runs it exactly once, before or after the restart.
* **Other doors.** The E2B door's sandboxes are sessions of the same service, kept the same
  way once that door asks for it (``ExecutorService.kept_doors``). What the door keeps
  beside a session (template, metadata, envd access token) is its own: it adopts its runs
  with :class:`DoorHooks` (the policy a run's sandbox starts from, and a callback that
  rebuilds the door's state of an adopted session; :mod:`harness.doors.e2b.restart`).

Paused runs of the agent loop (``callbox run``) never belong to a server: their checkpoint is in
the audit store and their sandbox has a keep record of its own, so a server's restart
leaves them as they are (a later ``callbox run --resume`` continues them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

from harness.audit.interruptions import SERVER_STOPPED, interruption
from harness.audit.store import AuditError, AuditStore, RunRecord
from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.core.session import Session
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.overrides import SandboxOverrides, sandbox_policy
from harness.doors.grpc.sandboxes_snapshots import _overrides as overrides_from_json
from harness.doors.grpc.sessions import ClientSession
from harness.engine.base import Sandbox
from harness.engine.docker import labels
from harness.engine.docker.engine import SandboxExpired, SandboxNotFound, SandboxPaused
from harness.engine.docker.lifetime import LifetimeRecord

if TYPE_CHECKING:
    from harness.doors.grpc.service import ExecutorService

__all__ = ["Adoption", "DoorHooks", "adopt", "grpc_hooks", "keep_past_server", "new_instance", "retire_instance",
           "run_meta"]

log = logging.getLogger("callbox.executor")

DOOR = "grpc"
SERVER = "server"
KEPT = "kept"
OVERRIDES = "overrides"
ENV_KEYS = "env_keys"

_live: set[str] = set()
_live_lock = threading.Lock()


# ---- which server instance serves a run --------------------------------------------------------


def new_instance() -> str:
    """A label for one server of this process (``host/pid/start/nonce``), live until retired."""
    label = f"{labels.Owner.current().label()}/{secrets.token_hex(4)}"
    with _live_lock:
        _live.add(label)
    return label


def retire_instance(label: str) -> None:
    """The server ``label`` stopped: its kept runs may be adopted (also by this process)."""
    with _live_lock:
        _live.discard(label)


def instance_alive(label: str) -> bool:
    """Whether the server instance ``label`` may still serve its runs (a process on another
    host, or one that cannot be told, counts as alive: its runs are left alone)."""
    process, _, _ = label.rpartition("/")
    owner = labels.Owner.parse(process)
    if owner is None:
        return False
    if process == labels.Owner.current().label():
        with _live_lock:
            return label in _live
    return labels.owner_alive(owner, socket.gethostname()) is not False


# ---- what a keeping server records when it registers a sandbox ---------------------------------


def run_meta(session: ClientSession, instance: str, kept: bool) -> dict[str, Any]:
    """The run meta a registered sandbox gets (see the module docstring)."""
    box = session.harness.active_sandbox
    overrides = dataclasses.asdict(session.overrides)
    env_keys = sorted(overrides.pop("env", {}))
    meta: dict[str, Any] = {SERVER: instance, KEPT: kept, OVERRIDES: {**overrides, ENV_KEYS: env_keys}}
    if box is not None:
        meta["container"] = box.id
    return meta


def keep_past_server(box: Sandbox | None, run_id: str) -> bool:
    """Mark ``box`` kept for run ``run_id`` so gc spares it when this process is gone (until
    its expiry); False for a sandbox of an engine without keep records (one that has no
    expiry of its own: not a Docker or Ray engine's)."""
    expires = getattr(box, "expires", None)
    if box is None or not isinstance(expires, float | int):
        return False
    # Its expiry as created (a keep-alive or pause since moves its lifetime record, which gc
    # also follows); given, so keeping it asks the engine nothing (0.5 ms instead of 1.6 ms).
    box.keep(run_id=run_id, until=float(expires) or None)
    return True


# ---- adoption --------------------------------------------------------------------------------------


@dataclass
class Adoption:
    """What a starting server found: sandboxes adopted, runs ended, calls marked interrupted."""

    adopted: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)
    """run id -> the reason its run was ended."""
    interrupted: list[tuple[str, str]] = field(default_factory=list)
    """(run id, call id) of calls found running with their process gone."""
    left: list[str] = field(default_factory=list)
    """Runs left alone (another live server's, or a sandbox that cannot be reached now)."""

    def summary(self) -> str:
        return (f"adopted {len(self.adopted)} sandbox(es), ended {len(self.ended)} run(s) whose sandbox is gone, "
                f"marked {len(self.interrupted)} interrupted call(s)")


@dataclass(frozen=True)
class DoorHooks:
    """How one door's runs are adopted: which runs (``door``, their meta's ``door``), the
    policy a run's sandbox starts from before its recorded overrides (``base_policy``; None:
    this server can no longer make it, e.g. a template it lacks, and the sandbox is
    destroyed), and what the door adds to an adopted session (``adopted``, called once it is
    live; it must not raise)."""

    door: str
    base_policy: Callable[[RunRecord], Policy | None]
    adopted: Callable[[ClientSession, RunRecord], None] = lambda session, run: None


def grpc_hooks(service: ExecutorService) -> DoorHooks:
    """The gRPC door's: a sandbox starts from its client's policy (its profile's or the server's)."""
    return DoorHooks(DOOR, lambda run: service.profiles.of(str(run.meta["client"])))


def adopt(service: ExecutorService, hooks: DoorHooks | None = None) -> Adoption:
    """Adopt what earlier servers on this audit store left of the runs of ``hooks.door``
    (default: the gRPC door's; see the module docstring)."""
    hooks = hooks or grpc_hooks(service)
    found = Adoption()
    engine: KeepingEngine | None = None
    for run in service.audit.open_runs():
        meta = run.meta
        sandbox_id = meta.get("container")
        if (meta.get("door") != hooks.door or not isinstance(sandbox_id, str)
                or not isinstance(meta.get("client"), str)):
            continue
        server = meta.get(SERVER)
        if not isinstance(server, str) or instance_alive(server):
            continue  # an older server's run (nothing says whose), or a live server's
        if engine is None:
            engine = _engine(service)
        if not meta.get(KEPT):
            if not _container_exists(engine, sandbox_id):
                _end(service.audit, run, "sandbox_gone", found)
            else:
                found.left.append(run.id)
            continue
        try:
            box = engine.open(sandbox_id)
        except (SandboxNotFound, SandboxExpired):  # SandboxGone is a SandboxExpired
            _end(service.audit, run, "sandbox_gone", found)
            continue
        except SandboxPaused:
            log.warning("sandbox %s of run %s was paused outside callbox; resume it (docker unpause) and restart "
                        "the server to adopt it", sandbox_id, run.id)
            found.left.append(run.id)
            continue
        except CallboxError as error:
            log.warning("cannot adopt sandbox %s of run %s: %s", sandbox_id, run.id, error.message)
            found.left.append(run.id)
            continue
        _interrupt_calls(service.audit, run.id, found)
        session = _session(service, run, box, engine, hooks.base_policy(run))
        if session is None:
            box.destroy()
            _end(service.audit, run, "policy_changed", found)
            continue
        with contextlib.suppress(AuditError):
            service.audit.update_run_meta(run.id, {SERVER: service.instance})
        service.adopt_session(session)
        hooks.adopted(session, run)
        found.adopted.append(run.id)
        log.info("adopted sandbox %s of client %s (run %s%s)", sandbox_id, session.client, run.id,
                 ", paused" if session.paused else "")
    return found


class KeepingEngine(Protocol):
    """What adoption needs of an engine: the Docker engine's, and the Ray engine's across its nodes."""

    def open(self, name_or_id: str) -> Any: ...

    def sandbox_exists(self, sandbox_id: str) -> bool: ...

    def lifetime_record(self, sandbox_id: str) -> LifetimeRecord | None: ...


def _engine(service: ExecutorService) -> KeepingEngine:
    engine = service.engine_factory()
    if not all(hasattr(engine, name) for name in ("open", "sandbox_exists", "lifetime_record")):
        raise CallboxError("keep_sandboxes needs the Docker or the Ray engine (their keep records and labels)",
                           code=ErrorCode.INVALID_CONFIG)
    return cast(KeepingEngine, engine)


def _container_exists(engine: KeepingEngine, sandbox_id: str) -> bool:
    try:
        return engine.sandbox_exists(sandbox_id)
    except CallboxError:
        return True  # cannot tell: leave the run alone


def _session(service: ExecutorService, run: RunRecord, box: Any, engine: KeepingEngine,
             base: Policy | None) -> ClientSession | None:
    """The live session of an opened sandbox ``box`` of ``run``, its policy ``base`` tightened
    by its recorded overrides; None if there is no ``base`` or it no longer allows them."""
    client = str(run.meta["client"])
    if base is None:
        log.warning("sandbox %s of client %s is not adopted: this server cannot make it any more (what it was "
                    "made of is gone from its configuration); it is destroyed", box.id, client)
        return None
    recorded = run.meta.get(OVERRIDES)
    overrides = _overrides(recorded, box.spec.env) if isinstance(recorded, Mapping) else SandboxOverrides()
    try:
        policy = sandbox_policy(base, overrides, service.profiles.exposed(client))
    except (ServiceError, CallboxError) as refusal:
        log.warning("sandbox %s of client %s is not adopted: this server's policy refuses what it was created "
                    "with (%s); it is destroyed", box.id, client, refusal)
        return None
    harness = Session(service.registry, policy, service.audit, run_id=run.id, engine_factory=service.engine_factory)
    harness.attach(box)
    session = ClientSession(client, harness, policy, service.registry.exposed_names(policy),
                            policy.sandbox.ttl_seconds, overrides)
    record = engine.lifetime_record(box.id)
    paused_at = record.paused_at if record is not None else None
    if paused_at is None and box.paused:
        paused_at = time.time()
    session.kept = True
    session.restore_clock(created=run.created, expires=box.expires, paused_at=paused_at,
                          remaining=record.paused_remaining_s if record is not None else None)
    return session


def _overrides(recorded: Mapping[str, Any], env: Mapping[str, str]) -> SandboxOverrides:
    """The overrides a run recorded, the environment's values taken from the sandbox's spec."""
    data = dict(recorded)
    keys = data.pop(ENV_KEYS, [])
    data["env"] = {key: env[key] for key in keys if key in env}
    return overrides_from_json(data)


def _end(audit: AuditStore, run: RunRecord, reason: str, found: Adoption) -> None:
    _interrupt_calls(audit, run.id, found)
    with contextlib.suppress(AuditError):
        audit.end_run(run.id, reason)
    found.ended[run.id] = reason
    log.info("run %s of client %s ended: its sandbox is gone (%s)", run.id, run.meta.get("client"), reason)


def _interrupt_calls(audit: AuditStore, run_id: str, found: Adoption) -> None:
    """Record an outcome for each call of ``run_id`` left unfinished by a process that is
    provably gone (:meth:`AuditStore.interrupt_orphan`)."""
    for call in audit.calls_for_run(run_id):
        if call.get("state") == "done":
            continue
        try:
            record = audit.interrupt_orphan(run_id, str(call["call_id"]), cause=SERVER_STOPPED)
        except AuditError:
            continue
        if record is None or interruption(record.result) is None:
            continue  # its process may be alive, or it finished meanwhile
        found.interrupted.append((run_id, str(call["call_id"])))
        log.warning("call %s of run %s was running when its server stopped; recorded as interrupted",
                    call["call_id"], run_id)
