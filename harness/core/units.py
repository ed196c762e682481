"""Parsing of human sizes such as ``512m`` (Docker's notation) and of timeouts in seconds."""

from __future__ import annotations

import argparse
import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*$", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """``"512m"`` -> 536870912; plain integers are bytes. Raises ValueError naming the format."""
    if isinstance(text, int):
        if text < 0:
            raise ValueError("a size cannot be negative")
        return text
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size; use a number with an optional unit k, m or g (e.g. 512m)")
    number, unit = match.groups()
    return int(float(number) * _UNITS[unit.lower()])


def format_size(n: int) -> str:
    """536870912 -> ``"512m"``: the largest unit that divides ``n`` (bytes as a plain number)."""
    for unit, size in (("t", 1 << 40), ("g", 1 << 30), ("m", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _size_or_value(value: object) -> object:
    return parse_size(value) if isinstance(value, str) else value


SIZE_PARSER = BeforeValidator(_size_or_value)
"""What makes a field a size: messages about it show values as sizes (``32m``)."""

ByteSize = Annotated[int, SIZE_PARSER]
"""A pydantic field type: bytes, also written as a size string such as ``"512m"``."""


MAX_TIMEOUT_S = 24 * 3600
"""The longest timeout a command may have: the agent refuses more."""


def parse_seconds(text: str, *, maximum: float = MAX_TIMEOUT_S) -> float:
    """``"30"`` -> 30.0: a finite number of seconds above 0 and at most ``maximum``.
    Raises ValueError saying which of these ``text`` is not."""
    try:
        seconds = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(seconds):
        raise ValueError(f"{text!r} is not a finite number of seconds")
    if seconds <= 0:
        raise ValueError(f"{text} must be more than 0 seconds")
    if seconds > maximum:
        raise ValueError(f"{text} must be at most {maximum:g} seconds ({maximum / 3600:g} h)")
    return seconds


def timeout_seconds(text: str) -> float:
    """An argparse ``type`` for ``--timeout``: :func:`parse_seconds`, its message as the usage error."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
