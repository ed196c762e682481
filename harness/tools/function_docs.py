"""What a function tool reads from its function's docstring: the tool's description (the
first paragraph) and each parameter's description, from a Google-style ``Args:`` section
or Sphinx-style ``:param name:`` fields.

Google style::

    Count the words in a file.

    Args:
        path (str): The file, absolute or relative to the workspace.
        min_length: Count only words at least this long; longer
            descriptions continue on more-indented lines.

Sphinx style::

    Count the words in a file.

    :param path: The file, absolute or relative to the workspace.
    :param int min_length: Count only words at least this long.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["Docstring", "parse_docstring"]

_ARGS_HEADERS = frozenset({"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"})
_SECTION = re.compile(r"^([A-Za-z][A-Za-z ]*):\s*$")
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(.*)$")
_SPHINX_PARAM = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:(.*)$")
_SPHINX_FIELD = re.compile(r"^:\w+")


@dataclass(frozen=True)
class Docstring:
    summary: str
    """The first paragraph, its lines joined with spaces ("" when there is none)."""
    params: dict[str, str] = field(default_factory=dict)
    """Parameter name -> its description, in the order documented."""


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _join(parts: list[str]) -> str:
    return " ".join(p.strip() for p in parts if p.strip())


def _summary(lines: list[str]) -> str:
    taken: list[str] = []
    for line in lines:
        stripped = line.strip()
        if not stripped:
            if taken:
                break
            continue
        if _SECTION.match(stripped) or _SPHINX_FIELD.match(stripped):
            break
        taken.append(stripped)
    return _join(taken)


def _google(lines: list[str], params: dict[str, str]) -> None:
    i = 0
    while i < len(lines):
        header = _SECTION.match(lines[i].strip())
        if header is None or header.group(1).strip().lower() not in _ARGS_HEADERS:
            i += 1
            continue
        base = _indent(lines[i])
        i += 1
        entry_indent: int | None = None
        name: str | None = None
        parts: list[str] = []
        while i < len(lines) and (not lines[i].strip() or _indent(lines[i]) > base):
            line = lines[i]
            i += 1
            if not line.strip():
                continue
            if entry_indent is None:
                entry_indent = _indent(line)
            entry = _GOOGLE_ENTRY.match(line.strip()) if _indent(line) <= entry_indent else None
            if entry is not None:
                if name is not None:
                    params[name] = _join(parts)
                name, parts = entry.group(1), [entry.group(2)]
            elif name is not None:
                parts.append(line)
        if name is not None:
            params[name] = _join(parts)


def _sphinx(lines: list[str], params: dict[str, str]) -> None:
    name: str | None = None
    parts: list[str] = []
    for line in [*lines, ""]:
        stripped = line.strip()
        entry = _SPHINX_PARAM.match(stripped)
        if name is not None and (entry is not None or not stripped or _SPHINX_FIELD.match(stripped)):
            params[name] = _join(parts)
            name = None
        if entry is not None:
            name, parts = entry.group(1), [entry.group(2)]
        elif name is not None:
            parts.append(stripped)


def parse_docstring(doc: str | None) -> Docstring:
    """``doc`` (already dedented, as ``inspect.getdoc`` returns it) read as above."""
    if not doc:
        return Docstring("")
    lines = doc.expandtabs().splitlines()
    params: dict[str, str] = {}
    _google(lines, params)
    _sphinx(lines, params)
    return Docstring(_summary(lines), params)
