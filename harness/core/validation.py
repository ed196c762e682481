"""Checking a tool call's arguments before anything runs.

Arguments arrive as JSON text (OpenAI) or an already-parsed object (Anthropic, MCP).
:func:`validate_call` turns them into the tool's pydantic input model or raises
:class:`CallRejected` with an :class:`~harness.core.calls.ErrorCode` and one message written
for the model that sent the call: what is wrong, where, and what was expected. The loop
turns that into an error *result* for the call_id; no sandbox is started for it.

Checks, in order (each one's code):

* size: the UTF-8 bytes of the JSON text (for an object: of its compact ``json.dumps``)
  must not exceed ``max_bytes`` (default 1 MiB) -> ``arguments_too_large``. Text is
  measured before it is parsed, so an oversized payload costs no parsing;
* JSON syntax, with the parser's line and column; ``NaN``/``Infinity`` and integers
  too long to convert are refused as not JSON -> ``invalid_json``;
* nesting: at most ``max_depth`` (default 32) levels of objects/arrays, the arguments
  object itself being level 1. The check is an iterative walk (no recursion to exhaust),
  and the parser's own ``RecursionError`` on hostile depth is reported as the same
  problem -> ``invalid_arguments``;
* the top level must be an object -> ``invalid_arguments``;
* no string (value or key) may contain a NUL character; the message names where, e.g.
  ``files[2].path`` -> ``invalid_arguments``;
* the input model: ``null`` for an optional field means "use the default", exactly like
  leaving the field out (the strict schema sent to OpenAI makes every optional field
  nullable and required, the plain one sent to Anthropic and MCP lets it be omitted; both
  are accepted whichever schema the caller saw; see
  :func:`harness.core.strict_schema.nulls_to_defaults`), then ``input_model.model_validate``;
  pydantic's errors become one message listing every
  problem as a sentence (``argument 'timeout_ms' must be an integer, got 'abc'``;
  ``unexpected argument 'foo' (allowed: command, workdir, timeout_ms)``;
  ``missing required argument 'command'``) -> ``invalid_arguments``.

Speed: the common call is one C-level JSON parse, two substring counts (which prove the
depth and NUL checks unnecessary for small, NUL-free text, so no Python-level walk), and
one ``model_validate``; nothing is built per call.

Duplicate keys in JSON text follow ``json``: the last one wins (the policy and the tool
both see that same value).
"""

from __future__ import annotations

import json
import math
import sys
import typing
from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from harness.core.calls import CALL_ID_PATTERN, ErrorCode
from harness.core.problems import describe_validation_error, is_model, parse_toml_model, render_path, show_value
from harness.core.strict_schema import nulls_to_defaults

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DEPTH",
    "CallRejected",
    "ToolDefinitionLike",
    "check_call_id",
    "describe_validation_error",
    "parse_arguments",
    "parse_toml_model",
    "render_path",
    "validate_call",
]

DEFAULT_MAX_BYTES = 1 << 20
DEFAULT_MAX_DEPTH = 32
_MAX_LISTED_PROBLEMS = 10


class CallRejected(Exception):
    """A call refused before it runs; ``message`` is the text the model reads."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ToolDefinitionLike(Protocol):
    """What validation needs of a tool definition (``harness.core.registry.ToolDefinition``)."""

    @property
    def name(self) -> str: ...

    @property
    def input_model(self) -> type[BaseModel]: ...


# --- call ids ------------------------------------------------------------------------------


def check_call_id(call_id: object) -> None:
    """Raise ``CallRejected(BAD_CALL_ID)`` unless ``call_id`` fully matches ``CALL_ID_PATTERN``."""
    if isinstance(call_id, str) and CALL_ID_PATTERN.fullmatch(call_id) is not None:
        return
    shown = show_value(call_id) if isinstance(call_id, str) else type(call_id).__name__
    raise CallRejected(
        ErrorCode.BAD_CALL_ID,
        f"call_id {shown} is not valid: a call_id is 1 to 128 characters, each a letter, a digit "
        "or one of _ . : -",
    )


# --- parsing -------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _size_text(limit: int) -> str:
    if limit >= 1 << 20 and limit % (1 << 20) == 0:
        return f"{limit:,} bytes ({limit >> 20} MiB)"
    if limit >= 1 << 10 and limit % (1 << 10) == 0:
        return f"{limit:,} bytes ({limit >> 10} KiB)"
    return f"{limit:,} bytes"


def _too_large(size: int, limit: int) -> CallRejected:
    return CallRejected(
        ErrorCode.ARGUMENTS_TOO_LARGE,
        f"arguments are {size:,} bytes of JSON, over the limit of {_size_text(limit)}; "
        "send less (split large content over several calls)",
    )


def _too_deep(limit: int) -> CallRejected:
    return CallRejected(
        ErrorCode.INVALID_ARGUMENTS,
        f"arguments are nested more than {limit} levels deep (the limit); flatten them",
    )


def parse_arguments(
    raw: str | Mapping[str, Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> dict[str, Any]:
    """The arguments as a dict, after the size, JSON, depth, object and NUL checks.

    ``raw`` is the JSON text a model sent or an already-parsed object; an object is
    returned as a plain ``dict`` (a shallow copy), text as the parsed dict.
    """
    if isinstance(raw, str):
        return _parse_text(raw, max_bytes, max_depth)
    if isinstance(raw, Mapping):
        return _check_object(raw, max_bytes, max_depth)
    raise CallRejected(
        ErrorCode.INVALID_ARGUMENTS,
        f"arguments must be a JSON object (or its JSON text), got {_kind(raw)}",
    )


def _parse_text(text: str, max_bytes: int, max_depth: int) -> dict[str, Any]:
    # Every character is at most 4 UTF-8 bytes: short text needs no encoding to measure.
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise _too_large(size, max_bytes)
    if not text.strip():
        raise CallRejected(
            ErrorCode.INVALID_JSON,
            "arguments are empty; send a JSON object (use {} when the tool takes no arguments)",
        )
    try:
        value = _DECODER.decode(text)
    except json.JSONDecodeError as exc:
        raise CallRejected(
            ErrorCode.INVALID_JSON,
            f"arguments are not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}",
        ) from None
    except RecursionError:
        raise _too_deep(max_depth) from None
    except ValueError as exc:  # NaN/Infinity, or an integer over Python's conversion digit limit
        if "integer string conversion" in str(exc):
            raise CallRejected(
                ErrorCode.INVALID_ARGUMENTS,
                f"arguments contain an integer with more than {sys.get_int_max_str_digits()} digits; "
                "send it as a string if it must be that long",
            ) from None
        raise CallRejected(ErrorCode.INVALID_JSON, f"arguments are not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CallRejected(
            ErrorCode.INVALID_ARGUMENTS,
            f"arguments must be a JSON object like {{\"name\": value, ...}}, got {_kind(value)}",
        )
    # Brackets (counted even inside strings) bound the depth from above; a NUL can only be
    # written as the escape \u0000 (raw control characters are invalid JSON). When neither
    # count can trip a check, no walk is needed.
    if text.count("{") + text.count("[") > max_depth or "\\u0000" in text:
        _walk(value, max_depth, check_types=False)
    return value


def _check_object(obj: Mapping[str, Any], max_bytes: int, max_depth: int) -> dict[str, Any]:
    # The walk comes first: it bounds the depth, so json.dumps below cannot recurse deeply
    # (and a reference cycle exceeds any depth limit instead of looping).
    _walk(obj, max_depth, check_types=True)
    try:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise CallRejected(ErrorCode.INVALID_ARGUMENTS, f"arguments are not JSON data: {exc}") from None
    if len(text) * 4 > max_bytes:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise _too_large(size, max_bytes)
    return dict(obj)


def _walk(root: Any, max_depth: int, *, check_types: bool) -> None:
    """Depth, NUL and (for objects handed over in Python) JSON-type checks, without recursion."""
    stack: list[tuple[Any, int, tuple[str | int, ...]]] = [(root, 1, ())]
    while stack:
        node, depth, path = stack.pop()
        if depth > max_depth:
            raise _too_deep(max_depth)
        if isinstance(node, Mapping):
            for key, value in node.items():
                if not isinstance(key, str):
                    raise CallRejected(
                        ErrorCode.INVALID_ARGUMENTS,
                        f"object keys must be strings; {_where(path)} has the key {key!r}",
                    )
                if "\0" in key:
                    raise CallRejected(
                        ErrorCode.INVALID_ARGUMENTS,
                        f"{_where(path)} has a key containing a NUL character (\\u0000); remove it",
                    )
                _visit(value, depth, (*path, key), stack, check_types)
        else:
            for index, value in enumerate(node):
                _visit(value, depth, (*path, index), stack, check_types)


def _visit(
    value: Any,
    depth: int,
    path: tuple[str | int, ...],
    stack: list[tuple[Any, int, tuple[str | int, ...]]],
    check_types: bool,
) -> None:
    if isinstance(value, str):
        if "\0" in value:
            raise CallRejected(
                ErrorCode.INVALID_ARGUMENTS,
                f"argument '{render_path(path)}' contains a NUL character (\\u0000), which no argument "
                "may contain; remove it",
            )
    elif isinstance(value, Mapping | list | tuple):
        stack.append((value, depth + 1, path))
    elif check_types:
        if isinstance(value, float) and not math.isfinite(value):
            raise CallRejected(
                ErrorCode.INVALID_ARGUMENTS,
                f"argument '{render_path(path)}' is {value}, which is not a JSON number",
            )
        if value is not None and not isinstance(value, bool | int | float):
            raise CallRejected(
                ErrorCode.INVALID_ARGUMENTS,
                f"argument '{render_path(path)}' is a {type(value).__name__}, which is not JSON data",
            )


def _where(path: tuple[str | int, ...]) -> str:
    return f"argument '{render_path(path)}'" if path else "the arguments object"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    return f"a {type(value).__name__}"


# --- validation against the input model --------------------------------------------------------


def validate_call(
    definition: ToolDefinitionLike,
    raw: str | Mapping[str, Any],
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_depth: int = DEFAULT_MAX_DEPTH,
) -> BaseModel:
    """The call's arguments as an instance of ``definition.input_model``, or ``CallRejected``."""
    args = parse_arguments(raw, max_bytes=max_bytes, max_depth=max_depth)
    model = definition.input_model
    # null for an optional field means "use the default" (strict schemas make the model send
    # it; plain-schema callers may too); text without the word null has no nulls, so the
    # rewrite is skipped on the common path.
    if not isinstance(raw, str) or "null" in raw:
        args = _nulls_to_defaults(model, args)
    try:
        return model.model_validate(args)
    except ValidationError as exc:
        problems = describe_validation_error(exc, model)
        raise CallRejected(ErrorCode.INVALID_ARGUMENTS, _join_problems(f"tool {definition.name!r}", problems)) from None


def _nulls_to_defaults(model: type[BaseModel], args: dict[str, Any]) -> dict[str, Any]:
    drop, nested = _null_plan(model)
    if nested:
        return nulls_to_defaults(model, args)
    if not any(args.get(key, 0) is None for key in drop):
        return args
    return {k: v for k, v in args.items() if not (v is None and k in drop)}


@lru_cache(maxsize=512)
def _null_plan(model: type[BaseModel]) -> tuple[frozenset[str], bool]:
    """For a model: the top-level keys whose ``null`` means "use the default" (asked of
    ``nulls_to_defaults`` itself, once), and whether nested models need its full walk."""
    keys: set[str] = set()
    nested = False
    for name, info in model.model_fields.items():
        keys.add(name)
        for alias in (info.alias, info.validation_alias):
            if isinstance(alias, str):
                keys.add(alias)
        nested = nested or _mentions_model(info.annotation)
    kept = nulls_to_defaults(model, dict.fromkeys(keys))
    return frozenset(keys - kept.keys()), nested


def _mentions_model(annotation: Any) -> bool:
    stack = [annotation]
    while stack:
        current = stack.pop()
        if is_model(current):
            return True
        stack.extend(typing.get_args(current))
    return False


def _join_problems(subject: str, problems: list[str]) -> str:
    if len(problems) > _MAX_LISTED_PROBLEMS:
        more = len(problems) - _MAX_LISTED_PROBLEMS
        problems = [*problems[:_MAX_LISTED_PROBLEMS], f"and {more} more"]
    if len(problems) == 1:
        return f"invalid arguments for {subject}: {problems[0]}"
    return f"invalid arguments for {subject} ({len(problems)} problems): " + "; ".join(problems)
