"""The shape of the code, read from its source: no import cycles, dependencies pointing one
way (cli and doors -> loop -> core -> engine -> agent client -> wire; cli -> eval -> loop, the
eval reading the audit store and drawing with the console's page helpers), and no
hand-written module over 600 lines.

Imports are read with ``ast`` (nothing is imported): those at module level and those inside
functions both count, those under ``if TYPE_CHECKING:`` do not (they never run). ``from pkg
import name`` is an import of ``pkg.name`` when that is a module, else of ``pkg``. The
generated ``*/v1/`` packages are not checked, but imports of them are seen.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("harness", "sandbox")
MAX_LINES = 600


@dataclass(frozen=True)
class Import:
    source: str
    target: str
    line: int


@dataclass(frozen=True)
class Module:
    name: str
    path: Path

    @property
    def shown(self) -> str:
        return str(self.path.relative_to(ROOT))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _generated(path: Path) -> bool:
    return "v1" in path.relative_to(ROOT).parts


@cache
def all_module_names() -> frozenset[str]:
    """Every module and package under the checked packages, generated ones included."""
    return frozenset(_module_name(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


@cache
def checked_modules() -> tuple[Module, ...]:
    """The hand-written modules: every ``.py`` under harness/ and sandbox/ but ``*/v1/``."""
    paths = sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py") if not _generated(p))
    return tuple(Module(_module_name(p), p) for p in paths)


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _resolve_relative(module: Module, level: int, name: str | None) -> str:
    package = module.name.split(".")
    if module.path.name != "__init__.py":
        package.pop()
    base = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*base, name] if name else base)


def _internal(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in PACKAGES


class _ImportCollector(ast.NodeVisitor):
    def __init__(self, module: Module) -> None:
        self.module = module
        self.found: list[Import] = []

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            # Only the else branch runs.
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _resolve_relative(self.module, node.level, node.module) if node.level else (node.module or "")
        for alias in node.names:
            candidate = f"{base}.{alias.name}"
            self._add(candidate if candidate in all_module_names() else base, node.lineno)

    def _add(self, target: str, line: int) -> None:
        found = Import(self.module.name, target, line)
        if _internal(target) and target != self.module.name and found not in self.found:
            self.found.append(found)


@cache
def imports_of(module: Module) -> tuple[Import, ...]:
    collector = _ImportCollector(module)
    collector.visit(ast.parse(module.path.read_text(), filename=str(module.path)))
    return tuple(collector.found)


def all_imports() -> Iterator[Import]:
    for module in checked_modules():
        yield from imports_of(module)


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


# ---- (a) no import cycles --------------------------------------------------------------------


def _graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: first line}, over the checked modules only."""
    names = {m.name for m in checked_modules()}
    graph: dict[str, dict[str, int]] = {name: {} for name in names}
    for imp in all_imports():
        if imp.target in names:
            graph[imp.source].setdefault(imp.target, imp.line)
    return graph


def _strongly_connected(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Tarjan's algorithm, iterative; components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


def _shortest_cycle(graph: dict[str, dict[str, int]], start: str, members: set[str]) -> list[str]:
    """The shortest path start -> ... -> start inside one component."""
    previous: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for child in sorted(graph[node]):
            if child not in members:
                continue
            if child == start:
                path = [node]
                while path[-1] != start:
                    path.append(previous[path[-1]])
                return [start, *reversed(path[:-1]), start]
            if child not in previous:
                previous[child] = node
                queue.append(child)
    raise AssertionError(f"{start} is in a cycle but none was found")


def _show_cycle(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [cycle[0]]
    for a, b in itertools.pairwise(cycle):
        steps.append(f"{b} (imported at {a.replace('.', '/')}.py:{graph[a][b]})")
    return " -> ".join(steps)


def test_no_import_cycles() -> None:
    graph = _graph()
    problems = []
    for component in _strongly_connected(graph):
        members = set(component)
        seen: set[frozenset[tuple[str, str]]] = set()
        cycles = []
        for start in component:
            cycle = _shortest_cycle(graph, start, members)
            edges = frozenset(itertools.pairwise(cycle))
            if edges not in seen:
                seen.add(edges)
                cycles.append(_show_cycle(graph, cycle))
        problems.append(f"import cycle among {', '.join(component)}:\n    " + "\n    ".join(cycles)
                        + "\n  fix: the lower module must not import the higher one; move what both need "
                          "into the lower layer, or pass it in (a Protocol in the lower layer, the concrete "
                          "object from the caller)")
    assert not problems, "\n".join(problems)


# ---- (b) dependencies point one way ----------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    source: str
    forbidden: str
    fix: str
    allowed: tuple[str, ...] = ()


CORE_PROTOCOLS = ("depend on the Engine/Sandbox protocols in harness.engine.base (or take the object as "
                  "an argument) and let the CLI or a door build the concrete engine")
RULES = (
    Rule("harness.core", "harness.doors", "the core is what doors adapt; move the shared code into "
         "harness.core (or harness.wire) so the door imports it"),
    Rule("harness.core", "harness.cli", "move the shared code into harness.core; the CLI calls the core"),
    Rule("harness.core", "harness.loop", "move the shared code into harness.core; the loop calls the core"),
    Rule("harness.core", "harness.tools", "the core knows tools only through the ToolRegistry; take the "
         "tool or registry as an argument (the caller builds it, e.g. harness.tools.builtin_registry)"),
    Rule("harness.core", "harness.engine.docker", CORE_PROTOCOLS),
    Rule("harness.core", "harness.doctor", "the doctor checks the host; the core must not depend on it"),
    Rule("harness.tools", "harness.engine.docker", "a tool gets a SandboxRuntime (agent client + env) from "
         "harness.engine.base, never the engine"),
    Rule("harness.tools", "harness.doors", "tools are reached through the core; move the shared code into "
         "harness.core"),
    Rule("harness.tools", "harness.cli", "move the shared code into harness.core or the tool itself"),
    Rule("harness.tools", "harness.loop", "move the shared code into harness.core or the tool itself"),
    Rule("harness.engine", "harness.core", "the engine sits below the core; move what it needs into "
         "harness.engine (or a leaf like harness.core.errors / harness.core.units)",
         allowed=("harness.core.errors", "harness.core.units", "harness.core.times", "harness.core.state_dirs")),
    Rule("harness.engine", "harness.tools", "the engine runs sandboxes, not tools; move the shared code "
         "into harness.engine"),
    Rule("harness.engine", "harness.loop", "move the shared code into harness.engine"),
    Rule("harness.engine", "harness.doors", "move the shared code into harness.engine or harness.wire"),
    Rule("harness.engine", "harness.cli", "move the shared code into harness.engine"),
    Rule("harness.loop", "harness.doors", "doors drive the loop, not the reverse; move the shared code into "
         "harness.loop or harness.core"),
    Rule("harness.loop", "harness.cli", "the CLI drives the loop; move the shared code into harness.loop"),
    Rule("harness.doors", "harness.cli", "doors are started by the CLI, never the reverse; move the shared "
         "code into the door or harness.core"),
    Rule("harness.eval", "harness.cli", "the CLI drives the eval; move the shared code into harness.eval or "
         "harness.loop"),
    *(Rule(lower, "harness.eval", "the eval sits on the loop (cli -> eval -> loop); move the shared code into "
           f"{lower} or below it") for lower in ("harness.loop", "harness.core", "harness.engine", "harness.tools",
                                                 "harness.models", "harness.audit", "harness.doors")),
    Rule("sandbox", "harness", "the in-container agent ships alone (stdlib, grpcio, protobuf, psutil); "
         "copy the small piece it needs into sandbox/ or put it in the proto"),
)

LEAVES = ("harness.core.errors", "harness.core.units", "harness.core.times", "harness.core.state_dirs")
"""Imported by the engine, so they may import nothing from harness."""

CLIENT = "harness.client"
CLIENT_ALLOWED = ("harness.v1", "harness.wire", "harness.core.units", "harness.core.state_dirs",
                  "harness.doors.grpc.tokens", "harness.core.calls")
"""What the Python client of the gRPC door may import besides its own modules (``harness.client``
and the ``harness.client_*`` modules split from it): generated code, the wire constants, the
size parser, where callbox keeps its state, the token module (it reads the caller's token
from the token file the server writes, ``client_token``) and the shared result shapes
(``ImagePart``: a result's pictures are the same type on both sides)."""
CLIENT_CLOSURE = (*CLIENT_ALLOWED, "harness.core.errors")
"""Everything loading the client may load: the above and what they import (tokens raises a
``CallboxError``)."""


def test_dependency_direction() -> None:
    problems = []
    for imp in all_imports():
        for rule in RULES:
            if (_under(imp.source, rule.source) and _under(imp.target, rule.forbidden)
                    and not any(_under(imp.target, ok) for ok in rule.allowed)):
                problems.append(f"{imp.source.replace('.', '/')}.py:{imp.line}: {imp.source} imports {imp.target}"
                                f" ({rule.source}.* must not import {rule.forbidden})\n  fix: {rule.fix}")
    assert not problems, "\n".join(problems)


def test_leaf_modules_import_nothing_from_harness() -> None:
    modules = {m.name: m for m in checked_modules()}
    assert set(LEAVES) <= set(modules), f"a leaf module is missing: {sorted(set(LEAVES) - set(modules))}"
    problems = [f"{modules[leaf].shown}:{imp.line}: {leaf} imports {imp.target}, but the engine imports "
                f"{leaf} as a leaf\n  fix: keep {leaf} free of harness imports (move the code that needs them "
                "out of it)" for leaf in LEAVES for imp in imports_of(modules[leaf])]
    assert not problems, "\n".join(problems)


def _client_module(name: str) -> bool:
    return name == CLIENT or name.startswith(CLIENT + "_")


def test_client_imports_only_small_helpers() -> None:
    by_name = {m.name: m for m in checked_modules()}
    problems = []
    seen: set[str] = set()
    queue = deque([CLIENT])
    while queue:
        name = queue.popleft()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        for imp in imports_of(by_name[name]):
            if _client_module(imp.target):
                queue.append(imp.target)
            elif _client_module(name) and not any(_under(imp.target, ok) for ok in CLIENT_ALLOWED):
                problems.append(f"{by_name[name].shown}:{imp.line}: {name} imports {imp.target}; the client may "
                                f"import only {', '.join(CLIENT_ALLOWED)}\n  fix: move what it needs into "
                                "harness.wire (or another of those)")
            elif not _client_module(name) and not any(_under(imp.target, ok) for ok in CLIENT_CLOSURE):
                problems.append(f"{by_name[name].shown}:{imp.line}: {name} imports {imp.target}, so loading "
                                f"{CLIENT} loads it\n  fix: keep {name} small (the client imports it)")
            else:
                queue.append(imp.target)
    assert not problems, "\n".join(problems)


# ---- (c) module size -------------------------------------------------------------------------


def test_no_module_over_600_lines() -> None:
    problems = []
    for module in checked_modules():
        lines = len(module.path.read_text().splitlines())
        if lines > MAX_LINES:
            problems.append(f"{module.shown}: {lines} lines (over {MAX_LINES})\n  fix: split {module.name} by "
                            "job into modules under 600 lines each")
    assert not problems, "\n".join(problems)


# ---- the reader itself -----------------------------------------------------------------------


def _collect(source: str, name: str = "harness.core.example", init: bool = False) -> list[str]:
    module = Module(name, ROOT / Path(*name.split(".")) / "__init__.py" if init
                    else ROOT / (name.replace(".", "/") + ".py"))
    collector = _ImportCollector(module)
    collector.visit(ast.parse(source))
    return [imp.target for imp in collector.found]


def test_reader_skips_type_checking_and_resolves_submodules() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import harness.core.errors\n"
        "from harness.core import units\n"
        "from harness.core.errors import CallboxError\n"
        "from . import policy\n"
        "from ..engine import base\n"
        "if TYPE_CHECKING:\n"
        "    from harness.engine.docker.engine import DockerEngine\n"
        "else:\n"
        "    import harness.wire\n"
        "def f():\n"
        "    from harness.tools import builtin_registry\n"
        "    import json\n"
    )
    assert _collect(source) == ["harness.core.errors", "harness.core.units", "harness.core.errors",
                                "harness.core.policy", "harness.engine.base", "harness.wire", "harness.tools"]


def test_cycle_finder() -> None:
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3}, "d": {"a": 4}}
    assert _strongly_connected(graph) == [["a", "b", "c"]]
    assert _shortest_cycle(graph, "b", {"a", "b", "c"}) == ["b", "c", "a", "b"]
