"""``kind = "mcp"``: a stdio MCP server in the sandbox whose tools join the registry.

A ``[[tool]]`` table of this kind names a prefix (``name``), the server's ``command`` (an
argv, run without a shell), and optionally ``env`` and ``mounts`` (a read-only directory
holding the server's code). Each tool the server lists becomes ``PREFIX__TOOL``
(:func:`mcp_tool_name`); a server tool whose full name would not be a tool name is skipped
with a warning.

The server's ``inputSchema`` is plain JSON Schema, usually beyond what a ``[[tool]]``
``parameters`` table may use. :func:`input_model_for` wraps it in a pydantic model:

* its JSON Schema is the server's own, so the registry derives the strict and plain forms
  from it with the same machinery as for every other tool;
* validation checks the arguments against that schema (:func:`check_value`, a subset of
  JSON Schema 2020-12 that covers what MCP servers publish: ``type``, ``enum``, ``const``,
  ``properties``, ``required``, ``additionalProperties``, ``items``, ``anyOf``/``oneOf``/
  ``allOf``, local ``$ref``, length, size and range bounds, ``pattern``; annotation keywords
  such as ``title``, ``description``, ``default``, ``format`` and ``examples`` are ignored,
  as JSON Schema treats them). A schema using any other keyword is refused by
  :func:`schema_problem`, and the tool is skipped with a message naming the keyword: an
  argument check that silently ignored a constraint would pass calls the server refuses.
"""

from __future__ import annotations

import copy
import math
import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

from harness.core.calls import TOOL_NAME_PATTERN

__all__ = [
    "MCP_SEPARATOR",
    "McpArgs",
    "check_mcp_table",
    "check_value",
    "input_model_for",
    "mcp_tool_name",
    "schema_problem",
]

MCP_SEPARATOR = "__"
"""Between the ``[[tool]]`` name (the prefix) and the server's tool name."""

_ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "format", "$schema", "$id", "$comment",
    "deprecated", "readOnly", "writeOnly", "contentMediaType", "contentEncoding",
})
_CHECKED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "anyOf", "oneOf",
    "allOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "minItems", "maxItems", "uniqueItems",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "pattern", "minProperties",
    "maxProperties",
})
_TYPES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})


def check_mcp_table(command: Sequence[str] | None, name: str, has_arguments: bool) -> None:
    """The checks of a ``kind = "mcp"`` table; ValueError naming the key and the fix."""
    if not command or not command[0]:
        raise ValueError('a kind = "mcp" tool needs command = ["PROGRAM", "ARG", ...], the server to start')
    if any("\0" in part for part in command):
        raise ValueError("command: an element contains a NUL character")
    if has_arguments:
        raise ValueError("arguments and parameters: an mcp tool's arguments are the ones its server lists; "
                         "remove them")
    if MCP_SEPARATOR in name:
        raise ValueError(f"name {name!r}: an mcp tool's name is the prefix of its server's tools "
                         f"(PREFIX{MCP_SEPARATOR}TOOL), so it cannot contain {MCP_SEPARATOR!r}")


def mcp_tool_name(prefix: str, server_tool: str) -> str | None:
    """``PREFIX__TOOL``, or None when that is not a tool name (too long, other characters)."""
    full = f"{prefix}{MCP_SEPARATOR}{server_tool}"
    return full if TOOL_NAME_PATTERN.fullmatch(full) else None


def schema_problem(schema: Any, where: str = "inputSchema") -> str | None:
    """Why ``schema`` cannot be used as a tool's arguments (None when it can)."""
    if not isinstance(schema, dict):
        return f"{where} is not a JSON object"
    if where == "inputSchema" and schema.get("type") != "object":
        return f'{where} is not type "object"'
    return _walk_problem(schema, where)


def _walk_problem(node: Any, where: str) -> str | None:
    if isinstance(node, bool):
        return None
    if not isinstance(node, dict):
        return f"{where} is not a schema"
    for key, value in node.items():
        if key in _ANNOTATIONS:
            continue
        if key not in _CHECKED:
            return f"{where} uses the JSON Schema keyword {key!r}, which callbox cannot check"
        if key == "$ref" and not (isinstance(value, str) and (value.startswith("#/$defs/")
                                                              or value.startswith("#/definitions/"))):
            return f"{where}: $ref {value!r} is not a local #/$defs/ reference"
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            if not all(isinstance(k, str) and k in _TYPES for k in kinds):
                return f"{where}: type {value!r} is not a JSON Schema type"
        if key == "pattern":
            try:
                re.compile(str(value))
            except re.error:
                return f"{where}: pattern {value!r} is not a regular expression Python can use"
    children: list[tuple[str, Any]] = []
    for key in ("properties", "$defs", "definitions"):
        if isinstance(node.get(key), dict):
            children += [(f"{where}.{key}.{k}", v) for k, v in node[key].items()]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(node.get(key), list):
            children += [(f"{where}.{key}[{i}]", v) for i, v in enumerate(node[key])]
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            children.append((f"{where}.{key}", node[key]))
    for child_where, child in children:
        problem = _walk_problem(child, child_where)
        if problem is not None:
            return problem
    return None


def _is_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and value.is_integer())
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return {
        "object": isinstance(value, dict), "array": isinstance(value, list), "string": isinstance(value, str),
        "boolean": isinstance(value, bool), "null": value is None,
    }[kind]


def _path(path: str, key: str | int) -> str:
    return f"{path}[{key}]" if isinstance(key, int) else (f"{path}.{key}" if path else key)


def check_value(schema: Any, value: Any, root: Mapping[str, Any], path: str = "") -> list[str]:
    """The problems of ``value`` against ``schema`` (already accepted by :func:`schema_problem`),
    each naming where (``files[2].path``); empty when it fits."""
    if schema is True or schema is None:
        return []
    if schema is False:
        return [f"argument '{path}' is not allowed"]
    where = f"argument '{path}'" if path else "the arguments"
    ref = schema.get("$ref")
    if isinstance(ref, str):
        _, section, name = ref.split("/", 2)
        target = root.get(section, {}).get(name)
        found = check_value(target if target is not None else True, value, root, path)
        if found:
            return found
    kinds = schema.get("type")
    if kinds is not None:
        wanted = kinds if isinstance(kinds, list) else [kinds]
        if not any(_is_type(value, k) for k in wanted):
            return [f"{where} must be {' or '.join(wanted)}, got {type(value).__name__} {_shown(value)}"]
    if "enum" in schema and not any(_equal(value, option) for option in schema["enum"]):
        return [f"{where} must be one of {', '.join(_shown(o) for o in schema['enum'])}, got {_shown(value)}"]
    if "const" in schema and not _equal(value, schema["const"]):
        return [f"{where} must be {_shown(schema['const'])}, got {_shown(value)}"]
    problems: list[str] = []
    if isinstance(value, str):
        problems += _string_problems(schema, value, where)
    if isinstance(value, int | float) and not isinstance(value, bool):
        problems += _number_problems(schema, value, where)
    if isinstance(value, list):
        problems += _array_problems(schema, value, root, path, where)
    if isinstance(value, dict):
        problems += _object_problems(schema, value, root, path, where)
    for part in schema.get("allOf", ()):
        problems += check_value(part, value, root, path)
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if options:
            fitting = sum(not check_value(option, value, root, path) for option in options)
            if fitting == 0 or (key == "oneOf" and fitting > 1):
                problems.append(f"{where} fits {'none' if fitting == 0 else 'more than one'} of the allowed "
                                f"forms ({key}), got {_shown(value)}")
    return problems


def _string_problems(schema: Mapping[str, Any], value: str, where: str) -> list[str]:
    problems = []
    if "minLength" in schema and len(value) < schema["minLength"]:
        problems.append(f"{where} must be at least {schema['minLength']} characters")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        problems.append(f"{where} must be at most {schema['maxLength']} characters")
    if "pattern" in schema and re.search(schema["pattern"], value) is None:
        problems.append(f"{where} must match the pattern {schema['pattern']!r}")
    return problems


def _number_problems(schema: Mapping[str, Any], value: float, where: str) -> list[str]:
    problems = []
    bounds = (("minimum", operator.ge, "at least"), ("maximum", operator.le, "at most"),
              ("exclusiveMinimum", operator.gt, "above"), ("exclusiveMaximum", operator.lt, "below"))
    for key, fits, words in bounds:
        bound = schema.get(key)
        if isinstance(bound, int | float) and not isinstance(bound, bool) and not fits(value, bound):
            problems.append(f"{where} must be {words} {bound}, got {value}")
    step = schema.get("multipleOf")
    if isinstance(step, int | float) and step > 0 and not math.isclose(value / step, round(value / step)):
        problems.append(f"{where} must be a multiple of {step}")
    return problems


def _array_problems(schema: Mapping[str, Any], value: list[Any], root: Mapping[str, Any], path: str,
                    where: str) -> list[str]:
    problems = []
    if "minItems" in schema and len(value) < schema["minItems"]:
        problems.append(f"{where} must have at least {schema['minItems']} items")
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        problems.append(f"{where} must have at most {schema['maxItems']} items")
    if schema.get("uniqueItems") and any(_equal(a, b) for i, a in enumerate(value) for b in value[i + 1:]):
        problems.append(f"{where} must not repeat an item")
    items = schema.get("items")
    if items is not None:
        for index, item in enumerate(value):
            problems += check_value(items, item, root, _path(path, index))
    return problems


def _object_problems(schema: Mapping[str, Any], value: dict[str, Any], root: Mapping[str, Any], path: str,
                     where: str) -> list[str]:
    problems = []
    properties: Mapping[str, Any] = schema.get("properties", {})
    for name in schema.get("required", ()):
        if name not in value:
            problems.append(f"missing required argument '{_path(path, name)}'")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            problems += check_value(properties[key], item, root, _path(path, key))
        elif extra is False:
            allowed = ", ".join(properties) or "none"
            problems.append(f"unexpected argument '{_path(path, key)}' (allowed: {allowed})")
        elif isinstance(extra, dict):
            problems += check_value(extra, item, root, _path(path, key))
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        problems.append(f"{where} must have at least {schema['minProperties']} keys")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        problems.append(f"{where} must have at most {schema['maxProperties']} keys")
    return problems


def _equal(a: Any, b: Any) -> bool:
    """JSON equality: ``true`` is not ``1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    return bool(a == b)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class McpArgs(BaseModel):
    """The arguments of one MCP server tool: any JSON object its ``inputSchema`` accepts."""

    model_config = ConfigDict(extra="allow", frozen=True)
    mcp_schema: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="before")
    @classmethod
    def _check(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("the arguments must be a JSON object")
        problems = check_value(cls.mcp_schema, data, cls.mcp_schema)
        if problems:
            raise ValueError("; ".join(problems[:10]))
        return data

    @classmethod
    def model_json_schema(cls, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The server's own schema (the registry derives the strict and plain forms from it)."""
        schema = copy.deepcopy(cls.mcp_schema)
        _mark_free_form(schema, root=True)
        schema.setdefault("properties", {})
        return schema

    def arguments(self) -> dict[str, Any]:
        """The arguments as the server receives them."""
        return dict(self.__pydantic_extra__ or {})


def _mark_free_form(node: Any, *, root: bool = False) -> None:
    """Say ``additionalProperties: true`` where a nested object schema lists no properties and
    says nothing about others: JSON Schema lets such an object hold any keys, and the schema
    machinery would otherwise read it as an empty, closed object."""
    if isinstance(node, list):
        for item in node:
            _mark_free_form(item)
        return
    if not isinstance(node, dict):
        return
    if (not root and node.get("type") == "object" and "properties" not in node
            and "additionalProperties" not in node):
        node["additionalProperties"] = True
    for key, value in node.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            for child in value.values():
                _mark_free_form(child)
        elif key in ("items", "additionalProperties", "anyOf", "oneOf", "allOf"):
            _mark_free_form(value)


def input_model_for(full_name: str, schema: dict[str, Any]) -> type[McpArgs]:
    """The input model of the MCP tool ``full_name`` with ``inputSchema`` ``schema`` (one that
    :func:`schema_problem` accepts)."""
    class_name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", full_name) if part) + "Args"
    model = type(class_name, (McpArgs,), {"mcp_schema": schema, "__module__": __name__,
                                          "__doc__": f"The arguments of {full_name}."})
    return model
