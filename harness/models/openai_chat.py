"""Chat Completions (``client.chat.completions.create``) behind the ModelAdapter interface.

The adapter for OpenAI's Chat Completions and every server that speaks it: vLLM,
llama.cpp server, Ollama (``base_url="http://localhost:11434/v1"``); with a base URL and no
``OPENAI_API_KEY`` the key defaults to ``"not-needed"`` (see ``harness.models.api``).

Request: ``model``, ``messages`` = the context (the system prompt is its first message),
``tools`` = ``harness.core.formats.tool_definitions(tools, "chat")`` and ``tool_choice``:

============================  =================================================================
ToolChoice                    sent as
============================  =================================================================
``"auto"``                    ``"auto"``
``"required"``                ``"required"``
``"none"``                    ``"none"`` (the tools are still sent)
``ForcedTool(name)``          ``{"type": "function", "function": {"name": name}}``
``AllowedTools(names, mode)`` ``{"type": "allowed_tools", "allowed_tools": {"mode": mode,
                              "tools": [{"type": "function", "function": {"name": n}}, ...]}}``
                              with every tool still in ``tools``; with
                              ``native_allowed_tools=False`` (most local servers do not know
                              allowed_tools) only the subset is sent, with ``tool_choice`` = mode
============================  =================================================================

With no tools at all neither ``tools`` nor ``tool_choice`` is sent.

Response: ``choices[0].message``: ``content`` (or ``refusal``) is the text;
``tool_calls[].id/function.name/function.arguments`` (and ``custom`` calls' ``input``) are
the calls, in order; a call without an id (some local servers) gets a generated one, used
in the assistant item as well so the tool message matches it. ``items`` is one assistant
message ``{"role": "assistant", "content": text or None, "tool_calls": [...]}`` rebuilt
from those fields only. Usage: ``prompt_tokens``/``completion_tokens``; ``stop_reason`` is
the ``finish_reason``.

``max_tokens`` is sent as ``max_completion_tokens`` (OpenAI's current name; reasoning
models reject ``max_tokens``); a server that only knows ``max_tokens`` gets it through
``request_options={"max_tokens": N}``.

Streaming (``stream=True``): ``stream: true`` with ``stream_options.include_usage``; content
deltas go to ``on_text`` and the tool call deltas are joined by ``index``.
"""

from __future__ import annotations

import uuid
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
from harness.models.openai_base import OpenAIModel, OpenAIOptions

__all__ = ["OpenAIChatModel", "chat_tool_choice", "parse_completion"]

API = "Chat Completions API"


def chat_tool_choice(choice: ToolChoice) -> str | dict[str, Any]:
    """``choice`` in the Chat Completions shape."""
    if isinstance(choice, ForcedTool):
        return {"type": "function", "function": {"name": choice.name}}
    if isinstance(choice, AllowedTools):
        return {
            "type": "allowed_tools",
            "allowed_tools": {
                "mode": choice.mode,
                "tools": [{"type": "function", "function": {"name": name}} for name in choice.names],
            },
        }
    return choice


class OpenAIChatModel(OpenAIModel):
    """A model behind Chat Completions (``openai-chat:NAME``)."""

    format: Format = "chat"
    provider = "openai-chat"
    api = API
    key_owner = "OpenAI-compatible Chat Completions"

    def __init__(self, model: str, *, max_tokens: int | None = None, **options: Unpack[OpenAIOptions]) -> None:
        super().__init__(model, **options)
        self.max_tokens = max_tokens

    # --- the interface ---------------------------------------------------------------------

    def _created(self, body: dict[str, Any]) -> dict[str, Any]:
        completion = self.client.chat.completions.create(**body)
        data: dict[str, Any] = completion.to_dict(mode="json", exclude_none=True)
        return data

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        return parse_completion(data)

    # --- the request -------------------------------------------------------------------------

    def request(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> dict[str, Any]:
        """The keyword arguments of ``chat.completions.create`` for this turn."""
        choice = check_tool_choice(tool_choice, [tool.name for tool in tools])
        body: dict[str, Any] = {"model": self.model, "messages": context.items}
        if tools:
            definitions = tool_definitions(tools, "chat")
            if isinstance(choice, AllowedTools) and not self.native_allowed_tools:
                definitions = [d for d in definitions if d["function"]["name"] in choice.names]
                body["tool_choice"] = choice.mode
            else:
                body["tool_choice"] = chat_tool_choice(choice)
            body["tools"] = definitions
        if self.max_tokens is not None:
            body["max_completion_tokens"] = self.max_tokens
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        body.update(self.request_options)
        return body

    # --- streaming --------------------------------------------------------------------------

    def _streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """Join the chunks into one completion-shaped dict."""
        text: list[str] = []
        refusal: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish_reason: str | None = None
        usage: dict[str, Any] | None = None
        with self.client.chat.completions.create(stream=True, **body) as chunks:
            for chunk in chunks:
                data = chunk.to_dict(mode="json", exclude_none=True)
                if isinstance(data.get("usage"), dict):
                    usage = data["usage"]
                for choice in data.get("choices") or []:
                    if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                        continue
                    if choice.get("finish_reason"):
                        finish_reason = str(choice["finish_reason"])
                    delta = choice.get("delta") or {}
                    content = delta.get("content")
                    if isinstance(content, str) and content:
                        text.append(content)
                        if self.on_text is not None:
                            self.on_text(content)
                    if isinstance(delta.get("refusal"), str):
                        refusal.append(delta["refusal"])
                    for part in delta.get("tool_calls") or []:
                        _join_tool_call(calls, part)
        message: dict[str, Any] = {"role": "assistant", "content": "".join(text) or None}
        if refusal:
            message["refusal"] = "".join(refusal)
        if calls:
            message["tool_calls"] = [calls[index] for index in sorted(calls)]
        data = {"choices": [{"index": 0, "message": message, "finish_reason": finish_reason}]}
        if usage is not None:
            data["usage"] = usage
        return data


def _join_tool_call(calls: dict[int, dict[str, Any]], part: object) -> None:
    """Add one streamed tool call delta (joined by ``index``, as the SDK's own helper does)."""
    if not isinstance(part, dict):
        return
    index = part.get("index")
    if not isinstance(index, int):
        index = len(calls)
    call = calls.setdefault(index, {"id": "", "type": part.get("type") or "function"})
    if part.get("id"):
        call["id"] = part["id"]
    if part.get("type"):
        call["type"] = part["type"]
    for key, fields in (("function", ("name", "arguments")), ("custom", ("name", "input"))):
        delta = part.get(key)
        if isinstance(delta, dict):
            target = call.setdefault(key, {})
            for field in fields:
                piece = delta.get(field)
                if piece is not None:
                    target[field] = str(target.get(field) or "") + json_text(piece)


# --- the response -------------------------------------------------------------------------------


def parse_completion(data: dict[str, Any]) -> ModelTurn:
    """A chat completion (as a dict) as a ModelTurn."""
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise ModelError(f"the {API} answered with no choices", retryable=True)
    choice = choices[0]
    message = choice.get("message") or {}
    text = _content_text(message.get("content"))
    if not text and isinstance(message.get("refusal"), str):
        text = message["refusal"]
    calls: list[ModelToolCall] = []
    wire_calls: list[dict[str, Any]] = []
    for raw in message.get("tool_calls") or []:
        if not isinstance(raw, dict):
            continue
        call_id = str(raw.get("id") or "") or f"call_{uuid.uuid4().hex[:24]}"
        if raw.get("type") == "custom" or ("custom" in raw and "function" not in raw):
            custom = raw.get("custom") or {}
            name = str(custom.get("name") or "")
            arguments = json_text(custom.get("input") or "")
            wire_calls.append({"id": call_id, "type": "custom", "custom": {"name": name, "input": arguments}})
        else:
            function = raw.get("function") or {}
            name = str(function.get("name") or "")
            arguments = json_text(function.get("arguments") or "")
            wire_calls.append({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
        calls.append(ModelToolCall(call_id=call_id, name=name, arguments=arguments))
    item: dict[str, Any] = {"role": "assistant", "content": text or (None if wire_calls else "")}
    if wire_calls:
        item["tool_calls"] = wire_calls
    usage = as_dict(data.get("usage"))
    return ModelTurn(
        text=text,
        tool_calls=tuple(calls),
        items=(item,),
        usage=Usage(
            input_tokens=int(usage.get("prompt_tokens") or 0),
            output_tokens=int(usage.get("completion_tokens") or 0),
        ),
        stop_reason=str(choice.get("finish_reason") or ""),
    )


def _content_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text") or "") for part in content if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""
