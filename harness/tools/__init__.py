"""Built-in tools. ``builtin_registry()`` returns a registry holding all of them."""

from __future__ import annotations

from harness.registry import ToolRegistry
from harness.tools.shell import SHELL


def builtin_registry() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(SHELL)
    return registry
