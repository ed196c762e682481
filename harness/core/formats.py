"""Tool definitions and tool results in the exact shape each model API expects.

* ``openai``: the Responses API (function tool; ``function_call_output`` item);
* ``chat``: Chat Completions (``{"type": "function", "function": {...}}``; a ``tool`` message);
* ``anthropic``: the Messages API (tool; ``tool_result`` content block);
* ``mcp``: the Model Context Protocol (``Tool``; ``CallToolResult``).

Each format gets the argument schema its consumers expect, both derived from the tool's
input model by :meth:`ToolDefinition.input_schema`:

* ``openai`` and ``chat``: the strict form with ``"strict": true`` (every property
  required, optional ones nullable), or with ``strict=False`` the plain form and
  ``"strict": false`` (for endpoints without strict mode);
* ``anthropic`` and ``mcp``: the plain form (``required`` lists only what is required).
  Many MCP clients check required arguments themselves, so the strict form would make
  them refuse any call that leaves out an optional argument.

Results carry the text verbatim: it is already the sentence the model should read,
errors included (Responses and Chat Completions have no error flag, so the words carry it).
A result's pictures (:attr:`ToolResult.images`) follow its text, base64-encoded:

* ``openai``: ``output`` becomes a list, an ``input_text`` part then one ``input_image``
  part per picture (a ``data:`` URL);
* ``anthropic``: ``content`` becomes a list of blocks, ``text`` then one ``image`` block per
  picture (``source`` of type ``base64``);
* ``mcp``: one ``ImageContent`` (``{"type": "image", "data", "mimeType"}``) per picture
  after the text;
* ``chat``: a ``tool`` message can hold text only, so its content is the text followed by
  one line per picture, ``[image 1: image/png 640x480, 12.3 KiB (chart.png); it follows in a
  user message]``, and :func:`chat_image_message` is the ``user`` message carrying the
  pictures of a turn's results, which goes after all of that turn's ``tool`` messages.

A result without pictures keeps the plain-text shape (a string ``output`` or ``content``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable, Sequence
from typing import Any, Literal, cast

from harness.core.calls import ImagePart, ToolResult
from harness.core.images import describe
from harness.core.registry import Tool, ToolDefinition
from harness.core.strict_schema import SchemaForm

__all__ = [
    "FORMATS",
    "Format",
    "chat_image_message",
    "chat_images_call_id",
    "data_url",
    "parse_format",
    "result_item",
    "schema_form",
    "tool_definition",
    "tool_definitions",
]

_CHAT_IMAGE_LINE = re.compile(r"\[image \d+ of tool call (\S+): ")
"""The line introducing a picture in :func:`chat_image_message`."""

Format = Literal["openai", "chat", "anthropic", "mcp"]
FORMATS: tuple[str, ...] = ("openai", "chat", "anthropic", "mcp")


def parse_format(text: str) -> Format:
    """``text`` as a Format; ValueError naming the choices otherwise."""
    value = text.strip().lower()
    if value not in FORMATS:
        raise ValueError(f"unknown format {text!r}; choose one of: {', '.join(FORMATS)}")
    return cast(Format, value)


def schema_form(fmt: Format, *, strict: bool = True) -> SchemaForm:
    """The argument schema form ``fmt``'s tools list uses (``strict`` matters to OpenAI only)."""
    if fmt in ("openai", "chat"):
        return "strict" if strict else "plain"
    if fmt in ("anthropic", "mcp"):
        return "plain"
    raise ValueError(_unknown(fmt))


def tool_definition(definition: ToolDefinition | Tool, fmt: Format, *, strict: bool = True) -> dict[str, Any]:
    """The definition of one tool as ``fmt``'s API expects it in its tools list.

    ``strict=False`` gives OpenAI formats the plain schema and ``"strict": false``;
    Anthropic and MCP always get the plain schema.
    """
    if isinstance(definition, Tool):
        definition = definition.definition
    schema = definition.input_schema(schema_form(fmt, strict=strict))
    if fmt == "openai":
        return {
            "type": "function",
            "name": definition.name,
            "description": definition.description,
            "parameters": schema,
            "strict": strict,
        }
    if fmt == "chat":
        return {
            "type": "function",
            "function": {
                "name": definition.name,
                "description": definition.description,
                "parameters": schema,
                "strict": strict,
            },
        }
    if fmt == "anthropic":
        return {"name": definition.name, "description": definition.description, "input_schema": schema}
    if fmt == "mcp":
        hints = definition.annotations
        annotations: dict[str, Any] = {}
        if hints.title is not None:
            annotations["title"] = hints.title
        annotations["readOnlyHint"] = hints.read_only
        annotations["destructiveHint"] = hints.destructive
        annotations["idempotentHint"] = hints.idempotent
        annotations["openWorldHint"] = hints.open_world
        return {
            "name": definition.name,
            "description": definition.description,
            "inputSchema": schema,
            "annotations": annotations,
        }
    raise ValueError(_unknown(fmt))


def tool_definitions(
    tools: Iterable[ToolDefinition | Tool], fmt: Format, *, strict: bool = True
) -> list[dict[str, Any]]:
    """The tools list for ``fmt``'s API, in the order given."""
    return [tool_definition(tool, fmt, strict=strict) for tool in tools]


def result_item(result: ToolResult, fmt: Format) -> dict[str, Any]:
    """The item a caller appends to the conversation for ``result`` in ``fmt``'s API."""
    text = _text(result)
    images = result.images
    if fmt == "openai":
        output: str | list[dict[str, Any]] = text
        if images:
            output = [{"type": "input_text", "text": text}] if text else []
            output.extend({"type": "input_image", "image_url": data_url(image)} for image in images)
        return {"type": "function_call_output", "call_id": result.call_id, "output": output}
    if fmt == "chat":
        lines = [f"[image {n}: {describe(image)}; it follows in a user message]" for n, image in enumerate(images, 1)]
        return {"role": "tool", "tool_call_id": result.call_id, "content": "\n".join([text, *lines] if text else lines)}
    if fmt == "anthropic":
        blocks: str | list[dict[str, Any]] = text
        if images:
            blocks = [{"type": "text", "text": text}] if text else []
            blocks.extend({"type": "image", "source": {"type": "base64", "media_type": image.media_type,
                                                       "data": _base64(image)}} for image in images)
        return {"type": "tool_result", "tool_use_id": result.call_id, "content": blocks, "is_error": result.is_error}
    if fmt == "mcp":
        content: list[dict[str, Any]] = [{"type": "text", "text": text}]
        content.extend({"type": "image", "data": _base64(image), "mimeType": image.media_type} for image in images)
        item: dict[str, Any] = {"content": content}
        if result.structured is not None:
            item["structuredContent"] = result.structured
        item["isError"] = result.is_error
        return item
    raise ValueError(_unknown(fmt))


def chat_image_message(results: Sequence[ToolResult]) -> dict[str, Any] | None:
    """For Chat Completions, whose ``tool`` messages hold text only: the ``user`` message
    carrying the pictures of ``results`` (to go after all their ``tool`` messages), each
    introduced by the line its ``tool`` message names it with; None when none has any."""
    parts: list[dict[str, Any]] = []
    for result in results:
        for n, image in enumerate(result.images, 1):
            parts.append({"type": "text", "text": f"[image {n} of tool call {result.call_id}: {describe(image)}]"})
            parts.append({"type": "image_url", "image_url": {"url": data_url(image)}})
    return {"role": "user", "content": parts} if parts else None


def chat_images_call_id(message: dict[str, Any]) -> str | None:
    """The call whose pictures begin ``message`` when it is one :func:`chat_image_message`
    made, else None (what the loop's context budget elides it as)."""
    content = message.get("content")
    if message.get("role") != "user" or not isinstance(content, list) or not content:
        return None
    first = content[0]
    match = _CHAT_IMAGE_LINE.match(str(first.get("text", ""))) if isinstance(first, dict) else None
    return match.group(1) if match else None


def data_url(image: ImagePart) -> str:
    """``data:image/png;base64,...``: a picture inline, as the OpenAI APIs take it."""
    return f"data:{image.media_type};base64,{_base64(image)}"


def _base64(image: ImagePart) -> str:
    return base64.b64encode(image.data).decode("ascii")


def _text(result: ToolResult) -> str:
    """The result text; an error with no words still says it failed (APIs reject empty error content)."""
    if result.text or not result.is_error:
        return result.text
    code = result.error.value if result.error is not None else "error"
    return f"The tool call failed ({code}) without a message."


def _unknown(fmt: object) -> str:
    return f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}"
