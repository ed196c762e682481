"""One run's tool calls: validate, authorize, execute at most once, record, shape.

``Session.call`` is the whole path of one call. Whatever the model got
wrong (bad call id, unknown tool, bad JSON, schema violation, denied, over budget,
timed out) comes back as a ``ToolResult`` with ``is_error``; only broken
infrastructure raises. The run's sandbox starts on the first call that needs it and
is destroyed by ``close``; with the policy's ``[pool]`` and no ``engine_factory`` given, the
process's shared pooled engine (:func:`harness.core.shared_engine.pooled_engine`) makes that start
a claim of a pre-started sandbox. Every call is claimed in the audit store first, so a
replayed or concurrent duplicate call_id returns the recorded result instead of
running again; an ``ask`` decision leaves the call pending until an approval is
resolved, after which sending the same call again runs it exactly once.

The one recorded result a retry does not get back is a retry-safe failure
(``sandbox_unavailable`` with ``command_started`` false: the engine did not answer, the
sandbox could not start or was gone before the command started): the store claims the
call again and it goes through the whole path once more, policy included, with the failed
attempt kept in its audit record. A tool that reports ``sandbox_unavailable`` without
ever having been handed a sandbox cannot have started anything, so its result is marked
``command_started: false`` here, whatever the tool said.

Each running call has a :class:`~harness.engine.cancel.CallScope`; ``cancel_calls``
cancels them (the agent kills what they started). ``close`` ends the session for good: it
cancels the running calls, destroys the sandbox, and from then on no sandbox starts for the
session and every call gets a ``sandbox_unavailable`` result. ``calls_held`` keeps every
other call of the run out while a revert puts the sandbox's files back (a call that arrives
meanwhile gets a ``conflict`` result).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import tenacity

from harness.audit.change_store import RunChanges, changes_root
from harness.audit.store import AuditStore
from harness.core.call_path import CallPath, DecisionSink
from harness.core.calls import Decision, ErrorCode, ToolCall, ToolResult
from harness.core.change_recorder import ChangeRecorder, sweep_ended_runs
from harness.core.context import OutputSink
from harness.core.errors import CallboxError, SandboxStartError, SessionClosed
from harness.core.memory import LOCAL_CLIENT, MemoryScope
from harness.core.policy import Policy
from harness.core.redaction import Redactor
from harness.core.registry import Tool, ToolRegistry
from harness.core.run_revert import running_calls
from harness.core.secrets import tool_password_pairs
from harness.core.shared_engine import pooled_engine
from harness.core.undo import RevertRefused
from harness.core.validation import CallRejected, check_call_id
from harness.engine.base import Engine, Sandbox, run_owner
from harness.engine.cancel import CallScope, current_scope
from harness.engine.secrets import redaction_pairs
from harness.engine.select import choice_of, engine_connector
from harness.engine.spec import SandboxSpec
from harness.telemetry import metrics

log = logging.getLogger("callbox.harness")


class Session:
    """The calls of one run, against one registry, policy and audit store."""

    def __init__(
        self,
        registry: ToolRegistry,
        policy: Policy,
        audit: AuditStore,
        *,
        run_id: str | None = None,
        spec: SandboxSpec | None = None,
        engine_factory: Callable[[], Engine] | None = None,
        door: str | None = None,
        client: str | None = None,
    ) -> None:
        policy.check_tools(t.definition for t in registry.tools())
        self.registry = registry
        self.policy = policy
        self.audit = audit
        self.run_id = audit.start_run(run_id)
        run = audit.get_run(self.run_id)
        self.started = run.created
        self.door = door or str(run.meta.get("door") or "local")
        """How the run's calls arrive (``grpc``, ``mcp``, ``e2b``, ``local``): a label of the
        call metrics and spans; the run's recorded ``door`` unless given."""
        self.client = client or str(run.meta.get("client") or LOCAL_CLIENT)
        """Who the run's calls come from: a door's authenticated client (the run's recorded
        ``client`` unless given), ``local`` for the command line; the memory tool's ``client`` scope."""
        self.memory = MemoryScope.of(policy.memory, self.client)
        """Where the run's ``memory`` tool keeps its files on this host (made on its first use)."""
        self.spec = spec if spec is not None else policy.sandbox_spec()
        self.redactor = Redactor.for_policy(policy.redaction, os.environ, self.spec.env)
        """Takes the policy's secrets out of every result (built once: the env values are read now)."""
        self.redactor.add_literals(redaction_pairs(self.spec.secrets))  # a secret that cannot be read fails here
        self.redactor.add_literals(tool_password_pairs(policy))
        self._engine_factory = engine_factory if engine_factory is not None else self._default_engine()
        self.changes = None if policy.checkpoints.mode == "off" else ChangeRecorder(
            policy.checkpoints, RunChanges(changes_root(audit.path), self.run_id), self.spec)
        """Records what each call of a tool not annotated read-only changes (None: ``[checkpoints]`` is off)."""
        if self.changes is not None:
            sweep_ended_runs(audit, changes_root(audit.path), policy.checkpoints)
        self._sandbox: Sandbox | None = None
        self._sandbox_lock = threading.Lock()
        self._closed = False
        self._calls_lock = threading.Lock()
        self._running: set[CallScope] = set()
        """The scopes of the calls running now, cancelled by ``cancel_calls`` and ``close``."""
        self._held = False
        """A revert of the run's places is under way (:meth:`calls_held`): no call runs meanwhile."""

    def _default_engine(self) -> Callable[[], Engine]:
        """Without an ``engine_factory``: the engine the policy's ``engine`` names (Docker when
        it names none); the process's shared engine with the policy's warm pool of this
        session's spec when ``[pool]`` asks for one (so a create is a claim once it has
        filled), else a connection of the session's own (Ray's is the process's)."""
        choice = choice_of(self.policy.engine, self.policy.ray)
        if self.policy.pool.size > 0:
            return pooled_engine(self.policy.pool, self.spec, choice)
        return engine_connector(choice)

    def exposed_tools(self) -> list[Tool]:
        """The tools this run offers the model (registered and allowed by its policy)."""
        return self.registry.exposed(self.policy)

    # ---- the sandbox of this run -------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called: the session then runs no call and starts no sandbox."""
        return self._closed

    def _refuse_if_closed(self) -> None:
        if self._closed:
            raise SessionClosed(f"the session of run {self.run_id} has ended; its sandbox is gone")

    def sandbox(self) -> Sandbox:
        """The run's sandbox, started on first use; SessionClosed once the session has ended
        (a sandbox that finishes starting after that is destroyed at once). Its owner is this
        run (``run:<run id>``), so an operator finds a server's sandbox by the id its client
        knows (``callbox sandbox ls``, ``callbox sandbox exec RUN_ID``)."""
        with self._sandbox_lock:
            self._refuse_if_closed()
            if self._sandbox is None:
                engine = self._engine_factory()
                sandbox = tenacity.Retrying(
                    retry=tenacity.retry_if_exception_type(SandboxStartError),
                    stop=tenacity.stop_after_attempt(2),
                    reraise=True,
                )(engine.create, self.spec, owner=run_owner(self.run_id))
                if self._closed:
                    sandbox.destroy()
                    self._refuse_if_closed()
                self._sandbox = sandbox
                self._redact_placeholders(sandbox)
            return self._sandbox

    def _redact_placeholders(self, sandbox: Sandbox) -> None:
        """Add the placeholders the sandbox holds for its secrets (and their values, read
        again) to what is redacted."""
        if self.spec.secrets:
            self.redactor.add_literals(redaction_pairs(self.spec.secrets, sandbox.spec.env))

    @property
    def active_sandbox(self) -> Sandbox | None:
        """The run's sandbox if one was started or attached; never starts one."""
        return self._sandbox

    def connect_engine(self) -> Engine:
        """An engine from this harness's factory (to attach a kept sandbox)."""
        return self._engine_factory()

    def attach(self, sandbox: Sandbox) -> None:
        """Run this run's calls in an existing sandbox (a paused run's, from
        ``Engine.attach``) instead of starting one; ``close`` destroys it as usual."""
        with self._sandbox_lock:
            self._refuse_if_closed()
            if self._sandbox is not None and self._sandbox is not sandbox:
                raise RuntimeError(f"run {self.run_id} already has sandbox {self._sandbox.id}")
            self._sandbox = sandbox
            self._redact_placeholders(sandbox)

    def detach(self) -> Sandbox | None:
        """Stop using the run's sandbox without destroying it (a paused run keeps it);
        ``close`` then leaves it alone. Returns it (None if none was started)."""
        with self._sandbox_lock:
            sandbox, self._sandbox = self._sandbox, None
            return sandbox

    def cancel_calls(self) -> int:
        """Cancel the calls running now (their agent RPCs, so the agent kills what they
        started); how many there were."""
        with self._calls_lock:
            running = list(self._running)
        for scope in running:
            scope.cancel()
        return len(running)

    @contextlib.contextmanager
    def calls_held(self, own: CallScope | None = None, own_call: str | None = None) -> Iterator[None]:
        """No other call of the run runs while the block does (a revert of its places): a
        RevertRefused error naming them if some run now (``own``, the scope of the caller's own
        call ``own_call``, excepted), and a call that arrives meanwhile gets a ``conflict`` result."""
        with self._calls_lock:
            busy = self._held or bool(self._running - {own} if own is not None else self._running)
            if not busy:
                self._held = True
        if busy:
            running = running_calls(self.audit, self.run_id, but=own_call)
            what = f"call {', '.join(running)}" if running else "another call or revert"
            raise RevertRefused(f"{what} of run {self.run_id} is running; revert once it has finished")
        try:
            yield
        finally:
            with self._calls_lock:
                self._held = False

    def close(self) -> int:
        """End the session for good: cancel the calls still running, destroy the run's
        sandbox; the calls cancelled (0 when already closed). A cancelled call gets
        SessionClosed if it asks for the sandbox after this, a later call an error result.
        If the destroy fails (EngineUnavailable: the engine went away) the sandbox is
        forgotten all the same; gc removes it once it stopped or expired, or this process
        is gone."""
        with self._calls_lock:
            first = not self._closed
            self._closed = True
        cancelled = self.cancel_calls() if first else 0
        with self._sandbox_lock:
            if self._sandbox is not None:
                self.record_egress(None)
                sandbox, self._sandbox = self._sandbox, None
                sandbox.destroy()
        return cancelled

    def record_egress(self, call_id: str | None) -> list[dict[str, Any]]:
        """Put the egress proxy's new decisions (allowlist sandboxes) into the audit store,
        attributed to ``call_id``; the decisions (their raw records)."""
        sandbox = self._sandbox
        if sandbox is None:
            return []
        records: list[dict[str, Any]] = []
        try:
            events = sandbox.new_egress_events()  # empty unless allowlist
            if not events:
                return []
            records = [dict(e.raw) for e in events]
            metrics.record_egress(str(getattr(e, "decision", "?")) for e in events)
            self.audit.record_egress(self.run_id, call_id, sandbox.id, records)
        except CallboxError as error:  # the call's result matters more than its audit trail
            log.error("could not record the egress decisions of sandbox %s: %s", sandbox.id, error.message)
        return records

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one call -----------------------------------------------------------------

    def call(
        self,
        call: ToolCall,
        *,
        on_output: OutputSink | None = None,
        on_decided: DecisionSink | None = None,
        scope: CallScope | None = None,
    ) -> ToolResult:
        """Run one call through the whole path (:class:`~harness.core.call_path.CallPath`).

        ``on_output`` receives the output chunks while the tool runs. ``on_decided`` receives
        the call's decision label (``allow``, ``ask``, ``deny``, ``approved``, ``rejected``)
        exactly once, before the handler runs (before the result returns, for a call that
        never runs); every result carries it in ``meta["decision"]``. ``scope`` (made
        current for the call, so the agent RPCs it makes are tracked) lets the caller cancel
        the call from any thread; ``cancel_calls`` and ``close`` cancel it too.

        Each call is counted in the call metrics (:func:`harness.telemetry.metrics.record_call`)
        and, while tracing is on, is a ``callbox.call`` span (child of the current span: a
        caller's, when the door continued its trace)."""
        started = time.perf_counter()
        path = CallPath(self, call, on_output, on_decided)
        trace = path.trace
        if trace is None:
            result = self._call(path, scope)
        else:
            try:
                result = self._call(path, scope)
            except BaseException as error:
                trace.finish({"callbox.tool": path.tool_label, "callbox.door": self.door}, type(error).__name__)
                raise
            trace.finish({"callbox.tool": path.tool_label, "callbox.door": self.door,
                          "callbox.decision": path.decision or "rejected"},
                         str(result.error or "error") if result.is_error else None)
        total = time.perf_counter() - started
        sandbox_s = path.sandbox_s
        metrics.record_call(path.tool_label, self.door, path.decision or "rejected",
                            result.error or ("error" if result.is_error else "ok"),
                            total - sandbox_s if sandbox_s is not None else total, sandbox_s)
        return result

    def refuse(self, call: ToolCall, failure: ToolResult, decision: Decision | None = None, *,
               on_decided: DecisionSink | None = None) -> ToolResult:
        """Record ``call`` as refused by its caller before it reached the path (the loop: a
        tool its turn did not offer, safety checks nobody may acknowledge, an action after a
        failed one of its batch), so the run's record holds it as it holds every call; the
        result (``failure`` with its decision label), or what an earlier claim of the call_id
        recorded."""
        path = CallPath(self, call, None, on_decided)
        try:
            check_call_id(call.call_id)
        except CallRejected as rejected:
            return path.labelled(ToolResult.failure(str(call.call_id)[:128], rejected.code, rejected.message))
        return path.refuse(failure, decision)

    def _call(self, path: CallPath, scope: CallScope | None) -> ToolResult:
        call = path.call
        try:
            check_call_id(call.call_id)
        except CallRejected as rejected:
            return path.labelled(ToolResult.failure(str(call.call_id)[:128], rejected.code, rejected.message))
        scope = scope if scope is not None else CallScope()
        with self._calls_lock:
            closed, held = self._closed, self._held
            if not closed and not held:
                self._running.add(scope)
        if held:
            return path.labelled(ToolResult.failure(
                call.call_id, ErrorCode.CONFLICT,
                f"a revert of run {self.run_id}'s files is under way; send the call again once it has finished"))
        if closed:
            return path.labelled(ToolResult(
                call_id=call.call_id, text=f"the session of run {self.run_id} has ended; its sandbox is gone",
                is_error=True, error=ErrorCode.SANDBOX_UNAVAILABLE, structured={"command_started": False},
            ))
        try:
            with current_scope(scope):
                return path.labelled(path.run())
        finally:
            with self._calls_lock:
                self._running.discard(scope)
