"""A model that replays a transcript: for demos, tests, and ``callbox run TRANSCRIPT.jsonl``.

The transcript is JSONL: one model turn per line, in order. Blank lines and lines whose
first non-blank character is ``#`` are skipped. Each turn is an object with these keys
(all optional; any other key is an error, so a typo cannot silently end the run):

``text``
    What the model says (string, default ``""``). A turn without tool calls is final.
``tool_calls``
    A list of calls, issued in this order within the turn. Each call is an object with
    ``name`` (required), ``arguments`` and ``call_id``. ``arguments`` may be an object
    (sent on as compact JSON text) or a string (sent verbatim, so malformed JSON can be
    scripted too); default ``{}``. ``call_id`` defaults to ``call_<turn>_<n>`` (both
    counted from 1, e.g. ``call_2_1``; another prefix than ``call`` with ``call_prefix=``:
    each agent of a run of several agents replays its own transcript, and its calls are
    ``call_<agent>_<turn>_<n>`` so that the call_ids of one run stay distinct).
``usage``
    ``{"input_tokens": int, "output_tokens": int, "cost_usd": float}`` (each optional).
``stop_reason``
    Default ``tool_calls`` for a turn with calls, ``stop`` otherwise.
``comment``
    Ignored: a note for the reader of the transcript.

A call may instead be an OpenAI ``computer_call`` (in the ``openai`` format only):
``{"type": "computer_call", "call_id": ..., "action": {...}}`` (or ``"actions": [...]``, batched),
with optional ``pending_safety_checks`` (``[{"id", "code", "message"}]``), written as the
Responses API sends it. It becomes the ``computer_call`` item and its calls of ``computer``,
answered by a ``computer_call_output``, exactly as the Responses adapter does
(:mod:`harness.models.computer_use`). In the ``anthropic`` format a ``computer`` call with
Anthropic's input (``{"action": "left_click", "coordinate": [x, y]}``) is already what the
Messages API sends.

The first line may name the format the transcript is written in, ``{"format": "anthropic"}``
(``openai``, ``chat`` or ``anthropic``): it is not a turn. A model made with an explicit
``format=`` that differs refuses the file.

Example::

    # list the files, then answer
    {"text": "Let me look.", "tool_calls": [{"call_id": "c1", "name": "shell", "arguments": {"command": "ls"}}]}
    {"text": "There are two files.", "usage": {"input_tokens": 120, "output_tokens": 9}}

and a click through OpenAI's computer use (one line in the file)::

    {"tool_calls": [{"type": "computer_call", "call_id": "c1",
                     "action": {"type": "click", "x": 400, "y": 250, "button": "left"}}]}

The model keeps its context in one provider's shapes, the Responses API's (``openai``) by
default, or ``chat`` / ``anthropic`` (``format=``): ``start``, ``append_turn`` and
``append_results`` behave exactly as that provider's adapter, and each turn's ``items`` are
what that provider would have sent (Responses: a ``message`` item with the text, then one
``function_call`` item per call; Chat: one assistant message with ``tool_calls``;
Anthropic: one assistant message with ``text`` and ``tool_use`` blocks, whose ``input`` is
the arguments object, or ``{"_arguments": TEXT}`` when the string is not a JSON object).

``complete`` returns the next turn whatever it is asked (after the same tool_choice check
the real adapters make), and records the request in ``requests`` (tools offered,
tool_choice, context length and a copy of the items) so tests can assert what the loop
asked. When the transcript is exhausted it raises ``ModelError(retryable=False)``: "the
transcript has no more turns".
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.core.formats import Format
from harness.core.registry import ToolDefinition
from harness.models.base import (
    Context,
    ModelConfigError,
    ModelError,
    ModelToolCall,
    ModelTurn,
    TextSink,
    ToolChoice,
    Usage,
)
from harness.models.common import ProviderContext, check_tool_choice, json_text
from harness.models.computer_use import computer_call_calls

__all__ = ["ScriptError", "ScriptedModel", "ScriptedRequest", "parse_turn"]

_TURN_KEYS = frozenset({"text", "tool_calls", "usage", "stop_reason", "comment"})
_CALL_KEYS = frozenset({"call_id", "name", "arguments"})
_COMPUTER_CALL_KEYS = frozenset({"type", "call_id", "action", "actions", "pending_safety_checks"})
_USAGE_KEYS = frozenset({"input_tokens", "output_tokens", "cost_usd"})
_CONTEXT_FORMATS = ("openai", "chat", "anthropic")


class ScriptError(ModelConfigError):
    """The transcript cannot be read; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class ScriptedRequest:
    """What the loop asked for one turn."""

    tools: tuple[str, ...]
    tool_choice: ToolChoice
    context_length: int
    items: list[dict[str, Any]]
    system: str


class ScriptedModel(ProviderContext):
    """Replays model turns from a transcript (see the module docstring for the format)."""

    def __init__(
        self,
        turns: Iterable[Mapping[str, Any]],
        *,
        format: Format = "openai",
        name: str = "scripted",
        sources: Sequence[str] | None = None,
        call_prefix: str = "call",
    ) -> None:
        """``turns`` as parsed JSON objects; ``sources`` names where each came from (for errors);
        ``call_prefix``: what a call without a ``call_id`` is named by (``PREFIX_<turn>_<n>``)."""
        if format not in _CONTEXT_FORMATS:
            raise ScriptError(f"the scripted model cannot speak {format!r}; use one of: {', '.join(_CONTEXT_FORMATS)}")
        self.format: Format = format
        self.name = name
        self.on_text: TextSink | None = None
        """Never called: a scripted turn arrives whole (kept for the adapters' common shape)."""
        self.stream = False
        raw_turns = list(turns)
        labels = list(sources) if sources is not None else [f"turn {n}" for n in range(1, len(raw_turns) + 1)]
        if len(labels) != len(raw_turns):
            raise ValueError("sources must name one place per turn")
        self.turns: list[ModelTurn] = [
            parse_turn(raw, number=number, fmt=format, where=label, call_prefix=call_prefix)
            for number, (raw, label) in enumerate(zip(raw_turns, labels, strict=True), start=1)
        ]
        self.requests: list[ScriptedRequest] = []
        """One entry per ``complete`` call, in order."""
        self.position = 0
        """How many turns were replayed."""

    @classmethod
    def from_file(cls, path: str | Path, *, format: Format | None = None, call_prefix: str = "call") -> ScriptedModel:
        """The model replaying the JSONL file at ``path``; ScriptError if it cannot be read.
        ``format``: the context's shapes (default: the file's ``{"format": ...}`` line, else openai)."""
        file = Path(path)
        try:
            text = file.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ScriptError(f"transcript {str(file)!r} not found") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ScriptError(f"cannot read transcript {str(file)!r}: {exc}") from None
        turns: list[Mapping[str, Any]] = []
        sources: list[str] = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            try:
                value = json.loads(stripped)
            except json.JSONDecodeError as exc:
                raise ScriptError(f"{file}:{line_number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(value, dict):
                raise ScriptError(f"{file}:{line_number}: each line must be a JSON object (one model turn)")
            turns.append(value)
            sources.append(f"{file}:{line_number}")
        written: Format | None = None
        if turns and set(turns[0]) == {"format"}:
            named = turns[0]["format"]
            if named not in _CONTEXT_FORMATS:
                raise ScriptError(f"{sources[0]}: format {named!r} is not one of: {', '.join(_CONTEXT_FORMATS)}")
            written = named
            if format is not None and format != written:
                raise ScriptError(f"{sources[0]}: the transcript is written in the {written} format, not {format}")
            turns, sources = turns[1:], sources[1:]
        if not turns:
            raise ScriptError(f"transcript {str(file)!r} holds no turns; write one JSON object per line")
        return cls(turns, format=format or written or "openai", name=f"scripted:{file}", sources=sources,
                   call_prefix=call_prefix)

    @property
    def remaining(self) -> int:
        """Turns not yet replayed."""
        return len(self.turns) - self.position

    # --- the interface ---------------------------------------------------------------------

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        self.requests.append(
            ScriptedRequest(
                tools=tuple(tool.name for tool in tools),
                tool_choice=tool_choice,
                context_length=len(context.items),
                items=copy.deepcopy(context.items),
                system=context.system,
            )
        )
        check_tool_choice(tool_choice, [tool.name for tool in tools])
        if self.position >= len(self.turns):
            raise ModelError(f"the transcript has no more turns (all {len(self.turns)} were replayed)", retryable=False)
        turn = self.turns[self.position]
        self.position += 1
        return turn


# --- one turn -------------------------------------------------------------------------------------


def parse_turn(raw: Mapping[str, Any], *, number: int, fmt: Format, where: str, call_prefix: str = "call") -> ModelTurn:
    """One transcript turn as the ModelTurn ``fmt``'s adapter would have returned."""
    if not isinstance(raw, Mapping):
        raise ScriptError(f"{where}: a turn must be a JSON object")
    unknown = sorted(set(raw) - _TURN_KEYS)
    if unknown:
        raise ScriptError(
            f"{where}: unknown key{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"a turn may have: {', '.join(sorted(_TURN_KEYS))}"
        )
    text = raw.get("text", "")
    if not isinstance(text, str):
        raise ScriptError(f"{where}: 'text' must be a string")
    raw_calls = raw.get("tool_calls", [])
    if not isinstance(raw_calls, list):
        raise ScriptError(f"{where}: 'tool_calls' must be a list of calls")
    calls: list[ModelToolCall] = []
    objects: list[dict[str, Any]] = []
    computer_items: dict[int, dict[str, Any]] = {}
    for index, call in enumerate(raw_calls, start=1):
        call_where = f"{where}: tool_calls[{index - 1}]"
        if not isinstance(call, Mapping):
            raise ScriptError(f"{call_where} must be an object with name, arguments and call_id")
        if call.get("type") == "computer_call":
            item = _computer_call(call, f"{call_prefix}_{number}_{index}", fmt, call_where)
            computer_items[len(calls)] = item
            mapped = computer_call_calls(item)
            calls.extend(mapped)
            objects.extend({} for _ in mapped)
            continue
        extra = sorted(set(call) - _CALL_KEYS)
        if extra:
            listed = ", ".join(map(repr, extra))
            raise ScriptError(f"{call_where}: unknown key(s) {listed}; use name, arguments, call_id")
        name = call.get("name")
        if not isinstance(name, str) or not name:
            raise ScriptError(f"{call_where} needs a 'name' (the tool to call)")
        call_id = call.get("call_id", f"{call_prefix}_{number}_{index}")
        if not isinstance(call_id, str):
            raise ScriptError(f"{call_where}: 'call_id' must be a string")
        arguments = call.get("arguments", {})
        if not isinstance(arguments, (str, dict)):
            raise ScriptError(f"{call_where}: 'arguments' must be an object or a string")
        calls.append(ModelToolCall(call_id=call_id, name=name, arguments=json_text(arguments)))
        objects.append(arguments if isinstance(arguments, dict) else _as_object(arguments))
    usage = _usage(raw.get("usage", {}), where)
    stop_reason = raw.get("stop_reason", "tool_calls" if calls else "stop")
    if not isinstance(stop_reason, str):
        raise ScriptError(f"{where}: 'stop_reason' must be a string")
    return ModelTurn(
        text=text,
        tool_calls=tuple(calls),
        items=_items(fmt, text, calls, objects, computer_items),
        usage=usage,
        stop_reason=stop_reason,
    )


def _computer_call(call: Mapping[str, Any], default_id: str, fmt: Format, where: str) -> dict[str, Any]:
    """A scripted ``computer_call`` as the Responses API's item."""
    if fmt != "openai":
        raise ScriptError(f"{where}: a computer_call is the OpenAI Responses shape; script the {fmt} format's "
                          "computer call as a call of 'computer' with the tool's arguments instead")
    extra = sorted(set(call) - _COMPUTER_CALL_KEYS)
    if extra:
        raise ScriptError(f"{where}: unknown key(s) {', '.join(map(repr, extra))} in a computer_call; use "
                          f"{', '.join(sorted(_COMPUTER_CALL_KEYS))}")
    if ("action" in call) == ("actions" in call):
        raise ScriptError(f"{where}: a computer_call needs one of 'action' (an object) or 'actions' (a list)")
    action, actions = call.get("action"), call.get("actions")
    if ("action" in call and not isinstance(action, dict)) or (
            "actions" in call and not (isinstance(actions, list) and actions
                                       and all(isinstance(a, dict) for a in actions))):
        raise ScriptError(f"{where}: 'action' must be an object, 'actions' a list of objects (OpenAI's actions)")
    call_id = call.get("call_id", default_id)
    if not isinstance(call_id, str) or not call_id:
        raise ScriptError(f"{where}: 'call_id' must be a string")
    checks = call.get("pending_safety_checks", [])
    if not isinstance(checks, list) or not all(isinstance(c, dict) and isinstance(c.get("id"), str) for c in checks):
        raise ScriptError(f"{where}: 'pending_safety_checks' must be a list of objects with an 'id'")
    item: dict[str, Any] = {"type": "computer_call", "id": f"cu_{call_id}", "call_id": call_id,
                            "pending_safety_checks": copy.deepcopy(checks), "status": "completed"}
    item["action" if "action" in call else "actions"] = copy.deepcopy(action if "action" in call else actions)
    return item


def _usage(raw: object, where: str) -> Usage:
    if not isinstance(raw, Mapping):
        raise ScriptError(f"{where}: 'usage' must be an object")
    extra = sorted(set(raw) - _USAGE_KEYS)
    if extra:
        listed = ", ".join(map(repr, extra))
        raise ScriptError(f"{where}: unknown usage key(s) {listed}; use {', '.join(sorted(_USAGE_KEYS))}")
    tokens: dict[str, int] = {}
    for key in ("input_tokens", "output_tokens"):
        value = raw.get(key, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ScriptError(f"{where}: usage {key} must be a whole number >= 0")
        tokens[key] = value
    cost = raw.get("cost_usd")
    if cost is not None and (not isinstance(cost, (int, float)) or isinstance(cost, bool) or cost < 0):
        raise ScriptError(f"{where}: usage cost_usd must be a number >= 0")
    return Usage(
        input_tokens=tokens["input_tokens"],
        output_tokens=tokens["output_tokens"],
        cost_usd=float(cost) if cost is not None else None,
    )


def _as_object(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return {"_arguments": arguments}
    return value if isinstance(value, dict) else {"_arguments": arguments}


def _items(
    fmt: Format, text: str, calls: list[ModelToolCall], objects: list[dict[str, Any]],
    computer_items: Mapping[int, dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], ...]:
    """The assistant items ``fmt``'s API would have returned for this turn (``computer_items``:
    the ``computer_call`` items, by the position of their first call)."""
    if fmt == "openai":
        items: list[dict[str, Any]] = []
        if text:
            items.append({"type": "message", "role": "assistant", "content": text})
        computer = computer_items or {}
        skip = 0
        for position, call in enumerate(calls):
            if position in computer:
                items.append(computer[position])
                skip = len(computer_call_calls(computer[position])) - 1
            elif skip:
                skip -= 1
            else:
                items.append({"type": "function_call", "call_id": call.call_id, "name": call.name,
                              "arguments": call.arguments})
        return tuple(items)
    if fmt == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": text or (None if calls else "")}
        if calls:
            message["tool_calls"] = [
                {"id": call.call_id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
                for call in calls
            ]
        return (message,)
    blocks: list[dict[str, Any]] = []
    if text:
        blocks.append({"type": "text", "text": text})
    blocks.extend(
        {"type": "tool_use", "id": call.call_id, "name": call.name, "input": obj}
        for call, obj in zip(calls, objects, strict=True)
    )
    return ({"role": "assistant", "content": blocks},) if blocks else ()
