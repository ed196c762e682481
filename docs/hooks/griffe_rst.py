"""A griffe extension for the Python API pages: this project's docstrings are written with
Sphinx roles (:class:`~harness.client.ExecutorClient`) and reST literal blocks (``Example::``),
which Markdown would show as written. Each docstring is rewritten as it is loaded: a role
becomes its target in code (the last part of it after ``~``), and a paragraph ending in
``::`` ends in ``:`` (the indented block after it is already a Markdown code block).

mkdocs.yml names this file under mkdocstrings' ``extensions``; it imports nothing of the project.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|mod|meth|func|attr|data|exc|obj|const|type):`(~?)([^`]+)`")
_LITERAL = re.compile(r"(?<=\S)::$", re.MULTILINE)
_LITERAL_ALONE = re.compile(r"^(\s*)::$", re.MULTILINE)


def rst_to_markdown(text: str) -> str:
    """``text`` with Sphinx roles as code spans and ``::`` paragraph endings as ``:``."""

    def role(match: re.Match[str]) -> str:
        tilde, target = match.groups()
        return f"`{target.rsplit('.', 1)[-1] if tilde else target}`"

    text = _ROLE.sub(role, text)
    text = _LITERAL_ALONE.sub(r"\1", text)
    return _LITERAL.sub(":", text)


class RestDocstrings(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`rst_to_markdown`."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
