"""Built-in tools. ``builtin_registry()`` returns a registry holding all of them;
``registry_for(policy)`` adds the tools the policy declares (``[[tool]]``): the registry
every door, the loop and the CLI serve a policy with.

``python`` (a stateful kernel) is served only to a policy that asks for it by name, in
``allowed_tools`` or with a ``[tools.python]`` table: it needs the code-interpreter image,
and a policy written before it existed, whose ``[tools.shell]`` rules restrict commands,
must not find a new tool beside them that runs any code unruled. ``computer`` (the desktop) is
served the same way, for the same reasons: it needs the desktop image, and it drives a browser
and anything else on the desktop, which no shell rule sees. The ``browser_*`` tools (the desktop's
Chromium, Playwright MCP's names) are served as one family, the same way, to a policy that names
any of them or ``browser_*`` (``allowed_tools``, or a ``[tools."browser_*"]`` table). ``undo``
(put the files back as they were before an earlier call) is served the same way, and only
beside ``[checkpoints] mode = "changes"``: a policy that names it without is refused. ``memory``
(files kept on this host between runs, per the policy's ``[memory]`` scope) is served the same
way: it writes outside the sandbox, which no policy written before it allowed."""

from __future__ import annotations

from collections.abc import Callable

from harness.core.policy import Policy, PolicyError
from harness.core.registry import ToolRegistry
from harness.engine.base import Engine
from harness.tools.apply_patch import APPLY_PATCH
from harness.tools.bash import BASH
from harness.tools.browser import BROWSER_TOOL_NAMES, BROWSER_TOOLS
from harness.tools.computer import COMPUTER
from harness.tools.declared import declared_tools
from harness.tools.editor import EDITOR
from harness.tools.files import FILE_TOOLS
from harness.tools.memory import MEMORY
from harness.tools.python_kernel import PYTHON
from harness.tools.shell import SHELL
from harness.tools.undo import UNDO
from harness.tools.unified_exec import UNIFIED_EXEC_TOOLS
from harness.tools.view_image import VIEW_IMAGE


def builtin_registry(*, python: bool = True, computer: bool = True, browser: bool = True,
                     undo: bool = False, memory: bool = False) -> ToolRegistry:
    """Every built-in tool (``python``: with the kernel tool; ``computer``: with the desktop tool;
    ``browser``: with the ``browser_*`` tools; ``undo``: with the undo tool, which is left out
    unless asked for: a session of this registry offers it only when its policy records changes;
    ``memory``: with the memory tool, also left out unless asked for)."""
    registry = ToolRegistry()
    for tool in (SHELL, BASH, EDITOR, APPLY_PATCH, *FILE_TOOLS, VIEW_IMAGE, *UNIFIED_EXEC_TOOLS):
        registry.register(tool)
    if python:
        registry.register(PYTHON)
    if computer:
        registry.register(COMPUTER)
    if browser:
        for tool in BROWSER_TOOLS:
            registry.register(tool)
    if undo:
        registry.register(UNDO)
    if memory:
        registry.register(MEMORY)
    return registry


def asks_for_python(policy: Policy) -> bool:
    """Whether ``policy`` names the ``python`` tool (``allowed_tools`` or ``[tools.python]``)."""
    return PYTHON.name in (policy.allowed_tools or ()) or PYTHON.name in policy.tools


def asks_for_computer(policy: Policy) -> bool:
    """Whether ``policy`` names the ``computer`` tool (``allowed_tools`` or ``[tools.computer]``)."""
    return COMPUTER.name in (policy.allowed_tools or ()) or COMPUTER.name in policy.tools


def asks_for_browser(policy: Policy) -> bool:
    """Whether ``policy`` names a ``browser_*`` tool or ``browser_*`` itself (``allowed_tools`` or
    ``[tools.NAME]``): the whole family is served then."""
    names = {*(policy.allowed_tools or ()), *policy.tools}
    return bool(names & (BROWSER_TOOL_NAMES | {"browser_*"}))


def asks_for_undo(policy: Policy) -> bool:
    """Whether ``policy`` names the ``undo`` tool (``allowed_tools`` or ``[tools.undo]``); a
    PolicyError when it does without recording changes, which the tool needs."""
    asked = UNDO.name in (policy.allowed_tools or ()) or UNDO.name in policy.tools
    if asked and policy.checkpoints.mode == "off":
        raise PolicyError("policy: the undo tool is named (allowed_tools or [tools.undo]) but [checkpoints] mode "
                          'is "off", so there would be nothing to undo; set [checkpoints] mode = "changes"')
    return asked


def asks_for_memory(policy: Policy) -> bool:
    """Whether ``policy`` names the ``memory`` tool (``allowed_tools`` or ``[tools.memory]``) and
    declares no tool of that name itself (``[[tool]]``: then the name is that tool's)."""
    named = MEMORY.name in (policy.allowed_tools or ()) or MEMORY.name in policy.tools
    return named and all(declared.name != MEMORY.name for declared in policy.tool)


def registry_for(policy: Policy, engine_for: Callable[[], Engine] | None = None) -> ToolRegistry:
    """The built-in tools, then the tools ``policy`` declares; a declared tool named like a
    built-in one is a PolicyError naming it. An ``mcp`` table's tools are listed by its
    server, started once per process in a sandbox of ``engine_for`` (default: the local
    Docker engine, connected only when the policy has such a table)."""
    registry = builtin_registry(python=asks_for_python(policy), computer=asks_for_computer(policy),
                                browser=asks_for_browser(policy), undo=asks_for_undo(policy),
                                memory=asks_for_memory(policy))
    builtins = set(builtin_registry(undo=True, memory=True).names())
    for tool in declared_tools(policy, engine_for):
        if tool.name in registry:
            index = next((i for i, t in enumerate(policy.tool) if t.name == tool.name), None)
            key = f"tool[{index}].name" if index is not None else "tool"
            what = "a built-in tool" if tool.name in builtins else "another declared tool (an mcp server's)"
            raise PolicyError(f"policy: key '{key}': {tool.name!r} is the name of {what}; "
                              "give the declared tool another name")
        registry.register(tool)
    return registry
