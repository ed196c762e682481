"""What the adapters behind a provider's HTTP API share: keys and base URLs, the client's
options and the mapping of SDK failures to ``ModelError``. Imports no SDK: each adapter
names its own (``ApiModel.sdk``).

Keys: the key comes from the ``api_key`` argument, else the provider's usual variable
(``OPENAI_API_KEY``; ``ANTHROPIC_API_KEY``). When there is none, construction fails with
``MissingApiKey`` naming the variable, before any request, unless a base URL is set
(``base_url=`` or ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``): a local server usually
needs no auth, so the key then defaults to ``"not-needed"`` (a server that does check it
answers 401, which becomes a ModelError naming the variable).

Errors: every SDK failure becomes ``ModelError(message, retryable=...)``: rate limits
(429), 408/409/425, 5xx, overload, timeouts and connection failures are retryable; other
4xx are not. The SDK clients are built with ``max_retries=0``: the loop does the retrying.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any, ClassVar, TypedDict, Unpack

from harness.models.base import MissingApiKey, ModelError, TextSink
from harness.models.common import ProviderContext

__all__ = ["NO_KEY_PLACEHOLDER", "ApiModel", "ApiOptions", "api_error", "resolve_base_url", "resolve_key"]

NO_KEY_PLACEHOLDER = "not-needed"
"""The key sent to a server at an explicit base URL when no key is configured."""


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


# --- the adapters' common part --------------------------------------------------------------


class ApiOptions(TypedDict, total=False):
    """The keyword arguments every API adapter takes (each adds its own, such as max_tokens)."""

    api_key: str | None
    """The key; else the provider's variable (see :func:`resolve_key`)."""
    base_url: str | None
    """The API's base URL; else the provider's variable, else the SDK's default."""
    stream: bool
    """Stream the answer (default False), giving ``on_text`` its text as it arrives."""
    on_text: TextSink | None
    timeout_s: float | None
    """The SDK client's timeout (default: the SDK's)."""
    request_options: dict[str, Any] | None
    """Extra request parameters, sent as they are."""


class ApiModel(ProviderContext):
    """A model behind a provider's HTTP API: the settings every such adapter keeps, the
    options its SDK client is built with, and its SDK's failures as ModelErrors."""

    provider: ClassVar[str]
    """The provider part of the spec (``openai``, ``openai-chat``, ``anthropic``)."""
    api: ClassVar[str]
    """The API's name in messages (``OpenAI Responses API``)."""
    key_owner: ClassVar[str]
    """Whose key is missing, in the MissingApiKey message."""
    key_variable: ClassVar[str]
    base_url_variable: ClassVar[str]
    sdk: ClassVar[ModuleType]
    """The SDK module (``openai``, ``anthropic``): its error classes tell failures apart."""

    def __init__(self, model: str, **options: Unpack[ApiOptions]) -> None:
        self.model = model
        self.name = f"{self.provider}:{model}"
        self.stream = options.get("stream", False)
        self.on_text = options.get("on_text")
        self.request_options = dict(options.get("request_options") or {})
        self.base_url = resolve_base_url(options.get("base_url"), self.base_url_variable)

    def resolved_key(self, explicit: str | None) -> str:
        """The key to send (see :func:`resolve_key`)."""
        return resolve_key(explicit, self.key_variable, base_url=self.base_url, provider=self.key_owner)

    def client_options(self, options: ApiOptions, **auth: str) -> dict[str, Any]:
        """The SDK client's keyword arguments: ``auth`` (its key or token), the base URL, no
        retries of its own (the loop retries) and the timeout if ``options`` set one."""
        client: dict[str, Any] = {**auth, "base_url": self.base_url, "max_retries": 0}
        timeout_s = options.get("timeout_s")
        if timeout_s is not None:
            client["timeout"] = timeout_s
        return client

    def api_failure(self, exc: Exception) -> ModelError:
        """``exc``, raised by this adapter's SDK, as a readable ModelError."""
        return api_error(
            exc,
            api=self.api,
            key_variable=self.key_variable,
            base_url=self.base_url,
            timeout_error=self.sdk.APITimeoutError,
            connection_error=self.sdk.APIConnectionError,
            status_error=self.sdk.APIStatusError,
        )


# --- SDK failures ------------------------------------------------------------------------------


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
