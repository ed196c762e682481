"""``kind = "command"``: an argv template run in the sandbox, never through a shell.

Rendering (:func:`render_argv`, :func:`render_env`) is pure:

* an argv element that is exactly ``"{name}"`` becomes the argument's value as one element,
  whatever it holds (spaces, ``;``, ``$(...)``, quotes, newlines); an array argument there
  becomes one element per item (none for an empty list);
* ``{name}`` inside a larger element is replaced by the value as text; the element stays
  one element;
* an ``env`` value is rendered the same way;
* an element or variable using an optional argument the call left out is left out whole;
* values are written as JSON writes scalars: ``true``/``false``, ``3``, ``2.5``.

The argv goes to the agent's ``Argv`` exec (the program is executed directly: no shell ever
sees it), so an argument cannot inject shell syntax. Policy command rules match the
rendered argv joined with :func:`shlex.join` (``ToolDefinition.command_of``), the way it
would be typed; the result is shaped like the shell tool's.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

from harness.core.calls import ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool, Placeholder, parse_template
from harness.core.registry import Tool
from harness.tools.declared.running import definition_for, run_argv
from harness.tools.shell import NotRan, agent_failure, exec_output

__all__ = ["command_tool", "render_argv", "render_env"]

Template = list[str | Placeholder]


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _fill(template: Template, values: Mapping[str, Any]) -> str | None:
    """The template with each placeholder's value, or None when one of them is absent."""
    out: list[str] = []
    for part in template:
        if isinstance(part, Placeholder):
            value = values.get(part.name)
            if value is None:
                return None
            out.append(_text(value))
        else:
            out.append(part)
    return "".join(out)


def render_argv(argv: Sequence[str], values: Mapping[str, Any]) -> list[str]:
    """``argv`` with the arguments ``values`` filled in (see the module's rules)."""
    out: list[str] = []
    for element in argv:
        template = parse_template(element)
        if len(template) == 1 and isinstance(template[0], Placeholder):
            value = values.get(template[0].name)
            if isinstance(value, list | tuple):
                out.extend(_text(item) for item in value)
                continue
        filled = _fill(template, values)
        if filled is not None:
            out.append(filled)
    return out


def render_env(env: Mapping[str, str], values: Mapping[str, Any]) -> dict[str, str]:
    """``env`` with the arguments ``values`` filled in; a variable using an absent one is left out."""
    out: dict[str, str] = {}
    for name, template in env.items():
        filled = _fill(parse_template(template), values)
        if filled is not None:
            out[name] = filled
    return out


def _values(declared: DeclaredTool, args: Mapping[str, Any] | BaseModel) -> dict[str, Any] | None:
    if isinstance(args, BaseModel):
        return args.model_dump()
    try:
        return declared.input_model.model_validate(dict(args)).model_dump()
    except ValidationError:
        return None


def command_tool(declared: DeclaredTool) -> Tool:
    """The registered tool of one ``kind = "command"`` table."""
    argv = declared.argv or ()

    def rendered(args: Mapping[str, Any] | BaseModel) -> str | None:
        values = _values(declared, args)
        return None if values is None else shlex.join(render_argv(argv, values))

    def handler(ctx: ToolContext, args: BaseModel) -> ToolOutput:
        values = args.model_dump()
        command = render_argv(argv, values)
        ran = run_argv(ctx, command, env=render_env(declared.env, values), timeout_s=declared.timeout_s,
                       cwd=declared.workdir or "")
        if isinstance(ran, NotRan):
            return agent_failure(ran.error, started=ran.started)
        return exec_output(ran, ctx.output_budget, argv=command)

    return Tool(definition_for(declared, command_of=rendered), handler)

