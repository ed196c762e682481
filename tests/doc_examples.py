"""The examples of every Markdown page (``README.md`` and ``docs/**/*.md``): their fenced
blocks, the marker lines above them, the console notation and its matcher.

A ``console`` block is a shell session: each line that starts with ``$ `` is a command, run
verbatim by bash; the lines after it, up to the next command, are what it prints (stdout and
stderr together, as a terminal shows them). In the expected output a line that is exactly
``...`` stands for any number of lines, and ``...`` inside a line for any text. A command
shown without output must print nothing a reader needs and exit 0. The commands of one block
run in order in one shell, so a variable set by one command is there for the next. A
``python`` block is a program, run as written (tests/integration/test_doc_examples.py).

The rule for the other blocks (tests/unit/test_doc_examples.py enforces it): a block in a
language that reads as commands (``sh``, ``bash``, ``shell``, ...) is not run, so the line
above it says why, ``<!-- not run: REASON -->``; the same marker keeps a ``console`` or
``python`` block from being run. A ``toml`` block is loaded by a unit test with the loader
its marker names, ``<!-- toml: policy -->``, ``<!-- toml: config -->`` (a server
configuration) or ``<!-- toml: tasks -->`` (an eval's task file), unless it is marked
``not run``. ``text``, ``json`` and other illustrations,
and blocks without a language, need no marker. Marker lines are HTML comments on the lines
right above the fence (blank lines between them and the fence are allowed); the page does
not show them.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ELLIPSIS = "..."

RUN_LANGUAGES = frozenset({"console", "python"})
"""Blocks the integration test runs (unless marked ``not run``)."""
COMMAND_LANGUAGES = frozenset({"sh", "bash", "shell", "zsh", "fish", "console", "shell-session", "sh-session",
                               "python", "py", "python3", "pycon", "powershell", "ps1", "bat", "cmd"})
"""Languages whose blocks read as something to run: run, or marked ``not run`` with a reason."""
TOML_KINDS = ("policy", "config", "tasks")
"""What a ``<!-- toml: KIND -->`` marker may name: the loader the block is checked with."""

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
_NOT_RUN = re.compile(r"^\s*<!-- not run: (?P<reason>.*\S.*?) -->\s*$")
_TOML = re.compile(r"^\s*<!-- toml: (?P<kind>\S+) -->\s*$")


def doc_files() -> list[Path]:
    """Every Markdown page: the README, then the site's pages in path order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def relative(path: Path) -> str:
    return path.resolve().relative_to(ROOT).as_posix()


@dataclass(frozen=True)
class Block:
    """One fenced block of a page."""

    source: str
    """The page, relative to the repository (``docs/exec.md``)."""
    line: int
    """Line of the opening fence (1-based)."""
    language: str
    """The first word of the fence's info string, lower case (``""`` when it has none)."""
    body: str
    """The block's lines, dedented by the fence's indentation, ending in a newline."""
    markers: tuple[str, ...]
    """The HTML comment lines right above the fence, nearest last."""

    @property
    def name(self) -> str:
        return f"{self.source}:{self.line}"

    @property
    def first_line(self) -> int:
        """Line of the block's first line of content."""
        return self.line + 1

    @property
    def not_run(self) -> str | None:
        """The reason of a ``<!-- not run: REASON -->`` marker, if the block has one."""
        for marker in self.markers:
            match = _NOT_RUN.match(marker)
            if match is not None:
                return match["reason"].strip()
        return None

    @property
    def toml_kind(self) -> str | None:
        """The loader a ``<!-- toml: KIND -->`` marker names, if the block has one."""
        for marker in self.markers:
            match = _TOML.match(marker)
            if match is not None:
                return match["kind"]
        return None


def fenced_blocks(text: str, source: str = "README.md") -> list[Block]:
    """Every fenced block of ``text`` (``source`` names the page in each block)."""
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        start = i
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
                break
            i += 1
        body = [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[start + 1:i]]
        info = opening["info"].strip().split()
        blocks.append(Block(source, start + 1, info[0].lower() if info else "",
                            "\n".join(body) + "\n" if body else "", _markers_above(lines, start)))
        i += 1
    return blocks


def _markers_above(lines: list[str], fence: int) -> tuple[str, ...]:
    found: list[str] = []
    j = fence - 1
    while j >= 0 and (not lines[j].strip() or _COMMENT.match(lines[j])):
        if lines[j].strip():
            found.append(lines[j].strip())
        j -= 1
    return tuple(reversed(found))


@cache
def page_blocks(path: Path) -> tuple[Block, ...]:
    return tuple(fenced_blocks(path.read_text(), relative(path)))


def all_blocks() -> list[Block]:
    """Every fenced block of every page."""
    return [block for path in doc_files() for block in page_blocks(path)]


# --- finding a block an example test is about -----------------------------------------------------


def page_containing(needle: str) -> tuple[str, str]:
    """(path, text) of the one page that contains ``needle``; a page is free to move text to
    another, the test follows it. Fails naming the pages when none or several do."""
    pages = [(relative(p), p.read_text()) for p in doc_files()]
    holding = [(name, text) for name, text in pages if needle in text]
    assert len(holding) == 1, (f"{needle!r} should be on exactly one page (README.md or docs/**/*.md), "
                               f"found on {[name for name, _ in holding] or 'none'}")
    return holding[0]


def block_between(start: str, end: str, language: str = "toml") -> str:
    """The first ``language`` block between the marker lines ``start`` and ``end``, on
    whichever page holds them."""
    source, text = page_containing(start)
    assert end in text.split(start, 1)[1], f"{source}: {start!r} has no {end!r} after it"
    inside = text.split(start, 1)[1].split(end, 1)[0]
    found = [b for b in fenced_blocks(inside, source) if b.language == language]
    assert found, f"{source}: no {language} block between {start!r} and {end!r}"
    return found[0].body


def block_with(language: str, *needles: str) -> Block:
    """The one ``language`` block, on any page, whose content holds every one of ``needles``."""
    found = [b for b in all_blocks() if b.language == language and all(n in b.body for n in needles)]
    assert len(found) == 1, (f"exactly one {language} block should hold {needles!r}, "
                             f"found {[b.name for b in found] or 'none'}")
    return found[0]


# --- console blocks -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Example:
    """One ``$ command`` of a console block and the output the page shows for it."""

    block: int
    """Index of its console block on its page (0-based, console blocks only)."""
    line: int
    """Line number of the command on its page (1-based)."""
    command: str
    """The command as written after ``$ ``."""
    expected: tuple[str, ...]
    """The output lines the page shows, trailing blank lines removed."""
    source: str = "README.md"
    """The page (``docs/exec.md``)."""

    @property
    def name(self) -> str:
        return f"{self.source}:{self.line}"


def console_examples(text: str, source: str = "README.md") -> list[list[Example]]:
    """Every console block of ``text`` that is run (not marked ``not run``), each as its examples."""
    blocks: list[list[Example]] = []
    console = [b for b in fenced_blocks(text, source) if b.language == "console"]
    for index, block in enumerate(console):
        if block.not_run is not None:
            continue
        examples: list[Example] = []
        command: str | None = None
        command_line = 0
        output: list[str] = []
        for offset, line in enumerate(block.body.splitlines()):
            if line.startswith("$ "):
                if command is not None:
                    examples.append(_example(index, command_line, command, output, source))
                command, command_line, output = line[2:], block.first_line + offset, []
            elif command is None:
                if line.strip():
                    raise ValueError(f"{source} line {block.first_line + offset}: console block text before "
                                     "its first `$ ` command")
            else:
                output.append(line)
        if command is not None:
            examples.append(_example(index, command_line, command, output, source))
        blocks.append(examples)
    return blocks


def all_console_examples() -> list[list[Example]]:
    """The console blocks of every page that are run."""
    return [examples for path in doc_files() for examples in console_examples(path.read_text(), relative(path))]


def _example(block: int, line: int, command: str, output: list[str], source: str) -> Example:
    while output and not output[-1].strip():
        output.pop()
    return Example(block, line, command, tuple(output), source)


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


# --- python blocks ------------------------------------------------------------------------------


def python_blocks(text: str, source: str = "README.md") -> list[tuple[int, str]]:
    """Every ``python`` block of ``text`` that is run, as (line of its first code line, code)."""
    return [(b.first_line, b.body) for b in fenced_blocks(text, source)
            if b.language == "python" and b.not_run is None]


def all_python_blocks() -> list[Block]:
    """The python blocks of every page that are run."""
    return [b for b in all_blocks() if b.language == "python" and b.not_run is None]


SNIPPET_SOURCES = {
    "openai-agents": "tests/interop/test_openai_agents.py",
    "pydantic-ai": "tests/interop/test_pydantic_ai.py",
    "claude-code": "tests/interop/test_claude_code.py",
    "codex": "tests/interop/codex_config.toml",
    "smolagents": "tests/interop/test_smolagents.py",
    "deepagents": "tests/interop/deepagents_driver.py",
    "deepagents-async": "tests/interop/deepagents_driver.py",
    "e2b-example": "tests/interop/e2b_example.py",
    "e2b-js-example": "tests/interop/e2b_example.mjs",
    "agents-sandbox": "tests/interop/agents_sandbox_program.py",
    "agents-sandbox-resume": "tests/interop/agents_sandbox_program.py",
    "agents-sandbox-ports": "tests/interop/agents_sandbox_program.py",
    "agents-sandbox-runner": "tests/interop/agents_sandbox_program.py",
    "inspect-ai": "tests/interop/inspect_ai_evals.py",
    "inspect-ai-dockerfile": "tests/interop/inspect_ai_evals.py",
}
"""Snippets of the pages copied from the interop tests that run them, by marker name (a
``.mjs`` file's is a ``javascript`` block, marked with ``//`` comments; a ``.toml`` file's,
a configuration file a test runs a client with, is a ``toml`` block)."""


def snippet_language(path: str) -> str:
    """The language of the page's block that copies the snippet of test file ``path``."""
    return {".mjs": "javascript", ".toml": "toml"}.get(Path(path).suffix, "python")


def snippet_in(source: str, name: str, comment: str = "#") -> str:
    """The code between ``# README: NAME snippet start`` and ``... end`` in ``source``
    (``comment``: the language's comment mark), dedented."""
    start, end = f"{comment} README: {name} snippet start\n", f"{comment} README: {name} snippet end"
    if start not in source or end not in source:
        raise ValueError(f"no README markers for the {name} snippet")
    body = source.split(start, 1)[1].split(end, 1)[0]
    return textwrap.dedent(body[: body.rindex("\n") + 1])
