"""Between a run's state and its checkpoint: what a pause saves, what a resume restores,
and the message that tells a person how to continue.

The checkpoint's format is :mod:`harness.loop.checkpoint`'s; this module only maps the
loop's :class:`RunState` to it and back.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from harness.core.calls import ErrorCode
from harness.core.times import stamp
from harness.loop.checkpoint import Checkpoint, CheckpointError, PausedCall, SandboxRef
from harness.loop.config import LoopConfig, choice_from_json, choice_to_json
from harness.loop.state import RunState
from harness.models.base import Context, ModelAdapter, ModelToolCall

if TYPE_CHECKING:
    from harness.core.session import Session

__all__ = ["checkpoint_of", "pause_message", "restore"]

log = logging.getLogger("callbox.loop")


def checkpoint_of(state: RunState, *, model: ModelAdapter, config: LoopConfig, session: Session,
                  seconds: float) -> Checkpoint:
    """What the paused run ``state`` saves: a call pending approval is saved without a
    result (re-sent on resume), every other call with its result."""
    s = state
    calls = [
        PausedCall(
            call_id=call.call_id, name=call.name, arguments=call.arguments,
            result=None if result is None or result.error is ErrorCode.APPROVAL_PENDING else result,
            approval_id=s.approvals.get(call.call_id), safety_checks=call.safety_checks, batch=call.batch,
        )
        for call, result in zip(s.calls, s.results, strict=True)
    ]
    return Checkpoint(
        run_id=s.run_id, model=model.name, format=model.format, system=s.context.system,
        items=list(s.context.items), turn=s.turn, calls=calls, tool_choice=choice_to_json(s.choice),
        stage=s.stage, input_tokens=s.input_tokens, output_tokens=s.output_tokens, cost_usd=s.cost_usd,
        tool_calls=s.tool_calls, seconds=seconds, streak_key=s.streak_key, streak_count=s.streak_count,
        rejections=s.rejections, config=config.model_dump(mode="json"), sandbox=s.sandbox,
        policy=session.policy.model_dump(mode="json"), spec=session.spec.model_dump(mode="json"),
    )


def restore(cp: Checkpoint, model: ModelAdapter, config: LoopConfig | None) -> tuple[RunState, LoopConfig]:
    """The run state ``cp`` saved and the config to continue with (``config``, else the
    checkpointed one); CheckpointError when ``model`` cannot continue it or the saved
    configuration is unusable."""
    if cp.format != model.format:
        raise CheckpointError(
            f"run {cp.run_id} was paused with {cp.model} ({cp.format} context); resume it with a model "
            f"of the same API, not {model.name} ({model.format})"
        )
    if cp.model != model.name:
        log.warning("run %s was paused with %s and resumes with %s", cp.run_id, cp.model, model.name)
    try:
        config = config or LoopConfig.model_validate(cp.config)
        choice = choice_from_json(cp.tool_choice)
    except ValueError as exc:
        raise CheckpointError(f"the checkpoint of run {cp.run_id} has an unusable configuration: {exc}") from None
    state = RunState(
        run_id=cp.run_id,
        context=Context(system=cp.system, items=list(cp.items)),
        choice=choice,
        turn=cp.turn,
        stage=cp.stage,
        input_tokens=cp.input_tokens,
        output_tokens=cp.output_tokens,
        cost_usd=cp.cost_usd,
        tool_calls=cp.tool_calls,
        prior_seconds=cp.seconds,
        streak_key=cp.streak_key,
        streak_count=cp.streak_count,
        rejections=cp.rejections,
        calls=[ModelToolCall(c.call_id, c.name, _arguments_text(c.arguments), safety_checks=c.safety_checks,
                             batch=c.batch) for c in cp.calls],
        results=[c.result for c in cp.calls],
        approvals={c.call_id: c.approval_id for c in cp.calls if c.approval_id is not None},
        sandbox=cp.sandbox,
    )
    return state, config


def pause_message(run_id: str, approval_ids: list[str], sandbox: SandboxRef | None, resume_command: str | None) -> str:
    """What a person reads when the run pauses: the approvals to resolve, the kept sandbox
    and its expiry, and how to continue (``resume_command`` if the caller gave one)."""
    resolve = " and ".join(f"`callbox approvals approve {i}` (or `deny {i} --reason ...`)" for i in approval_ids)
    kept_note = ""
    if sandbox is not None:
        kept_note = f"; its sandbox {sandbox.id} is kept until {stamp(sandbox.expires)}"
    then = (f"then continue it with: {resume_command}" if resume_command
            else f"then resume run {run_id} with the model it ran with")
    return (f"run {run_id} is paused waiting for approval {', '.join(approval_ids)}{kept_note}; "
            f"resolve it with {resolve}, {then}")


def _arguments_text(arguments: str | dict[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
