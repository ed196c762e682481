"""Definitions and result items in each API's exact shape, written out literally; the
schema form each format gets, checked on every built-in tool."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput, ToolResult
from harness.core.formats import (
    FORMATS,
    Format,
    parse_format,
    result_item,
    schema_form,
    tool_definition,
    tool_definitions,
)
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.strict_schema import strict_json_schema
from harness.tools import builtin_registry


class ReadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = Field(description="File to read.")
    limit: int | None = Field(None, description="Most lines to return.")


READ = ToolDefinition(
    name="read_file",
    description="Read a text file in the workspace.",
    input_model=ReadArgs,
    annotations=ToolAnnotations(read_only=True, destructive=False, idempotent=True, title="Read file"),
    path_fields=("path",),
)

STRICT_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "File to read."},
        "limit": {"description": "Most lines to return.", "anyOf": [{"type": "integer"}, {"type": "null"}]},
    },
    "required": ["path", "limit"],
    "additionalProperties": False,
}
PLAIN_SCHEMA = {
    "type": "object",
    "properties": {
        "path": {"type": "string", "description": "File to read."},
        "limit": {"type": "integer", "description": "Most lines to return."},
    },
    "required": ["path"],
    "additionalProperties": False,
}

OK = ToolResult(call_id="call_abc123", text="line one\nline two\n", structured={"lines": 2, "truncated": False})
DENIED = ToolResult.failure(
    "toolu_01XYZ",
    ErrorCode.DENIED,
    'Denied by policy rule tools.shell.rules[0] deny "rm -rf *": deleting the workspace is not allowed.',
)


# --- definitions --------------------------------------------------------------------------


def test_openai_responses_definition() -> None:
    assert tool_definition(READ, "openai") == {
        "type": "function",
        "name": "read_file",
        "description": "Read a text file in the workspace.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File to read."},
                "limit": {"description": "Most lines to return.", "anyOf": [{"type": "integer"}, {"type": "null"}]},
            },
            "required": ["path", "limit"],
            "additionalProperties": False,
        },
        "strict": True,
    }


def test_chat_completions_definition() -> None:
    assert tool_definition(READ, "chat") == {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a text file in the workspace.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "File to read."},
                    "limit": {
                        "description": "Most lines to return.",
                        "anyOf": [{"type": "integer"}, {"type": "null"}],
                    },
                },
                "required": ["path", "limit"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }


def test_anthropic_definition() -> None:
    assert tool_definition(READ, "anthropic") == {
        "name": "read_file",
        "description": "Read a text file in the workspace.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File to read."},
                "limit": {"type": "integer", "description": "Most lines to return."},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
    }


def test_mcp_definition() -> None:
    assert tool_definition(READ, "mcp") == {
        "name": "read_file",
        "description": "Read a text file in the workspace.",
        "inputSchema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "File to read."},
                "limit": {"type": "integer", "description": "Most lines to return."},
            },
            "required": ["path"],
            "additionalProperties": False,
        },
        "annotations": {
            "title": "Read file",
            "readOnlyHint": True,
            "destructiveHint": False,
            "idempotentHint": True,
            "openWorldHint": False,
        },
    }


def test_mcp_definition_omits_a_missing_title_and_keeps_default_hints() -> None:
    shell = ToolDefinition(name="shell", description="Run a command.", input_model=ReadArgs)
    assert tool_definition(shell, "mcp")["annotations"] == {
        "readOnlyHint": False,
        "destructiveHint": True,
        "idempotentHint": False,
        "openWorldHint": False,
    }


def test_definitions_accept_tools_keep_order_and_are_json() -> None:
    def handler(_context: Any, _args: Any) -> ToolOutput:
        return ToolOutput(text="")

    other = ToolDefinition(name="a_second", description="Second.", input_model=ReadArgs)
    listed = tool_definitions([Tool(READ, handler), other], "anthropic")
    assert [d["name"] for d in listed] == ["read_file", "a_second"]
    assert listed[0]["input_schema"] == PLAIN_SCHEMA
    for fmt in FORMATS:
        json.dumps(tool_definitions([READ, other], parse_format(fmt)))


def test_definition_schema_is_not_shared_between_calls() -> None:
    first = tool_definition(READ, "openai")
    first["parameters"]["properties"].clear()
    assert tool_definition(READ, "openai")["parameters"] == STRICT_SCHEMA


def test_openai_formats_without_strict_mode_get_the_plain_schema() -> None:
    responses = tool_definition(READ, "openai", strict=False)
    assert responses["strict"] is False
    assert responses["parameters"] == PLAIN_SCHEMA
    chat = tool_definitions([READ], "chat", strict=False)[0]["function"]
    assert chat["strict"] is False
    assert chat["parameters"] == PLAIN_SCHEMA
    # Anthropic and MCP have no strict variant: the flag changes nothing there
    assert tool_definition(READ, "mcp", strict=False) == tool_definition(READ, "mcp")
    assert tool_definition(READ, "anthropic", strict=False) == tool_definition(READ, "anthropic")


def test_schema_form_per_format() -> None:
    assert [schema_form(parse_format(fmt)) for fmt in FORMATS] == ["strict", "strict", "plain", "plain"]
    assert [schema_form(parse_format(fmt), strict=False) for fmt in FORMATS] == ["plain"] * 4
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        schema_form("xml")  # type: ignore[arg-type]


# --- built-in tools in every format ------------------------------------------------------

BUILTINS = builtin_registry()
# What each built-in tool really requires (everything else has a default).
REQUIRED = {
    "shell": ["command"],
    "bash": [],
    "str_replace_based_edit_tool": ["command", "path"],
    "apply_patch": ["patch"],
    "read_file": ["path"],
    "write_file": ["path", "content"],
    "list_dir": [],
    "search": ["pattern"],
    "view_image": ["path"],
    "exec_command": ["cmd"],
    "write_stdin": ["session_id"],
    "python": ["code"],
    "computer": ["action"],
    "browser_navigate": ["url"],
    "browser_snapshot": [],
    "browser_click": ["element", "ref"],
    "browser_type": ["element", "ref", "text"],
    "browser_press_key": ["key"],
    "browser_take_screenshot": [],
    "browser_tabs": ["action"],
    "browser_console_messages": [],
    "browser_wait_for": [],
}


def schema_of(definition: dict[str, Any], fmt: Format) -> dict[str, Any]:
    if fmt == "openai":
        schema: dict[str, Any] = definition["parameters"]
    elif fmt == "chat":
        schema = definition["function"]["parameters"]
    elif fmt == "anthropic":
        schema = definition["input_schema"]
    else:
        schema = definition["inputSchema"]
    return schema


def nodes(schema: Any) -> list[dict[str, Any]]:
    """Every sub-schema (dict) of ``schema``, itself included."""
    found: list[dict[str, Any]] = []
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            found.append(node)
            for key, value in node.items():
                if key in ("properties", "$defs"):
                    stack.extend(value.values())
                elif key not in ("enum", "const", "required", "default", "examples"):
                    stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return found


def test_every_builtin_tool_is_covered() -> None:
    assert BUILTINS.names() == list(REQUIRED)


@pytest.mark.parametrize("fmt", ["anthropic", "mcp"])
@pytest.mark.parametrize("name", list(REQUIRED))
def test_builtin_plain_schema_requires_only_real_requirements(name: str, fmt: Format) -> None:
    tool = BUILTINS.get(name)
    assert tool is not None
    schema = schema_of(tool_definition(tool, fmt), fmt)
    assert schema.get("required", []) == REQUIRED[name]
    assert "required" not in schema or schema["required"], "no empty required list"
    # the same properties as the strict form, in the same order, and nothing else goes in
    assert list(schema["properties"]) == list(strict_json_schema(tool.definition.input_model)["properties"])
    assert schema["additionalProperties"] is False
    jsonschema.Draft202012Validator.check_schema(schema)
    for node in nodes(schema):
        assert node.get("type") != "null" and "null" not in node.get("type", []), f"{name}: null branch {node}"
        assert "$ref" not in node and "$defs" not in node and "title" not in node
        assert node.get("default", 0) is not None


@pytest.mark.parametrize("fmt", ["openai", "chat"])
@pytest.mark.parametrize("name", list(REQUIRED))
def test_builtin_strict_schema_is_the_strict_form(name: str, fmt: Format) -> None:
    tool = BUILTINS.get(name)
    assert tool is not None
    definition = tool_definition(tool, fmt)
    schema = schema_of(definition, fmt)
    assert schema == strict_json_schema(tool.definition.input_model)
    assert schema["required"] == list(schema["properties"])
    assert (definition if fmt == "openai" else definition["function"])["strict"] is True
    optional = [prop for prop in schema["properties"] if prop not in REQUIRED[name]]
    for prop in optional:
        branch = schema["properties"][prop]
        assert "null" in branch.get("type", []) or {"type": "null"} in branch.get("anyOf", []), (name, prop)


SHELL_PLAIN = {
    "type": "object",
    "description": "Run a shell command in the sandbox and return its exit code and output.",
    "properties": {
        "command": {
            "type": "string",
            "description": "The command line, run with `bash -c` in the sandbox.",
            "minLength": 1,
        },
        "workdir": {"type": "string", "description": "Working directory inside the sandbox (default: the workspace)."},
        "timeout_ms": {
            "type": "integer",
            "description": "Kill the command after this many milliseconds (capped by policy).",
            "minimum": 1,
        },
    },
    "required": ["command"],
    "additionalProperties": False,
}


def test_builtin_shell_in_mcp_and_anthropic() -> None:
    shell = BUILTINS.get("shell")
    assert shell is not None
    assert tool_definition(shell, "mcp")["inputSchema"] == SHELL_PLAIN
    assert tool_definition(shell, "anthropic")["input_schema"] == SHELL_PLAIN


def test_builtin_defaults_are_shown_in_the_plain_form() -> None:
    def props(name: str) -> dict[str, Any]:
        tool = BUILTINS.get(name)
        assert tool is not None
        return dict(tool.definition.input_schema("plain")["properties"])

    assert props("read_file")["start_line"]["default"] == 1
    assert props("write_file")["create_only"]["default"] is False
    assert [props("list_dir")[key]["default"] for key in ("path", "depth", "include_hidden")] == [".", 1, False]
    assert [props("search")[key].get("default") for key in ("path", "literal", "glob", "max_results")] == [
        ".", False, None, 100,
    ]


# --- results ------------------------------------------------------------------------------


def test_openai_results() -> None:
    assert result_item(OK, "openai") == {
        "type": "function_call_output",
        "call_id": "call_abc123",
        "output": "line one\nline two\n",
    }
    assert result_item(DENIED, "openai") == {
        "type": "function_call_output",
        "call_id": "toolu_01XYZ",
        "output": 'Denied by policy rule tools.shell.rules[0] deny "rm -rf *": deleting the workspace is not allowed.',
    }


def test_chat_results() -> None:
    assert result_item(OK, "chat") == {
        "role": "tool",
        "tool_call_id": "call_abc123",
        "content": "line one\nline two\n",
    }
    assert result_item(DENIED, "chat") == {
        "role": "tool",
        "tool_call_id": "toolu_01XYZ",
        "content": 'Denied by policy rule tools.shell.rules[0] deny "rm -rf *": deleting the workspace is not allowed.',
    }


def test_anthropic_results() -> None:
    assert result_item(OK, "anthropic") == {
        "type": "tool_result",
        "tool_use_id": "call_abc123",
        "content": "line one\nline two\n",
        "is_error": False,
    }
    assert result_item(DENIED, "anthropic") == {
        "type": "tool_result",
        "tool_use_id": "toolu_01XYZ",
        "content": 'Denied by policy rule tools.shell.rules[0] deny "rm -rf *": deleting the workspace is not allowed.',
        "is_error": True,
    }


def test_mcp_results() -> None:
    assert result_item(OK, "mcp") == {
        "content": [{"type": "text", "text": "line one\nline two\n"}],
        "structuredContent": {"lines": 2, "truncated": False},
        "isError": False,
    }
    assert result_item(DENIED, "mcp") == {
        "content": [
            {
                "type": "text",
                "text": 'Denied by policy rule tools.shell.rules[0] deny "rm -rf *": '
                "deleting the workspace is not allowed.",
            }
        ],
        "isError": True,
    }


def test_error_with_structured_detail_keeps_it_in_mcp_only() -> None:
    timed_out = ToolResult(
        call_id="c1",
        text="Exit code: 124\nWall time: 30.0 seconds\nOutput:\nThe command timed out after 30 s.",
        is_error=True,
        error=ErrorCode.TIMED_OUT,
        structured={"exit_code": 124, "timed_out": True},
        meta={"duration_ms": 30001},
    )
    assert result_item(timed_out, "mcp")["structuredContent"] == {"exit_code": 124, "timed_out": True}
    for fmt in ("openai", "chat", "anthropic"):
        item = result_item(timed_out, parse_format(fmt))
        assert "structuredContent" not in item
        assert "duration_ms" not in json.dumps(item)  # meta never reaches the model
        assert timed_out.text in item.values()


def test_error_without_words_still_says_it_failed() -> None:
    silent = ToolResult(call_id="c2", text="", is_error=True, error=ErrorCode.TOOL_FAILED)
    expected = "The tool call failed (tool_failed) without a message."
    assert result_item(silent, "openai")["output"] == expected
    assert result_item(silent, "chat")["content"] == expected
    assert result_item(silent, "anthropic")["content"] == expected
    assert result_item(silent, "mcp")["content"] == [{"type": "text", "text": expected}]


def test_empty_success_text_is_kept_empty() -> None:
    empty = ToolResult(call_id="c3", text="")
    assert result_item(empty, "openai")["output"] == ""
    assert result_item(empty, "anthropic") == {
        "type": "tool_result",
        "tool_use_id": "c3",
        "content": "",
        "is_error": False,
    }


# --- format names -------------------------------------------------------------------------


def test_formats_tuple() -> None:
    assert FORMATS == ("openai", "chat", "anthropic", "mcp")


@pytest.mark.parametrize(("text", "expected"), [("openai", "openai"), (" MCP ", "mcp"), ("Chat", "chat")])
def test_parse_format(text: str, expected: str) -> None:
    assert parse_format(text) == expected


@pytest.mark.parametrize("text", ["", "responses", "claude", "open ai"])
def test_parse_format_rejects_unknown_names_listing_the_choices(text: str) -> None:
    with pytest.raises(ValueError, match=r"choose one of: openai, chat, anthropic, mcp") as info:
        parse_format(text)
    assert repr(text) in str(info.value)


def test_unknown_format_value_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        tool_definition(READ, "xml")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown format 'xml'"):
        result_item(OK, "xml")  # type: ignore[arg-type]
