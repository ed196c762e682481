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

__all__ = ["CALL_ID_PATTERN", "TOOL_NAME_PATTERN", "Action", "Decision", "ErrorCode", "ToolCall",
           "ToolOutput", "ToolResult"]

CALL_ID_PATTERN = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
TOOL_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@dataclass(frozen=True)
class ToolCall:
    """What the model emitted: a tool name, its arguments (JSON text or object), a call id."""

    name: str
    arguments: str | dict[str, Any]
    call_id: str


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
