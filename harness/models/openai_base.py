"""What the two OpenAI adapters (Responses and Chat Completions) share: the key and base
URL variables, the SDK client, and one turn's request with the SDK's failures mapped."""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar, Unpack

import openai

from harness.core.registry import ToolDefinition
from harness.models.api import ApiModel, ApiOptions
from harness.models.base import Context, ModelTurn, ToolChoice

__all__ = ["BASE_URL_VARIABLE", "KEY_VARIABLE", "OpenAIModel", "OpenAIOptions"]

KEY_VARIABLE = "OPENAI_API_KEY"
BASE_URL_VARIABLE = "OPENAI_BASE_URL"


class OpenAIOptions(ApiOptions, total=False):
    native_allowed_tools: bool
    """False: send an allowed subset as a filtered tools list (default True: as the
    ``allowed_tools`` tool_choice, which servers other than OpenAI's may not know)."""


class OpenAIModel(ApiModel):
    """A model behind one of OpenAI's APIs, through ``openai.OpenAI``."""

    key_variable = KEY_VARIABLE
    base_url_variable = BASE_URL_VARIABLE
    sdk: ClassVar[ModuleType] = openai

    def __init__(self, model: str, *, native_allowed_tools: bool = True, **options: Unpack[ApiOptions]) -> None:
        super().__init__(model, **options)
        self.native_allowed_tools = native_allowed_tools
        self.client = openai.OpenAI(**self.client_options(options, api_key=self.resolved_key(options.get("api_key"))))

    def complete(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> ModelTurn:
        body = self.request(context, tools, tool_choice)
        try:
            data = self._streamed(body) if self.stream else self._created(body)
        except openai.APIError as exc:
            raise self.api_failure(exc) from None
        return self.parse(data)

    # --- what each API does its own way ------------------------------------------------------

    def request(self, context: Context, tools: list[ToolDefinition], tool_choice: ToolChoice) -> dict[str, Any]:
        """The keyword arguments of the API's create call for this turn."""
        raise NotImplementedError

    def _created(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``body`` without streaming, as a dict."""
        raise NotImplementedError

    def _streamed(self, body: dict[str, Any]) -> dict[str, Any]:
        """The answer to ``body`` read from the event stream, as the same dict."""
        raise NotImplementedError

    def parse(self, data: dict[str, Any]) -> ModelTurn:
        """The answer as a ModelTurn."""
        raise NotImplementedError
