"""Pick a model adapter from a spec string, and the pieces every adapter shares.

``make_model(spec)`` understands:

* ``openai:NAME``: the OpenAI Responses API (``client.responses.create``);
* ``openai-chat:NAME``: Chat Completions (``client.chat.completions.create``); with
  ``base_url`` (or ``OPENAI_BASE_URL``) it talks to any OpenAI-compatible server: vLLM,
  llama.cpp server, Ollama (``http://localhost:11434/v1``);
* ``anthropic:NAME``: the Anthropic Messages API (``client.messages.create``);
* ``scripted:PATH`` (or ``scripted`` with ``transcript=PATH``): replays a JSONL transcript.

Only the first ``:`` separates the provider, so ``openai-chat:llama3.1:8b`` names the model
``llama3.1:8b``. An unknown provider is an ``UnknownModelProvider`` (exit code 2) listing
the choices. The adapter modules are imported on demand, so importing this module does not
import the SDKs.

Keys (decided here, once, for every adapter): the key comes from the ``api_key`` argument,
else the provider's usual variable (``OPENAI_API_KEY``; ``ANTHROPIC_API_KEY``, then
``ANTHROPIC_AUTH_TOKEN`` sent as a bearer token). When there is none, construction fails
with ``MissingApiKey`` naming the variable, before any request, unless a base URL is set
(``base_url=`` or ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``): a local server usually
needs no auth, so the key then defaults to ``"not-needed"`` (a server that does check it
answers 401, which becomes a ModelError naming the variable).

Errors: every SDK failure becomes ``ModelError(message, retryable=...)``: rate limits
(429), 408/409/425, 5xx, overload, timeouts and connection failures are retryable; other
4xx are not. The SDK clients are built with ``max_retries=0``: the loop does the retrying.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.calls import ToolResult
from harness.core.errors import CallboxError
from harness.core.formats import Format, result_item
from harness.models.base import AllowedTools, Context, ForcedTool, ModelError, ModelTurn, ToolChoice

if TYPE_CHECKING:
    from harness.models.base import ModelAdapter

__all__ = [
    "NO_KEY_PLACEHOLDER",
    "PROVIDERS",
    "MissingApiKey",
    "ModelConfigError",
    "TextSink",
    "UnknownModelProvider",
    "api_error",
    "append_items",
    "append_results",
    "as_dict",
    "check_tool_choice",
    "json_text",
    "make_model",
    "new_context",
    "resolve_base_url",
    "resolve_key",
]

PROVIDERS: dict[str, str] = {
    "openai": "OpenAI Responses API, e.g. openai:gpt-5",
    "openai-chat": "Chat Completions (OpenAI, vLLM, llama.cpp, Ollama via base_url), e.g. openai-chat:gpt-4.1",
    "anthropic": "Anthropic Messages API, e.g. anthropic:claude-sonnet-4-5",
    "scripted": "replay a JSONL transcript of model turns, e.g. scripted:demo/transcript.jsonl",
}

NO_KEY_PLACEHOLDER = "not-needed"
"""The key sent to a server at an explicit base URL when no key is configured."""

TextSink = Callable[[str], None]


class ModelConfigError(CallboxError):
    """A model cannot be set up as asked (bad spec, missing key, unreadable transcript)."""

    exit_code = 2


class UnknownModelProvider(ModelConfigError):
    """The spec names a provider callbox has no adapter for."""


class MissingApiKey(ModelConfigError):
    """No key for a provider that needs one; ``variable`` is the one to set."""

    def __init__(self, message: str, *, variable: str) -> None:
        super().__init__(message)
        self.variable = variable


# --- make_model ---------------------------------------------------------------------------


def _choices() -> str:
    return "; ".join(f"{name} ({hint})" for name, hint in PROVIDERS.items())


def make_model(
    spec: str,
    *,
    base_url: str | None = None,
    transcript: str | Path | None = None,
    api_key: str | None = None,
    stream: bool = False,
    on_text: TextSink | None = None,
    max_tokens: int | None = None,
    timeout_s: float | None = None,
    request_options: dict[str, Any] | None = None,
    format: Format = "openai",
    native_allowed_tools: bool = True,
) -> ModelAdapter:
    """The adapter ``spec`` names (``provider:model``); ModelConfigError if it cannot be built.

    ``max_tokens`` caps the output (Anthropic requires one and defaults to 8192);
    ``request_options`` are extra request parameters passed through as they are
    (e.g. ``{"temperature": 0}`` or ``{"reasoning": {"effort": "low"}}``); ``format`` is the
    provider shape the scripted model keeps its context in (the API adapters have their own);
    ``native_allowed_tools=False`` makes the OpenAI adapters send an allowed subset as a
    filtered tools list (for servers that do not know the ``allowed_tools`` tool_choice).
    """
    text = spec.strip()
    provider, sep, name = text.partition(":")
    provider = provider.strip().lower()
    name = name.strip()
    if provider == "scripted":
        path = name or (str(transcript) if transcript is not None else "")
        if not path:
            raise ModelConfigError("the scripted model needs a transcript: use scripted:PATH (a JSONL file)")
        from harness.models.scripted import ScriptedModel

        return ScriptedModel.from_file(path, format=format)
    if provider not in PROVIDERS:
        raise UnknownModelProvider(
            f"unknown model provider {provider or text!r} in {spec!r}; use PROVIDER:MODEL with one of: {_choices()}"
        )
    if not sep or not name:
        raise ModelConfigError(f"{spec!r} names no model; write it as {provider}:MODEL_NAME")
    options: dict[str, Any] = {
        "api_key": api_key,
        "base_url": base_url,
        "stream": stream,
        "on_text": on_text,
        "timeout_s": timeout_s,
        "request_options": request_options,
    }
    if provider == "openai":
        from harness.models.openai_responses import OpenAIResponsesModel

        return OpenAIResponsesModel(
            name, max_output_tokens=max_tokens, native_allowed_tools=native_allowed_tools, **options
        )
    if provider == "openai-chat":
        from harness.models.openai_chat import OpenAIChatModel

        return OpenAIChatModel(name, max_tokens=max_tokens, native_allowed_tools=native_allowed_tools, **options)
    from harness.models.anthropic_messages import DEFAULT_MAX_TOKENS, AnthropicMessagesModel

    return AnthropicMessagesModel(name, max_tokens=max_tokens or DEFAULT_MAX_TOKENS, **options)


# --- keys and URLs ------------------------------------------------------------------------


def resolve_base_url(explicit: str | None, variable: str) -> str | None:
    """``explicit``, else the variable (as the SDKs read it), else None (the SDK default)."""
    if explicit:
        return explicit
    return os.environ.get(variable) or None


def resolve_key(explicit: str | None, variable: str, *, base_url: str | None, provider: str) -> str:
    """The key to send: explicit, else ``variable``, else the placeholder when a base URL is
    set; MissingApiKey naming the variable otherwise."""
    if explicit:
        return explicit
    value = os.environ.get(variable, "").strip()
    if value:
        return value
    if base_url:
        return NO_KEY_PLACEHOLDER
    raise MissingApiKey(
        f"no API key for {provider}: set the {variable} environment variable "
        "(or pass base_url for a local server that needs no key)",
        variable=variable,
    )


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


def append_items(context: Context, items: Iterable[dict[str, Any]]) -> None:
    """Append the model's own items (copies: the turn keeps its own)."""
    context.items.extend(copy.deepcopy(list(items)))


def append_results(context: Context, results: Sequence[ToolResult], fmt: Format) -> None:
    """One result per call, in the order given, as ``fmt`` wants them.

    * ``openai``: one ``function_call_output`` item each (``custom_tool_call_output`` when
      the call was a freeform ``custom_tool_call``);
    * ``chat``: one ``{"role": "tool"}`` message each;
    * ``anthropic``: ONE user message whose content is the ``tool_result`` blocks in order.
    """
    if not results:
        return
    if fmt == "openai":
        custom = {item.get("call_id") for item in context.items if item.get("type") == "custom_tool_call"}
        for result in results:
            item = result_item(result, "openai")
            if result.call_id in custom:
                item["type"] = "custom_tool_call_output"
            context.items.append(item)
    elif fmt == "chat":
        context.items.extend(result_item(result, "chat") for result in results)
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


_RETRYABLE_STATUS = frozenset({408, 409, 425, 429})
_RETRYABLE_TYPES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "rate_limit_error",
        "timeout_error",
        "server_error",
        "rate_limit_exceeded",
        "internal_error",
    }
)
_MAX_DETAIL = 500


def _detail(body: object, fallback: str) -> tuple[str, str]:
    """(readable message, error type/code) from an error body of either SDK."""
    kind = ""
    message = ""
    if isinstance(body, dict):
        inner = body.get("error")
        error = inner if isinstance(inner, dict) else body
        raw_message = error.get("message")
        if isinstance(raw_message, str):
            message = raw_message
        for key in ("type", "code"):
            value = error.get(key)
            if isinstance(value, str) and value and value != "error":
                kind = value
                break
        if not message and isinstance(inner, str):
            message = inner
    elif isinstance(body, str):
        message = body.strip()
    message = " ".join((message or fallback).split())
    if len(message) > _MAX_DETAIL:
        message = message[:_MAX_DETAIL] + "..."
    return message, kind


def api_error(
    exc: Exception,
    *,
    api: str,
    key_variable: str,
    base_url: str | None,
    timeout_error: type[Exception],
    connection_error: type[Exception],
    status_error: type[Exception],
) -> ModelError:
    """``exc`` (an SDK exception) as a readable ModelError; the SDK's classes are passed in."""
    where = f" at {base_url}" if base_url else ""
    if isinstance(exc, timeout_error):
        return ModelError(f"the {api}{where} timed out", retryable=True)
    if isinstance(exc, connection_error):
        cause = exc.__cause__ or exc.__context__
        reason = f": {cause}" if cause is not None and str(cause) else ""
        return ModelError(f"cannot reach the {api}{where}{reason}", retryable=True)
    fallback = str(getattr(exc, "message", "") or exc) or type(exc).__name__
    message, kind = _detail(getattr(exc, "body", None), fallback)
    status = getattr(exc, "status_code", None)
    if isinstance(exc, status_error) and isinstance(status, int) and status >= 400:
        retryable = status in _RETRYABLE_STATUS or status >= 500 or kind in _RETRYABLE_TYPES
        hint = ""
        if status in (401, 403):
            hint = f" (check {key_variable})"
        elif status == 404:
            hint = " (check the model name and the base URL)"
        label = f" {kind}" if kind else ""
        return ModelError(f"the {api} answered HTTP {status}{label}: {message}{hint}", retryable=retryable)
    # An error reported inside a stream (HTTP 200), or a response the SDK could not read.
    retryable = kind in _RETRYABLE_TYPES
    label = f" ({kind})" if kind else ""
    return ModelError(f"the {api} failed{label}: {message}", retryable=retryable)
