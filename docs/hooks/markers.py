"""The marker lines a page puts where a generated section goes.

A line that is exactly ``<!-- generated: NAME -->`` is replaced, when the site is built, by the
Markdown the generator NAME returns. A marker naming no generator, or a line that looks like a
marker but is not one (``<!-- generated:cli-->``, text after it), fails the build: a typo must
not leave a reference page quietly empty.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

MARKER = re.compile(r"^<!-- generated: ([a-z0-9-]+) -->$")
_LOOKS_LIKE = re.compile(r"<!--\s*generated\b", re.IGNORECASE)


class MarkerError(Exception):
    """A marker the build cannot replace; the message names the page and the line."""


def markers(markdown: str) -> list[tuple[int, str]]:
    """Every marker of ``markdown`` as (line number, 1-based; generator name). A line that
    looks like a marker but is not exactly one is a :class:`MarkerError`."""
    found = []
    for number, line in enumerate(markdown.splitlines(), start=1):
        match = MARKER.match(line.strip())
        if match is not None:
            found.append((number, match.group(1)))
        elif _LOOKS_LIKE.search(line):
            raise MarkerError(f"line {number}: {line.strip()!r} is not a marker line; "
                              "write exactly <!-- generated: NAME --> alone on its line")
    return found


def expand(markdown: str, generators: Mapping[str, Callable[[], str]], *, page: str) -> str:
    """``markdown`` with each marker line replaced by its generator's output."""
    try:
        found = markers(markdown)
    except MarkerError as exc:
        raise MarkerError(f"{page}: {exc}") from None
    if not found:
        return markdown
    lines = markdown.splitlines()
    for number, name in reversed(found):
        generator = generators.get(name)
        if generator is None:
            known = ", ".join(sorted(generators))
            raise MarkerError(f"{page}:{number}: no generator is named {name!r} (known: {known})")
        lines[number - 1] = generator().rstrip("\n")
    return "\n".join(lines) + "\n"
