"""The OpenAI Responses API (``client.responses.create``) behind the ModelAdapter interface.

Request: ``model``, ``input`` = the context items, ``instructions`` = the system prompt,
``tools`` = ``harness.core.formats.tool_definitions(tools, "openai")`` and ``tool_choice``:

============================  =================================================================
ToolChoice                    sent as
============================  =================================================================
``"auto"``                    ``"auto"``
``"required"``                ``"required"``
``"none"``                    ``"none"`` (the tools are still sent: the context may refer to them)
``ForcedTool(name)``          ``{"type": "function", "name": name}``
``AllowedTools(names, mode)`` ``{"type": "allowed_tools", "mode": mode,
                              "tools": [{"type": "function", "name": n}, ...]}`` with every
                              tool still in ``tools`` (keeps the prompt cache); with
                              ``native_allowed_tools=False`` (servers without allowed_tools)
                              only the subset is sent, with ``tool_choice`` = mode
============================  =================================================================

With no tools at all neither ``tools`` nor ``tool_choice`` is sent. The ``computer`` tool is
sent as OpenAI's computer-use tool (``{"type": "computer"}``, or ``computer_use_preview`` for the
preview models), named in a forcing or allowed tool_choice by that type; its ``computer_call``
items become calls of ``computer`` answered by ``computer_call_output`` items
(:mod:`harness.models.computer_use`).

Response: ``function_call`` items (``call_id``, ``name``, ``arguments``), freeform
``custom_tool_call`` items (``input``) and ``computer_call`` items become the tool calls, in
output order; the text is
every ``output_text`` (and ``refusal``) part; ``items`` are all output items (reasoning
included) as the API sent them (``to_dict``, nulls dropped), to be sent back verbatim;
``stop_reason`` is the status (``completed``) or the ``incomplete_details.reason``.

Streaming (``stream=True``): the same request with ``stream: true``; ``on_text`` receives
each ``response.output_text.delta``; the turn comes from ``response.completed`` (or
``response.incomplete``), falling back to the ``response.output_item.*`` events (with their
deltas) when that event carries no output. ``on_text`` is only called while streaming.
"""

from __future__ import annotations

from typing import Any, Unpack

from harness.core.formats import Format, tool_definitions
from harness.core.registry import ToolDefinition
from harness.models.base import (
    AllowedTools,
    Context,
    ForcedTool,
    ModelError,
    ModelToolCall,
    ModelTurn,
    ToolChoice,
    Usage,
)
from harness.models.common import as_dict, check_tool_choice, json_text
from harness.models.computer_use import COMPUTER, computer_call_calls, is_computer, responses_computer_tool
from harness.models.openai_base import OpenAIModel, OpenAIOptions

__all__ = ["OpenAIResponsesModel", "parse_response", "responses_tool_choice"]

API = "OpenAI Responses API"


def responses_tool_choice(choice: ToolChoice, computer: dict[str, Any] | None = None) -> str | dict[str, Any]:
    """``choice`` in the Responses API's shape; ``computer``: the computer tool's entry when it is
    sent as OpenAI's own tool type (then ``computer`` is named by that type)."""

    def named(name: str) -> dict[str, Any]:
        if computer is not None and name == COMPUTER:
            return {"type": computer["type"]}
        return {"type": "function", "name": name}

    if isinstance(choice, ForcedTool):
        return named(choice.name)
    if isinstance(choice, AllowedTools):
        return {"type": "allowed_tools", "mode": choice.mode, "tools": [named(name) for name in choice.names]}
    return choice


class OpenAIResponsesModel(OpenAIModel):
    """A model behind the Responses API (``openai:NAME``)."""

    format: Format = "openai"
    provider = "openai"
    api = API
    key_owner = "OpenAI"

    def __init__(self, model: str, *, max_output_tokens: int | None = None, **options: Unpack[OpenAIOptions]) -> None:
        super().__init__(model, **options)
        self.max_output_tokens = max_output_tokens

    # --- the interface ---------------------------------------------------------------------

    def _created(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.responses.create(**body)
        data: dict[str, Any] = response.to_dict(mode="json", exclude_none=True)
        return data

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        return parse_response(data)

    # --- the request -------------------------------------------------------------------------

    def request(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> dict[str, Any]:
        """The keyword arguments of ``responses.create`` for this turn."""
        choice = check_tool_choice(tool_choice, [tool.name for tool in tools])
        body: dict[str, Any] = {"model": self.model, "input": context.items}
        if context.system:
            body["instructions"] = context.system
        if tools:
            computer = next((responses_computer_tool(self.model) for tool in tools if is_computer(tool)), None)
            offered = tools
            if isinstance(choice, AllowedTools) and not self.native_allowed_tools:
                offered = [tool for tool in tools if tool.name in choice.names]
                body["tool_choice"] = choice.mode
            else:
                body["tool_choice"] = responses_tool_choice(choice, computer)
            body["tools"] = [computer if computer is not None and is_computer(tool)
                             else tool_definitions([tool], "openai")[0] for tool in offered]
        if self.max_output_tokens is not None:
            body["max_output_tokens"] = self.max_output_tokens
        body.update(self.request_options)
        return body

    # --- streaming --------------------------------------------------------------------------

    def _streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """Read the event stream into the final response (as a dict)."""
        final: dict[str, Any] | None = None
        items: dict[int, dict[str, Any]] = {}
        with self.client.responses.create(stream=True, **body) as events:
            for event in events:
                data = event.to_dict(mode="json", exclude_none=True)
                kind = data.get("type")
                index = data.get("output_index")
                if kind == "response.output_text.delta":
                    delta = data.get("delta") or ""
                    if delta and self.on_text is not None:
                        self.on_text(delta)
                    if isinstance(index, int) and index in items:
                        _add_text_delta(items[index], data.get("content_index"), delta)
                elif kind == "response.function_call_arguments.delta" and isinstance(index, int) and index in items:
                    item = items[index]
                    item["arguments"] = str(item.get("arguments") or "") + str(data.get("delta") or "")
                elif kind == "response.custom_tool_call_input.delta" and isinstance(index, int) and index in items:
                    item = items[index]
                    item["input"] = str(item.get("input") or "") + str(data.get("delta") or "")
                elif kind in ("response.output_item.added", "response.output_item.done") and isinstance(index, int):
                    item = data.get("item")
                    if isinstance(item, dict):
                        items[index] = item
                elif kind in ("response.completed", "response.incomplete", "response.failed"):
                    response = data.get("response")
                    if isinstance(response, dict):
                        final = response
                elif kind == "error":
                    raise _stream_error(data)
        if final is None:
            raise ModelError(f"the {API} stream ended before the response was complete", retryable=True)
        if not final.get("output") and items:
            final["output"] = [items[index] for index in sorted(items)]
        return final


def _add_text_delta(item: dict[str, Any], content_index: object, delta: str) -> None:
    """Accumulate a text delta into a message item built from ``output_item.added``."""
    content = item.setdefault("content", [])
    if not isinstance(content, list):
        return
    position = content_index if isinstance(content_index, int) else len(content) - 1
    while len(content) <= position:
        content.append({"type": "output_text", "text": "", "annotations": []})
    part = content[position]
    if isinstance(part, dict):
        part["text"] = str(part.get("text") or "") + delta


def _stream_error(data: dict[str, Any]) -> ModelError:
    code = str(data.get("code") or "")
    message = str(data.get("message") or "the stream reported an error")
    retryable = code in ("server_error", "rate_limit_exceeded", "internal_error") or not code
    label = f" ({code})" if code else ""
    return ModelError(f"the {API} failed{label}: {message}", retryable=retryable)


# --- the response -------------------------------------------------------------------------------


def parse_response(data: dict[str, Any]) -> ModelTurn:
    """A Responses API response (as a dict) as a ModelTurn."""
    status = str(data.get("status") or "")
    if status == "failed":
        error = as_dict(data.get("error"))
        code = str(error.get("code") or "")
        message = str(error.get("message") or "no reason given")
        retryable = code in ("server_error", "rate_limit_exceeded", "internal_error")
        raise ModelError(f"the {API} failed ({code or 'failed'}): {message}", retryable=retryable)
    texts: list[str] = []
    calls: list[ModelToolCall] = []
    items: list[dict[str, Any]] = []
    for item in data.get("output") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "message":
            for part in item.get("content") or []:
                if isinstance(part, dict) and part.get("type") == "output_text":
                    texts.append(str(part.get("text") or ""))
                elif isinstance(part, dict) and part.get("type") == "refusal":
                    texts.append(str(part.get("refusal") or ""))
        elif kind == "function_call":
            calls.append(
                ModelToolCall(
                    call_id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=json_text(item.get("arguments") or ""),
                )
            )
        elif kind == "custom_tool_call":
            calls.append(
                ModelToolCall(
                    call_id=str(item.get("call_id") or ""),
                    name=str(item.get("name") or ""),
                    arguments=json_text(item.get("input") or ""),
                )
            )
        elif kind == "computer_call":
            calls.extend(computer_call_calls(item))
        items.append(item)
    usage = as_dict(data.get("usage"))
    stop_reason = status
    if status == "incomplete":
        details = data.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        stop_reason = str(reason or status)
    return ModelTurn(
        text="".join(texts),
        tool_calls=tuple(calls),
        items=tuple(items),
        usage=Usage(
            input_tokens=int(usage.get("input_tokens") or 0),
            output_tokens=int(usage.get("output_tokens") or 0),
        ),
        stop_reason=stop_reason,
    )
