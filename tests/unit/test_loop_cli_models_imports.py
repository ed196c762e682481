"""The loop, the CLI and the model adapters import each other without cycles, counting
imports inside functions too (a lazy import still ties the modules together)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[2] / "harness"
PACKAGES = ("harness.cli", "harness.loop", "harness.models")


def _module_name(path: Path) -> str:
    parts = path.relative_to(HARNESS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph() -> dict[str, set[str]]:
    files = [f for package in ("cli", "loop", "models") for f in (HARNESS / package).glob("*.py")]
    modules = {_module_name(f): f for f in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
                imported.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _cycle_from(start: str, graph: dict[str, set[str]]) -> list[str] | None:
    """A path start -> ... -> start, if there is one."""
    stack: list[tuple[str, list[str]]] = [(start, [start])]
    seen: set[str] = set()
    while stack:
        node, path = stack.pop()
        for following in sorted(graph[node]):
            if following == start:
                return [*path, start]
            if following not in seen:
                seen.add(following)
                stack.append((following, [*path, following]))
    return None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    graph = _graph()
    for module in sorted(m for m in graph if m.startswith(package)):
        cycle = _cycle_from(module, graph)
        assert cycle is None, " -> ".join(cycle or [])


def test_command_groups_do_not_import_main() -> None:
    graph = _graph()
    importers = sorted(m for m, imported in graph.items() if "harness.cli.main" in imported)
    assert importers == []


def test_adapters_do_not_import_the_factory() -> None:
    graph = _graph()
    importers = sorted(m for m, imported in graph.items() if "harness.models.factory" in imported)
    assert importers == ["harness.cli.eval", "harness.cli.run", "harness.loop.handoff"]  # runs, and agents
