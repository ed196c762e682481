"""What every adapter shares: the context in each provider's shapes, the tool_choice
check, and small JSON helpers. Imports no SDK, so the scripted model needs none."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Sequence
from typing import Any

from harness.core.calls import ToolResult
from harness.core.formats import Format, chat_image_message, result_item
from harness.models.base import AllowedTools, Context, ForcedTool, ModelError, ModelTurn, ToolChoice
from harness.models.computer_use import computer_call_outputs, group_by_computer_call

__all__ = [
    "ProviderContext",
    "append_items",
    "append_results",
    "as_dict",
    "check_tool_choice",
    "json_text",
    "new_context",
    "set_system",
]


# --- contexts in each provider's shapes -----------------------------------------------------


class ProviderContext:
    """The context half of the ModelAdapter interface, the same for every adapter: the
    conversation is kept in ``self.format``'s item shapes."""

    format: Format

    def start(self, system: str, task: str) -> Context:
        return new_context(self.format, system, task)

    def append_turn(self, context: Context, turn: ModelTurn) -> None:
        append_items(context, turn.items)

    def append_results(self, context: Context, results: list[ToolResult]) -> None:
        append_results(context, results, self.format)


def new_context(fmt: Format, system: str, task: str) -> Context:
    """The first items: Chat puts the system prompt in a system message; the Responses and
    Anthropic adapters send ``context.system`` as a request parameter instead."""
    items: list[dict[str, Any]] = []
    if fmt == "chat" and system:
        items.append({"role": "system", "content": system})
    items.append({"role": "user", "content": task})
    return Context(system=system, items=items)


def set_system(context: Context, fmt: Format, system: str) -> None:
    """Give ``context`` another system prompt (another agent took the run over): its
    ``system``, and in Chat the system message that opens the conversation (replaced, made
    if there was none, removed for an empty prompt)."""
    context.system = system
    if fmt != "chat":
        return
    has_one = bool(context.items) and context.items[0].get("role") == "system"
    if has_one and system:
        context.items[0] = {"role": "system", "content": system}
    elif has_one:
        del context.items[0]
    elif system:
        context.items.insert(0, {"role": "system", "content": system})


def append_items(context: Context, items: Iterable[dict[str, Any]]) -> None:
    """Append the model's own items (copies: the turn keeps its own)."""
    context.items.extend(copy.deepcopy(list(items)))


def append_results(context: Context, results: Sequence[ToolResult], fmt: Format) -> None:
    """One result per call, in the order given, as ``fmt`` wants them.

    * ``openai``: one ``function_call_output`` item each (``custom_tool_call_output`` when
      the call was a freeform ``custom_tool_call``); the calls of one ``computer_call`` item
      together get its one ``computer_call_output`` (:mod:`harness.models.computer_use`);
    * ``chat``: one ``{"role": "tool"}`` message each, then, when any result has pictures,
      one ``user`` message carrying them (a tool message holds text only);
    * ``anthropic``: ONE user message whose content is the ``tool_result`` blocks in order.
    """
    if not results:
        return
    if fmt == "openai":
        custom = {item.get("call_id") for item in context.items if item.get("type") == "custom_tool_call"}
        computer = {str(item.get("call_id")): item for item in context.items if item.get("type") == "computer_call"}
        for parent, group in group_by_computer_call(results, computer):
            if parent is not None:
                context.items.extend(computer_call_outputs(computer[parent], group))
                continue
            (result,) = group
            item = result_item(result, "openai")
            if result.call_id in custom:
                item["type"] = "custom_tool_call_output"
            context.items.append(item)
    elif fmt == "chat":
        context.items.extend(result_item(result, "chat") for result in results)
        pictures = chat_image_message(results)
        if pictures is not None:
            context.items.append(pictures)
    elif fmt == "anthropic":
        context.items.append({"role": "user", "content": [result_item(result, "anthropic") for result in results]})
    else:
        raise ValueError(f"a model context has no {fmt!r} shape; use openai, chat or anthropic")


# --- tool_choice ------------------------------------------------------------------------------


def check_tool_choice(tool_choice: ToolChoice, offered: Sequence[str]) -> ToolChoice:
    """``tool_choice`` checked against the tools offered this turn (ModelError, not retryable,
    when it names a tool not offered or requires a call with no tool to call); an empty
    AllowedTools subset in auto mode becomes ``none``."""
    names = set(offered)
    listed = ", ".join(offered) or "none"
    if isinstance(tool_choice, ForcedTool):
        if tool_choice.name not in names:
            raise ModelError(
                f"tool_choice forces tool {tool_choice.name!r}, which is not among the tools offered "
                f"this turn ({listed})",
                retryable=False,
            )
        return tool_choice
    if isinstance(tool_choice, AllowedTools):
        unknown = [name for name in tool_choice.names if name not in names]
        if unknown:
            raise ModelError(
                f"tool_choice allows {', '.join(map(repr, unknown))}, not among the tools offered this turn ({listed})",
                retryable=False,
            )
        if not tool_choice.names:
            if tool_choice.mode == "required":
                raise ModelError("tool_choice requires a tool call but allows no tools", retryable=False)
            return "none"
        return tool_choice
    if tool_choice not in ("auto", "required", "none"):
        raise ModelError(
            f"unknown tool_choice {tool_choice!r}; use auto, required, none, ForcedTool or AllowedTools",
            retryable=False,
        )
    if tool_choice == "required" and not names:
        raise ModelError("tool_choice 'required' but no tools are offered this turn", retryable=False)
    return tool_choice


# --- small helpers ------------------------------------------------------------------------------


def as_dict(value: object) -> dict[str, Any]:
    """``value`` if it is a JSON object, else an empty one (for optional response fields)."""
    return value if isinstance(value, dict) else {}


def json_text(value: Any) -> str:
    """Arguments as text: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
