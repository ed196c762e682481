"""Keeping a long run's context under a byte budget by eliding old tool outputs.

The rule, applied by the loop after each turn's results are appended:

* **Size** is the UTF-8 byte length of the context items serialized as compact JSON
  (``json.dumps(items, ensure_ascii=False, separators=(",", ":"))``), the system prompt
  not included (it never changes and is never elided).
* **Trigger**: nothing happens while the size is at most ``trigger`` (default 0.9) times
  the budget. Once it is above, tool outputs are elided **oldest first** until the size is
  at most ``target`` (default 0.7) times the budget, or nothing more can be elided. The gap
  between the two marks means elision happens in batches every few turns, not a little on
  every turn, so the start of the context (what provider prompt caches key on) changes
  rarely.
* **What is elided**: only tool *outputs*, never the model's own messages, its tool calls
  (names and arguments stay, so the model still sees what it did) or the user's task. The
  latest ``keep_latest`` (default 3) outputs always stay whole, whatever the size. An
  output is replaced by the stub ``[output of CALL_ID elided: N bytes]``, where N is the
  UTF-8 size of the original output text (of its JSON when the output is a list of content
  blocks). An output already elided, or one no larger than its stub, is left alone, so
  eliding is idempotent. The full output stays in the audit store (``callbox audit --run``).
* **Where outputs are**, per provider shape (as :func:`harness.core.formats.result_item` and the
  adapters append them):

  - OpenAI Responses: an item ``{"type": "function_call_output", "call_id", "output"}``
    (also ``custom_tool_call_output``); ``output`` is replaced; of a ``computer_call_output``
    (whose output can only be a screenshot) the screenshot's ``image_url`` is replaced by a
    blank 1x1 PNG rather than a stub;
  - Chat Completions: a message ``{"role": "tool", "tool_call_id", "content"}``;
    ``content`` is replaced; so is the ``content`` of the ``user`` message carrying the
    pictures of a turn's results (:func:`harness.core.formats.chat_image_message`), an
    output of the first call it has pictures of;
  - Anthropic Messages: a block ``{"type": "tool_result", "tool_use_id", "content", ...}``
    inside a user message's ``content`` list (or standing alone as an item); ``content``
    is replaced and ``is_error`` kept.

Items are changed in place (the loop owns its context); everything else in them is kept.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from harness.core.formats import chat_images_call_id
from harness.models.computer_use import BLANK_PNG_URL

__all__ = ["DEFAULT_KEEP_LATEST", "DEFAULT_TARGET", "DEFAULT_TRIGGER", "Elision", "context_size", "elide",
           "stub", "tool_outputs"]

DEFAULT_TRIGGER = 0.9
"""Elide once the context is above this fraction of the budget."""
DEFAULT_TARGET = 0.7
"""...down to this fraction of it."""
DEFAULT_KEEP_LATEST = 3
"""The latest outputs kept whole."""

_STUB = re.compile(r"\[output of \S+ elided: \d+ bytes\]")
_RESPONSES_OUTPUT_TYPES = ("function_call_output", "custom_tool_call_output")


def stub(call_id: str, size: int) -> str:
    """``[output of call_X elided: N bytes]``."""
    return f"[output of {call_id} elided: {size} bytes]"


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _size(value: object) -> int:
    """Bytes ``value`` takes in the compact JSON of the context."""
    return len(_dumps(value).encode("utf-8", "surrogatepass"))


def context_size(items: list[dict[str, Any]]) -> int:
    """The serialized size of the context items, as the budget counts it."""
    return _size(items)


@dataclass(frozen=True)
class _Output:
    """One tool output in the context: ``holder[key]`` is the output of ``call_id``."""

    holder: dict[str, Any]
    key: str
    call_id: str
    replacement: str | None = None
    """What replaces it, when it is not the stub (a shape that must stay an image)."""


def tool_outputs(items: list[dict[str, Any]]) -> list[_Output]:
    """Every tool output in the context, in context order, whatever the provider shape."""
    return list(_outputs(items))


def _outputs(items: list[dict[str, Any]]) -> Iterator[_Output]:
    for item in items:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind in _RESPONSES_OUTPUT_TYPES and "output" in item:
            yield _Output(item, "output", str(item.get("call_id", "?")))
        elif kind == "computer_call_output" and isinstance(item.get("output"), dict) and "image_url" in item["output"]:
            yield _Output(item["output"], "image_url", str(item.get("call_id", "?")), replacement=BLANK_PNG_URL)
        elif item.get("role") == "tool" and "content" in item:
            yield _Output(item, "content", str(item.get("tool_call_id", "?")))
        elif (pictures_of := chat_images_call_id(item)) is not None:
            yield _Output(item, "content", pictures_of)
        elif kind == "tool_result" and "content" in item:
            yield _Output(item, "content", str(item.get("tool_use_id", "?")))
        elif isinstance(item.get("content"), list):  # an Anthropic message holding tool_result blocks
            for block in item["content"]:
                if isinstance(block, dict) and block.get("type") == "tool_result" and "content" in block:
                    yield _Output(block, "content", str(block.get("tool_use_id", "?")))


def _original_size(value: object) -> int:
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    return _size(value)


def _is_stub(value: object) -> bool:
    return isinstance(value, str) and _STUB.fullmatch(value) is not None


@dataclass(frozen=True)
class Elision:
    """What one :func:`elide` did."""

    call_ids: tuple[str, ...]
    """The calls whose outputs were replaced by stubs now, oldest first."""
    bytes_before: int
    bytes_after: int

    @property
    def changed(self) -> bool:
        return bool(self.call_ids)


def elide(
    items: list[dict[str, Any]],
    budget_bytes: int,
    *,
    keep_latest: int = DEFAULT_KEEP_LATEST,
    trigger: float = DEFAULT_TRIGGER,
    target: float = DEFAULT_TARGET,
) -> Elision:
    """Apply the module's rule to ``items`` (in place) and report what was elided."""
    if budget_bytes <= 0:
        raise ValueError(f"the context budget must be positive, got {budget_bytes}")
    if not 0 < target <= trigger:
        raise ValueError(f"need 0 < target <= trigger, got target={target} trigger={trigger}")
    before = context_size(items)
    if before <= trigger * budget_bytes:
        return Elision((), before, before)
    outputs = tool_outputs(items)
    candidates = outputs[: max(0, len(outputs) - max(0, keep_latest))]
    size = before
    elided: list[str] = []
    for out in candidates:
        if size <= target * budget_bytes:
            break
        value = out.holder[out.key]
        if _is_stub(value) or (out.replacement is not None and value == out.replacement):
            continue
        replacement = out.replacement or stub(out.call_id, _original_size(value))
        saved = _size(value) - _size(replacement)
        if saved <= 0:
            continue
        out.holder[out.key] = replacement
        size -= saved
        elided.append(out.call_id)
    return Elision(tuple(elided), before, size)
