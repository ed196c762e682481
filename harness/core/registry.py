"""The tool registry: what each tool shows the model, and the handler it never sees.

Mistakes in a tool definition (a duplicate or malformed name, an empty description, an
input model strict mode cannot describe, a policy hint naming a field the model does not
have) are caught at ``register``, with a message saying how to fix them.

Each definition derives its argument schema from its input model in two forms (see
:mod:`harness.core.strict_schema`): ``strict`` for OpenAI strict mode, ``plain`` for everything
else; :mod:`harness.core.formats` picks the form each API expects.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Protocol

import pydantic

from harness.core.calls import TOOL_NAME_PATTERN, ToolOutput
from harness.core.errors import CallboxError, ErrorCode
from harness.core.strict_schema import SchemaForm, StrictSchemaError, json_schema

__all__ = ["Handler", "RegistryError", "Tool", "ToolAnnotations", "ToolDefinition", "ToolFilter", "ToolRegistry"]


class ToolFilter(Protocol):
    """What decides which registered tools a run exposes (a policy)."""

    def tool_allowed(self, name: str) -> bool: ...


@dataclass(frozen=True)
class ToolAnnotations:
    """MCP ToolAnnotations: hints about what the tool does, set truthfully per tool."""

    read_only: bool = False
    """readOnlyHint: the tool does not modify its environment."""
    destructive: bool = True
    """destructiveHint: it may delete or overwrite (MCP's default when not read-only)."""
    idempotent: bool = False
    """idempotentHint: calling it again with the same arguments has no further effect."""
    open_world: bool = False
    """openWorldHint: it reaches outside the sandbox (network none by default: False)."""
    title: str | None = None
    """A human-readable title."""


@dataclass(frozen=True)
class ToolDefinition:
    """What the model sees of a tool, plus hints the policy uses on its arguments."""

    name: str
    description: str
    input_model: type[pydantic.BaseModel]
    annotations: ToolAnnotations = ToolAnnotations()
    command_field: str | None = None
    """The argument holding a shell command (policy command patterns apply to it)."""
    path_fields: tuple[str, ...] = ()
    """The arguments holding paths (policy path globs apply to them)."""
    command_of: Callable[[Any], str | None] | None = field(default=None, compare=False)
    """For a tool whose command is built from its arguments rather than given in one (a
    declared command tool's argv template): the command policy command rules match,
    from the arguments (a dict or the validated input model)."""
    records_changes: bool = True
    """False for a tool that records what it changes itself (``undo``: a revert record): the
    call path then takes no change record of its calls, whatever its annotations."""
    freeform_field: str | None = None
    """If set, arguments that arrive as plain text instead of a JSON object (a freeform
    tool call, as Codex sends apply_patch) become ``{freeform_field: text}``."""
    _schemas: dict[str, dict[str, Any]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def input_schema(self, form: SchemaForm = "strict") -> dict[str, Any]:
        """The JSON Schema of the arguments in ``form``: ``strict`` (OpenAI strict mode) or
        ``plain`` (only the real requirements). Computed once per form; each call returns a copy."""
        schema = self._schemas.get(form)
        if schema is None:
            schema = json_schema(self.input_model, form)
            self._schemas[form] = schema
        return copy.deepcopy(schema)


Handler = Callable[[Any, Any], ToolOutput]
"""``handler(context, arguments)``: the context is the harness's ToolContext, the arguments
an instance of the definition's ``input_model``."""


@dataclass(frozen=True)
class Tool:
    definition: ToolDefinition
    handler: Handler

    @property
    def name(self) -> str:
        return self.definition.name


class RegistryError(CallboxError):
    """A tool cannot be registered or looked up; the message names the fix."""

    code = ErrorCode.INVALID_CONFIG


_NAME_EXAMPLE = "'read_file'"


class ToolRegistry:
    """Tools by name, in registration order."""

    def __init__(self, tools: Collection[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.register(tool)

    def register(self, tool: Tool) -> None:
        definition = tool.definition
        name = definition.name
        if not isinstance(name, str) or TOOL_NAME_PATTERN.fullmatch(name) is None:
            raise RegistryError(
                f"tool name {name!r} is invalid: a name must match {TOOL_NAME_PATTERN.pattern} "
                f"(letters, digits, '_', '.', '-'; 1 to 64 characters), e.g. {_NAME_EXAMPLE}"
            )
        if name in self._tools:
            raise RegistryError(f"tool {name!r} is already registered; give the new one another name")
        if not isinstance(definition.description, str) or not definition.description.strip():
            raise RegistryError(
                f"tool {name!r} has an empty description; write a sentence or two telling the model "
                "what the tool does and when to use it"
            )
        if not callable(tool.handler):
            raise RegistryError(f"tool {name!r} has a handler that is not callable; pass a function")
        model = definition.input_model
        if not (isinstance(model, type) and issubclass(model, pydantic.BaseModel)):
            raise RegistryError(
                f"tool {name!r} has input_model {model!r}, which is not a pydantic model; "
                "pass a pydantic.BaseModel subclass describing the arguments"
            )
        try:
            schema = definition.input_schema("strict")
            definition.input_schema("plain")
        except StrictSchemaError as exc:
            raise RegistryError(f"tool {name!r}: its input schema cannot be made strict: {exc}") from exc
        properties: dict[str, Any] = schema["properties"]
        hinted = [definition.command_field, definition.freeform_field, *definition.path_fields]
        for hint in hinted:
            if hint is not None and hint not in properties:
                raise RegistryError(
                    f"tool {name!r} names {hint!r} as a command, freeform or path field, but {model.__name__} "
                    f"has no such field (it has: {', '.join(properties) or 'none'}); "
                    "fix command_field/freeform_field/path_fields"
                )
        self._tools[name] = tool

    def add(self, *tools: Tool) -> ToolRegistry:
        """Register each of ``tools`` (as ``register`` does) and return this registry, so
        ``builtin_registry().add(my_tool)`` is the registry to hand a Session or a door."""
        for tool in tools:
            self.register(tool)
        return self

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def tools(self, allowed: Collection[str] | None = None) -> list[Tool]:
        """The registered tools in registration order; only those in ``allowed`` when given."""
        if allowed is None:
            return list(self._tools.values())
        if isinstance(allowed, str):
            raise RegistryError(f"allowed_tools must be a list of tool names, not the string {allowed!r}")
        unknown = sorted(set(allowed) - self._tools.keys())
        if unknown:
            listed = ", ".join(repr(name) for name in unknown)
            raise RegistryError(
                f"allowed_tools names unknown tool{'s' if len(unknown) > 1 else ''} {listed}; "
                f"the registered tools are: {', '.join(self._tools) or 'none'}"
            )
        wanted = set(allowed)
        return [tool for name, tool in self._tools.items() if name in wanted]

    def names(self) -> list[str]:
        return list(self._tools)

    def exposed(self, allowed_by: ToolFilter) -> list[Tool]:
        """The tools a run under ``allowed_by`` offers a model, in registration order: the one
        answer every door, the loop and the CLI give to "which tools are there"."""
        return [tool for name, tool in self._tools.items() if allowed_by.tool_allowed(name)]

    def exposed_names(self, allowed_by: ToolFilter) -> list[str]:
        return [tool.definition.name for tool in self.exposed(allowed_by)]
