"""The path of one call through its session: claim, validate, authorize, run, bound, record.

:class:`CallPath` holds what one call carries along the way (the call, its tool, where its
output and its decision go). The decision is reported once, before the handler runs (or
before the result is returned, for a call that never runs), as one of :data:`DECISIONS`,
and the same label is in ``meta["decision"]`` of the result, recorded with it, so a replay
of the call reports what the original did.

What a tool produced (its text, its structured content and the output chunks it streams)
has the session's secrets taken out (:mod:`harness.core.redaction`) before the output
budget bounds it, so neither the model, a door nor the audit store gets them; the result's
``meta["redactions"]`` (recorded with it) says how many were taken out, of which kinds and
where, and is absent when there were none. The pictures it produced pass as they are (their
labels are redacted like text); each is checked against the policy's image bounds
(:mod:`harness.core.images`), and one over a bound is left out with a line of the text
naming it, its size and the bound.

A process stopped in the middle of a call (Ctrl-C, or SIGTERM through the CLI: see
:mod:`harness.core.stopping`) records the call as interrupted before it exits
(:mod:`harness.audit.interruptions`), saying whether its command had started: not before its
handler ran, nor while the handler waited for the sandbox to start (false: the same call sent
again runs, like any retry-safe failure); once the agent reported the command started, or the
handler returned (true); unknown in between (null). A call whose process was killed outright
is recorded by the next process that sends its call_id and finds the owner gone
(:mod:`harness.audit.orphans`); either way a command that may have started never runs again.

Each step is a span while tracing is on (:mod:`harness.telemetry.tracing`), marked where it
ends: validate, authorize, exec (with the sandbox's start or claim inside it), shape, audit;
the handler's time is kept for the call metrics (``sandbox_s``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from harness.audit.interruptions import PROCESS_STOPPED, interrupted_result
from harness.audit.owners import this_process
from harness.audit.records import final_decision, retry_safe
from harness.audit.store import Claim, arguments_digest
from harness.core.budgets import CallTimeout
from harness.core.calls import Action, Decision, ErrorCode, ImagePart, ToolCall, ToolOutput, ToolResult
from harness.core.change_recorder import ChangeRecorder
from harness.core.context import OutputSink, ToolContext
from harness.core.egress_ask import egress_meta, watch_egress
from harness.core.errors import AgentCallError, CallboxError
from harness.core.images import bound_images, image_meta
from harness.core.redaction import Finding, StreamRedactor, redaction_summary
from harness.core.registry import Tool
from harness.core.run_revert import live_undo
from harness.core.shaping import bound_text, strip_terminal_codes
from harness.core.stopping import STOPS, signals_held, stop_signal
from harness.core.validation import CallRejected, validate_call
from harness.engine.agent_errors import sandbox_gone
from harness.engine.base import Sandbox
from harness.engine.cancel import active_scope
from harness.telemetry import tracing
from harness.telemetry.tracing import CallTrace

if TYPE_CHECKING:
    from harness.core.session import Session

__all__ = ["DECISIONS", "CallPath", "DecisionLabel", "DecisionSink", "decision_label"]

log = logging.getLogger("callbox.harness")

DecisionLabel = Literal["allow", "ask", "deny", "approved", "rejected"]
DECISIONS: tuple[DecisionLabel, ...] = ("allow", "ask", "deny", "approved", "rejected")
_ACTION_LABELS: dict[Action, DecisionLabel] = {Action.ALLOW: "allow", Action.ASK: "ask", Action.DENY: "deny"}
DecisionSink = Callable[[str], None]
"""Receives the decision label of a call, once, before its handler runs."""

# How long a duplicate call waits for the process that is running the original.
WAIT_MARGIN_S = 60.0
# How long a sandbox may take to answer a health check after a tool failed in it.
GONE_CHECK_S = 2.0


def decision_label(decision: Decision | None) -> DecisionLabel:
    """The label of a recorded decision: none is ``rejected`` (the call never reached the
    policy), a person's approval ``approved``, anything else the policy's action."""
    if decision is None:
        return "rejected"
    if decision.rule.startswith("approval "):
        return "approved"
    return _ACTION_LABELS[decision.action]


def _freeform(call: ToolCall, tool: Tool | None) -> ToolCall:
    """Wrap plain-text arguments of a freeform tool as the JSON object its model expects."""
    field = tool.definition.freeform_field if tool is not None else None
    if field is None or not isinstance(call.arguments, str) or call.arguments.lstrip().startswith("{"):
        return call
    return dataclasses.replace(call, arguments={field: call.arguments})


class _CallSandbox:
    """The run's sandbox as one call's handler sees it, noting whether it got one, and
    whether the process was stopped while the handler waited for it."""

    def __init__(self, session: Session, trace: CallTrace | None) -> None:
        self._session = session
        self._trace = trace
        self.handed_out = False
        self.stopped_waiting = False

    def sandbox(self) -> Sandbox:
        try:
            if self._trace is not None and self._session.active_sandbox is None:
                with self._trace.nested("callbox.sandbox"):  # started, or claimed from the pool
                    sandbox = self._session.sandbox()
            else:
                sandbox = self._session.sandbox()
        except STOPS:
            self.stopped_waiting = not self.handed_out
            raise
        self.handed_out = True
        return sandbox


class CallPath:
    """One call, from its checked call_id to its recorded result (``run``)."""

    def __init__(
        self, session: Session, call: ToolCall, on_output: OutputSink | None, on_decided: DecisionSink | None
    ) -> None:
        self.session = session
        self.tool = session.registry.get(call.name)
        self.call = _freeform(call, self.tool)
        self.on_output = on_output
        self._on_decided = on_decided
        self.decision: DecisionLabel | None = None
        self.tool_label = self.tool.definition.name if self.tool is not None else "unknown"
        """The call's tool in metrics (a name no tool has is ``unknown``: the label set stays bounded)."""
        self.sandbox_s: float | None = None
        """Seconds the tool's handler ran (None: it never ran)."""
        self.trace = tracing.start_call(session.run_id, call.call_id)
        """The call's spans (None while tracing is off): each step appends its mark where it ends."""
        self._stage: Literal["before", "handler", "after"] = "before"
        """Where ``_execute`` is: before the handler, in it, or after it returned."""
        self._retried = False

    def decided(self, label: DecisionLabel) -> None:
        """Report the call's decision (only the first report counts)."""
        if self.decision is None:
            self.decision = label
            if self._on_decided is not None:
                self._on_decided(label)

    def labelled(self, result: ToolResult, fallback: DecisionLabel = "rejected") -> ToolResult:
        """``result`` with the call's decision in its meta (``fallback`` if none was reported)."""
        self.decided(fallback)
        origin = {"origin": self.call.origin} if self.call.origin else {}
        return dataclasses.replace(result, meta={**result.meta, "decision": self.decision, **origin})

    def run(self) -> ToolResult:
        """Claim the call_id, then run the call once, or return what a claim before this one
        recorded. A call that cannot run (unknown or disabled tool, arguments its schema
        refuses) is checked before the claim, as that needs nothing stored, and its failure is
        recorded once claimed; one that can is claimed, decided and, if allowed, marked running
        in one transaction (``AuditStore.claim_and_start``)."""
        s, call, tool, trace = self.session, self.call, self.tool, self.trace
        if tool is None or not s.policy.tool_allowed(call.name):
            return self._refused(self._unavailable())
        try:
            args = validate_call(tool.definition, call.arguments)
        except CallRejected as rejected:
            return self._refused(ToolResult.failure(call.call_id, rejected.code, rejected.message))
        if trace is not None:
            trace.append(("callbox.validate", time.time_ns()))
        start = s.audit.claim_and_start(
            s.run_id, call.call_id, call.name, call.arguments, lambda counted: self._authorize(tool, args, counted),
            max_calls=s.policy.budgets.max_tool_calls,
        )
        if trace is not None:
            trace.append(("callbox.authorize", time.time_ns()))
        claim, decision = start.claim, start.decision
        if not claim.fresh or decision is None:
            return self._repeat(claim)
        if decision.action is Action.DENY:
            code = ErrorCode.BUDGET_EXCEEDED if decision.rule.startswith("budgets.") else ErrorCode.DENIED
            return self._finish(ToolResult.failure(call.call_id, code, decision.reason), decision)
        if decision.action is Action.ASK:
            approved = self._approved_before(claim)
            if approved is None:
                return self._ask(decision)
            decision = approved
        return self._execute(tool, args, decision, running=start.running)

    def refuse(self, failure: ToolResult, decision: Decision | None = None) -> ToolResult:
        """Record a call its caller refused before the path (``failure``, with ``decision``
        when a rule refused it), or return what an earlier claim of its call_id recorded."""
        claim = self.session.audit.claim_call(self.session.run_id, self.call.call_id, self.call.name,
                                              self.call.arguments)
        if not claim.fresh:
            return self._repeat(claim)
        return self._finish(failure, decision)

    def _refused(self, failure: ToolResult) -> ToolResult:
        """Claim a call that cannot run and record ``failure`` as its result (or return what
        an earlier claim of its call_id recorded)."""
        s, call = self.session, self.call
        if self.trace is not None:  # the tool's lookup or its arguments' check refused it
            self.trace.append(("callbox.validate", time.time_ns()))
        claim = s.audit.claim_call(s.run_id, call.call_id, call.name, call.arguments)
        if not claim.fresh:
            return self._repeat(claim)
        return self._finish(failure)

    def _approved_before(self, claim: Claim) -> Decision | None:
        """For a retry of a call a person approved whose attempt never started: that
        approval (already consumed by the failed attempt) still stands for these arguments."""
        if claim.attempt == 1:
            return None
        approval = self.session.audit.find_approval(self.session.run_id, self.call.call_id)
        if approval is None or approval.state != "consumed" or approval.args_digest != claim.record.args_digest:
            return None
        return Decision(Action.ALLOW, f"approval {approval.id}", approval.reason)

    def _unavailable(self) -> ToolResult:
        call = self.call
        exposed = self.session.registry.exposed_names(self.session.policy)
        if self.tool is None:
            text = f"unknown tool {call.name!r}; the available tools are: {', '.join(exposed) or 'none'}"
            return ToolResult.failure(call.call_id, ErrorCode.UNKNOWN_TOOL, text)
        text = f"tool {call.name!r} is not enabled in this run; the enabled tools are: {', '.join(exposed)}"
        return ToolResult.failure(call.call_id, ErrorCode.TOOL_NOT_ALLOWED, text)

    def _authorize(self, tool: Tool, args: Any, counted: int) -> Decision:
        """The budgets' decision (``counted``: the run's authorized calls so far), else the policy's."""
        s = self.session
        budget = s.policy.budgets.check(counted, time.time() - s.started)
        if budget is not None:
            return budget
        return s.policy.decide(tool.definition, args, workdir=s.spec.workdir)

    def _ask(self, decision: Decision) -> ToolResult:
        s, call = self.session, self.call
        reason = decision.reason
        if call.flags:  # the approval acknowledges them: the person sees them
            flagged = "the model's provider flags this call: " + "; ".join(call.flags)
            reason = f"{reason}; {flagged}" if reason else flagged
        approval = s.audit.create_approval(s.run_id, call.call_id, call.name, call.arguments, decision.rule, reason)
        if self.trace is not None:
            self.trace.append(("callbox.audit", time.time_ns()))
        self.decided("ask")
        return ToolResult.failure(
            call.call_id,
            ErrorCode.APPROVAL_PENDING,
            f"this call needs approval ({decision.rule}) and is pending as approval {approval.id}; "
            "it runs once a person approves it",
            approval_id=approval.id,
        )

    def _repeat(self, claim: Claim) -> ToolResult:
        """The call_id was seen before in this run: never run it a second time."""
        s, call = self.session, self.call
        if claim.conflict:
            return ToolResult.failure(
                call.call_id, ErrorCode.BAD_CALL_ID,
                f"call_id {call.call_id!r} was already used in this run for a different call; "
                "use a new call_id for a new call",
            )
        if claim.result is not None:
            return self._replay(claim.result, claim.decision)
        decision = claim.decision
        if claim.state == "claimed" and decision is not None and decision.action is Action.ASK \
                and self.tool is not None:
            return self._resume_approval(self.tool, decision)
        timeout = s.policy.budgets.call_timeout_ceiling_s + WAIT_MARGIN_S
        result = s.audit.wait_for_result(s.run_id, call.call_id, timeout)
        if result is not None:
            record = s.audit.get_call(s.run_id, call.call_id)
            return self._replay(result, record.decision if record is not None else None)
        gone = s.audit.interrupt_orphan(s.run_id, call.call_id)  # its process may have stopped meanwhile
        if gone is not None and gone.result is not None:
            if retry_safe(gone.result) and not self._retried:  # it never reached its handler
                self._retried = True
                return self.run()
            return self._replay(gone.result, gone.decision)
        return ToolResult.failure(
            call.call_id, ErrorCode.INTERNAL,
            f"call {call.call_id!r} is being run by another harness process that has not finished",
        )

    def _replay(self, result: ToolResult, decision: Decision | None) -> ToolResult:
        """A recorded result (with its pictures), reported with the decision it was recorded with."""
        recorded = result.meta.get("decision")
        self.decided(recorded if recorded in DECISIONS else decision_label(decision))
        return self.session.audit.with_images(result)

    def _resume_approval(self, tool: Tool, decision: Decision) -> ToolResult:
        s, call = self.session, self.call
        approval = s.audit.find_approval(s.run_id, call.call_id)
        if approval is None or approval.state == "pending":
            return self._ask(decision)
        if approval.state == "denied":
            why = f": {approval.resolution_reason}" if approval.resolution_reason else ""
            result = ToolResult.failure(
                call.call_id, ErrorCode.APPROVAL_DENIED, f"a person denied this call (approval {approval.id}){why}"
            )
            self.decided("deny")
            return self._finish(result, final_decision(decision, approval))
        if approval.args_digest != arguments_digest(call.arguments):
            return ToolResult.failure(
                call.call_id, ErrorCode.BAD_CALL_ID,
                f"approval {approval.id} was given for different arguments; send the call exactly as approved",
            )
        if not s.audit.consume_approval(approval.id):  # another process is running it
            return self._repeat(s.audit.claim_call(s.run_id, call.call_id, call.name, call.arguments))
        args = validate_call(tool.definition, call.arguments)
        approved = Decision(Action.ALLOW, f"approval {approval.id}", decision.reason)
        if self.trace is not None:  # the approval, checked and consumed
            self.trace.append(("callbox.authorize", time.time_ns()))
        return self._execute(tool, args, approved)

    def _execute(self, tool: Tool, args: Any, decision: Decision, *, running: bool = False) -> ToolResult:
        """Run an authorized call; ``running``: ``claim_and_start`` marked it running already."""
        s, call = self.session, self.call
        budgets = s.policy.budgets
        if not running and not s.audit.mark_running(s.run_id, call.call_id, max_calls=budgets.max_tool_calls):
            denied = budgets.check(budgets.max_tool_calls, 0) or decision
            result = ToolResult.failure(call.call_id, ErrorCode.BUDGET_EXCEEDED, denied.reason)
            return self._finish(result, denied)
        provider = _CallSandbox(s, self.trace)
        started = time.perf_counter()
        try:
            return self._run_and_record(tool, args, decision, provider)
        except STOPS as stop:
            self._record_stop(stop, decision, provider, started)
            raise

    def _run_and_record(self, tool: Tool, args: Any, decision: Decision, provider: _CallSandbox) -> ToolResult:
        """Run the handler, shape its output and record the result."""
        s, call, trace = self.session, self.call, self.trace
        budgets = s.policy.budgets
        stream = s.redactor.stream(self.on_output) if self.on_output is not None and s.redactor.active else None
        ctx = ToolContext(
            run_id=s.run_id, call_id=call.call_id, provider=provider,
            default_timeout_s=budgets.default_call_timeout_s, timeout_ceiling_s=budgets.call_timeout_ceiling_s,
            output_budget=budgets.max_output_bytes, on_output=stream or self.on_output,
            image_bounds=budgets.image_bounds(), undo=live_undo(s), memory=s.memory,
        )
        self.decided(decision_label(decision))
        recorded = tool.definition.records_changes and not tool.definition.annotations.read_only
        recorder = s.changes if s.changes is not None and recorded else None
        changes = _record_before(recorder, provider) if recorder is not None else None
        started = time.perf_counter()
        self._stage = "handler"
        with watch_egress(s, call, self.on_output):
            output = self._unless_gone(self._run_handler(tool, ctx, args, stream))
        self._stage = "after"
        self.sandbox_s = time.perf_counter() - started
        if recorder is not None and s.active_sandbox is not None:
            changes = changes or recorder.after(s.active_sandbox, call.call_id, tool.definition.name)
        if trace is not None:
            trace.append(("callbox.exec", time.time_ns()))
        if output.error is ErrorCode.SANDBOX_UNAVAILABLE and not provider.handed_out:
            output = dataclasses.replace(output, structured={**(output.structured or {}), "command_started": False})
        output = told_of_lowered_timeouts(output, ctx.lowered)
        duration_ms = self.sandbox_s * 1000
        egress = s.record_egress(call.call_id)
        text, structured, findings = self._redacted(output)
        images = bound_images(self._labels_redacted(output.images, findings), budgets.image_bounds())
        if images.refused:  # at the end, so the tail the output budget keeps holds it
            text = f"{text}\n{images.note()}" if text else images.note()
        shaped = bound_text(text, budgets.max_output_bytes, keep_terminal_codes=True)  # codes went before redaction
        meta: dict[str, Any] = {"duration_ms": round(duration_ms, 3), "rule": decision.rule,
                                "raw_bytes": output.raw_bytes, "truncated": shaped.truncated}
        if output.images:
            meta["images"] = [image_meta(image) for image in images.kept]
            if images.refused:
                meta["images_refused"] = len(images.refused)
        if findings:
            meta["redactions"] = redaction_summary(findings)
        for lowered in ctx.lowered:
            meta.update(lowered.meta())
        if egress:
            meta["egress"] = egress_meta(egress)
        if changes:
            meta["changes"] = changes
        result = self.labelled(ToolResult(
            call_id=call.call_id, text=shaped.text, is_error=output.is_error, error=output.error,
            structured=structured, meta=meta, images=images.kept,
        ))
        if trace is not None:
            trace.append(("callbox.shape", time.time_ns()))
        exit_code = (output.structured or {}).get("exit_code")
        s.audit.finish_call(
            s.run_id, call.call_id, result, decision=decision,
            exit_code=exit_code if isinstance(exit_code, int) else None,
            duration_ms=duration_ms, bytes_out=len(shaped.text.encode()), truncated=shaped.truncated,
        )
        if trace is not None:
            trace.append(("callbox.audit", time.time_ns()))
        return result

    def _command_started(self, provider: _CallSandbox) -> bool | None:
        """Whether the command of a call stopped half-way had started (None: unknown)."""
        scope = active_scope()
        if self._stage == "after" or (scope is not None and scope.command_started):
            return True
        if self._stage == "before" or (provider.stopped_waiting and not provider.handed_out):
            return False
        return None

    def _record_stop(self, stop: BaseException, decision: Decision, provider: _CallSandbox, started: float) -> None:
        """The process is stopping (``stop``) in the middle of this call: record it as
        interrupted, unless its result is recorded already."""
        s, call = self.session, self.call
        me = this_process().label
        interrupted = interrupted_result(call.call_id, cause=PROCESS_STOPPED,
                                         command_started=self._command_started(provider), owner=me, noticed_by=me,
                                         signal=stop_signal(stop))
        # Labelled without reporting a decision: a stopping process tells its caller nothing more.
        result = dataclasses.replace(interrupted, meta={"decision": self.decision or decision_label(decision)})
        with signals_held():
            try:
                s.audit.finish_call(s.run_id, call.call_id, result, decision=None, exit_code=None,
                                    duration_ms=(time.perf_counter() - started) * 1000, bytes_out=0, truncated=False)
            except CallboxError as error:  # already recorded, or the store failed: the stop goes on
                log.debug("call %s of run %s: the interruption was not recorded: %s", call.call_id, s.run_id,
                          error.message)

    def _redacted(self, output: ToolOutput) -> tuple[str, dict[str, Any] | None, list[Finding]]:
        """The output's text (terminal codes removed first, so none can hide a secret) and
        structured content with the session's secrets taken out, and where they were."""
        redactor = self.session.redactor
        text = strip_terminal_codes(output.text)
        if not redactor.active:
            return text, output.structured, []
        text, findings = redactor.redact(text)
        structured = output.structured
        if structured:
            structured, found = redactor.redact_structured(structured)
            findings.extend(found)
        return text, structured, findings

    def _labels_redacted(self, images: tuple[ImagePart, ...], findings: list[Finding]) -> tuple[ImagePart, ...]:
        """``images`` with the session's secrets taken out of their labels (a label is text the
        model reads); the pictures themselves are passed as they are."""
        redactor = self.session.redactor
        if not redactor.active or not images:
            return images
        cleaned = []
        for image in images:
            label, found = redactor.redact(image.label, "image_label")
            findings.extend(found)
            cleaned.append(dataclasses.replace(image, label=label) if found else image)
        return tuple(cleaned)

    @staticmethod
    def _run_handler(tool: Tool, ctx: ToolContext, args: Any, stream: StreamRedactor | None) -> ToolOutput:
        try:
            return tool.handler(ctx, args)
        except CallboxError as error:
            # No engine, image missing, sandbox failed to start, session ended: the model cannot
            # fix it, but it must get a result for its call_id; nothing ran on the host.
            return ToolOutput(text=f"the sandbox is unavailable: {error.message}", is_error=True,
                              error=ErrorCode.SANDBOX_UNAVAILABLE)
        except Exception:
            log.exception("tool %s failed inside the harness", tool.definition.name)
            return ToolOutput(text=f"the tool {tool.definition.name!r} failed inside the harness (a bug); "
                                   "the error is in the harness log", is_error=True, error=ErrorCode.INTERNAL)
        finally:
            if stream is not None:  # what the stream held back goes out before the result
                stream.flush()

    def _unless_gone(self, output: ToolOutput) -> ToolOutput:
        """A tool failure in a sandbox that no longer answers is ``sandbox_unavailable``
        (retryable, as the file tools and shell report it), whichever tool saw it."""
        sandbox = self.session.active_sandbox
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

    def _finish(self, result: ToolResult, decision: Decision | None = None) -> ToolResult:
        """Record the result of a call that did not run (its decision label follows ``decision``)."""
        s = self.session
        result = self.labelled(result, decision_label(decision))
        s.audit.finish_call(
            s.run_id, self.call.call_id, result, decision=decision, exit_code=None, duration_ms=0.0,
            bytes_out=len(result.text.encode()), truncated=False,
        )
        if self.trace is not None:
            self.trace.append(("callbox.audit", time.time_ns()))
        return result


def _record_before(recorder: ChangeRecorder, provider: _CallSandbox) -> dict[str, Any] | None:
    """The baseline of the run's writable places, if it has none yet (a sandbox that cannot
    start is left to the handler to report)."""
    try:
        sandbox = provider.sandbox()
    except CallboxError:
        return None
    return recorder.before(sandbox)


def told_of_lowered_timeouts(output: ToolOutput, lowered: Sequence[CallTimeout]) -> ToolOutput:
    """``output`` telling the model of each timeout it asked for that was lowered to the
    ceiling: ``timeout_clamped`` in its structured content, and the note as its first line
    unless the tool put it in its text already (shell puts it in its header)."""
    if not lowered:
        return output
    structured = dict(output.structured or {})
    text = output.text
    for timeout in lowered:
        structured.update(timeout.meta())
        if timeout.note() not in text:
            text = f"{timeout.note()}\n{text}"
    return dataclasses.replace(output, text=text, structured=structured)
