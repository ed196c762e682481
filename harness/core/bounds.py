"""A value outside a field's bounds, in callbox's words: what was given and what is allowed.

pydantic says ``Input should be greater than or equal to 33554432``; a user wrote
``--memory 1k`` and should read ``1k is below the minimum of 32m``. The bounds are read
from the field itself (its ``ge``, ``gt``, ``le``, ``lt``), so the message gives the whole
allowed range (``0 is below the minimum of 8 (allowed: 8 to 65536)``) wherever the error
surfaces: a flag, a policy key, a client's override, a tool argument. Sizes
(:data:`~harness.core.units.ByteSize` fields) are shown as a user writes them (``32m``).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from typing import Any

import annotated_types
from pydantic.fields import FieldInfo

from harness.core.units import SIZE_PARSER, format_size

__all__ = ["BOUND_ERRORS", "allowed_range", "is_size", "out_of_bounds"]

BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})
"""pydantic's error types for a value outside a ``ge``/``gt``/``le``/``lt`` bound."""

_CTX_KEY = {"greater_than": "gt", "greater_than_equal": "ge", "less_than": "lt", "less_than_equal": "le"}


def is_size(info: FieldInfo | None) -> bool:
    """Whether the field holds a size in bytes (a ByteSize, possibly optional)."""
    if info is None:
        return False
    if SIZE_PARSER in info.metadata:
        return True
    stack: list[Any] = [info.annotation]
    while stack:
        current = stack.pop()
        if typing.get_origin(current) is typing.Annotated and SIZE_PARSER in getattr(current, "__metadata__", ()):
            return True
        stack.extend(typing.get_args(current))
    return False


def _bounds(info: FieldInfo | None) -> dict[str, Any]:
    """The field's bounds by kind (``ge``, ``gt``, ``le``, ``lt``)."""
    found: dict[str, Any] = {}
    for item in info.metadata if info is not None else ():
        for kind, cls in (("ge", annotated_types.Ge), ("gt", annotated_types.Gt), ("le", annotated_types.Le),
                          ("lt", annotated_types.Lt)):
            if isinstance(item, cls):
                found[kind] = getattr(item, kind)
    return found


def _show(value: object, size: bool) -> str:
    if size and isinstance(value, int) and not isinstance(value, bool):
        return format_size(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def allowed_range(info: FieldInfo | None, bounds: Mapping[str, Any] | None = None) -> str:
    """The field's allowed values in words: ``8 to 65536``, ``at least 32m``, ``more than 0``,
    ``more than 0 and at most 60`` ("" when it has no bounds). ``bounds`` adds to (or
    stands in for) the field's own."""
    found = {**_bounds(info), **(bounds or {})}
    size = is_size(info)
    if "ge" in found and "le" in found:
        return f"{_show(found['ge'], size)} to {_show(found['le'], size)}"
    low = (f"at least {_show(found['ge'], size)}" if "ge" in found
           else f"more than {_show(found['gt'], size)}" if "gt" in found else "")
    high = (f"at most {_show(found['le'], size)}" if "le" in found
            else f"less than {_show(found['lt'], size)}" if "lt" in found else "")
    return " and ".join(part for part in (low, high) if part)


def out_of_bounds(value: object, info: FieldInfo | None, kind: str, ctx: Mapping[str, Any] | None = None) -> str:
    """``value`` refused by bound error ``kind`` (one of :data:`BOUND_ERRORS`) of field
    ``info``: ``1k is below the minimum of 32m``, ``100000 is above the maximum of 65536
    (allowed: 8 to 65536)``. ``ctx`` is the error's context (its bound, when the field does
    not declare it: a bound inside a type)."""
    key = _CTX_KEY[kind]
    bound = (ctx or {}).get(key, _bounds(info).get(key))
    size = is_size(info)
    shown, limit = _show(value, size), _show(bound, size)
    sentence = {
        "ge": f"{shown} is below the minimum of {limit}",
        "gt": f"{shown} is too small: it must be more than {limit}",
        "le": f"{shown} is above the maximum of {limit}",
        "lt": f"{shown} is too large: it must be less than {limit}",
    }[key]
    whole = allowed_range(info, {key: bound})
    one_sided = whole in (f"at least {limit}", f"more than {limit}", f"at most {limit}", f"less than {limit}")
    return sentence if one_sided or not whole else f"{sentence} (allowed: {whole})"
