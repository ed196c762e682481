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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, cast

from harness.core.calls import ToolResult
from harness.core.registry import Tool, ToolDefinition
from harness.core.strict_schema import SchemaForm

__all__ = [
    "FORMATS",
    "Format",
    "parse_format",
    "result_item",
    "schema_form",
    "tool_definition",
    "tool_definitions",
]

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
    if fmt == "openai":
        return {"type": "function_call_output", "call_id": result.call_id, "output": text}
    if fmt == "chat":
        return {"role": "tool", "tool_call_id": result.call_id, "content": text}
    if fmt == "anthropic":
        return {"type": "tool_result", "tool_use_id": result.call_id, "content": text, "is_error": result.is_error}
    if fmt == "mcp":
        item: dict[str, Any] = {"content": [{"type": "text", "text": text}]}
        if result.structured is not None:
            item["structuredContent"] = result.structured
        item["isError"] = result.is_error
        return item
    raise ValueError(_unknown(fmt))


def _text(result: ToolResult) -> str:
    """The result text; an error with no words still says it failed (APIs reject empty error content)."""
    if result.text or not result.is_error:
        return result.text
    code = result.error.value if result.error is not None else "error"
    return f"The tool call failed ({code}) without a message."


def _unknown(fmt: object) -> str:
    return f"unknown format {fmt!r}; choose one of: {', '.join(FORMATS)}"
