"""The shapes every part of the harness shares: a tool call, its result, a decision.

A model-visible failure (bad JSON, schema violation, unknown tool, denied, timed out,
non-zero exit) is a ``ToolResult`` with ``is_error`` set and an ``error`` code, never
an exception: the loop hands it to the model, which can act on the words in ``text``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import ErrorCode

__all__ = ["CALL_ID_PATTERN", "IMAGE_MEDIA_TYPES", "TOOL_NAME_PATTERN", "Action", "Decision", "ErrorCode",
           "ImagePart", "ToolCall", "ToolOutput", "ToolResult"]

CALL_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
IMAGE_MEDIA_TYPES = ("image/png", "image/jpeg", "image/gif", "image/webp")
"""The image formats a result may carry: those every model dialect accepts."""


@dataclass(frozen=True)
class ImagePart:
    """A picture in a tool result, beside its text (a screenshot, a chart, an image file)."""

    media_type: str
    """One of :data:`IMAGE_MEDIA_TYPES`."""
    data: bytes
    """The encoded image, exactly as the file or the screenshot holds it."""
    width: int
    """Pixels across, read from the image's header."""
    height: int
    """Pixels down, read from the image's header."""
    label: str = ""
    """Where it came from, for people and placeholders (``/workspace/chart.png``, ``screenshot``)."""


@dataclass(frozen=True)
class ToolCall:
    """What the model emitted: a tool name, its arguments (JSON text or object), a call id."""

    name: str
    arguments: str | dict[str, Any]
    call_id: str
    flags: tuple[str, ...] = ()
    """What the model's provider flags on this call (OpenAI's pending safety checks, as ``code:
    message``): a person asked to approve the call reads them beside its arguments."""
    origin: str = ""
    """Who sent it when not the model or a client: ``acceptance`` for a check the agent loop runs
    on the model's final answer (the harness's own call). Kept in the recorded result's
    ``meta["origin"]``, so the audit tells such calls from the model's."""


@dataclass(frozen=True)
class ToolResult:
    """What goes back to the model under the same call id."""

    call_id: str
    text: str
    """The text the model reads (already bounded by the output budget)."""
    is_error: bool = False
    error: ErrorCode | None = None
    structured: dict[str, Any] | None = None
    """Machine-readable detail (exit code, truncation, ...), for MCP structuredContent."""
    meta: dict[str, Any] = field(default_factory=dict)
    """Harness-side facts not shown to the model (timings, bytes, the rule that decided)."""
    images: tuple[ImagePart, ...] = ()
    """Pictures the model sees after ``text``, each within the policy's image bounds."""

    @classmethod
    def failure(cls, call_id: str, code: ErrorCode, text: str, **meta: Any) -> ToolResult:
        return cls(call_id=call_id, text=text, is_error=True, error=code, meta=meta)


class Action(enum.StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


@dataclass(frozen=True)
class Decision:
    """The policy's verdict on one call and the rule that produced it (for the audit log)."""

    action: Action
    rule: str
    """Human-readable rule name, e.g. ``tools.shell.rules[2] deny "rm -rf *"`` or ``default``."""
    reason: str = ""
    """Sentence shown to the model when the action is deny (or to an approver for ask)."""


@dataclass(frozen=True)
class ToolOutput:
    """What a handler returns, before the harness bounds and shapes it for the model."""

    text: str
    is_error: bool = False
    error: ErrorCode | None = None
    structured: dict[str, Any] | None = None
    raw_bytes: int = 0
    """Bytes the tool produced before any truncation (for the audit log)."""
    images: tuple[ImagePart, ...] = ()
    """Pictures the tool produced, before the harness checks them against the policy's bounds."""
