"""Acceptance checks on a final answer: the loop's VERIFY state (``verify_and_finish``).

When the model gives a final answer and the run has checks (``LoopConfig.acceptance``, else
the policy's ``[acceptance]``: :func:`effective` picks them; :mod:`harness.core.acceptance`
says which source wins), :class:`Acceptance` runs them in the run's sandbox, in order:

* Each check is a call of the ``shell`` tool through the run's :class:`~harness.core.session.Session`,
  the one call path: validated, authorized by the policy (rules and budgets), recorded in
  the audit store. Its call id is ``accept-<turn>-<n>-<random>`` and its ``ToolCall.origin``
  is ``acceptance``, which the recorded result keeps (``meta["origin"]``): the audit tells it
  from the model's calls (``callbox audit --run`` lists it with origin ``acceptance``).
* A check passes when it exits with its ``expect_exit`` and did not time out. Its timeout
  is its ``timeout_s``, at most what is left of the run's wall-time budget (and the
  policy's ``call_timeout_ceiling_s``, which the shell tool applies and reports).
* All pass: the run ends ``final:accepted``. The first that fails stops the round (the
  checks after it are not run): the model gets a user message naming the check, its exit
  code and its output (the result's text, head and tail within ``max_output_bytes``), and
  the run goes on through CHECK_LIMITS, so ``max_turns`` and the budgets still end it. The
  model is told of at most ``max_rejections`` rejections; the next rejected answer ends the
  run ``rejected:acceptance`` (``max_rejections = 0``: the first one does).
* A check the run cannot run ends it at once, as no answer of the model could change that:
  one the policy denies or would have a person approve (``error:config``; the same is
  checked before the first turn by :func:`preflight`, so a run does not spend a model's
  turns first), one a budget refuses (``budget:tool_calls`` or ``budget:wall_time``), one
  that finds the sandbox unavailable (``error:sandbox_unavailable``).

Budgets: the checks' time is the run's time (the loop's wall-time budget counts it), and
each check is a call of the run, so it counts toward the policy's ``max_tool_calls`` as the
model's calls do (the outcome's ``tool_calls`` counts the model's calls only).

Every round is kept in the run's audit record too, in its meta under ``acceptance``
(``rejections``, ``max_rejections`` and ``rounds``: per answer checked, its turn and each
check's command, workdir, call id, exit code and whether it passed), which the console's
run page shows. The rejection count is part of the run's state, so a run that pauses for an
approval keeps it across ``resume``.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from harness.core.acceptance import AcceptanceCheck
from harness.core.calls import Action, ErrorCode, ToolCall, ToolResult
from harness.core.policy import Policy
from harness.core.session import Session
from harness.core.validation import CallRejected, validate_call
from harness.loop.config import LoopConfig, LoopConfigError
from harness.loop.events import AcceptanceCheckFinished, AcceptanceCheckStarted, AnswerRejected, Event
from harness.loop.state import RunState
from harness.models.base import Context

__all__ = ["CHECK_CALL_PREFIX", "CHECK_TOOL", "ORIGIN", "Acceptance", "Verdict", "effective", "preflight"]

ORIGIN = "acceptance"
"""``ToolCall.origin`` (and the recorded ``meta["origin"]``) of an acceptance check."""
CHECK_CALL_PREFIX = "accept-"
"""Call ids of the checks start with this (then turn, check number and a random part)."""
CHECK_TOOL = "shell"
"""The tool a check is a call of."""
_REJECTED = "Your answer was not accepted: "


@dataclass(frozen=True)
class Verdict:
    """What checking one final answer came to: ``reason`` is the run's end reason, or ""
    when the answer was rejected and the run goes on (the model was told, in ``message``)."""

    reason: str
    message: str = ""


def effective(config: LoopConfig, policy: Policy) -> LoopConfig:
    """``config`` with the policy's ``[acceptance]`` checks when it has none of its own (and the
    policy's ``max_rejections`` unless the config set one)."""
    if config.acceptance or not policy.acceptance.check:
        return config
    update: dict[str, Any] = {"acceptance": policy.acceptance.check}
    if policy.acceptance.max_rejections is not None and "max_rejections" not in config.model_fields_set:
        update["max_rejections"] = policy.acceptance.max_rejections
    return config.model_copy(update=update)


def check_arguments(check: AcceptanceCheck, timeout_s: float | None = None) -> dict[str, Any]:
    """The ``shell`` arguments a check is run with."""
    seconds = check.timeout_s if timeout_s is None else min(check.timeout_s, timeout_s)
    arguments: dict[str, Any] = {"command": check.command, "timeout_ms": max(1, int(seconds * 1000))}
    if check.workdir is not None:
        arguments["workdir"] = check.workdir
    return arguments


def describe(check: AcceptanceCheck, index: int) -> str:
    """``acceptance check 2 (`make test` in /workspace)``."""
    where = f" in {check.workdir}" if check.workdir else ""
    return f"acceptance check {index} (`{check.command}`{where})"


def preflight(config: LoopConfig, session: Session) -> None:
    """Refuse, before the first turn, checks this run could never run: the policy does not
    enable the shell tool, a check's arguments are not valid shell arguments, or the policy
    denies a check or would ask a person to approve it (LoopConfigError naming the check,
    the rule and the fix)."""
    if not config.acceptance:
        return
    tool = session.registry.get(CHECK_TOOL)
    if tool is None or not session.policy.tool_allowed(CHECK_TOOL):
        raise LoopConfigError(
            f"this run has acceptance checks, which run as calls of the {CHECK_TOOL!r} tool, but its policy "
            f"does not enable that tool; add {CHECK_TOOL!r} to allowed_tools or remove the checks")
    for index, check in enumerate(config.acceptance, 1):
        try:
            args = validate_call(tool.definition, check_arguments(check))
        except CallRejected as rejected:
            raise LoopConfigError(f"{describe(check, index)} is not a valid shell call: {rejected.message}") from None
        decision = session.policy.decide(tool.definition, args, workdir=session.spec.workdir)
        if decision.action is not Action.ALLOW:
            raise LoopConfigError(refused_message(check, index, decision.action.value, decision.rule))


def refused_message(check: AcceptanceCheck, index: int, action: str, rule: str) -> str:
    what = "denies" if action == "deny" else "would ask a person to approve"
    return (f"{describe(check, index)} cannot run: the policy {what} it ({rule}); checks run unattended, so the "
            f"policy must allow them: add a rule to [tools.{CHECK_TOOL}] that allows this command, or change "
            "the check")


class Acceptance:
    """Runs one run's checks on each final answer (see the module docstring)."""

    def __init__(self, session: Session, config: LoopConfig, emit: Callable[[Event], None],
                 time_left: Callable[[], float]) -> None:
        self.session = session
        self.config = config
        self._emit = emit
        self._time_left = time_left
        """Seconds left of the run's wall-time budget (the loop's clock)."""

    def verify(self, state: RunState) -> Verdict:
        """Check the final answer of ``state.turn``. A rejection that does not end the run
        is counted in ``state.rejections`` and told to the model in its context (the
        verdict's reason is then "")."""
        checks = self.config.acceptance
        if not checks:
            return Verdict("final")
        rows: list[dict[str, Any]] = []
        verdict = Verdict("final:accepted")
        for index, check in enumerate(checks, 1):
            outcome = self._run_one(state.turn, index, check, rows)
            if outcome is not None:
                verdict = outcome
                break
        if verdict.reason == "":
            verdict = self._rejected(state, verdict.message)
        self._record(state, rows, verdict)
        return verdict

    # ---- one check -------------------------------------------------------------------

    def _run_one(self, turn: int, index: int, check: AcceptanceCheck, rows: list[dict[str, Any]]) -> Verdict | None:
        """Run check ``index``; None when it passed, else what the answer comes to."""
        total = len(self.config.acceptance)
        left = self._time_left()
        if left <= 0:
            return Verdict("budget:wall_time", f"{describe(check, index)} was not run: the run has used its "
                                               "wall-time budget (budgets.max_wall_time_s)")
        call_id = f"{CHECK_CALL_PREFIX}{turn}-{index}-{secrets.token_hex(4)}"
        self._emit(AcceptanceCheckStarted(turn, index, total, call_id, check.command, check.workdir))
        result = self.session.call(ToolCall(CHECK_TOOL, check_arguments(check, left), call_id, origin=ORIGIN))
        exit_code = _exit_code(result)
        timed_out = bool((result.structured or {}).get("timed_out"))
        passed = exit_code is not None and exit_code == check.expect_exit and not timed_out
        self._emit(AcceptanceCheckFinished(turn, index, total, call_id, check.command, passed, exit_code,
                                           check.expect_exit, result))
        rows.append({"index": index, "command": check.command, "workdir": check.workdir, "call_id": call_id,
                     "passed": passed, "exit_code": exit_code, "expect_exit": check.expect_exit,
                     "error": None if result.error is None else str(result.error),
                     "duration_ms": result.meta.get("duration_ms")})
        if passed:
            return None
        ended = self._cannot_run(check, index, result)
        if ended is not None:
            return ended
        return self._reject(turn, index, check, result, exit_code, timed_out)

    def _cannot_run(self, check: AcceptanceCheck, index: int, result: ToolResult) -> Verdict | None:
        """The end of the run for a check that could not run at all (None: it ran and failed)."""
        code = result.error
        if code is ErrorCode.SANDBOX_UNAVAILABLE:
            return Verdict("error:sandbox_unavailable", f"{describe(check, index)}: {result.text}")
        if code is ErrorCode.BUDGET_EXCEEDED:
            record = self.session.audit.get_call(self.session.run_id, result.call_id)
            rule = record.decision.rule if record is not None and record.decision is not None else ""
            reason = "budget:wall_time" if rule == "budgets.max_wall_time_s" else "budget:tool_calls"
            return Verdict(reason, f"{describe(check, index)} was not run: {result.text}")
        if code in (ErrorCode.DENIED, ErrorCode.APPROVAL_DENIED, ErrorCode.APPROVAL_PENDING,
                    ErrorCode.TOOL_NOT_ALLOWED, ErrorCode.UNKNOWN_TOOL, ErrorCode.INVALID_ARGUMENTS):
            return Verdict("error:config", f"{describe(check, index)} cannot run: {result.text}")
        return None

    def _reject(self, turn: int, index: int, check: AcceptanceCheck, result: ToolResult, exit_code: int | None,
                timed_out: bool) -> Verdict:
        total = len(self.config.acceptance)
        if timed_out:
            how = f"did not finish within its timeout (exit code {exit_code})"
        elif exit_code is None:
            how = f"could not be run to an exit ({result.error or 'error'})"
        else:
            how = f"exited with {exit_code}, expected {check.expect_exit}"
        head = f"{_REJECTED}{describe(check, index)}, {index} of {total}, {how}."
        body = f"Its output:\n{result.text}" if result.text else "It printed nothing."
        return Verdict("", f"{head}\n{body}")

    # ---- the answer --------------------------------------------------------------------

    def _rejected(self, state: RunState, failure: str) -> Verdict:
        """Count a rejected answer: tell the model (the run goes on), or end the run when it
        is one more than ``max_rejections``."""
        state.rejections += 1
        most = self.config.max_rejections
        ends = state.rejections > most
        if ends:
            told = failure
        else:
            left = most - state.rejections
            after = "the next rejection ends the run" if left == 0 else f"{left + 1} more rejections end the run"
            told = f"{failure}\nFix the problem, then give your final answer again ({after})."
        self._emit(AnswerRejected(state.turn, state.rejections, most, ends, told))
        if ends:  # the output was in the events already: the end's message names the check only
            last = failure.split("\n", 1)[0].removeprefix(_REJECTED)
            return Verdict("rejected:acceptance", f"the acceptance checks rejected {_answers(state.rejections)} "
                                                  f"(max_rejections = {most}); the last: {last}")
        _tell(state.context, told)
        state.final_text = ""
        return Verdict("", told)

    def _record(self, state: RunState, rows: list[dict[str, Any]], verdict: Verdict) -> None:
        """Keep the round in the run's audit record (its meta's ``acceptance``)."""
        audit, run_id = self.session.audit, self.session.run_id
        kept = audit.get_run(run_id).meta.get("acceptance")
        rounds = list(kept.get("rounds", [])) if isinstance(kept, dict) else []
        rounds.append({"turn": state.turn, "passed": verdict.reason == "final:accepted", "checks": rows})
        audit.update_run_meta(run_id, {"acceptance": {
            "rejections": state.rejections, "max_rejections": self.config.max_rejections,
            "verdict": verdict.reason or "rejected", "rounds": rounds,
        }})


def _answers(count: int) -> str:
    return "1 answer" if count == 1 else f"{count} answers"


def _exit_code(result: ToolResult) -> int | None:
    code = (result.structured or {}).get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def _tell(context: Context, text: str) -> None:
    """Append a user message: the same shape opens every provider's context (``new_context``)."""
    context.items.append({"role": "user", "content": text})


def record_lines(meta: dict[str, Any]) -> list[str]:
    """A run's acceptance record (its meta's ``acceptance``) as lines for a person:
    ``acceptance: final:accepted after 1 rejected answer``, then per answer checked
    ``turn 1: ✗ check 1 `pytest -q` exit 1 (expected 0) accept-1-1-ab12cd34``. Empty without checks."""
    kept = meta.get("acceptance")
    if not isinstance(kept, dict):
        return []
    rejections = int(kept.get("rejections") or 0)
    lines = [f"acceptance: {kept.get('verdict', '?')} after {rejections} rejected "
             f"answer{'' if rejections == 1 else 's'} (max_rejections {kept.get('max_rejections', '?')})"]
    for round_ in kept.get("rounds") or ():
        for check in round_.get("checks") or ():
            mark = "✓" if check.get("passed") else "✗"
            code = check.get("exit_code")
            how = f"exit {code}" if code is not None else str(check.get("error") or "not run")
            if not check.get("passed") and code is not None:
                how += f" (expected {check.get('expect_exit', 0)})"
            lines.append(f"  turn {round_.get('turn')}: {mark} check {check.get('index')} `{check.get('command')}` "
                         f"{how} {check.get('call_id')}")
    return lines
