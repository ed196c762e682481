"""The MCP door's tool logic, no MCP wire types: the tools every session of one server shares
(:class:`McpToolService`), one MCP session and its run (:class:`McpSession`), and where a
session will live until its first call (:class:`SessionSlot`). Transports and protocol
handlers reach the tools only through these.

Each session belongs to a client (the name of its bearer token over HTTP, :data:`LOCAL_CLIENT`
otherwise), served with that client's policy and counted in its quotas
(:mod:`harness.doors.quota_ledger`): each call is one of its ``calls_per_minute``, and the
session's sandbox one of its live sandboxes from the first call (which may start it) until
the session ends; a call that started no sandbox gives its place back.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.audit.store import AuditStore, arguments_digest
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.errors import CallboxError, SessionClosed
from harness.core.formats import tool_definition
from harness.core.policy import Policy, load_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.core.shared_engine import SharedEngine
from harness.doors.profiles import ClientPolicies, PolicySource
from harness.doors.quota_ledger import QuotaKeeper, Reservation
from harness.engine.cancel import CallScope
from harness.engine.docker import teardown
from harness.engine.select import choice_of, engine_connector
from harness.engine.spec import SandboxSpec
from harness.tools import registry_for

__all__ = ["LOCAL_CLIENT", "McpSession", "McpToolService", "SessionSlot"]

log = logging.getLogger("callbox.mcp")

LOCAL_CLIENT = "local"
"""The client name of a session without a bearer token (stdio; HTTP on a server without tokens)."""

class McpSession:
    """One MCP session: its own run in the audit store, its own (lazily started) sandbox.

    ``call`` blocks (it runs the tool); the server calls it from a worker thread. Thread-safe:
    a client may have several calls in flight in one session.
    """

    def __init__(self, service: McpToolService, meta: dict[str, Any], client: str = LOCAL_CLIENT) -> None:
        extra: dict[str, Any] = {}
        if service.engine_factory is not None:
            extra["engine_factory"] = service.engine_factory
        policy = service.policy_for(client)
        spec = service.spec if policy is service.policy else policy.sandbox_spec()
        self.harness = Session(service.registry, policy, service.audit, spec=spec, door="mcp", client=client,
                               **extra)
        self.client = client
        """The client name of the session's bearer token (``local`` without tokens)."""
        self._quotas = service.quotas
        self._reservation: Reservation | None = None
        """The sandbox's place in the client's quotas: taken by a call while there is no
        sandbox yet, given back if no sandbox came of it, or when the session ends."""
        self._in_flight = 0
        self.run_id = self.harness.run_id
        self._audit = service.audit
        self._lock = threading.Lock()
        self._seq = 0
        self._awaiting: dict[tuple[str, str], str] = {}
        """(tool, arguments digest) -> call id of a call waiting for (or just given) approval."""
        self._closed = False
        service.audit.update_run_meta(self.run_id, {"door": "mcp", "owner": client, **meta})
        log.info("MCP session started: run %s %s", self.run_id, meta)

    @property
    def sandbox_id(self) -> str | None:
        box = self.harness.active_sandbox
        return box.id if box is not None else None

    def call(
        self, name: str, arguments: dict[str, Any], *, call_id: str | None = None,
        on_output: Callable[[str, bytes], None] | None = None, scope: CallScope | None = None,
    ) -> ToolResult:
        """Run one ``tools/call``; see the module docstring for how the call id is chosen.
        ``scope.cancel()``, from any thread, cancels the call's agent RPCs (killing its
        processes in the sandbox). QuotaExceeded when the client's quotas refuse the call, or
        the sandbox it may start (before anything is recorded)."""
        key = (name, arguments_digest(arguments))
        with self._lock:
            if self._closed:
                raise SessionClosed("this MCP session has ended")
            self._quotas.start_call(self.client, door="mcp")
            if self.harness.active_sandbox is None and self._reservation is None:
                spec = self.harness.spec
                self._reservation = self._quotas.reserve_sandbox(self.client, cpus=spec.cpus, memory=spec.memory,
                                                                 door="mcp")
            if call_id is None:
                call_id = self._awaiting.get(key)
            if call_id is None:
                self._seq += 1
                call_id = f"mcp-{self._seq:06d}"
            self._in_flight += 1
        try:
            result = self.harness.call(ToolCall(name, arguments, call_id), on_output=on_output, scope=scope)
        finally:
            with self._lock:
                self._in_flight -= 1
                if not self._in_flight and self.harness.active_sandbox is None:
                    self._give_back(refund=True)
        with self._lock:
            if result.error is ErrorCode.APPROVAL_PENDING:
                self._awaiting[key] = call_id
            elif self._awaiting.get(key) == call_id:
                del self._awaiting[key]
        return result

    def _give_back(self, *, refund: bool = False) -> None:
        """Free the reservation (``refund``: no sandbox came of it, so not in the hour either)."""
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.release()
            if refund:
                reservation.refund()

    def close(self) -> None:
        """Destroy the sandbox (if one was started) and end the run; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        sandbox_id = self.sandbox_id
        try:
            self.harness.close()  # cancels the calls still running first
        finally:
            with self._lock:
                self._give_back()
            with contextlib.suppress(CallboxError):
                self._audit.end_run(self.run_id, "mcp_session_ended")
            log.info("MCP session ended: run %s, sandbox %s destroyed", self.run_id, sandbox_id or "(none)")


class SessionSlot:
    """Where a session will live: created on the event loop without I/O, the session itself
    (an audit run) on the first tool call, from a worker thread."""

    def __init__(self, service: McpToolService, meta: dict[str, Any], client: str = LOCAL_CLIENT) -> None:
        self._service = service
        self._meta = meta
        self.client = client
        self._lock = threading.Lock()
        self._session: McpSession | None = None
        self._closed = False

    def session(self) -> McpSession:
        with self._lock:
            if self._closed:
                raise SessionClosed("this MCP session has ended")
            if self._session is None:
                self._session = McpSession(self._service, self._meta, self.client)
            return self._session

    @property
    def current(self) -> McpSession | None:
        return self._session

    def close(self) -> None:
        with self._lock:
            self._closed = True
            session, self._session = self._session, None
        self._service.forget(self)
        if session is not None:
            session.close()


class McpToolService:
    """The tools every MCP session of one server shares: registry, policy, audit store.

    ``engine_factory`` (tests, other engines) defaults to the Session's own: connect to the
    Docker engine named by DOCKER_HOST, failing closed when there is none. With the policy's
    ``[pool]`` it is one :class:`~harness.core.shared_engine.SharedEngine` for every session of
    this server, its warm pool of the server's spec filling from the start, so a session's
    first sandbox is a claim; ``close`` destroys the pooled sandboxes after the sessions'.
    """

    def __init__(
        self, registry: ToolRegistry, policy: Policy, audit: AuditStore, *, spec: SandboxSpec | None = None,
        engine_factory: Callable[[], Any] | None = None, owns_audit: bool = False,
        quotas: QuotaKeeper | None = None, policies: PolicySource | None = None,
    ) -> None:
        policy.check_tools(t.definition for t in registry.tools())
        self.registry = registry
        self.policy = policy
        self.audit = audit
        self.quotas = quotas or QuotaKeeper()
        """Every client's quotas (shared with the server's other doors)."""
        self.profiles = ClientPolicies(policy, registry, policies)
        """The policy each client's sessions are served with (its profile's, or ``policy``)."""
        self.spec = spec if spec is not None else policy.sandbox_spec()
        self.shared_engine: SharedEngine | None = None
        """The engine every session shares when the policy has ``[pool]`` (and none was given)."""
        if engine_factory is None and policy.pool.size > 0:
            engine_factory = self.shared_engine = SharedEngine(
                engine_connector(choice_of(policy.engine, policy.ray)), pool=policy.pool, pool_specs=[self.spec])
            self.shared_engine.warm_in_background()
        self.engine_factory = engine_factory
        self._owns_audit = owns_audit
        self._slots: set[SessionSlot] = set()
        self._lock = threading.Lock()
        self._closed = False

    @classmethod
    def open(cls, *, policy_path: Path | None = None, audit_path: Path | None = None,
             quotas: QuotaKeeper | None = None, policies: PolicySource | None = None) -> McpToolService:
        """The built-in tools and those the policy declares, under the policy at ``policy_path`` (default: the packaged
        default policy), auditing to ``audit_path`` (default $CALLBOX_AUDIT_DB or the state
        dir). A bad policy raises PolicyError (exit code 2) before anything is served."""
        policy = load_policy(policy_path)
        registry = registry_for(policy)
        audit = AuditStore(audit_path)
        try:
            return cls(registry, policy, audit, owns_audit=True, quotas=quotas, policies=policies)
        except BaseException:
            audit.close()
            raise

    # ---- what clients see

    def policy_for(self, client: str) -> Policy:
        """The policy ``client``'s sessions are served with."""
        return self.profiles.of(client)

    def exposed(self, client: str = LOCAL_CLIENT) -> list[str]:
        return self.profiles.exposed(client)

    def tool_definitions(self, client: str = LOCAL_CLIENT) -> list[dict[str, Any]]:
        """The tools ``client`` is shown, in MCP's ``Tool`` shape (name, description, inputSchema, annotations)."""
        return [tool_definition(self.registry.get(name).definition, "mcp")  # type: ignore[union-attr]
                for name in self.exposed(client)]

    # ---- sessions

    def new_slot(self, meta: dict[str, Any], client: str = LOCAL_CLIENT) -> SessionSlot:
        slot = SessionSlot(self, meta, client)
        with self._lock:
            if self._closed:
                raise SessionClosed("the MCP server is shutting down")
            self._slots.add(slot)
        return slot

    def forget(self, slot: SessionSlot) -> None:
        with self._lock:
            self._slots.discard(slot)

    def live_sessions(self) -> list[McpSession]:
        with self._lock:
            slots = list(self._slots)
        return [s.current for s in slots if s.current is not None]

    def close_sessions(self) -> None:
        """End every session (destroying its sandbox); the service stays usable."""
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            try:
                slot.close()
            except Exception:
                log.exception("closing an MCP session failed")

    def close(self) -> None:
        """End every session, destroy the warm pool's sandboxes (if any), wait (bounded) until
        their containers are removed, then close the audit store if this service opened it."""
        with self._lock:
            self._closed = True
        self.close_sessions()
        try:
            if self.shared_engine is not None:
                self.shared_engine.close()  # the pooled sandboxes
            # Sandboxes are removed in the background; a stopped server has removed its own.
            if not teardown.drain_all():
                log.error("the sandboxes of the ended MCP sessions are not all removed yet; gc removes the rest")
        finally:
            if self._owns_audit:
                self.audit.close()
