"""The agent loop's entry points: :func:`run_agent` (a new run) and :func:`resume` (a run
that paused for an approval), and the names callers need, re-exported.

The loop is a state machine, :class:`harness.loop.machine.Loop` (its module docstring
describes every state); the rest is split by job: :mod:`harness.loop.state` (the steps and
the run's state), :mod:`harness.loop.planning` (what a turn offers: tools and tool_choice),
:mod:`harness.loop.calls` (running a turn's calls), :mod:`harness.loop.acceptance` (the
checks of a final answer), :mod:`harness.loop.paused` (a run's
state to its checkpoint and back), :mod:`harness.loop.checkpoint` (the checkpoint format),
:mod:`harness.loop.config`, :mod:`harness.loop.events` and
:mod:`harness.loop.context_budget`.
"""

from __future__ import annotations

from harness.core.session import Session
from harness.engine.docker.engine import DockerEngine
from harness.loop.config import AcceptanceCheck, AllowTools, ForceTool, LoopConfig, LoopConfigError, Stage
from harness.loop.events import (
    AcceptanceCheckFinished,
    AcceptanceCheckStarted,
    AnswerRejected,
    ContextElided,
    Event,
    EventSink,
    ModelReplied,
    ModelRetrying,
    RunEnded,
    RunOutcome,
    RunStarted,
    ToolCallFinished,
    ToolCallStarted,
    ToolOutputChunk,
    TurnStarted,
)
from harness.loop.machine import Loop
from harness.loop.state import RunState, Step
from harness.models.base import ModelAdapter

__all__ = [
    "AcceptanceCheck",
    "AcceptanceCheckFinished",
    "AcceptanceCheckStarted",
    "AllowTools",
    "AnswerRejected",
    "ContextElided",
    "Event",
    "EventSink",
    "ForceTool",
    "Loop",
    "LoopConfig",
    "LoopConfigError",
    "ModelReplied",
    "ModelRetrying",
    "RunEnded",
    "RunOutcome",
    "RunStarted",
    "RunState",
    "Stage",
    "Step",
    "ToolCallFinished",
    "ToolCallStarted",
    "ToolOutputChunk",
    "TurnStarted",
    "resume",
    "run_agent",
]


def run_agent(
    model: ModelAdapter,
    harness: Session,
    *,
    task: str,
    system: str = "",
    config: LoopConfig | None = None,
    on_event: EventSink | None = None,
    resume_command: str | None = None,
) -> RunOutcome:
    """Run ``task`` to its end (or pause) on the harness's run."""
    return Loop.start(model, harness, task=task, system=system, config=config, on_event=on_event,
                      resume_command=resume_command).run()


def resume(
    run_id: str,
    model: ModelAdapter,
    harness: Session,
    *,
    config: LoopConfig | None = None,
    on_event: EventSink | None = None,
    engine: DockerEngine | None = None,
    resume_command: str | None = None,
) -> RunOutcome:
    """Continue the paused run ``run_id`` to its end (or its next pause)."""
    return Loop.resume(run_id, model, harness, config=config, on_event=on_event, engine=engine,
                       resume_command=resume_command).run()
