"""Small Markdown helpers the generators share: docstrings and help texts made fit for a
table cell, and the escaping that keeps a cell one cell."""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence

from docs.hooks.griffe_rst import rst_to_markdown

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_SPECIAL = re.compile(r"([\\*_<>\[\]|#])")
_BARE_PIPE = re.compile(r"(?<!\\)\|")


def docstring_markdown(text: str) -> str:
    """A docstring written in this project's reST-flavoured style as Markdown: ``x`` becomes
    `x`, a Sphinx role (:class:`~a.b.C`) its name in code, ``Example::`` ``Example:``."""
    return rst_to_markdown(inspect.cleandoc(text)).replace("``", "`")


def escape(text: str) -> str:
    """``text`` with Markdown's special characters escaped outside its code spans, so a help
    text's ``*.example.com`` or ``<id>`` is shown as written."""
    out: list[str] = []
    last = 0
    for match in _CODE_SPAN.finditer(text):
        out.append(_SPECIAL.sub(r"\\\1", text[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_SPECIAL.sub(r"\\\1", text[last:]))
    return "".join(out)


def cell(text: str) -> str:
    """One table cell: Markdown kept, lines joined (a blank line becomes a line break), pipes
    outside code spans escaped."""
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text.strip())]
    joined = "<br>".join(p for p in paragraphs if p)
    out: list[str] = []
    last = 0
    for match in _CODE_SPAN.finditer(joined):
        out.append(_BARE_PIPE.sub(r"\|", joined[last:match.start()]))
        out.append(match.group(0))
        last = match.end()
    out.append(_BARE_PIPE.sub(r"\|", joined[last:]))
    return "".join(out)


def code(text: str) -> str:
    """``text`` as a Markdown code span, with enough backticks around it."""
    fence = "`"
    while fence in text:
        fence += "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table of already formatted cells, in a ``<div class="callbox-ref">`` (the
    site's stylesheet keeps the code in generated tables from breaking inside a word)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines.extend("| " + " | ".join(row) + " |" for row in rows)
    return '<div class="callbox-ref" markdown>\n\n' + "\n".join(lines) + "\n\n</div>"


def slug(text: str) -> str:
    """A stable anchor: lower case, runs of anything but letters, digits, ``_`` and ``.`` as ``-``."""
    return re.sub(r"[^a-z0-9_.]+", "-", text.lower()).strip("-")
