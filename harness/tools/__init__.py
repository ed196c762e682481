"""Built-in tools. ``builtin_registry()`` returns a registry holding all of them."""

from __future__ import annotations

from harness.core.registry import ToolRegistry
from harness.tools.apply_patch import APPLY_PATCH
from harness.tools.bash import BASH
from harness.tools.editor import EDITOR
from harness.tools.files import FILE_TOOLS
from harness.tools.shell import SHELL


def builtin_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for tool in (SHELL, BASH, EDITOR, APPLY_PATCH, *FILE_TOOLS):
        registry.register(tool)
    return registry
