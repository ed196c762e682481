"""Built-in tools. ``builtin_registry()`` returns a registry holding all of them;
``registry_for(policy)`` adds the tools the policy declares (``[[tool]]``): the registry
every door, the loop and the CLI serve a policy with."""

from __future__ import annotations

from harness.core.policy import Policy, PolicyError
from harness.core.registry import ToolRegistry
from harness.tools.apply_patch import APPLY_PATCH
from harness.tools.bash import BASH
from harness.tools.declared import declared_tools
from harness.tools.editor import EDITOR
from harness.tools.files import FILE_TOOLS
from harness.tools.shell import SHELL


def builtin_registry() -> ToolRegistry:
    registry = ToolRegistry()
    for tool in (SHELL, BASH, EDITOR, APPLY_PATCH, *FILE_TOOLS):
        registry.register(tool)
    return registry


def registry_for(policy: Policy) -> ToolRegistry:
    """The built-in tools, then the tools ``policy`` declares; a declared tool named like a
    built-in one is a PolicyError naming its key."""
    registry = builtin_registry()
    for index, tool in enumerate(declared_tools(policy)):
        if tool.name in registry:
            raise PolicyError(f"policy: key 'tool[{index}].name': {tool.name!r} is the name of a built-in tool; "
                              "give the declared tool another name")
        registry.register(tool)
    return registry
