"""The tools a policy declares (``[[tool]]``, modelled in :mod:`harness.core.declared`) as
registered tools: ``command`` (:mod:`.command`) and ``python`` (:mod:`.python`)."""

from __future__ import annotations

from harness.core.declared import DeclaredTool
from harness.core.policy import Policy
from harness.core.registry import Tool
from harness.tools.declared.command import command_tool
from harness.tools.declared.python import python_tool

__all__ = ["declared_tool", "declared_tools"]


def declared_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``[[tool]]`` table."""
    if declared.kind == "python":
        return python_tool(declared)
    return command_tool(declared)


def declared_tools(policy: Policy) -> list[Tool]:
    """The tools ``policy`` declares, in the order of its ``[[tool]]`` tables."""
    return [declared_tool(declared) for declared in policy.tool]
