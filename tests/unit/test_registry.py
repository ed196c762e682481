"""The tool registry: registration errors name the fix; allowed_tools filters in order."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ToolOutput
from harness.core.errors import CallboxError
from harness.core.registry import RegistryError, Tool, ToolAnnotations, ToolDefinition, ToolRegistry
from harness.core.strict_schema import SchemaForm, json_schema


class EchoArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(description="What to echo.")
    path: str | None = None


class BadArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: dict[str, str]


def echo(_context: Any, args: Any) -> ToolOutput:
    return ToolOutput(text=args.text)


def make(name: str = "echo", description: str = "Echo the text back.", model: Any = EchoArgs, **kw: Any) -> Tool:
    return Tool(ToolDefinition(name=name, description=description, input_model=model, **kw), echo)


def test_register_get_names_tools() -> None:
    reg = ToolRegistry()
    a, b, c = make("b_tool"), make("a_tool"), make("c.tool-1")
    for tool in (a, b, c):
        reg.register(tool)
    assert reg.names() == ["b_tool", "a_tool", "c.tool-1"]  # registration order, not sorted
    assert reg.tools() == [a, b, c]
    assert reg.get("a_tool") is b
    assert reg.get("missing") is None
    assert "c.tool-1" in reg
    assert len(reg) == 3


def test_constructor_registers_the_given_tools() -> None:
    reg = ToolRegistry([make("one"), make("two")])
    assert reg.names() == ["one", "two"]


def test_handler_runs() -> None:
    tool = make()
    assert tool.handler(None, EchoArgs(text="hi")) == ToolOutput(text="hi")
    assert tool.name == "echo"


def test_duplicate_name_is_rejected() -> None:
    reg = ToolRegistry([make("echo")])
    with pytest.raises(RegistryError) as info:
        reg.register(make("echo", description="Another echo."))
    assert info.value.message == "tool 'echo' is already registered; give the new one another name"
    assert reg.get("echo") is not None and reg.get("echo").definition.description == "Echo the text back."  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["", "has space", "x" * 65, "slash/name", "naïve", "semi;colon", "new\nline"])
def test_bad_name_is_rejected_with_pattern_and_example(name: str) -> None:
    with pytest.raises(RegistryError) as info:
        ToolRegistry().register(make(name))
    message = info.value.message
    assert repr(name) in message
    assert "[A-Za-z0-9_.-]{1,64}" in message
    assert "e.g. 'read_file'" in message


@pytest.mark.parametrize("name", ["a", "x" * 64, "str_replace_based_edit_tool", "ns.tool-2", "A_B.c-d"])
def test_good_names_are_accepted(name: str) -> None:
    reg = ToolRegistry()
    reg.register(make(name))
    assert reg.names() == [name]


@pytest.mark.parametrize("description", ["", "   \n"])
def test_empty_description_is_rejected(description: str) -> None:
    with pytest.raises(RegistryError, match="tool 'echo' has an empty description; write a sentence"):
        ToolRegistry().register(make(description=description))


def test_schema_that_cannot_be_strict_names_tool_and_field() -> None:
    reg = ToolRegistry()
    with pytest.raises(RegistryError) as info:
        reg.register(make("envtool", model=BadArgs))
    message = info.value.message
    assert message.startswith("tool 'envtool': its input schema cannot be made strict: field 'BadArgs.env'")
    assert "use a list of {key, value} objects or a model with fixed fields" in message
    assert reg.names() == []


def test_input_model_must_be_a_pydantic_model() -> None:
    with pytest.raises(RegistryError, match="not a pydantic model"):
        ToolRegistry().register(make(model=dict))


def test_handler_must_be_callable() -> None:
    tool = Tool(ToolDefinition(name="x", description="d", input_model=EchoArgs), "not a function")  # type: ignore[arg-type]
    with pytest.raises(RegistryError, match="handler that is not callable"):
        ToolRegistry().register(tool)


def test_command_and_path_fields_must_exist() -> None:
    reg = ToolRegistry()
    reg.register(make("ok", command_field="text", path_fields=("path",)))
    with pytest.raises(RegistryError, match="names 'cmd' as a command, freeform or path field") as info:
        reg.register(make("bad1", command_field="cmd"))
    assert "(it has: text, path)" in info.value.message
    with pytest.raises(RegistryError, match="names 'file'"):
        reg.register(make("bad2", path_fields=("path", "file")))
    assert reg.names() == ["ok"]


def test_allowed_filters_in_registration_order() -> None:
    reg = ToolRegistry([make("shell"), make("read_file"), make("write_file")])
    assert [t.name for t in reg.tools(["write_file", "shell"])] == ["shell", "write_file"]
    assert reg.tools([]) == []
    assert [t.name for t in reg.tools(None)] == ["shell", "read_file", "write_file"]
    assert [t.name for t in reg.tools(frozenset({"read_file"}))] == ["read_file"]


def test_unknown_allowed_names_are_named() -> None:
    reg = ToolRegistry([make("shell"), make("read_file")])
    with pytest.raises(RegistryError) as info:
        reg.tools(["shell", "sh", "bash"])
    assert info.value.message == (
        "allowed_tools names unknown tools 'bash', 'sh'; the registered tools are: shell, read_file"
    )
    with pytest.raises(RegistryError, match="unknown tool 'x';"):
        reg.tools(["x"])


def test_allowed_as_a_bare_string_is_rejected() -> None:
    reg = ToolRegistry([make("shell")])
    with pytest.raises(RegistryError, match="list of tool names"):
        reg.tools("shell")


def test_registry_error_is_a_callbox_error() -> None:
    assert issubclass(RegistryError, CallboxError)
    assert RegistryError("x").exit_code == 2  # a bad tool declaration is a configuration error


def test_input_schema_is_computed_once_per_form_and_returned_as_a_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[type[BaseModel], str]] = []

    def counting(model: type[BaseModel], form: SchemaForm) -> dict[str, Any]:
        calls.append((model, form))
        return json_schema(model, form)

    monkeypatch.setattr("harness.core.registry.json_schema", counting)
    definition = ToolDefinition(name="echo", description="Echo.", input_model=EchoArgs)
    first = definition.input_schema()
    first["properties"].clear()
    second = definition.input_schema()
    assert list(second["properties"]) == ["text", "path"]
    assert second["required"] == ["text", "path"]
    plain = definition.input_schema("plain")
    plain["properties"].clear()
    assert list(definition.input_schema("plain")["properties"]) == ["text", "path"]
    assert calls == [(EchoArgs, "strict"), (EchoArgs, "plain")]


def test_definition_equality_ignores_the_cache() -> None:
    one = ToolDefinition(name="echo", description="Echo.", input_model=EchoArgs)
    two = ToolDefinition(name="echo", description="Echo.", input_model=EchoArgs)
    one.input_schema()
    assert one == two
    assert "_schema" not in repr(one)
    assert "_schemas" not in repr(one)


def test_annotation_defaults_follow_mcp() -> None:
    hints = ToolAnnotations()
    assert (hints.read_only, hints.destructive, hints.idempotent, hints.open_world, hints.title) == (
        False,
        True,
        False,
        False,
        None,
    )
    assert make().definition.annotations == hints
