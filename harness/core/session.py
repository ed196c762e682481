"""One run's tool calls: validate, authorize, execute at most once, record, shape.

``Session.call`` is the whole path of one call. Whatever the model got
wrong (bad call id, unknown tool, bad JSON, schema violation, denied, over budget,
timed out) comes back as a ``ToolResult`` with ``is_error``; only broken
infrastructure raises. The run's sandbox starts on the first call that needs it and
is destroyed by ``close``. Every call is claimed in the audit store first, so a
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
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import tenacity

from harness.audit.records import final_decision
from harness.audit.store import AuditStore, Claim, arguments_digest
from harness.core.calls import Action, Decision, ErrorCode, ToolCall, ToolOutput, ToolResult
from harness.core.context import OutputSink, ToolContext
from harness.core.errors import AgentCallError, CallboxError, SandboxStartError, SessionClosed
from harness.core.policy import Policy
from harness.core.registry import Tool, ToolRegistry
from harness.core.shaping import bound_text
from harness.core.validation import CallRejected, check_call_id, validate_call
from harness.engine.agent_client import sandbox_gone
from harness.engine.base import Engine, Sandbox
from harness.engine.cancel import CallScope, current_scope
from harness.engine.default import connect_default_engine
from harness.engine.spec import SandboxSpec

log = logging.getLogger("callbox.harness")

# How long a duplicate call waits for the process that is running the original.
WAIT_MARGIN_S = 60.0
# How long a sandbox may take to answer a health check after a tool failed in it.
GONE_CHECK_S = 2.0


def _freeform(call: ToolCall, tool: Tool | None) -> ToolCall:
    """Wrap plain-text arguments of a freeform tool as the JSON object its model expects."""
    field = tool.definition.freeform_field if tool is not None else None
    if field is None or not isinstance(call.arguments, str) or call.arguments.lstrip().startswith("{"):
        return call
    return ToolCall(call.name, {field: call.arguments}, call.call_id)


class _CallSandbox:
    """The run's sandbox as one call's handler sees it, noting whether it got one."""

    def __init__(self, harness: Session) -> None:
        self._harness = harness
        self.handed_out = False

    def sandbox(self) -> Sandbox:
        sandbox = self._harness.sandbox()
        self.handed_out = True
        return sandbox


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
        engine_factory: Callable[[], Engine] = connect_default_engine,
    ) -> None:
        policy.check_tools(t.definition for t in registry.tools())
        self.registry = registry
        self.policy = policy
        self.audit = audit
        self.run_id = audit.start_run(run_id)
        self.started = audit.get_run(self.run_id).created
        self.spec = spec if spec is not None else policy.sandbox_spec()
        self._engine_factory = engine_factory
        self._sandbox: Sandbox | None = None
        self._sandbox_lock = threading.Lock()
        self._closed = False
        self._calls_lock = threading.Lock()
        self._running: set[CallScope] = set()
        """The scopes of the calls running now, cancelled by ``cancel_calls`` and ``close``."""

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
        (a sandbox that finishes starting after that is destroyed at once)."""
        with self._sandbox_lock:
            self._refuse_if_closed()
            if self._sandbox is None:
                engine = self._engine_factory()
                sandbox = tenacity.Retrying(
                    retry=tenacity.retry_if_exception_type(SandboxStartError),
                    stop=tenacity.stop_after_attempt(2),
                    reraise=True,
                )(engine.create, self.spec)
                if self._closed:
                    sandbox.destroy()
                    self._refuse_if_closed()
                self._sandbox = sandbox
            return self._sandbox

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
                self._record_egress(None)
                sandbox, self._sandbox = self._sandbox, None
                sandbox.destroy()
        return cancelled

    def _record_egress(self, call_id: str | None) -> None:
        """Put the egress proxy's new decisions (allowlist sandboxes) into the audit store,
        attributed to ``call_id``."""
        sandbox = self._sandbox
        if sandbox is None:
            return
        try:
            events = sandbox.new_egress_events()  # empty unless allowlist
            if not events:
                return
            self.audit.record_egress(self.run_id, call_id, sandbox.id, [e.raw for e in events])
        except CallboxError as error:  # the call's result matters more than its audit trail
            log.error("could not record the egress decisions of sandbox %s: %s", sandbox.id, error.message)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- one call -----------------------------------------------------------------

    def call(
        self, call: ToolCall, *, on_output: OutputSink | None = None, scope: CallScope | None = None
    ) -> ToolResult:
        """Run one call through the whole path. ``scope`` (made current for the call, so the
        agent RPCs it makes are tracked) lets the caller cancel it from any thread;
        ``cancel_calls`` and ``close`` cancel it too."""
        try:
            check_call_id(call.call_id)
        except CallRejected as rejected:
            return ToolResult.failure(str(call.call_id)[:128], rejected.code, rejected.message)
        scope = scope if scope is not None else CallScope()
        with self._calls_lock:
            closed = self._closed
            if not closed:
                self._running.add(scope)
        if closed:
            return ToolResult(
                call_id=call.call_id, text=f"the session of run {self.run_id} has ended; its sandbox is gone",
                is_error=True, error=ErrorCode.SANDBOX_UNAVAILABLE, structured={"command_started": False},
            )
        try:
            with current_scope(scope):
                return self._call(call, on_output)
        finally:
            with self._calls_lock:
                self._running.discard(scope)

    def _call(self, call: ToolCall, on_output: OutputSink | None) -> ToolResult:
        tool = self.registry.get(call.name)
        call = _freeform(call, tool)
        claim = self.audit.claim_call(self.run_id, call.call_id, call.name, call.arguments)
        if not claim.fresh:
            return self._repeat(call, tool, claim, on_output)
        if tool is None or not self.policy.tool_allowed(call.name):
            return self._finish(call, self._unavailable(call, tool))
        try:
            args = validate_call(tool.definition, call.arguments)
        except CallRejected as rejected:
            return self._finish(call, ToolResult.failure(call.call_id, rejected.code, rejected.message))
        decision = self._authorize(tool, args)
        self.audit.record_decision(self.run_id, call.call_id, decision)
        if decision.action is Action.DENY:
            code = ErrorCode.BUDGET_EXCEEDED if decision.rule.startswith("budgets.") else ErrorCode.DENIED
            return self._finish(call, ToolResult.failure(call.call_id, code, decision.reason), decision)
        if decision.action is Action.ASK:
            approved = self._approved_before(call, claim)
            if approved is None:
                return self._ask(call, decision)
            decision = approved
        return self._execute(call, tool, args, decision, on_output)

    def _approved_before(self, call: ToolCall, claim: Claim) -> Decision | None:
        """For a retry of a call a person approved whose attempt never started: that
        approval (already consumed by the failed attempt) still stands for these arguments."""
        if claim.attempt == 1:
            return None
        approval = self.audit.find_approval(self.run_id, call.call_id)
        if approval is None or approval.state != "consumed" or approval.args_digest != claim.record.args_digest:
            return None
        return Decision(Action.ALLOW, f"approval {approval.id}", approval.reason)

    def _unavailable(self, call: ToolCall, tool: Tool | None) -> ToolResult:
        exposed = self.registry.exposed_names(self.policy)
        if tool is None:
            text = f"unknown tool {call.name!r}; the available tools are: {', '.join(exposed) or 'none'}"
            return ToolResult.failure(call.call_id, ErrorCode.UNKNOWN_TOOL, text)
        text = f"tool {call.name!r} is not enabled in this run; the enabled tools are: {', '.join(exposed)}"
        return ToolResult.failure(call.call_id, ErrorCode.TOOL_NOT_ALLOWED, text)

    def _authorize(self, tool: Tool, args: Any) -> Decision:
        budget = self.policy.budgets.check(self.audit.count_calls(self.run_id), time.time() - self.started)
        if budget is not None:
            return budget
        return self.policy.decide(tool.definition, args, workdir=self.spec.workdir)

    def _ask(self, call: ToolCall, decision: Decision) -> ToolResult:
        approval = self.audit.create_approval(
            self.run_id, call.call_id, call.name, call.arguments, decision.rule, decision.reason
        )
        return ToolResult.failure(
            call.call_id,
            ErrorCode.APPROVAL_PENDING,
            f"this call needs approval ({decision.rule}) and is pending as approval {approval.id}; "
            "it runs once a person approves it",
            approval_id=approval.id,
        )

    def _repeat(self, call: ToolCall, tool: Tool | None, claim: Claim, on_output: OutputSink | None) -> ToolResult:
        """The call_id was seen before in this run: never run it a second time."""
        if claim.conflict:
            return ToolResult.failure(
                call.call_id, ErrorCode.BAD_CALL_ID,
                f"call_id {call.call_id!r} was already used in this run for a different call; "
                "use a new call_id for a new call",
            )
        if claim.result is not None:
            return claim.result
        decision = claim.decision
        if claim.state == "claimed" and decision is not None and decision.action is Action.ASK and tool is not None:
            return self._resume_approval(call, tool, decision, on_output)
        timeout = self.policy.budgets.call_timeout_ceiling_s + WAIT_MARGIN_S
        result = self.audit.wait_for_result(self.run_id, call.call_id, timeout)
        if result is not None:
            return result
        return ToolResult.failure(
            call.call_id, ErrorCode.INTERNAL,
            f"call {call.call_id!r} is being run by another harness process that has not finished",
        )

    def _resume_approval(
        self, call: ToolCall, tool: Tool, decision: Decision, on_output: OutputSink | None
    ) -> ToolResult:
        approval = self.audit.find_approval(self.run_id, call.call_id)
        if approval is None:
            return self._ask(call, decision)
        if approval.state == "pending":
            return self._ask(call, decision)
        if approval.state == "denied":
            why = f": {approval.resolution_reason}" if approval.resolution_reason else ""
            result = ToolResult.failure(
                call.call_id, ErrorCode.APPROVAL_DENIED, f"a person denied this call (approval {approval.id}){why}"
            )
            return self._finish(call, result, final_decision(decision, approval))
        if approval.args_digest != arguments_digest(call.arguments):
            return ToolResult.failure(
                call.call_id, ErrorCode.BAD_CALL_ID,
                f"approval {approval.id} was given for different arguments; send the call exactly as approved",
            )
        if not self.audit.consume_approval(approval.id):  # another process is running it
            return self._repeat(call, tool, self.audit.claim_call(self.run_id, call.call_id, call.name,
                                                                   call.arguments), on_output)
        args = validate_call(tool.definition, call.arguments)
        approved = Decision(Action.ALLOW, f"approval {approval.id}", decision.reason)
        return self._execute(call, tool, args, approved, on_output)

    def _execute(
        self, call: ToolCall, tool: Tool, args: Any, decision: Decision, on_output: OutputSink | None
    ) -> ToolResult:
        budgets = self.policy.budgets
        if not self.audit.mark_running(self.run_id, call.call_id, max_calls=budgets.max_tool_calls):
            denied = budgets.check(budgets.max_tool_calls, 0) or decision
            result = ToolResult.failure(call.call_id, ErrorCode.BUDGET_EXCEEDED, denied.reason)
            return self._finish(call, result, denied)
        provider = _CallSandbox(self)
        ctx = ToolContext(
            run_id=self.run_id, call_id=call.call_id, provider=provider,
            default_timeout_s=budgets.default_call_timeout_s, timeout_ceiling_s=budgets.call_timeout_ceiling_s,
            output_budget=budgets.max_output_bytes, on_output=on_output,
        )
        started = time.monotonic()
        output = self._unless_gone(self._run_handler(tool, ctx, args))
        if output.error is ErrorCode.SANDBOX_UNAVAILABLE and not provider.handed_out:
            output = dataclasses.replace(output, structured={**(output.structured or {}), "command_started": False})
        duration_ms = (time.monotonic() - started) * 1000
        self._record_egress(call.call_id)
        shaped = bound_text(output.text, budgets.max_output_bytes)
        result = ToolResult(
            call_id=call.call_id, text=shaped.text, is_error=output.is_error, error=output.error,
            structured=output.structured,
            meta={"duration_ms": round(duration_ms, 3), "rule": decision.rule, "raw_bytes": output.raw_bytes,
                  "truncated": shaped.truncated},
        )
        exit_code = (output.structured or {}).get("exit_code")
        self.audit.finish_call(
            self.run_id, call.call_id, result, decision=decision,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            duration_ms=duration_ms, bytes_out=len(shaped.text.encode()), truncated=shaped.truncated,
        )
        return result

    @staticmethod
    def _run_handler(tool: Tool, ctx: ToolContext, args: Any) -> ToolOutput:
        try:
            return tool.handler(ctx, args)
        except CallboxError as error:
            # No engine, image missing, sandbox failed to start: the model cannot fix it, but
            # it must get a result for its call_id; nothing ran on the host.
            return ToolOutput(text=f"the sandbox is unavailable: {error.message}", is_error=True,
                              error=ErrorCode.SANDBOX_UNAVAILABLE)
        except Exception:
            log.exception("tool %s failed inside the harness", tool.definition.name)
            return ToolOutput(text=f"the tool {tool.definition.name!r} failed inside the harness (a bug); "
                                   "the error is in the harness log", is_error=True, error=ErrorCode.INTERNAL)

    def _unless_gone(self, output: ToolOutput) -> ToolOutput:
        """A tool failure in a sandbox that no longer answers is ``sandbox_unavailable``
        (retryable, as the file tools and shell report it), whichever tool saw it."""
        sandbox = self._sandbox
        if output.error is not ErrorCode.TOOL_FAILED or sandbox is None:
            return output
        try:
            sandbox.agent.health(timeout=GONE_CHECK_S)
        except AgentCallError as error:
            if not sandbox_gone(error):
                return output
            return ToolOutput(
                text=f"the sandbox did not answer. {output.text}", is_error=True,
                error=ErrorCode.SANDBOX_UNAVAILABLE, structured={**(output.structured or {}), "reason": error.reason},
                raw_bytes=output.raw_bytes,
            )
        return output

    def _finish(self, call: ToolCall, result: ToolResult, decision: Decision | None = None) -> ToolResult:
        self.audit.finish_call(
            self.run_id, call.call_id, result, decision=decision, exit_code=None, duration_ms=0.0,
            bytes_out=len(result.text.encode()), truncated=False,
        )
        return result
