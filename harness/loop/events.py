"""What an agent run reports while it runs (events) and how it ended (``RunOutcome``).

``on_event`` receives these small frozen dataclasses, each with a ``kind`` and ``to_dict()``
for JSON lines (bytes decoded as UTF-8, a ToolResult as the audit store writes it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, is_dataclass
from typing import Any, ClassVar

from harness.audit.store import result_to_json
from harness.core.calls import ToolResult
from harness.models.base import ModelToolCall, Usage

PAUSED = "approval_pending"
"""The reason of a run that paused for an approval (not a final end)."""

def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, ToolResult):
        return json.loads(result_to_json(value))
    if is_dataclass(value) and not isinstance(value, type):
        return {k: _jsonable(v) for k, v in asdict(value).items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class _EventBase:
    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, with ``"event": kind`` first (bytes decoded as UTF-8)."""
        return {"event": self.kind, **{f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}}


@dataclass(frozen=True)
class RunStarted(_EventBase):
    kind: ClassVar[str] = "run_started"
    run_id: str
    model: str
    resumed: bool


@dataclass(frozen=True)
class TurnStarted(_EventBase):
    kind: ClassVar[str] = "turn_started"
    turn: int
    tools: tuple[str, ...]
    """Names of the tools offered this turn."""
    tool_choice: str
    """As :func:`describe_choice` writes it."""


@dataclass(frozen=True)
class ModelRetrying(_EventBase):
    kind: ClassVar[str] = "model_retry"
    turn: int
    attempt: int
    """The attempt that failed (1 is the first)."""
    error: str


@dataclass(frozen=True)
class ModelReplied(_EventBase):
    kind: ClassVar[str] = "model_turn"
    turn: int
    text: str
    calls: tuple[ModelToolCall, ...]
    usage: Usage


@dataclass(frozen=True)
class ToolCallStarted(_EventBase):
    kind: ClassVar[str] = "tool_call_started"
    turn: int
    call_id: str
    name: str
    arguments: str | dict[str, Any]
    decision: str
    """What the policy says before it runs: allow | ask | deny | approved (an approval was
    granted) | rejected (unknown or not offered tool, invalid arguments)."""


@dataclass(frozen=True)
class ToolOutputChunk(_EventBase):
    kind: ClassVar[str] = "tool_output"
    call_id: str
    stream: str
    data: bytes


@dataclass(frozen=True)
class ToolCallFinished(_EventBase):
    kind: ClassVar[str] = "tool_result"
    turn: int
    call_id: str
    name: str
    decision: str
    """What happened, as recorded: allow | ask (pending) | deny | approved | rejected."""
    result: ToolResult


@dataclass(frozen=True)
class AcceptanceCheckStarted(_EventBase):
    kind: ClassVar[str] = "acceptance_check_started"
    turn: int
    """The turn whose final answer is being checked."""
    index: int
    """The check's place in the run's list, from 1."""
    total: int
    """How many checks the run has."""
    call_id: str
    """The check's call in the audit (``accept-...``; the harness's own call, not the model's)."""
    command: str
    workdir: str | None


@dataclass(frozen=True)
class AcceptanceCheckFinished(_EventBase):
    kind: ClassVar[str] = "acceptance_check_finished"
    turn: int
    index: int
    total: int
    call_id: str
    command: str
    passed: bool
    """Exited with ``expect_exit`` (and did not time out)."""
    exit_code: int | None
    """None: the command did not run to an exit (refused, sandbox gone)."""
    expect_exit: int
    result: ToolResult
    """The check's result as recorded (its text bounded like every result's)."""


@dataclass(frozen=True)
class AnswerRejected(_EventBase):
    kind: ClassVar[str] = "answer_rejected"
    turn: int
    rejections: int
    """Answers rejected so far in the run, this one included."""
    max_rejections: int
    ends_run: bool
    """This rejection was one too many: the run ends ``rejected:acceptance``."""
    message: str
    """What the model is told (the failed check, its exit code and output)."""


@dataclass(frozen=True)
class ContextElided(_EventBase):
    kind: ClassVar[str] = "context_elided"
    turn: int
    call_ids: tuple[str, ...]
    bytes_before: int
    bytes_after: int


@dataclass(frozen=True)
class RunEnded(_EventBase):
    kind: ClassVar[str] = "run_ended"
    run_id: str
    reason: str
    turns: int
    tool_calls: int
    seconds: float
    input_tokens: int
    output_tokens: int
    cost_usd: float | None
    final_text: str
    message: str
    """A sentence for a person: why it stopped, what to do (resume command, expiry, ...)."""
    pending_approvals: tuple[str, ...]
    resume_command: str = ""
    """Paused: the command that continues the run, if the caller gave one."""
    rejections: int = 0
    """Final answers the acceptance checks rejected."""

    @classmethod
    def of(cls, out: RunOutcome) -> RunEnded:
        """The event that reports ``out``."""
        return cls(
            run_id=out.run_id, reason=out.reason, turns=out.turns, tool_calls=out.tool_calls, seconds=out.seconds,
            input_tokens=out.usage.input_tokens, output_tokens=out.usage.output_tokens,
            cost_usd=out.usage.cost_usd, final_text=out.final_text, message=out.message,
            pending_approvals=out.pending_approvals, resume_command=out.resume_command, rejections=out.rejections,
        )


Event = (RunStarted | TurnStarted | ModelRetrying | ModelReplied | ToolCallStarted | ToolOutputChunk
         | ToolCallFinished | AcceptanceCheckStarted | AcceptanceCheckFinished | AnswerRejected | ContextElided
         | RunEnded)
EventSink = Callable[[Event], None]


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended (or paused)."""

    run_id: str
    reason: str
    final_text: str
    turns: int
    tool_calls: int
    seconds: float
    usage: Usage
    message: str = ""
    pending_approvals: tuple[str, ...] = ()
    resume_command: str = ""
    """Paused: the command that continues the run, if the caller gave one."""
    rejections: int = 0
    """Final answers the acceptance checks rejected (:mod:`harness.loop.acceptance`)."""

    @property
    def paused(self) -> bool:
        return self.reason == PAUSED

