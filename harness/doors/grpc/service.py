"""The ``harness.v1.Executor`` servicer: sandboxes owned by clients, tool calls streamed.

A *session* is one sandbox and the :class:`~harness.core.session.Session` of its run (the
sandbox id is the run id), owned by the client name its bearer token maps to
(:mod:`harness.doors.grpc.tokens`). Every session shares the server's registry, audit store and
Docker engine; its policy is the server's (or the client's profile's:
:mod:`harness.doors.profiles`), tightened by the ``CreateSandbox`` overrides
(:func:`sandbox_policy`). Decisions made here:

* **Ownership.** A sandbox, its run and its approvals exist only for the client that
  created it: any other client gets NOT_FOUND with the same words as for an id that was
  never issued, so ids cannot be probed. Runs are marked in the audit store
  (``meta = {"door": "grpc", "client": NAME}``), so ``GetRun``/``ListRuns`` keep working
  for the client after a server restart; runs of other doors (CLI, MCP) are not shown.
* **Overrides only tighten.** ``memory_bytes``, ``cpus``, ``pids``, ``ttl_seconds`` at most
  the server's; ``network`` the server's own or ``none``; ``allowed_tools`` a subset of what the server
  exposes; ``mounts`` only under the server policy's ``allowed_mount_roots`` (checked
  lexically before the host path is even resolved, so a client learns nothing about paths
  outside them; no roots means no client mounts), added to the policy's own mounts;
  ``env`` is added. Looser is PERMISSION_DENIED naming the field; out of range is
  INVALID_ARGUMENT. The workdir cannot be overridden: relative path rules of the policy
  are anchored at it.
* **Eager start.** ``CreateSandbox`` starts the container (so engine or image problems
  surface there, and the limits count real containers); it is destroyed by
  ``DeleteSandbox``, when its ``ttl_seconds`` pass (the reaper), at shutdown, or once the
  operator removed it (:attr:`ClientSession.removed`: NOT_FOUND at once, ended by the reaper).
* **Limits.** Live sandboxes per client and in total (creations in progress count), and the
  client's quotas (:mod:`harness.doors.quota_ledger`; ``calls_per_minute`` at each CallTool),
  each a RESOURCE_EXHAUSTED with ``retryable`` set and a sentence naming the limit.
* **Cancellation.** Each ``CallTool`` runs ``Session.call`` in a worker thread (kept for the
  next call: :mod:`harness.doors.grpc.workers`), with a
  :class:`~harness.engine.cancel.CallScope` of its own, and streams the output chunks it
  reports. The scope holds the streaming agent RPCs (``Exec``, bash ``Run``) the call makes;
  when the ``CallTool`` RPC ends early (client cancel, deadline passed) it is cancelled, and
  when the sandbox is deleted, expires or the server stops, the session cancels it: the
  agent then kills the command's whole process tree (a bash session is killed and marked
  for restart). A call whose sandbox ended before its tool asked for it gets a
  ``sandbox_unavailable`` result and starts no sandbox. The call is still recorded in the
  audit store with what it got, so a retry of the same call_id returns that record rather
  than running again (a failure from before the command started, such as an unreachable
  engine, is the one record a retry runs past).
* **Approvals and roles.** Only an operator's token (:mod:`~harness.doors.grpc.tokens`)
  resolves approvals (``by = grpc:NAME``), of any run: a client never resolves one, not
  even of its own calls, so an approval always means a person. An operator also acts on
  any client's sandbox and reads any run of this door; a client only its own.
* **Sandboxes.** The ``harness.v1.Sandboxes`` service (:mod:`harness.doors.grpc.sandboxes`)
  works on these sessions (``client_of``, ``session_of``); a fork becomes a session of the
  same client through ``reserved`` and ``register``, like a created sandbox. A paused
  sandbox's ``CallTool`` is FAILED_PRECONDITION, PAUSED.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
from google.protobuf import struct_pb2

from harness.audit.store import AuditError, AuditStore
from harness.core.calls import ToolCall
from harness.core.errors import CallboxError, ErrorCode
from harness.core.formats import tool_definitions
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.core.shared_engine import SharedEngine
from harness.doors.grpc import adoption
from harness.doors.grpc.errors import (
    ServiceError,
    abort,
    creation_failure,
    handle_errors,
    not_found,
    paused,
    quota_refused,
)
from harness.doors.grpc.messages import (
    FORMAT_ENUM,
    json_text,
    parse_format,
    result_message,
)
from harness.doors.grpc.overrides import SandboxOverrides, sandbox_policy
from harness.doors.grpc.run_records import DOOR, RunRecordRpcs
from harness.doors.grpc.sessions import REMOVED, ClientSession, Limits
from harness.doors.grpc.tokens import TokenSet, bearer_token
from harness.doors.grpc.workers import Workers
from harness.doors.profiles import ClientPolicies, PolicySource
from harness.doors.quota_ledger import QuotaExceeded, QuotaKeeper, Reservation
from harness.doors.start_queue import StartQueue
from harness.engine.base import Engine
from harness.engine.cancel import CallScope
from harness.engine.select import choice_of, engine_connector
from harness.engine.spec import SandboxSpec
from harness.telemetry import metrics, tracing
from harness.v1 import executor_pb2, executor_pb2_grpc

__all__ = ["ExecutorService"]

log = logging.getLogger("callbox.executor")


CREATE_WAIT_AT_SHUTDOWN_S = 45.0


class ExecutorService(RunRecordRpcs, executor_pb2_grpc.ExecutorServicer):
    """Sessions of every client of one server; see the module docstring."""

    def __init__(
        self,
        *,
        registry: ToolRegistry,
        policy: Policy,
        audit: AuditStore,
        tokens: TokenSet,
        limits: Limits | None = None,
        engine_factory: Callable[[], Engine] | None = None,
        keep_sandboxes: bool = False,
        quotas: QuotaKeeper | None = None,
        policies: PolicySource | None = None,
    ) -> None:
        policy.check_tools(t.definition for t in registry.tools())
        self.registry = registry
        self.policy = policy
        self.audit = audit
        metrics.watch_approvals(str(audit.path), audit)  # the approvals pending, in /metrics
        metrics.watch_audit_chain(str(audit.path), audit)  # the audit chain's head, in /metrics and the log
        self.tokens = tokens
        self.limits = limits or Limits()
        # The policy's engine (Docker's unless it names another), without retries: a server
        # fails at once when the engine is not there.
        self.engine_factory = engine_factory or SharedEngine(
            engine_connector(choice_of(policy.engine, policy.ray), retry=False), pool=policy.pool,
            pool_specs=[policy.sandbox_spec()] if policy.pool.size else [], room=self._pool_room)
        self.keep_sandboxes = keep_sandboxes
        """Leave the sandboxes of the ``kept_doors`` running at shutdown for the next server (:mod:`.adoption`)."""
        self.kept_doors: set[str] = {DOOR}
        """The doors whose sandboxes ``keep_sandboxes`` keeps: those that can adopt them again
        (the E2B door adds itself)."""
        self.instance = adoption.new_instance()
        self.left_running: list[str] = []
        """The sandboxes ``shutdown`` left running (``keep_sandboxes``)."""
        self.exposed = registry.exposed_names(policy)
        self.quotas = quotas or QuotaKeeper()
        """Every client's quotas (shared with the other doors of the server)."""
        self.profiles = ClientPolicies(policy, registry, policies)
        """The policy each client's sandboxes start from (its profile's, or ``policy``)."""
        self._lock = threading.Condition()
        self._sessions: dict[str, ClientSession] = {}
        self._creating: dict[str, int] = {}
        self._closing = False
        self._stop_reaper = threading.Event()
        self._reaper: threading.Thread | None = None
        self.starts = StartQueue(lambda: self.limits.max_starting, over_share=self._over_share)
        """The line every door's sandbox starts wait in beyond what the host starts at once."""
        self._workers = Workers("callbox-call")
        """Run each CallTool's call beside its RPC's thread (threads kept between calls)."""

    # ---- who is asking, and what they own ----------------------------------------------------

    def _client(self, context: grpc.ServicerContext) -> str:
        name = self.tokens.lookup(bearer_token(context.invocation_metadata()))
        if name is None:  # the auth interceptor lets no such request through; be safe anyway
            raise ServiceError(ErrorCode.UNAUTHENTICATED, "the bearer token is not valid for this server")
        return name

    def _session(self, sandbox_id: str, client: str) -> ClientSession:
        with self._lock:
            session = self._sessions.get(sandbox_id)
        if session is None or session.closed or session.removed or not self._may_act_for(client, session.client):
            raise not_found("sandbox", sandbox_id)
        return session

    def _may_act_for(self, client: str, owner: str) -> bool:
        """Whether ``client`` may act on what ``owner`` made: its own, or anyone's for an operator."""
        return client == owner or self.tokens.is_operator(client)

    def client_of(self, context: grpc.ServicerContext) -> str:
        """The client name of the request's bearer token (the Sandboxes service asks too)."""
        return self._client(context)

    def session_of(self, sandbox_id: str, client: str) -> ClientSession:
        """``client``'s live session of ``sandbox_id``; NOT_FOUND for anyone else's or none."""
        return self._session(sandbox_id, client)

    # ---- ListTools ---------------------------------------------------------------------------

    @handle_errors
    def ListTools(self, request: executor_pb2.ListToolsRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        fmt = parse_format(request.format)
        names = self._session(request.sandbox_id, client).tools if request.sandbox_id else self.profiles.exposed(client)
        tools = [t for t in self.registry.tools() if t.definition.name in names]
        response = executor_pb2.ListToolsResponse(format=FORMAT_ENUM[fmt])
        for tool, definition in zip(tools, tool_definitions(tools, fmt), strict=True):
            struct = struct_pb2.Struct()
            struct.update(definition)
            response.tools.add(name=tool.definition.name, definition_json=json_text(definition), definition=struct)
        return response

    # ---- CreateSandbox / DeleteSandbox -------------------------------------------------------

    def _reserve(self, client: str, spec: SandboxSpec | None) -> Reservation:
        with self._lock:
            if self._closing:
                raise ServiceError(ErrorCode.SHUTTING_DOWN, "the server is shutting down; create no sandbox")
            mine = sum(1 for s in self._sessions.values() if s.client == client) + self._creating.get(client, 0)
            total = len(self._sessions) + sum(self._creating.values())
            limits = self.limits
            hard = limits.max_sandboxes_per_client
            if hard is not None and self.quotas.limits(client).live_sandboxes is None and mine >= hard:
                raise ServiceError(
                    ErrorCode.LIMIT_REACHED,
                    f"client {client!r} already has {mine} live sandboxes, the most one client may have on this "
                    f"server ({hard}); delete one first (DeleteSandbox, or kill in the "
                    "E2B SDK)",
                )
            if total >= limits.max_sandboxes_total:
                raise ServiceError(
                    ErrorCode.LIMIT_REACHED,
                    f"this server already runs {total} sandboxes, its limit ({limits.max_sandboxes_total}); "
                    "try again when one is deleted",
                )
            try:  # the client's quotas, counted over every door
                reservation = self.quotas.reserve_sandbox(client, cpus=spec.cpus if spec else 0.0,
                                                          memory=spec.memory if spec else 0, door=DOOR)
            except QuotaExceeded as refusal:
                raise quota_refused(refusal) from None
            self._creating[client] = self._creating.get(client, 0) + 1
            return reservation

    def _over_share(self, client: str, starting: int) -> bool:
        """Whether ``client``, with ``starting`` sandboxes being started, is at or past its
        work-conserving share (never when a hard limit or its own quota bounds it instead)."""
        limits = self.limits
        if limits.max_sandboxes_per_client is not None or self.quotas.limits(client).live_sandboxes is not None:
            return False
        with self._lock:
            live = sum(1 for s in self._sessions.values() if s.client == client)
        return live + starting >= limits.client_share

    def _unreserve(self, client: str) -> None:
        with self._lock:
            left = self._creating.get(client, 0) - 1
            if left > 0:
                self._creating[client] = left
            else:
                self._creating.pop(client, None)
            self._lock.notify_all()

    @contextlib.contextmanager
    def reserved(self, client: str, spec: SandboxSpec | None = None) -> Iterator[Reservation]:
        """A place for one more sandbox of ``client`` (of ``spec``'s CPUs and memory) while it
        is made (RESOURCE_EXHAUSTED beyond the limits or the client's quotas, SHUTTING_DOWN once
        shutdown began). Pass the reservation to ``register``; a failed make gives it back."""
        reservation = self._reserve(client, spec)
        try:
            yield reservation
        except BaseException:
            reservation.release()
            reservation.refund()
            raise
        finally:
            self._unreserve(client)

    def new_run(self, client: str, *, door: str = DOOR) -> str:
        """A new run of ``client`` in the audit store (a sandbox's id is its run's id), marked
        with the door that made it (only ``grpc`` runs are listed by GetRun/ListRuns)."""
        run_id = f"{door}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(6)}"
        return self.audit.start_run(run_id, meta={"door": door, "client": client})

    def register(self, session: ClientSession, still_wanted: Callable[[], bool],
                 reservation: Reservation | None = None) -> None:
        """Make a session whose sandbox is running live (call while ``reserved``); if the
        server is shutting down or the request was cancelled meanwhile (``still_wanted()``
        is false: a gRPC context's ``is_active``), destroy it instead and raise."""
        box = session.harness.active_sandbox
        session.hold(reservation)
        try:
            if box is not None:
                with contextlib.suppress(AuditError):
                    kept = (self.keep_sandboxes
                            and self.audit.get_run(session.sandbox_id).meta.get("door") in self.kept_doors)
                    if kept:
                        session.kept = adoption.keep_past_server(box, session.sandbox_id)
                    self.audit.update_run_meta(session.sandbox_id, adoption.run_meta(session, self.instance, kept))
            with self._lock:
                keep = not self._closing and still_wanted()
                if keep:
                    self._sessions[session.sandbox_id] = session
        except BaseException:
            session.close(self.audit, "sandbox_start_failed")
            raise
        if not keep:
            closing = self._closing
            session.close(self.audit, "server_shutdown" if closing else "client_gone")
            if closing:
                raise ServiceError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")
            raise ServiceError(ErrorCode.CANCELLED, "the request was cancelled; the sandbox was destroyed")
        log.info("client %s has sandbox %s (container %s)", session.client, session.sandbox_id,
                 box.id if box is not None else "?")

    def create_session(self, client: str, overrides: SandboxOverrides, *, door: str = DOOR,
                       base_policy: Policy | None = None,
                       still_wanted: Callable[[], bool] = lambda: True) -> ClientSession:
        """Start a sandbox for ``client`` and make it a live session (what CreateSandbox does,
        for every door): ``overrides`` tighten ``base_policy`` (default: the client's profile's
        policy, else the server's); ServiceError for a refused override, a limit or quota
        reached or a sandbox that cannot start."""
        policy = sandbox_policy(base_policy or self.profiles.of(client), overrides, self.profiles.exposed(client))
        with self.reserved(client, policy.sandbox_spec()) as reservation:
            run_id = self.new_run(client, door=door)
            harness = Session(self.registry, policy, self.audit, run_id=run_id, engine_factory=self.engine_factory)
            tools = self.registry.exposed_names(policy)
            session = ClientSession(client, harness, policy, tools, policy.sandbox.ttl_seconds, overrides)
            try:
                with self.starts.slot(client, door=door, still_wanted=still_wanted):
                    harness.sandbox()
            except QuotaExceeded as refusal:  # the host's start line's bound passed
                with contextlib.suppress(AuditError):
                    self.audit.end_run(run_id, "sandbox_start_failed")
                raise quota_refused(refusal) from None
            except CallboxError as error:
                with contextlib.suppress(AuditError):
                    self.audit.end_run(run_id, "sandbox_start_failed")
                raise creation_failure(error) from None
            self.register(session, still_wanted, reservation)
            return session

    @handle_errors
    def CreateSandbox(self, request: executor_pb2.CreateSandboxRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        overrides = SandboxOverrides.from_request(request)
        return self.create_session(client, overrides, still_wanted=context.is_active).message()

    def delete_session(self, session: ClientSession, reason: str = "deleted") -> int:
        """Destroy a live session's sandbox and end its run; the calls it cancelled."""
        with self._lock:
            self._sessions.pop(session.sandbox_id, None)
            self._lock.notify_all()
        return session.close(self.audit, reason)

    @handle_errors
    def DeleteSandbox(self, request: executor_pb2.DeleteSandboxRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        session = self._session(request.sandbox_id, client)
        return executor_pb2.DeleteSandboxResponse(cancelled_calls=self.delete_session(session))

    # ---- CallTool ------------------------------------------------------------------------------

    def CallTool(self, request: executor_pb2.CallToolRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            client = self._client(context)
            session = self._session(request.sandbox_id, client)
            fmt = parse_format(request.format)
        except ServiceError as error:
            abort(context, error)
        call_id = request.call_id or f"call_{secrets.token_hex(8)}"
        if session.closed:
            abort(context, not_found("sandbox", request.sandbox_id))
        if session.paused:
            abort(context, paused(request.sandbox_id))
        try:
            self.quotas.start_call(client, door=DOOR)
        except QuotaExceeded as refusal:
            abort(context, quota_refused(refusal))
        scope = CallScope()
        context.add_callback(scope.cancel)  # runs when the RPC ends: cancelled, expired or done
        events: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        call = ToolCall(request.name, request.arguments_json or "{}", call_id)
        trace = tracing.carrier(context.invocation_metadata())  # a caller's traceparent continues its trace

        def on_output(stream: str, data: bytes) -> None:
            events.put(("output", stream, data))

        def work() -> None:
            try:
                with tracing.continued(trace):
                    result = session.harness.call(call, on_output=on_output, scope=scope)
                events.put(("result", result, None))
            except BaseException as exc:
                events.put(("error", exc, None))

        self._workers.submit(work)
        seq = 0
        while True:
            try:
                kind, first, second = events.get(timeout=0.25)
            except queue.Empty:
                if not context.is_active():
                    scope.cancel()
                    return
                continue
            if kind == "output":
                chunk = executor_pb2.OutputChunk(seq=seq)
                if first == "stderr":
                    chunk.stderr = second
                else:
                    chunk.stdout = second
                seq += 1
                yield executor_pb2.CallToolEvent(output=chunk)
            elif kind == "result":
                yield executor_pb2.CallToolEvent(result=result_message(first, fmt))
                return
            else:
                log.error("call %s in sandbox %s failed inside the server", call_id, session.sandbox_id,
                          exc_info=first)
                abort(context, ServiceError(ErrorCode.INTERNAL,
                                            f"the call failed inside the server (a bug or a broken audit store): "
                                            f"{type(first).__name__}; the error is in the server log"))

    # ---- lifetime ------------------------------------------------------------------------------

    def live_sandboxes(self) -> dict[str, str]:
        """sandbox id -> client, of the live sessions."""
        with self._lock:
            return {sid: s.client for sid, s in self._sessions.items()}

    def sessions_of(self, client: str) -> list[ClientSession]:
        """``client``'s live sessions, oldest first."""
        with self._lock:
            return sorted((s for s in self._sessions.values() if s.client == client and not s.closed),
                          key=lambda s: s.created)

    def adopt_session(self, session: ClientSession) -> None:
        """Make a sandbox an earlier server left a live session (:func:`.adoption.adopt`)."""
        spec = session.harness.active_sandbox.spec if session.harness.active_sandbox else session.harness.spec
        session.hold(self.quotas.adopt_sandbox(session.client, cpus=spec.cpus, memory=spec.memory))
        with self._lock:
            self._sessions[session.sandbox_id] = session

    def begin_shutdown(self) -> None:
        """Refuse new sandboxes and cancel every running call (the sandboxes stay until ``shutdown``)."""
        with self._lock:
            self._closing = True
            sessions = list(self._sessions.values())
        for session in sessions:
            session.harness.cancel_calls()

    def shutdown(self, *, wait_for_creations_s: float = CREATE_WAIT_AT_SHUTDOWN_S) -> list[str]:
        """Destroy every sandbox this server owns (after creations in progress finish); their ids.
        With ``keep_sandboxes`` the kept ones are left running instead (``left_running``)."""
        self.begin_shutdown()
        self._stop_reaper.set()
        deadline = time.monotonic() + wait_for_creations_s
        with self._lock:
            while self._creating and time.monotonic() < deadline:
                self._lock.wait(timeout=max(0.0, deadline - time.monotonic()))
            sessions = list(self._sessions.values())
            self._sessions.clear()
        kept = [s for s in sessions if self.keep_sandboxes and s.kept]
        for session in kept:
            session.release()
        self.left_running = [s.sandbox_id for s in kept]
        adoption.retire_instance(self.instance)
        sessions = [s for s in sessions if s not in kept]
        if sessions:
            with ThreadPoolExecutor(max_workers=min(8, len(sessions)), thread_name_prefix="callbox-destroy") as pool:
                list(pool.map(lambda s: s.close(self.audit, "server_shutdown"), sessions))
        if isinstance(self.engine_factory, SharedEngine):
            self.engine_factory.close()  # the warm pool's sandboxes, if any
        return [s.sandbox_id for s in sessions]

    def _pool_room(self) -> int:
        """The most pooled sandboxes beside the live ones: the total limit counts both."""
        # Read without the service's lock (the pool's refill thread asks under its own): a
        # moment's stale count only delays or brings forward one refill.
        return self.limits.max_sandboxes_total - len(self._sessions) - sum(list(self._creating.values()))

    def reap_expired(self, now: float | None = None) -> list[str]:
        """Destroy the sandboxes whose ttl_seconds (a paused one's clock stands still: see
        :meth:`ClientSession.due`) or paused TTL have passed, or that the operator removed; their
        ids. A running one with an ``on_expiry`` hook is offered to it first: if it pauses it, it stays."""
        moment = time.time() if now is None else now
        with self._lock:
            due = [s for s in self._sessions.values() if s.removed or s.due(moment)]
        expired = [s for s in due if s.removed or s.paused or s.on_expiry is None or not self._paused_at_expiry(s)]
        with self._lock:
            for session in expired:
                self._sessions.pop(session.sandbox_id, None)
            self._lock.notify_all()
        for session in expired:
            session.close(self.audit, REMOVED if session.removed else "paused_expired" if session.paused else "expired")
        return [s.sandbox_id for s in expired]

    @staticmethod
    def _paused_at_expiry(session: ClientSession) -> bool:
        """Whether the session's ``on_expiry`` hook paused it (a failing hook: it did not)."""
        assert session.on_expiry is not None
        try:
            return session.on_expiry(session)
        except Exception:
            log.exception("sandbox %s: pausing it at its timeout failed; it is removed", session.sandbox_id)
            return False

    def start_reaper(self, interval_s: float = 5.0) -> None:
        """A daemon thread that runs ``reap_expired`` every ``interval_s`` until ``shutdown``;
        with a warm pool in the policy, the engine is connected now so the pool fills ahead."""
        if self._reaper is not None:
            return
        if self.policy.pool.enabled and isinstance(self.engine_factory, SharedEngine):
            self.engine_factory.warm_in_background()

        def loop() -> None:
            while not self._stop_reaper.wait(interval_s):
                try:
                    self.reap_expired()
                except Exception:
                    log.exception("reaping expired sandboxes failed")

        self._reaper = threading.Thread(target=loop, name="callbox-executor-reaper", daemon=True)
        self._reaper.start()
