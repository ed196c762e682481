"""What the loop knows about its run: the steps of the state machine and the run's state
(what a checkpoint saves)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from harness.audit.store import arguments_digest
from harness.core.calls import ToolResult
from harness.loop.checkpoint import SandboxRef
from harness.models.base import Context, ModelToolCall, ToolChoice

__all__ = ["RunState", "Step", "call_key"]


class Step(enum.StrEnum):
    ATTACH_SANDBOX = "attach_sandbox"
    RESEND_CALLS = "resend_calls"
    SELECT_TOOLS = "select_tools"
    CALL_MODEL = "call_model"
    EXECUTE_CALLS = "execute_calls"
    APPEND_RESULTS = "append_results"
    VERIFY = "verify"
    CHECK_LIMITS = "check_limits"
    PAUSE = "pause"
    FINISH = "finish"
    DONE = "done"


@dataclass
class RunState:
    """Everything the loop knows about its run (what a checkpoint saves)."""

    run_id: str
    context: Context
    choice: ToolChoice
    turn: int = 0
    stage: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None
    tool_calls: int = 0
    prior_seconds: float = 0.0
    streak_key: str | None = None
    streak_count: int = 0
    calls: list[ModelToolCall] = field(default_factory=list)
    """The current turn's calls, in the model's order."""
    results: list[ToolResult | None] = field(default_factory=list)
    """Their results, by position (None: not run yet)."""
    approvals: dict[str, str] = field(default_factory=dict)
    """call_id -> approval id, for the current turn's pending calls."""
    sandbox: SandboxRef | None = None
    rejections: int = 0
    """Final answers the acceptance checks rejected so far."""
    final_text: str = ""
    reason: str = ""
    message: str = ""


def call_key(call: ModelToolCall) -> str:
    """What loop detection compares: the tool and its arguments as canonical JSON."""
    return f"{call.name}\0{arguments_digest(call.arguments)}"
