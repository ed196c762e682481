"""The ``computer`` tool in each provider's own computer-use shape (imports no SDK).

There is one ``computer`` tool (:mod:`harness.tools.computer`, actions named as Anthropic names
them) and one call path. What differs per provider is only the request's tool entry and how the
model's calls and their screenshots are written:

* **Anthropic Messages**: the tool is sent as Anthropic's computer tool type instead of a
  function schema, ``{"type": VERSION, "name": "computer", "display_width_px": 1280,
  "display_height_px": 800, "display_number": 1}`` (``computer_20251124`` adds
  ``"enable_zoom": true``), with the version's ``anthropic-beta`` header. The version follows
  the model's name (:func:`anthropic_computer_version`): ``computer_20250124``
  (``computer-use-2025-01-24``) for the models that only know it (Claude Sonnet 4.5, Haiku 4.5,
  Opus 4.1, Sonnet 4, Opus 4, Sonnet 3.7), ``computer_20251124`` (``computer-use-2025-11-24``)
  for every other model. The model's ``tool_use`` input is the tool's arguments as they are; the
  screenshot comes back as an ``image`` block of the ``tool_result``.
* **OpenAI Responses**: ``{"type": "computer"}`` (the GA tool), or for the ``computer-use-preview``
  models ``{"type": "computer_use_preview", "display_width": 1280, "display_height": 800,
  "environment": "linux"}``. A ``computer_call`` item (its ``action``, or its batched ``actions``)
  becomes one call of ``computer`` per action (:func:`harness.tools.computer.from_openai_action`),
  under the item's ``call_id`` when it is one action, else ``CALL_ID:1``, ``CALL_ID:2``, ... in
  order; once an action of a batch fails, the ones after it are not run (``tool_failed``, saying
  which failed). The calls are answered together by ONE ``computer_call_output`` item carrying the last
  screenshot taken (``{"type": "computer_screenshot", "image_url": "data:image/png;base64,..."}``).
  A failed action cannot be said in that item (it holds a screenshot only), so its message follows
  in a ``user`` message, ``[computer_call CALL_ID: MESSAGE]``; when no action of the item produced
  a screenshot, the item carries a blank 1x1 PNG.

  **Safety checks**: a ``computer_call`` with ``pending_safety_checks`` is only run when the policy
  asks a person to approve the call (``decision = "ask"`` for ``computer``); the approval's reason
  lists the checks, and the person's approval is the acknowledgement, so its
  ``computer_call_output`` carries ``acknowledged_safety_checks``. Otherwise the loop refuses
  the call (``denied``, naming the checks) without running it and nothing is acknowledged:
  callbox never acknowledges on its own a check it cannot judge.

Chat Completions has no computer-use tool type: there ``computer`` is the plain function tool.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import struct
import zlib
from collections.abc import Sequence
from typing import Any

from harness.core.calls import ToolResult
from harness.core.formats import data_url
from harness.core.registry import ToolDefinition
from harness.models.base import ModelToolCall
from harness.tools.computer import SCREEN_HEIGHT, SCREEN_WIDTH, ComputerArgs, from_openai_action

__all__ = [
    "ANTHROPIC_BETAS",
    "BLANK_PNG_URL",
    "COMPUTER",
    "anthropic_computer_tool",
    "anthropic_computer_version",
    "computer_call_calls",
    "computer_call_outputs",
    "computer_call_parent",
    "is_computer",
    "responses_computer_tool",
]

COMPUTER = "computer"
DISPLAY_NUMBER = 1
ANTHROPIC_BETAS = {"computer_20251124": "computer-use-2025-11-24", "computer_20250124": "computer-use-2025-01-24"}
"""Each Anthropic computer tool version and the ``anthropic-beta`` header it needs."""
_OLDER_CLAUDE = re.compile(
    r"(?:^|[./:])claude-(?:(?:sonnet|haiku)-4-5|opus-4-1|(?:opus|sonnet)-4(?:-0)?|3-7-sonnet)(?:-\d{8})?(?:-latest)?"
    r"(?:[-@:]v\d.*)?$")
"""The models that know ``computer_20250124`` and not the newer version."""
_BATCH = re.compile(r"^(.*):\d+$")


def is_computer(definition: ToolDefinition) -> bool:
    """Whether ``definition`` is callbox's own ``computer`` tool (a declared tool of that name is not)."""
    return definition.name == COMPUTER and definition.input_model is ComputerArgs


# --- Anthropic ------------------------------------------------------------------------------------


def anthropic_computer_version(model: str) -> str:
    """The computer tool version ``model`` takes (see the module docstring)."""
    return "computer_20250124" if _OLDER_CLAUDE.search(model.strip().lower()) else "computer_20251124"


def anthropic_computer_tool(version: str) -> dict[str, Any]:
    """The Messages API's tool entry for ``computer`` in ``version``."""
    tool: dict[str, Any] = {"type": version, "name": COMPUTER, "display_width_px": SCREEN_WIDTH,
                            "display_height_px": SCREEN_HEIGHT, "display_number": DISPLAY_NUMBER}
    if version == "computer_20251124":
        tool["enable_zoom"] = True
    return tool


# --- OpenAI Responses -----------------------------------------------------------------------------


def responses_computer_tool(model: str) -> dict[str, Any]:
    """The Responses API's tool entry for ``computer``: the preview shape for the preview models."""
    if model.strip().lower().startswith("computer-use-preview"):
        return {"type": "computer_use_preview", "display_width": SCREEN_WIDTH, "display_height": SCREEN_HEIGHT,
                "environment": "linux"}
    return {"type": "computer"}


def computer_call_calls(item: dict[str, Any]) -> list[ModelToolCall]:
    """A ``computer_call`` item as the calls of ``computer`` it asks for, in order."""
    call_id = str(item.get("call_id") or "")
    batched = item.get("actions")
    actions = batched if isinstance(batched, list) else [item.get("action")]
    arguments = [args for action in actions for args in from_openai_action(action if isinstance(action, dict) else {})]
    checks = tuple(f"{check.get('code') or 'safety_check'}: {check.get('message') or 'no message'}"
                   for check in item.get("pending_safety_checks") or [] if isinstance(check, dict))
    ids = [call_id] if len(arguments) == 1 else [f"{call_id}:{n}" for n in range(1, len(arguments) + 1)]
    batch = call_id if len(arguments) > 1 else ""
    return [ModelToolCall(call_id=each, name=COMPUTER, arguments=json.dumps(args, separators=(",", ":")),
                          safety_checks=checks, batch=batch)
            for each, args in zip(ids, arguments, strict=True)]


def computer_call_parent(call_id: str, computer_calls: dict[str, dict[str, Any]]) -> str | None:
    """The ``computer_call`` item's id that the call ``call_id`` belongs to (None: not one of them)."""
    if call_id in computer_calls:
        return call_id
    batch = _BATCH.match(call_id)
    return batch.group(1) if batch and batch.group(1) in computer_calls else None


def computer_call_outputs(item: dict[str, Any], results: Sequence[ToolResult]) -> list[dict[str, Any]]:
    """The answer to one ``computer_call`` item from the results of its calls (see the module docstring)."""
    call_id = str(item.get("call_id") or "")
    images = [image for result in results for image in result.images]
    output: dict[str, Any] = {
        "type": "computer_call_output", "call_id": call_id,
        "output": {"type": "computer_screenshot", "image_url": data_url(images[-1]) if images else BLANK_PNG_URL},
    }
    checks = [check for check in item.get("pending_safety_checks") or [] if isinstance(check, dict)]
    if checks and results and all(result.meta.get("decision") == "approved" for result in results):
        output["acknowledged_safety_checks"] = [
            {key: check[key] for key in ("id", "code", "message") if check.get(key) is not None} for check in checks]
    items = [output]
    failures = [f"[computer_call {call_id}: {result.text}]" for result in results if result.is_error]
    if failures:
        items.append({"role": "user", "content": [{"type": "input_text", "text": "\n".join(failures)}]})
    return items


def group_by_computer_call(results: Sequence[ToolResult], computer_calls: dict[str, dict[str, Any]]
                           ) -> list[tuple[str | None, list[ToolResult]]]:
    """``results`` in order, the consecutive ones of one ``computer_call`` together (its id; None: others)."""
    groups: list[tuple[str | None, list[ToolResult]]] = []
    for parent, run in itertools.groupby(results, key=lambda r: computer_call_parent(r.call_id, computer_calls)):
        if parent is None:
            groups.extend((None, [result]) for result in run)
        else:
            groups.append((parent, list(run)))
    return groups


def _blank_png() -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    header = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\x00\xff\xff\xff"))
            + chunk(b"IEND", b""))


BLANK_PNG_URL = "data:image/png;base64," + base64.b64encode(_blank_png()).decode("ascii")
