"""The code interpreter's bash, JavaScript and TypeScript contexts (images/code-interpreter/), on this host.

They are stdlib-only modules of the image variant; here they drive the host's own bash (and
node, when the host has one; for TypeScript, a node with the typescript module) as they drive
the sandbox's: state across cells, the cell's end and status, ``env_vars`` for one cell, an
interrupt that ends the cell and keeps the process, and a process that exits replaced by a
fresh one.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "images" / "code-interpreter"))

from bash_context import BashContext, cell_lines, check_env
from node_context import NodeContext, TypeScriptContext
from process_context import ProcessContext


def run(context: ProcessContext, code: str, env: dict[str, str] | None = None,
        gone_after: float | None = None) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    began = time.monotonic()
    context.run(code, env or {}, lambda doc: lines.append(doc) or True,
                lambda: gone_after is not None and time.monotonic() - began > gone_after)
    return lines


def kinds(lines: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    return [(line["type"], line.get("text", line.get("value"))) for line in lines
            if line["type"] not in {"number_of_executions", "end_of_execution"}]


@pytest.fixture
def bash(tmp_path: Path) -> Iterator[BashContext]:
    context = BashContext(str(tmp_path), {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}, str(tmp_path))
    context.start()
    try:
        yield context
    finally:
        context.stop()


def test_env_var_names_are_checked_and_values_quoted() -> None:
    with pytest.raises(ValueError, match="'A-B'"):
        check_env({"A-B": "x", "OK": "y"})
    check_env({"_OK1": "y"})
    line = cell_lines("/tmp/cell.sh", 3, {"V": "it's $(rm -rf /)"}, 7)
    assert line.startswith("V='it'\"'\"'s $(rm -rf /)' . /tmp/cell.sh </dev/null\n")
    assert line.endswith("printf '%s %s\\n' 3 \"$?\" >&7\n")


def test_bash_keeps_its_state_and_reports_a_status(bash: BashContext, tmp_path: Path) -> None:
    first = run(bash, "kept=41\ncd /\necho set\necho careful >&2")
    assert kinds(first) == [("stdout", "set\n"), ("stderr", "careful\n")]
    assert first[0] == {"type": "number_of_executions", "execution_count": 1}
    assert first[-1] == {"type": "end_of_execution"}
    assert kinds(run(bash, "echo $((kept + 1)) $PWD")) == [("stdout", "42 /\n")]
    assert kinds(run(bash, "exit_with() { return $1; }\nexit_with 3")) == [("error", "3")]
    assert kinds(run(bash, "if then"))[-1] == ("error", "2")  # a syntax error is the cell's alone
    with_env = run(bash, "echo $V; sh -c 'echo $V'", {"V": "one"})  # the shell's and a child's
    assert "".join(line["text"] for line in with_env if line["type"] == "stdout") == "one\none\n"
    assert kinds(run(bash, "echo ${V:-gone}")) == [("stdout", "gone\n")]


def test_an_interrupt_ends_the_cell_and_the_shell_stays(bash: BashContext) -> None:
    run(bash, "survivor=here")
    began = time.monotonic()
    assert kinds(run(bash, "for i in 1 2 3; do sleep 20; done; echo late", gone_after=0.5)) == []
    assert time.monotonic() - began < 15
    assert kinds(run(bash, "echo $survivor")) == [("stdout", "here\n")]


def test_an_interrupt_that_comes_as_the_cell_is_read_still_ends_it(bash: BashContext) -> None:
    # At once, the interrupt may reach bash while it reads the cell, which discards it: the
    # cell is nudged again (its end asked for, the interrupt sent anew) until it ends.
    for _ in range(8):  # one in four or so came while bash was reading, before the fix
        began = time.monotonic()
        run(bash, "for i in 1 2 3; do sleep 5; done; echo late", gone_after=0.0)
        assert time.monotonic() - began < 10
    run(bash, "survivor=here")
    assert kinds(run(bash, "echo $survivor")) == [("stdout", "here\n")]


def test_a_cell_that_exits_the_shell_gets_a_fresh_one(bash: BashContext) -> None:
    run(bash, "gone=no")
    ended = run(bash, "exit 4")
    assert [line["name"] for line in ended if line["type"] == "error"] == ["ContextRestarted"]
    assert "status 4" in ended[1]["value"]
    assert kinds(run(bash, "echo ${gone:-fresh}")) == [("stdout", "fresh\n")]


@pytest.mark.skipif(shutil.which("node") is None, reason="no node on this host (the sandbox's is tested in interop)")
def test_node_keeps_its_state_and_reports_values_and_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import node_context

    monkeypatch.setattr(node_context, "NODE", shutil.which("node"))
    context = NodeContext(str(tmp_path), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    context.start()
    try:
        assert kinds(run(context, "const base = 40; console.log('hi')")) == [("stdout", "hi\n")]
        assert kinds(run(context, "base + 2")) == [("result", "42")]
        assert kinds(run(context, "process.env.V", {"V": "one"})) == [("result", "one")]
        assert kinds(run(context, "process.env.V || 'gone'")) == [("result", "gone")]
        thrown = run(context, "throw new RangeError('far')")
        assert [(e["name"], e["value"]) for e in thrown if e["type"] == "error"] == [("RangeError", "far")]
        began = time.monotonic()
        assert kinds(run(context, "while (true) {}", gone_after=0.5)) == []
        assert kinds(run(context, "new Promise(() => {})", gone_after=0.5)) == []
        assert time.monotonic() - began < 15
        assert kinds(run(context, "base")) == [("result", "40")]
    finally:
        context.stop()


def _node_with_typescript() -> bool:
    node = shutil.which("node")
    if node is None:
        return False
    found = subprocess.run([node, "-e", "require('typescript')"], capture_output=True, timeout=30, check=False)
    return found.returncode == 0


@pytest.mark.skipif(not _node_with_typescript(),
                    reason="no node with the typescript module on this host (the sandbox's is tested in interop)")
def test_typescript_is_transpiled_keeps_its_state_and_reports_syntax_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import node_context

    monkeypatch.setattr(node_context, "NODE", shutil.which("node"))
    context = TypeScriptContext(str(tmp_path), {"PATH": "/usr/bin:/bin"}, str(tmp_path))
    context.start()
    try:
        assert kinds(run(context, "interface P { x: number }\nconst p: P = { x: 40 }")) == []
        assert kinds(run(context, "const add = (n: number): number => p.x + n\nadd(2)")) == [("result", "42")]
        assert kinds(run(context, "const s: number = 'unchecked'; s")) == [("result", "unchecked")]
        broken = run(context, "console.log('never')\nlet half: = 1")
        assert [(e["name"], e["value"]) for e in broken if e["type"] == "error"] == [("SyntaxError", "Type expected.")]
        assert kinds(broken) == [("error", "Type expected.")]
    finally:
        context.stop()
