"""The Anthropic Messages API (``client.messages.create``) behind the ModelAdapter interface.

Request: ``model``, ``max_tokens`` (required by the API; 8192 unless set), ``system`` = the
system prompt, ``messages`` = the context, ``tools`` =
``harness.core.formats.tool_definitions(tools, "anthropic")`` and ``tool_choice``:

============================  =================================================================
ToolChoice                    sent as
============================  =================================================================
``"auto"``                    ``{"type": "auto"}``
``"required"``                ``{"type": "any"}``
``"none"``                    ``{"type": "none"}`` (the tools are still sent)
``ForcedTool(name)``          ``{"type": "tool", "name": name}``
``AllowedTools(names, mode)`` emulated: the API has no allowed-subset mode, so only the
                              subset's definitions are sent (in the order offered), with
                              ``{"type": "auto"}`` (mode auto) or ``{"type": "any"}``
                              (mode required). Earlier ``tool_use`` blocks naming other tools
                              stay in the context; the API accepts them.
============================  =================================================================

With no tools at all neither ``tools`` nor ``tool_choice`` is sent. The ``computer`` tool is
sent as Anthropic's computer tool type, ``computer_20251124`` or ``computer_20250124`` as the
model needs (``computer_tool=`` chooses another), with that version's ``anthropic-beta`` header
(added to any the request options send); see :mod:`harness.models.computer_use`. The ``memory``
tool is sent as Anthropic's memory tool type, ``{"type": "memory_20250818", "name": "memory"}``
(generally available: no beta header); its ``tool_use`` input is the tool's arguments as they are.

Response: ``tool_use`` blocks (``id``, ``name``, ``input``) are the calls, in order, with the
input object serialized as compact JSON text for ``arguments``; the text is the ``text``
blocks joined; ``items`` is one ``{"role": "assistant", "content": [...blocks...]}`` with
every block (thinking included, signature and all) as the API sent it, nulls and empty text
blocks dropped (the API rejects empty text blocks on input). Usage: ``input_tokens`` plus
the cache creation and cache read tokens (the API reports those apart), ``output_tokens``;
``stop_reason`` as sent (``end_turn``, ``tool_use``, ``max_tokens``, ...).

Results: ONE user message whose content is the ``tool_result`` blocks, in order.

Streaming (``stream=True``): through the SDK's ``messages.stream`` helper (the same request
with ``stream: true``), which accumulates the events into the final message; ``on_text``
receives each text delta as it arrives, and is only called while streaming.

Without streaming the SDK refuses requests whose ``max_tokens`` it expects to take longer
than ten minutes (over about 21,000) unless ``timeout_s`` is set: stream those.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, ClassVar, Unpack

import anthropic

from harness.core.formats import Format, tool_definitions
from harness.core.registry import ToolDefinition
from harness.models.api import ApiModel, ApiOptions
from harness.models.base import (
    AllowedTools,
    Context,
    ForcedTool,
    ModelConfigError,
    ModelError,
    ModelToolCall,
    ModelTurn,
    ToolChoice,
    Usage,
)
from harness.models.common import as_dict, check_tool_choice, json_text
from harness.models.computer_use import (
    ANTHROPIC_BETAS,
    anthropic_computer_tool,
    anthropic_computer_version,
    is_computer,
)
from harness.tools.memory import is_memory

__all__ = ["DEFAULT_MAX_TOKENS", "AnthropicMessagesModel", "anthropic_tool_choice", "parse_message"]

API = "Anthropic Messages API"
KEY_VARIABLE = "ANTHROPIC_API_KEY"
TOKEN_VARIABLE = "ANTHROPIC_AUTH_TOKEN"  # noqa: S105 (a variable name, not a secret)
BASE_URL_VARIABLE = "ANTHROPIC_BASE_URL"
DEFAULT_MAX_TOKENS = 8192
MEMORY_TOOL = {"type": "memory_20250818", "name": "memory"}
"""The Messages API's tool entry for the ``memory`` tool (:mod:`harness.tools.memory`)."""


def anthropic_tool_choice(choice: ToolChoice) -> dict[str, Any]:
    """``choice`` in the Messages API's shape (AllowedTools as its mode: the subset is
    emulated by the tools sent)."""
    if isinstance(choice, ForcedTool):
        return {"type": "tool", "name": choice.name}
    if isinstance(choice, AllowedTools):
        return {"type": "any" if choice.mode == "required" else "auto"}
    if choice == "required":
        return {"type": "any"}
    return {"type": choice}


class AnthropicMessagesModel(ApiModel):
    """A Claude model behind the Messages API (``anthropic:NAME``)."""

    format: Format = "anthropic"
    provider = "anthropic"
    api = API
    key_owner = "Anthropic"
    key_variable = KEY_VARIABLE
    base_url_variable = BASE_URL_VARIABLE
    sdk: ClassVar[ModuleType] = anthropic

    def __init__(self, model: str, *, max_tokens: int = DEFAULT_MAX_TOKENS, computer_tool: str | None = None,
                 **options: Unpack[ApiOptions]) -> None:
        super().__init__(model, **options)
        self.max_tokens = max_tokens
        if computer_tool is not None and computer_tool not in ANTHROPIC_BETAS:
            raise ModelConfigError(f"unknown Anthropic computer tool version {computer_tool!r}; use one of: "
                                   f"{', '.join(ANTHROPIC_BETAS)}")
        self.computer_tool = computer_tool or anthropic_computer_version(model)
        """The computer tool version sent when ``computer`` is offered."""
        api_key = options.get("api_key")
        token = os.environ.get(TOKEN_VARIABLE, "").strip()
        if not api_key and not os.environ.get(KEY_VARIABLE, "").strip() and token:
            auth = {"auth_token": token}  # ANTHROPIC_AUTH_TOKEN alone: sent as a bearer token
        else:
            auth = {"api_key": self.resolved_key(api_key)}
        self.client = anthropic.Anthropic(**self.client_options(options, **auth))

    # --- the interface ---------------------------------------------------------------------

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        body = self.request(context, tools, tool_choice)
        try:
            if self.stream:
                with self.client.messages.stream(**body) as events:
                    for event in events:
                        if event.type == "text" and event.text and self.on_text is not None:
                            self.on_text(event.text)
                    message = events.get_final_message()
            else:
                message = self.client.messages.create(**body)
        except anthropic.APIError as exc:
            raise self.api_failure(exc) from None
        except ValueError as exc:  # the SDK's own refusals (e.g. "streaming is required")
            raise ModelError(f"the {API} request was refused by the SDK: {exc}", retryable=False) from None
        return parse_message(message.to_dict(mode="json", exclude_none=True))

    # --- the request -------------------------------------------------------------------------

    def request(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> dict[str, Any]:
        """The keyword arguments of ``messages.create`` for this turn."""
        choice = check_tool_choice(tool_choice, [tool.name for tool in tools])
        body: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": context.items}
        if context.system:
            body["system"] = context.system
        offered: list[ToolDefinition] = []
        if tools:
            offered = tools
            if isinstance(choice, AllowedTools):
                offered = [tool for tool in tools if tool.name in choice.names]
            body["tools"] = [self._tool_entry(tool) for tool in offered]
            body["tool_choice"] = anthropic_tool_choice(choice)
        body.update(self.request_options)
        if any(is_computer(tool) for tool in offered):
            headers = dict(body.get("extra_headers") or {})
            betas = [b.strip() for b in str(headers.get("anthropic-beta") or "").split(",") if b.strip()]
            beta = ANTHROPIC_BETAS[self.computer_tool]
            headers["anthropic-beta"] = ",".join([*betas, beta] if beta not in betas else betas)
            body["extra_headers"] = headers
        return body

    def _tool_entry(self, tool: ToolDefinition) -> dict[str, Any]:
        """One offered tool as the request names it: computer and memory as Anthropic's own tool
        types, every other tool as a function with its plain schema."""
        if is_computer(tool):
            return anthropic_computer_tool(self.computer_tool)
        if is_memory(tool):
            return dict(MEMORY_TOOL)
        return tool_definitions([tool], "anthropic")[0]


# --- the response -------------------------------------------------------------------------------


def parse_message(data: dict[str, Any]) -> ModelTurn:
    """A Messages API message (as a dict) as a ModelTurn."""
    texts: list[str] = []
    calls: list[ModelToolCall] = []
    blocks: list[dict[str, Any]] = []
    for block in data.get("content") or []:
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            text = str(block.get("text") or "")
            if not text:
                continue
            texts.append(text)
        elif kind == "tool_use":
            raw_input = block.get("input")
            calls.append(
                ModelToolCall(
                    call_id=str(block.get("id") or ""),
                    name=str(block.get("name") or ""),
                    arguments=json_text(raw_input if raw_input is not None else {}),
                )
            )
        blocks.append(block)
    usage = as_dict(data.get("usage"))
    input_tokens = sum(
        int(usage.get(key) or 0) for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    items: tuple[dict[str, Any], ...] = ({"role": "assistant", "content": blocks},) if blocks else ()
    return ModelTurn(
        text="".join(texts),
        tool_calls=tuple(calls),
        items=items,
        usage=Usage(input_tokens=input_tokens, output_tokens=int(usage.get("output_tokens") or 0)),
        stop_reason=str(data.get("stop_reason") or ""),
    )
