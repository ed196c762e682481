"""Pick a model adapter from a spec string.

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

Keys and errors are decided once, for every adapter, in :mod:`harness.models.api`: the key
comes from ``api_key``, else the provider's usual variable (``OPENAI_API_KEY``;
``ANTHROPIC_API_KEY``, then ``ANTHROPIC_AUTH_TOKEN`` sent as a bearer token), else
``MissingApiKey`` unless a base URL is set; every SDK failure becomes a ``ModelError`` that
says whether it is retryable.

The pieces the adapters share live in :mod:`harness.models.base`, :mod:`harness.models.common`
and :mod:`harness.models.api` (which never import this module); they are re-exported here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.core.formats import Format
from harness.models.api import NO_KEY_PLACEHOLDER, api_error, resolve_base_url, resolve_key
from harness.models.base import MissingApiKey, ModelConfigError, TextSink
from harness.models.common import (
    ProviderContext,
    append_items,
    append_results,
    as_dict,
    check_tool_choice,
    json_text,
    new_context,
)

if TYPE_CHECKING:
    from harness.models.base import ModelAdapter

__all__ = [
    "NO_KEY_PLACEHOLDER",
    "PROVIDERS",
    "MissingApiKey",
    "ModelConfigError",
    "ProviderContext",
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


class UnknownModelProvider(ModelConfigError):
    """The spec names a provider callbox has no adapter for."""


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
    format: Format | None = None,
    native_allowed_tools: bool = True,
) -> ModelAdapter:
    """The adapter ``spec`` names (``provider:model``); ModelConfigError if it cannot be built.

    ``max_tokens`` caps the output (Anthropic requires one and defaults to 8192);
    ``request_options`` are extra request parameters passed through as they are
    (e.g. ``{"temperature": 0}`` or ``{"reasoning": {"effort": "low"}}``); ``format`` is the
    provider shape the scripted model keeps its context in (default: the transcript's
    ``{"format": ...}`` line, else openai; the API adapters have their own);
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
