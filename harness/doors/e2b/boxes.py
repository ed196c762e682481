"""The E2B door's sandboxes: sessions of the executor, with what the E2B API adds to them.

An E2B sandbox is a session of the :class:`~harness.doors.grpc.service.ExecutorService` (one
registry for every door: the same limits per client and in total, the same TTL reaper, the
same policy, audit store and engine), made with ``door="e2b"``, so its id is its run's id
(``e2b-...``). The door keeps beside it what E2B clients give and get: the template, the
metadata, the environment variables, and the envd access token.

Who may do what:

* **Control plane** (REST): the client named by the request's API key (``X-API-KEY``, a
  token of the server's token file) sees and controls only its own sandboxes; anyone
  else's, like one that never existed, is ``not_found`` with the same words.
* **envd** (the sandbox's own API): requests name the sandbox (``E2b-Sandbox-Id``) and carry
  its access token (``X-Access-Token``), returned only to its owner by create and connect.
  A missing or wrong token is ``unauthenticated``; an unknown sandbox ``not_found``.
* **Actions**: each is gated by the sandbox's policy with the actor ``e2b:CLIENT``
  (:meth:`E2bSandboxes.acting`), recorded in the sandbox's run like the gRPC door's.

Its run's meta records the template, the metadata, the start and the SHA-256 digest of its
access token (never the token), so a server that keeps its sandboxes can adopt them after a
restart (:mod:`harness.doors.e2b.restart`).

Lifetime (the E2B ``timeout``): a sandbox's timeout is its session's TTL, at least
``MIN_TIMEOUT_S`` (a shorter one is raised to it) and at most its template policy's ``sandbox.ttl_seconds`` (more is
``permission_denied`` naming that key). :meth:`E2bSandboxes.set_timeout` moves its end to now
+ timeout through the engine's keep-alive (the gRPC door's KeepAlive), which the door's
reaper follows; :meth:`~E2bSandboxes.pause` and :meth:`~E2bSandboxes.resume` are the
engine's (the clock stands still while paused) and the policy's ``pause`` action;
:meth:`~E2bSandboxes.connect` resumes a paused sandbox and never shortens a timeout, only
extends it. :meth:`~E2bSandboxes.metrics` reads the sandbox's cgroup. One the operator removed
(``callbox sandbox rm ID``) is ``not_found`` at once, as a killed one; the executor's reaper ends it.

Templates: ``base`` (what the SDK asks for when its caller names none) is the server's
policy (or the client's profile's) with the sandbox working in ``/home/user``, E2B's home and working directory, where
E2B scripts put their files (a scratch tmpfs of its own, like ``/workspace``, and ``HOME``;
relative paths, the policy's relative path rules included, are anchored there).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import secrets
import threading
import time
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from harness.audit.records import arguments_digest
from harness.audit.store import AuditError
from harness.core.actions import ActionDenied, ActionGate, ActionTicket, ApprovalPending, action_tool
from harness.core.calls import Decision
from harness.core.errors import CallboxError, ErrorCode, short_reason
from harness.core.policy import Policy
from harness.core.sandbox_settings import SandboxSettings
from harness.core.shared_engine import SharedEngine
from harness.doors.e2b.access_tokens import ENVD_TOKENS, TRAFFIC_TOKENS, known_token, token_digest
from harness.doors.e2b.errors import E2bError, from_callbox, from_service_error, invalid, not_found
from harness.doors.e2b.lifecycle import (
    KILL,
    LIFECYCLE_META,
    PAUSE_GRACE_S,
    Lifecycle,
    check_allowed,
    pause_at_timeout,
    pause_box,
    pauses_to_disk,
    wake,
)
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import ClientSession
from harness.engine.base import LivingSandbox, is_living
from harness.engine.docker.lifetime import MIN_TTL_S

if TYPE_CHECKING:
    from harness.doors.e2b.template_boxes import BuiltTemplates

__all__ = ["DEFAULT_TEMPLATE", "DEFAULT_TIMEOUT_S", "DOOR", "E2B_WORKDIR", "MIN_TIMEOUT_S",
           "E2bSandbox", "E2bSandboxes", "Metric", "e2b_errors", "e2b_template"]

log = logging.getLogger("callbox.e2b")

DOOR = "e2b"
E2B_WORKDIR = "/home/user"
"""Where an E2B sandbox works: its commands start there and relative paths resolve there."""
DEFAULT_TEMPLATE = "base"
"""The template the SDK asks for when its caller names none: the server's own policy and image."""
DEFAULT_TIMEOUT_S = 300
"""E2B's timeout when a request gives none (create and connect), capped at the server's limit."""
MIN_TIMEOUT_S = int(MIN_TTL_S)
"""The shortest timeout the engine keeps a sandbox for."""
MIB = 1 << 20

@dataclass(frozen=True)
class Metric:
    """One reading of a sandbox's resources, in the units of E2B's metrics."""

    timestamp: float
    cpu_count: int
    cpu_used_pct: float
    """CPU time used since the previous reading (the first: since the start), as a percent
    of the CPU quota over that wall time."""
    mem_used: int
    mem_total: int
    disk_used: int
    """Not measured: the scratch places are tmpfs, their pages count in ``mem_used``."""
    disk_total: int
    """The sizes of the scratch tmpfs mounts (workspace, /tmp, home) together."""


@dataclass
class E2bSandbox:
    """One E2B sandbox: its executor session and what the E2B API keeps with it."""

    session: ClientSession
    template_id: str
    access_token: str
    metadata: dict[str, str] = field(default_factory=dict)
    env_vars: dict[str, str] = field(default_factory=dict)
    started_at: float = field(default_factory=time.time)
    network_note: str | None = None
    """How its network is less than its create request asked (its info says so)."""
    token_digests: tuple[str, ...] = ()
    """Digests of access tokens handed out before a server restart, still accepted (a client
    holding one goes on without connecting again)."""
    traffic_access_token: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    """What a request to one of its ports carries (``e2b-traffic-access-token``), given only to its owner."""
    traffic_digests: tuple[str, ...] = ()
    """Digests of traffic access tokens handed out before a server restart, still accepted."""
    public_ports: bool = False
    """Whether its ports are served without a credential (the policy's ``sandbox.public_ports``)."""
    lifecycle: Lifecycle = KILL
    """What its timeout does, and whether a request resumes it when paused (:mod:`.lifecycle`)."""
    seq: int = 0
    """Its place in the order the door began serving its sandboxes (lists are paged by it)."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Held by the lifetime operations (pause, resume, connect, timeout), one at a time."""
    _cpu_sample: tuple[float, float] | None = field(default=None, repr=False, compare=False)
    """(wall time, CPU seconds) of the last metrics reading."""

    @property
    def sandbox_id(self) -> str:
        return self.session.sandbox_id

    @property
    def client(self) -> str:
        return self.session.client

    def accepts(self, token: str) -> bool:
        """Whether ``token`` is an access token of this sandbox (the current one or, by its
        digest, one handed out before a restart)."""
        return known_token(token, self.access_token, self.token_digests)

    def accepts_traffic(self, token: str) -> bool:
        """Whether ``token`` is a traffic access token of this sandbox (as :meth:`accepts`)."""
        return known_token(token, self.traffic_access_token, self.traffic_digests)

    @property
    def closed(self) -> bool:
        return self.session.closed

    @property
    def box(self) -> LivingSandbox:
        """The engine sandbox (paused or running)."""
        box = self.session.harness.active_sandbox
        if not is_living(box):
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE, f"sandbox {self.sandbox_id} has no running container")
        return box

    def running(self) -> LivingSandbox:
        """The engine sandbox, for what needs its agent: ``failed_precondition`` while paused
        (the SDK's ``Sandbox.connect`` resumes it)."""
        box = self.box
        if self.session.paused or box.paused:
            raise E2bError(ErrorCode.PAUSED,
                           f"sandbox {self.sandbox_id} is paused; resume it with Sandbox.connect first")
        return box

    @property
    def state(self) -> str:
        """``running`` or ``paused``, as the E2B API names them (a pause from the host,
        ``callbox sandbox pause``, counts: the session's clock stops then too)."""
        if not self.session.paused and not self.closed:
            box = self.session.harness.active_sandbox
            if is_living(box) and box.paused:
                self.session.mark_paused(time.time())
        return "paused" if self.session.paused else "running"

    def end_at(self, now: float | None = None) -> float:
        """When its timeout removes it (while paused: if it were resumed now)."""
        return self.session.expires_at(time.time() if now is None else now)


def e2b_template(policy: Policy) -> Policy:
    """``policy`` with its sandbox working in :data:`E2B_WORKDIR`, which is also its ``HOME``
    (unless the policy's env sets one), as in E2B sandboxes."""
    sandbox = policy.sandbox
    env = {"HOME": E2B_WORKDIR, **sandbox.env}
    if sandbox.workdir == E2B_WORKDIR and env == sandbox.env:
        return policy
    settings = SandboxSettings.model_validate({**sandbox.model_dump(), "workdir": E2B_WORKDIR, "env": env})
    return policy.model_copy(update={"sandbox": settings})


class E2bSandboxes:
    """The E2B sandboxes of one server, over an :class:`ExecutorService`; see the module docstring."""

    def __init__(self, executor: ExecutorService, templates: Mapping[str, Policy] | None = None) -> None:
        self.executor = executor
        self.audit = executor.audit
        self.templates: dict[str, Policy] = dict(templates or {})
        self.templates.setdefault(DEFAULT_TEMPLATE, e2b_template(executor.policy))
        if isinstance(executor.engine_factory, SharedEngine) and executor.policy.pool.size:  # pool E2B's base too
            executor.engine_factory.pool_specs.append(self.templates[DEFAULT_TEMPLATE].sandbox_spec())
        executor.kept_doors.add(DOOR)  # its sandboxes can be adopted after a restart (keep_sandboxes)
        self._lock = threading.Lock()
        self._profile_bases: dict[int, tuple[Policy, Policy]] = {}
        """id of a client's profile policy -> (it, the ``base`` template made of it)."""
        self._boxes: dict[str, E2bSandbox] = {}
        self._seq = itertools.count(1)
        self.built: BuiltTemplates | None = None
        """Templates built through the template API (:mod:`.template_boxes`), if served."""
        self._idempotent: dict[tuple[str, str], tuple[str, str | None]] = {}
        """(client, Idempotency-Key) -> (the request's fingerprint, its sandbox id; None while starting)."""

    # ---- create, find, remove --------------------------------------------------------------------

    def create(self, client: str, *, template_id: str = DEFAULT_TEMPLATE, overrides: SandboxOverrides | None = None,
               metadata: Mapping[str, str] | None = None, idempotency_key: str | None = None,
               fingerprint: str = "", lifecycle: Lifecycle = KILL, public_ports: bool = False) -> E2bSandbox:
        """Start a sandbox of ``template_id`` for ``client`` (``overrides`` tighten its policy:
        the timeout as ``ttl_seconds``, the envVars as ``env``).

        With ``idempotency_key`` (the ``Idempotency-Key`` header), a repeat of the same
        request (``fingerprint``: what identifies it) while its sandbox lives returns that
        sandbox instead of starting another; the key with a different request, or while the
        first is still starting, is ``already_exists`` (409)."""
        check_allowed(lifecycle, self.check_template(template_id, client))
        if not idempotency_key:
            return self._create(client, template_id, overrides, metadata, lifecycle, public_ports)
        slot = (client, idempotency_key)
        with self._lock:
            for key in [k for k, (_, sid) in self._idempotent.items() if sid is not None and sid not in self._boxes]:
                del self._idempotent[key]
            found = self._idempotent.get(slot)
            if found is not None:
                earlier, sandbox_id = found
                if earlier != fingerprint:
                    raise E2bError(ErrorCode.ALREADY_EXISTS,
                        f"Idempotency-Key {idempotency_key!r} was used for a different "
                                   "create request; use a new key for a new sandbox")
                if sandbox_id is None:
                    raise E2bError(ErrorCode.ALREADY_EXISTS,
                        f"the sandbox of Idempotency-Key {idempotency_key!r} is still "
                                   "being created; retry in a moment")
                live = self._boxes.get(sandbox_id)
                if live is not None and not live.closed:
                    return live
            self._idempotent[slot] = (fingerprint, None)
        try:
            sandbox = self._create(client, template_id, overrides, metadata, lifecycle, public_ports)
        except BaseException:
            with self._lock:
                self._idempotent.pop(slot, None)
            raise
        with self._lock:
            self._idempotent[slot] = (fingerprint, sandbox.sandbox_id)
        return sandbox

    def template(self, template_id: str, client: str | None = None) -> Policy | None:
        """The policy of template ``template_id`` for ``client``: ``base`` is made of the
        client's own policy when its profile has one (:mod:`harness.doors.profiles`)."""
        name = template_id or DEFAULT_TEMPLATE
        if name != DEFAULT_TEMPLATE or client is None:
            found = self.templates.get(name)
            if found is None and self.built is not None and client is not None:
                found = self.built.policy(self.template(DEFAULT_TEMPLATE, client) or self.templates[DEFAULT_TEMPLATE],
                                          client, name)
            return found
        policy = self.executor.profiles.of(client)
        if policy is self.executor.policy:
            return self.templates[DEFAULT_TEMPLATE]
        with self._lock:
            known = self._profile_bases.get(id(policy))
            if known is None or known[0] is not policy:
                known = self._profile_bases[id(policy)] = (policy, e2b_template(policy))
        return known[1]

    def check_template(self, template_id: str, client: str | None = None) -> Policy:
        """The policy of template ``template_id`` (for ``client``); ``not_found`` listing the known ones."""
        base = self.template(template_id, client)
        if base is None:
            known = ", ".join(sorted(self.templates))
            raise E2bError(ErrorCode.NOT_FOUND, f"template {template_id!r} not found; this server has: {known}")
        return base

    def _create(self, client: str, template_id: str, overrides: SandboxOverrides | None,
                metadata: Mapping[str, str] | None, lifecycle: Lifecycle = KILL,
                public_ports: bool = False) -> E2bSandbox:
        base = self.check_template(template_id, client)
        wanted = overrides or SandboxOverrides()
        try:
            session = self.executor.create_session(client, wanted, door=DOOR, base_policy=base)
        except ServiceError as error:
            raise from_service_error(error) from None
        sandbox = E2bSandbox(session=session, template_id=template_id or DEFAULT_TEMPLATE,
                             access_token=secrets.token_urlsafe(24), metadata=dict(metadata or {}),
                             env_vars=dict(wanted.env), lifecycle=lifecycle, public_ports=public_ports)
        return self.serve_new(sandbox)

    def serve_new(self, sandbox: E2bSandbox) -> E2bSandbox:
        """Serve ``sandbox``, just started: its timeout counted from now, its run meta written."""
        # The timeout counts from when the sandbox is ready, not from the request: on a busy
        # host a start can take seconds, which a short timeout would otherwise lose.
        try:
            self._keep_alive(sandbox, sandbox.session.ttl_seconds, sandbox.started_at)
        except (CallboxError, E2bError) as error:
            log.warning("sandbox %s: its timeout counts from the request (%s)", sandbox.sandbox_id, error)
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(sandbox.sandbox_id, {
                "template": sandbox.template_id, "metadata": sandbox.metadata, "started_at": sandbox.started_at,
                ENVD_TOKENS: [token_digest(sandbox.access_token)], LIFECYCLE_META: sandbox.lifecycle.meta(),
                TRAFFIC_TOKENS: [token_digest(sandbox.traffic_access_token)], "public_ports": sandbox.public_ports})
        if self.built is not None and sandbox.template_id not in self.templates:
            try:  # its files, start and ready commands; a sandbox that does not start is removed
                with e2b_errors(sandbox):
                    self.built.start(self, sandbox)
            except BaseException:
                self.executor.delete_session(sandbox.session, "template_start_failed")
                raise
        self.add_adopted(sandbox)
        return sandbox

    def set_lifecycle(self, sandbox: E2bSandbox, lifecycle: Lifecycle) -> None:
        """Give a live ``sandbox`` another lifecycle (v1's resume with ``autoPause``)."""
        check_allowed(lifecycle, sandbox.session.policy)
        sandbox.lifecycle = lifecycle
        sandbox.session.on_expiry = (lambda _session: pause_at_timeout(self, sandbox)) if lifecycle.pauses else None
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(sandbox.sandbox_id, {LIFECYCLE_META: lifecycle.meta()})

    def add_adopted(self, sandbox: E2bSandbox) -> None:
        """Serve ``sandbox`` (also one adopted after a server restart: :mod:`.restart`); one
        whose timeout pauses it is offered to :func:`.lifecycle.pause_at_timeout` by the reaper."""
        if sandbox.lifecycle.pauses:
            sandbox.session.on_expiry = lambda _session: pause_at_timeout(self, sandbox)
        with self._lock:
            sandbox.seq = next(self._seq)
            self._boxes[sandbox.sandbox_id] = sandbox

    def _live(self, sandbox_id: str) -> E2bSandbox | None:
        with self._lock:
            sandbox = self._boxes.get(sandbox_id)
            if sandbox is not None and sandbox.closed:  # expired, deleted through another door, shut down
                del self._boxes[sandbox_id]
                return None
            return None if sandbox is not None and sandbox.session.removed else sandbox

    def find(self, sandbox_id: str) -> E2bSandbox | None:
        """The live sandbox ``sandbox_id`` whoever owns it, or None (for what tells no more
        than whether it runs, like envd's ``/health``)."""
        return self._live(sandbox_id)

    def every(self) -> list[E2bSandbox]:
        """Every live sandbox, whoever owns it (to find the one a signed file URL names)."""
        with self._lock:
            return [sandbox for sandbox in self._boxes.values() if not sandbox.closed]

    def find_folded(self, sandbox_id: str) -> E2bSandbox | None:
        """:meth:`find` ignoring case: an id read from a host name, which clients lower-case."""
        folded = sandbox_id.lower()
        with self._lock:
            found = [sid for sid in self._boxes if sid.lower() == folded]
        return self._live(found[0]) if len(found) == 1 else None

    def get(self, client: str, sandbox_id: str) -> E2bSandbox:
        """``client``'s live sandbox ``sandbox_id``; ``not_found`` for anyone else's or none."""
        sandbox = self._live(sandbox_id)
        if sandbox is None or sandbox.client != client:
            raise not_found("sandbox", sandbox_id)
        return sandbox

    def for_envd(self, sandbox_id: str, access_token: str | None) -> E2bSandbox:
        """The sandbox an envd request names, if it carries that sandbox's access token
        (then :meth:`awake` before the request is served)."""
        sandbox = self._live(sandbox_id)
        if sandbox is None:
            raise not_found("sandbox", sandbox_id)
        if not access_token or not sandbox.accepts(access_token):
            raise E2bError(ErrorCode.UNAUTHENTICATED,
                           f"the X-Access-Token header is missing or not the access token of sandbox {sandbox_id}")
        return sandbox

    def awake(self, sandbox: E2bSandbox) -> None:
        """Before an envd request: a paused ``sandbox`` is resumed if it auto-resumes, else
        refused (:func:`.lifecycle.wake`); a running one is left alone."""
        wake(self, sandbox)

    def list(self, client: str, *, metadata: Mapping[str, str] | None = None,
             states: Collection[str] | None = None) -> list[E2bSandbox]:
        """``client``'s live sandboxes in the order the door began serving them (``seq``);
        with ``metadata``, those whose metadata has every one of its pairs; with ``states``,
        those in one of them (running, paused)."""
        with self._lock:
            for sid in [sid for sid, s in self._boxes.items() if s.closed]:
                del self._boxes[sid]
            mine = sorted((s for s in self._boxes.values() if s.client == client and not s.session.removed),
                          key=lambda s: s.seq)
        wanted = dict(metadata or {})
        return [s for s in mine
                if all(s.metadata.get(key) == value for key, value in wanted.items())
                and (not states or s.state in states)]

    def kill(self, client: str, sandbox_id: str) -> None:
        """Destroy ``client``'s sandbox (``not_found`` for anyone else's)."""
        sandbox = self.get(client, sandbox_id)
        with self._lock:
            self._boxes.pop(sandbox_id, None)
        self.executor.delete_session(sandbox.session, "deleted")

    # ---- lifetime: timeout, pause, resume, connect, metrics ---------------------------------------

    def timeout_limit(self, template_id: str, client: str | None = None) -> int:
        """The longest timeout a sandbox of ``template_id`` may have: its policy's ``sandbox.ttl_seconds``."""
        base = self.template(template_id, client) or self.templates[DEFAULT_TEMPLATE]
        return base.sandbox.ttl_seconds

    def check_timeout(self, template_id: str, seconds: object, what: str = "timeout",
                      client: str | None = None) -> int:
        """``seconds`` as a timeout for a sandbox of ``template_id``: ``invalid_argument`` for
        anything but a whole number of seconds, ``permission_denied`` above the limit. A
        shorter one than the engine keeps a sandbox for (``MIN_TIMEOUT_S``) is that minimum:
        the sandbox ends a few seconds later than asked (its ``endAt`` says when), not never."""
        if isinstance(seconds, bool) or not isinstance(seconds, int) or seconds < 0:
            raise invalid(f"{what}: {seconds!r} is not a whole number of seconds")
        if seconds < MIN_TIMEOUT_S:
            log.info("a %s of %d s is below this server's minimum: %d s", what, seconds, MIN_TIMEOUT_S)
            return MIN_TIMEOUT_S
        limit = self.timeout_limit(template_id, client)
        if seconds > limit:
            raise E2bError(ErrorCode.PERMISSION_DENIED,
                           f"{what}: {seconds} s is above this server's limit of {limit} s (sandbox.ttl_seconds "
                           "in its policy); ask for at most that")
        return seconds

    def set_timeout(self, sandbox: E2bSandbox, seconds: int) -> float:
        """Make ``sandbox`` end ``seconds`` from now (shorter or longer than before, at most
        the limit; while paused: that much running time once resumed); its new end."""
        seconds = self.check_timeout(sandbox.template_id, seconds, client=sandbox.client)
        with sandbox.lock, e2b_errors(sandbox):
            return self._extend(sandbox, seconds)

    def _keep_alive(self, sandbox: E2bSandbox, seconds: int, now: float) -> None:
        """End ``sandbox`` ``seconds`` from now; the engine's clock of one its timeout pauses
        ends ``PAUSE_GRACE_S`` later (its agent must not stop before the reaper pauses it)."""
        grace = PAUSE_GRACE_S if sandbox.lifecycle.pauses else 0.0
        expires = sandbox.box.keep_alive(float(seconds) + grace)
        sandbox.session.mark_kept_alive(expires - grace, now)

    def _extend(self, sandbox: E2bSandbox, seconds: int) -> float:
        now = time.time()
        self._keep_alive(sandbox, seconds, now)
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(sandbox.sandbox_id, {"timeout_s": seconds, "timeout_set_at": now})
        return sandbox.end_at(now)

    def pause(self, sandbox: E2bSandbox, *, by: str | None = None) -> None:
        """Freeze ``sandbox`` (the policy's ``pause`` action, op pause; ``by``: what paused it
        if not its client, e.g. ``timeout``); ``already_exists`` (409, as E2B answers) if it
        is paused already."""
        with sandbox.lock:
            if sandbox.state == "paused":
                raise E2bError(ErrorCode.ALREADY_EXISTS, f"sandbox {sandbox.sandbox_id} is already paused")
            to_disk = pauses_to_disk(sandbox.box)
            details = {"op": "pause", **({"by": by} if by else {}), **({"to_disk": True} if to_disk else {})}
            with self.acting(sandbox, "pause", details), e2b_errors(sandbox):
                pause_box(sandbox.box)
                sandbox.session.mark_paused(time.time())

    def resume(self, sandbox: E2bSandbox) -> None:
        """Thaw a paused ``sandbox`` (the policy's ``pause`` action, op resume), its clock
        moved later by the pause; ``failed_precondition`` (409) if it is running."""
        with sandbox.lock:
            if sandbox.state != "paused":
                raise E2bError(ErrorCode.CONFLICT, f"sandbox {sandbox.sandbox_id} is running, not paused")
            self._resume(sandbox)

    def _resume(self, sandbox: E2bSandbox) -> None:
        with self.acting(sandbox, "pause", {"op": "resume"}), e2b_errors(sandbox):
            sandbox.session.mark_resumed(sandbox.box.resume())

    def connect(self, sandbox: E2bSandbox, seconds: int) -> bool:
        """Resume ``sandbox`` if it is paused, then make it last at least ``seconds`` more
        (a longer timeout it has stays); whether it was resumed."""
        seconds = self.check_timeout(sandbox.template_id, seconds, client=sandbox.client)
        with sandbox.lock:
            resumed = sandbox.state == "paused"
            if resumed:
                self._resume(sandbox)
            if sandbox.end_at() < time.time() + seconds:
                with e2b_errors(sandbox):
                    self._extend(sandbox, seconds)
            return resumed

    def metrics(self, sandbox: E2bSandbox) -> Metric:
        """The sandbox's resources now, from its cgroup (works while paused)."""
        with e2b_errors(sandbox):
            box = sandbox.box
            stats = box.stats()
        now = time.time()
        spec = box.spec
        with sandbox.lock:
            since, cpu_before = sandbox._cpu_sample or (sandbox.started_at, 0.0)
            sandbox._cpu_sample = (now, stats.cpu_usage_s)
        wall = max(now - since, 1e-3)
        used = max(0.0, stats.cpu_usage_s - cpu_before)
        pct = min(100.0, 100.0 * used / (wall * spec.cpus))
        scratch = spec.effective_workspace_size + spec.effective_tmp_size + spec.effective_home_size
        return Metric(timestamp=now, cpu_count=max(1, math.ceil(spec.cpus)), cpu_used_pct=round(pct, 2),
                      mem_used=stats.memory_bytes, mem_total=spec.memory, disk_used=0, disk_total=scratch)

    # ---- policy and audit of sandbox actions -------------------------------------------------------

    def gate(self, sandbox: E2bSandbox) -> ActionGate:
        """The action gate of the sandbox's policy and run, the actor ``e2b:CLIENT``."""
        return ActionGate(sandbox.session.policy, self.audit, run_id=sandbox.sandbox_id,
                          actor=f"{DOOR}:{sandbox.client}")

    @contextlib.contextmanager
    def acting(self, sandbox: E2bSandbox, action: str, details: Mapping[str, Any], *,
               floor: Decision | None = None) -> Iterator[ActionTicket]:
        """Authorize ``action`` (the more restrictive of its policy decision and ``floor``):
        ``permission_denied`` if denied; if the policy asks, ``failed_precondition`` naming the
        approval. E2B clients cannot send an approval id, so the same action repeated after a
        person approved it uses that approval (once). Then record the outcome when the block
        ends: ok, cancelled (the client went away: an ok end), or failed."""
        gate = self.gate(sandbox)
        full = {"sandbox": sandbox.sandbox_id, **details}
        try:
            ticket = gate.authorize(action, full, approval_id=_approval_of(gate, action, full), floor=floor)
        except ActionDenied as denied:
            raise from_callbox(denied) from None
        except ApprovalPending as pending:
            raise _asked(gate, pending) from None
        try:
            yield ticket
        except GeneratorExit:
            gate.finish_logged(ticket, ok=True, detail={**ticket.outcome, "ended": "cancelled"})
            raise
        except BaseException as exc:
            gate.finish_logged(ticket, ok=False, detail={**ticket.outcome, "error": short_reason(exc)})
            raise
        gate.finish_logged(ticket, ok=True, detail=ticket.outcome)


def _approval_of(gate: ActionGate, action: str, details: Mapping[str, Any]) -> str | None:
    """The approval a person gave (or has yet to give) to this very action, if any."""
    tool = action_tool(action)
    digest = arguments_digest({"actor": gate.actor, **details})
    try:
        for state in ("approved", "pending"):
            for approval in gate.audit.list_approvals(state, run_id=gate.run_id):
                if approval.tool == tool and approval.args_digest == digest:
                    return approval.id
    except AuditError as error:
        log.error("cannot look up the approvals of run %s: %s", gate.run_id, error.message)
    return None


def _asked(gate: ActionGate, pending: ApprovalPending) -> E2bError:
    approval_id = pending.approval_id
    try:
        why = gate.audit.get_approval(approval_id).reason
    except AuditError:
        why = f"approval required by policy ({pending.rule})"
    return E2bError(ErrorCode.APPROVAL_PENDING, f"{why}; it waits for approval {approval_id}: approve it with "
                    f"`callbox approvals approve {approval_id}` (or deny it), then do the same again, "
                    "which uses the approval once")


@contextlib.contextmanager
def e2b_errors(sandbox: E2bSandbox | None = None) -> Iterator[None]:
    """callbox errors as E2bError; an operation of a sandbox removed meanwhile is ``not_found``."""
    try:
        yield
    except E2bError:
        raise
    except ServiceError as error:
        raise from_service_error(error) from None
    except CallboxError as error:
        if sandbox is not None and sandbox.closed:
            raise not_found("sandbox", sandbox.sandbox_id) from None
        raise from_callbox(error) from None
