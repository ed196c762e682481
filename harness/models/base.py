"""The one small interface every model adapter implements.

The loop never sees a provider's types. It keeps the conversation as a list of JSON
items in the provider's own shapes (``Context.items``: Responses input items, Chat
messages or Anthropic messages), asks the adapter for the next turn, and appends the
adapter's assistant items and the tool results (shaped by ``harness.core.formats``) back
in that provider's way. Because the context is plain JSON it can be checkpointed in
the audit store and resumed by another process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from harness.core.calls import ToolResult
from harness.core.errors import CallboxError, ErrorCode
from harness.core.formats import Format
from harness.core.registry import ToolDefinition

TextSink = Callable[[str], None]
"""Receives the model's text as it streams."""


@dataclass(frozen=True)
class ModelToolCall:
    """One tool call the model emitted in a turn, in the order it emitted them."""

    call_id: str
    name: str
    arguments: str
    """The arguments exactly as the model sent them (JSON text, or freeform text)."""
    safety_checks: tuple[str, ...] = ()
    """The provider's pending safety checks on the call (``code: message``), which a person must
    acknowledge by approving it (OpenAI's ``computer_call``); empty for ordinary calls."""
    batch: str = ""
    """The provider item this call is one action of, when the item asks for several (OpenAI's
    batched ``computer_call``): once one of them fails, the ones after it are not run."""


@dataclass(frozen=True)
class Usage:
    """What the provider reported for one turn (zeros when it reports nothing)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float | None = None


@dataclass(frozen=True)
class ModelTurn:
    """The model's answer: text, tool calls, or both; ``items`` are the provider-shaped
    assistant items to append to the context verbatim."""

    text: str
    tool_calls: tuple[ModelToolCall, ...]
    items: tuple[dict[str, Any], ...]
    usage: Usage = field(default_factory=Usage)
    stop_reason: str = ""

    @property
    def is_final(self) -> bool:
        return not self.tool_calls


@dataclass(frozen=True)
class ForcedTool:
    """tool_choice that forces one named tool."""

    name: str


@dataclass(frozen=True)
class AllowedTools:
    """tool_choice that restricts this turn to a subset (``mode`` auto or required)."""

    names: tuple[str, ...]
    mode: Literal["auto", "required"] = "auto"


ToolChoice = Literal["auto", "required", "none"] | ForcedTool | AllowedTools


@dataclass
class Context:
    """The conversation in the provider's shapes, plus the system prompt kept apart
    (Anthropic and Responses take it as a separate parameter)."""

    system: str
    items: list[dict[str, Any]] = field(default_factory=list)


class ModelError(Exception):
    """A model API failure; ``retryable`` says whether the loop may try the turn again."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable


class ModelConfigError(CallboxError):
    """A model cannot be set up as asked (bad spec, missing key, unreadable transcript)."""

    code = ErrorCode.INVALID_REQUEST


class MissingApiKey(ModelConfigError):
    """No key for a provider that needs one; ``variable`` is the one to set."""

    def __init__(self, message: str, *, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


class ModelAdapter(Protocol):
    """A model behind one provider's API."""

    format: Format
    """The shape tool results take in this provider's context (openai, chat or anthropic)."""
    name: str
    """``provider:model`` for logs and the audit store."""

    def start(self, system: str, task: str) -> Context:
        """A new context holding the user's task."""
        ...

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        """Ask the model for its next turn; raise ModelError on API failure."""
        ...

    def append_turn(self, context: Context, turn: ModelTurn) -> None:
        """Append the model's own turn (its ``items``) to the context."""
        ...

    def append_results(self, context: Context, results: list[ToolResult]) -> None:
        """Append one result per call, in the order given, in the provider's shape."""
        ...
