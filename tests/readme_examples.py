"""The README's console examples, read as (command, expected output) pairs, and the matcher.

A ``console`` block in the README is a shell session: each line that starts with ``$ `` is
a command, run verbatim by bash; the lines after it, up to the next command, are what it
prints (stdout and stderr together, as a terminal shows them). In the expected output a
line that is exactly ``...`` stands for any number of lines, and ``...`` inside a line for
any text. A command shown without output must print nothing a reader needs and exit 0.
The commands of one block run in order in one shell, so a variable set by one command is
there for the next.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ELLIPSIS = "..."


@dataclass(frozen=True)
class Example:
    """One ``$ command`` of a console block and the output the README shows for it."""

    block: int
    """Index of its console block in the README (0-based, console blocks only)."""
    line: int
    """Line number of the command in the README (1-based)."""
    command: str
    """The command as written after ``$ ``."""
    expected: tuple[str, ...]
    """The output lines the README shows, trailing blank lines removed."""

    @property
    def name(self) -> str:
        return f"README:{self.line}"


def console_examples(text: str) -> list[list[Example]]:
    """Every console block of ``text``, each as its list of examples."""
    blocks: list[list[Example]] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        i += 1
        examples: list[Example] = []
        command: str | None = None
        command_line = 0
        output: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            line = lines[i]
            if line.startswith("$ "):
                if command is not None:
                    examples.append(_example(len(blocks), command_line, command, output))
                command, command_line, output = line[2:], i + 1, []
            elif command is None:
                if line.strip():
                    raise ValueError(f"README line {i + 1}: console block text before its first `$ ` command")
            else:
                output.append(line)
            i += 1
        if command is not None:
            examples.append(_example(len(blocks), command_line, command, output))
        blocks.append(examples)
        i += 1
    return blocks


def _example(block: int, line: int, command: str, output: list[str]) -> Example:
    while output and not output[-1].strip():
        output.pop()
    return Example(block, line, command, tuple(output))


def _line_pattern(expected: str) -> re.Pattern[str]:
    parts = expected.rstrip().split(ELLIPSIS)
    return re.compile(".*?".join(re.escape(p) for p in parts) + r"\Z", re.DOTALL)


def output_matches(expected: tuple[str, ...] | list[str], actual: list[str]) -> bool:
    """Whether ``actual`` lines fit ``expected`` (``...`` lines and in-line wildcards)."""
    want = [line.rstrip() for line in expected]
    got = [line.rstrip() for line in actual]
    while got and not got[-1]:
        got.pop()
    patterns = [None if w == ELLIPSIS else _line_pattern(w) for w in want]

    # Classic wildcard matching over lines, memoized on (expected index, actual index).
    memo: dict[tuple[int, int], bool] = {}

    def fit(i: int, j: int) -> bool:
        key = (i, j)
        if key in memo:
            return memo[key]
        if i == len(patterns):
            result = j == len(got)
        elif patterns[i] is None:
            result = any(fit(i + 1, k) for k in range(j, len(got) + 1))
        else:
            pattern = patterns[i]
            result = j < len(got) and pattern is not None and bool(pattern.match(got[j])) and fit(i + 1, j + 1)
        memo[key] = result
        return result

    return fit(0, 0)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """Every ``python`` block of ``text`` as (line of its first code line, code)."""
    found = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start = i + 1
            i = start
            while i < len(lines) and lines[i].strip() != "```":
                i += 1
            found.append((start + 1, "\n".join(lines[start:i]) + "\n"))
        i += 1
    return found


SNIPPET_SOURCES = {
    "openai-agents": "tests/interop/test_openai_agents.py",
    "pydantic-ai": "tests/interop/test_pydantic_ai.py",
    "e2b-example": "tests/interop/e2b_example.py",
}
"""README snippets copied from the interop tests that run them, by marker name."""


def snippet_in(source: str, name: str) -> str:
    """The code between ``# README: NAME snippet start`` and ``... end`` in ``source``, dedented."""
    import textwrap

    start, end = f"# README: {name} snippet start\n", f"# README: {name} snippet end"
    if start not in source or end not in source:
        raise ValueError(f"no README markers for the {name} snippet")
    body = source.split(start, 1)[1].split(end, 1)[0]
    return textwrap.dedent(body[: body.rindex("\n") + 1])
