"""Run one argv in the run's sandbox for a declared tool, through the shell tool's exec loop.

The command is always an argv (the agent's ``Argv`` form: executed directly, no shell), so
nothing a model sends is ever parsed as shell syntax. Output streams to
``ToolContext.on_output`` as it arrives, like the shell tool's.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from harness.core.context import ToolContext
from harness.core.declared import DeclaredAnnotations, DeclaredTool
from harness.core.registry import ToolAnnotations, ToolDefinition
from harness.tools.shell import NotRan, Ran, run_in_sandbox


def run_argv(
    ctx: ToolContext,
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    timeout_s: float | None,
    cwd: str = "",
    stdin: bytes = b"",
    streamed: Collection[str] = ("stdout", "stderr"),
) -> Ran | NotRan:
    """Run ``argv`` executed directly, never through a shell (the only form a declared tool
    may use), as the shell tool runs its commands."""
    return run_in_sandbox(ctx, list(argv), env=env, timeout_s=timeout_s, cwd=cwd, stdin=stdin, streamed=streamed)


def definition_for(declared: DeclaredTool, **hints: Any) -> ToolDefinition:
    """What the model sees of ``declared`` (``hints``: more ToolDefinition fields). A sql tool
    without ``[tool.annotations]`` is annotated from ``write``: read-only (and idempotent)
    unless it may write, destructive when it may."""
    a = declared.annotations
    if declared.kind == "sql" and "annotations" not in declared.model_fields_set:
        a = DeclaredAnnotations(read_only=not declared.write, destructive=bool(declared.write),
                                idempotent=not declared.write)
    return ToolDefinition(
        name=declared.name, description=declared.shown_description, input_model=declared.input_model,
        annotations=ToolAnnotations(read_only=a.read_only, destructive=a.destructive, idempotent=a.idempotent,
                                    open_world=a.open_world, title=a.title),
        **hints,
    )
