"""How an agent run is configured: tool_choice settings, stages, limits (``LoopConfig``).

Everything here is plain data validated by pydantic; a paused run's checkpoint holds
``LoopConfig.model_dump(mode="json")`` and the current tool_choice as JSON
(:func:`choice_to_json`), so both survive a restart.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from harness.core.acceptance import AcceptanceCheck
from harness.core.errors import CallboxError, ErrorCode
from harness.models.base import AllowedTools, ForcedTool, ToolChoice

__all__ = ["AcceptanceCheck", "AllowTools", "ChoiceSetting", "ForceTool", "LoopConfig", "LoopConfigError", "Stage",
           "choice_from_json", "choice_to_json", "describe_choice", "relaxed", "to_tool_choice"]


class LoopConfigError(CallboxError):
    """A loop configuration that cannot work with this registry and policy."""

    code = ErrorCode.INVALID_REQUEST


class ForceTool(BaseModel):
    """tool_choice ``{"tool": NAME}``: the model must call this tool."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tool: str
    """The tool to force."""


class AllowTools(BaseModel):
    """tool_choice ``{"allowed": [...], "mode": "auto"|"required"}``: only these tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    allowed: tuple[str, ...] = Field(min_length=1)
    """The tools the model may call this turn (all exposed tools stay listed)."""
    mode: Literal["auto", "required"] = "auto"
    """``required``: the model must call one of them."""


ChoiceSetting = Literal["auto", "required", "none"] | ForceTool | AllowTools
"""A tool_choice as configured (and checkpointed) as JSON."""

_TURNS = re.compile(r"\s*(\d+)\s*(?:(-)\s*(\d+)?)?\s*")


class Stage(BaseModel):
    """A per-stage override: ``{turns = "1-2", tools = [...], tool_choice = ...}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    turns: str
    """Turns it covers, counted from 1: ``"3"``, ``"1-2"``, or ``"4-"`` (turn 4 onwards)."""
    tools: tuple[str, ...] | None = None
    """Tools exposed in these turns (within the policy's allowed_tools); None: all of them."""
    tool_choice: ChoiceSetting | None = None
    """tool_choice from the stage's first turn on (reset to auto after a tool-calling turn
    like any other); None: keep the current one."""

    @field_validator("turns")
    @classmethod
    def _turns(cls, value: str) -> str:
        match = _TURNS.fullmatch(value)
        if match is None:
            raise ValueError(f'turns {value!r} must be "N", "N-M" or "N-" with turns counted from 1')
        first = int(match.group(1))
        last = match.group(3)
        if first < 1 or (last is not None and int(last) < first):
            raise ValueError(f"turns {value!r} is an empty range (turns are counted from 1)")
        return value.strip()

    def covers(self, turn: int) -> bool:
        match = _TURNS.fullmatch(self.turns)
        assert match is not None  # validated
        first = int(match.group(1))
        if match.group(2) is None:
            return turn == first
        last = match.group(3)
        return turn >= first and (last is None or turn <= int(last))


class LoopConfig(BaseModel):
    """How one agent run is driven and when it must stop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(default=50, ge=1)
    """Model turns at most; a run still calling tools after this many ends with ``max_turns``."""
    tool_choice: ChoiceSetting = "auto"
    """tool_choice of the first turn: ``auto``, ``required``, ``none``, ``{"tool": NAME}`` or
    ``{"allowed": [...], "mode": ...}``. ``required`` and forced become ``auto`` after a turn
    that called tools."""
    stages: tuple[Stage, ...] = ()
    """Per-stage overrides of the exposed tools and tool_choice; the first stage covering a
    turn applies to it."""
    max_input_tokens: int | None = Field(default=None, ge=1)
    """Total input tokens the model may consume in the run (``budget:input_tokens``)."""
    max_output_tokens: int | None = Field(default=None, ge=1)
    """Total output tokens the model may produce in the run (``budget:output_tokens``)."""
    max_cost_usd: float | None = Field(default=None, gt=0)
    """Total cost in USD (``budget:cost``); checked only if the adapter reports cost."""
    loop_detection: int | None = Field(default=5, ge=2)
    """End with ``loop_detected`` once this many calls in a row are the same tool with the
    same arguments; None turns detection off."""
    model_retries: int = Field(default=3, ge=0)
    """Retries of a model call that failed with a retryable ModelError."""
    retry_wait_s: float = Field(default=1.0, ge=0)
    """First backoff before a retry (doubling each time, at most ``retry_wait_max_s``)."""
    retry_wait_max_s: float = Field(default=30.0, ge=0)
    """Longest backoff between two retries."""
    parallel_tool_calls: bool = True
    """Run consecutive read-only calls of one turn concurrently (results keep the model's order)."""
    max_parallel: int = Field(default=8, ge=1)
    """Threads for concurrent read-only calls."""
    context_budget_bytes: int | None = Field(default=None, ge=1024)
    """Serialized context size to stay under by eliding old tool outputs
    (:mod:`harness.loop.context_budget`); None: never elide."""
    keep_latest_outputs: int = Field(default=3, ge=0)
    """Latest tool outputs never elided."""
    paused_sandbox_ttl_s: float | None = Field(default=None, ge=0)
    """How long a paused run's sandbox is kept from the pause; None: until the sandbox's own
    expiry (its creation plus the policy's ``sandbox.ttl_seconds``)."""
    acceptance: tuple[AcceptanceCheck, ...] = ()
    """Checks run when the model gives a final answer (:mod:`harness.loop.acceptance`); all
    pass: the run ends ``final:accepted``; one fails: the model is told what failed and the
    run goes on, up to ``max_rejections`` times, then ends ``rejected:acceptance``. Empty:
    the policy's ``[acceptance]`` checks, if any, else ``final`` as is."""
    max_rejections: int = Field(default=3, ge=0)
    """Rejected answers the model is told of (and may try again after); the next rejected
    answer ends the run ``rejected:acceptance`` (0: the first one does)."""


def to_tool_choice(setting: ChoiceSetting) -> ToolChoice:
    """A configured tool_choice as the adapter interface's ToolChoice."""
    if isinstance(setting, ForceTool):
        return ForcedTool(setting.tool)
    if isinstance(setting, AllowTools):
        return AllowedTools(tuple(setting.allowed), setting.mode)
    return setting


def choice_to_json(choice: ToolChoice) -> Any:
    """A ToolChoice as the JSON a config or checkpoint holds."""
    if isinstance(choice, ForcedTool):
        return {"tool": choice.name}
    if isinstance(choice, AllowedTools):
        return {"allowed": list(choice.names), "mode": choice.mode}
    return choice


def choice_from_json(value: Any) -> ToolChoice:
    class _Holder(BaseModel):
        choice: ChoiceSetting

    return to_tool_choice(_Holder.model_validate({"choice": value}).choice)


def describe_choice(choice: ToolChoice) -> str:
    """``auto`` / ``required`` / ``none`` / ``tool:NAME`` / ``allowed:a,b`` (+ ``/required``)."""
    if isinstance(choice, ForcedTool):
        return f"tool:{choice.name}"
    if isinstance(choice, AllowedTools):
        suffix = "/required" if choice.mode == "required" else ""
        return f"allowed:{','.join(choice.names)}{suffix}"
    return choice


def relaxed(choice: ToolChoice) -> ToolChoice:
    """The tool_choice after a turn that called tools: never forced to call again."""
    if choice == "required" or isinstance(choice, ForcedTool):
        return "auto"
    if isinstance(choice, AllowedTools) and choice.mode == "required":
        return AllowedTools(choice.names, "auto")
    return choice

