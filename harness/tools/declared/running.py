"""Run one argv in the run's sandbox for a declared tool: the exec loop both kinds share.

The command is always an argv (the agent's ``Argv`` form: executed directly, no shell), so
nothing a model sends is ever parsed as shell syntax. Output streams to
``ToolContext.on_output`` as it arrives, like the shell tool's.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.declared import DeclaredTool
from harness.core.errors import AgentCallError
from harness.core.registry import ToolAnnotations, ToolDefinition
from harness.engine.exec_result import ExecResult, collect
from harness.tools.shell import agent_output_cap, command_may_have_started, format_exec_output
from sandbox.v1 import process_pb2


@dataclass(frozen=True)
class Ran:
    """One finished exec: the result, stdout and stderr interleaved as they arrived, and the
    bytes the sandbox's output cap dropped unseen."""

    result: ExecResult
    combined: bytes
    unseen: int


@dataclass(frozen=True)
class NotRan:
    """An exec the agent failed (or lost) before it ended; ``started``: whether the process
    had started (None: not known)."""

    error: AgentCallError
    started: bool | None


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
    """Run ``argv`` with ``env`` added to the sandbox's environment, within the call's
    timeout (``timeout_s`` asked for, clamped to the policy's ceiling); the ``streamed``
    streams reach ``ctx.on_output`` as they arrive."""
    seconds = ctx.timeout_for(timeout_s)
    runtime = ctx.runtime()
    combined = bytearray()
    unseen = 0
    started = False

    def watch(events: Iterator[process_pb2.ExecEvent]) -> Iterator[process_pb2.ExecEvent]:
        nonlocal started
        for event in events:
            started = started or event.WhichOneof("event") == "started"
            yield event

    def forward(stream: str, data: bytes, dropped_before: int) -> None:
        nonlocal unseen
        unseen += dropped_before
        combined.extend(data)
        if ctx.on_output is not None and stream in streamed:
            ctx.on_output(stream, data)

    try:
        events = runtime.agent.exec(
            list(argv), cwd=cwd, env={**runtime.env, **env}, stdin=stdin,
            timeout_ms=max(1, int(seconds * 1000)), output_cap_bytes=agent_output_cap(ctx.output_budget),
        )
        result = collect(watch(events), on_output=forward)
    except AgentCallError as error:
        return NotRan(error, started or command_may_have_started(error))
    return Ran(result, bytes(combined), unseen)


def exec_output(ran: Ran, budget: int, **extra: object) -> ToolOutput:
    """A finished exec as the shell tool's result: Codex's ``Exit code / Wall time / Output``
    text within ``budget`` bytes, the error code of a timeout, OOM kill or non-zero exit, and
    the same ``structured`` keys (plus ``extra``)."""
    result = ran.result
    exit_code = result.shell_exit_code
    formatted = format_exec_output(
        exit_code=exit_code, duration_ms=result.duration_ms, output=ran.combined.decode("utf-8", errors="replace"),
        budget=budget, timed_out=result.timed_out, oom_killed=result.oom_killed, unseen_bytes=ran.unseen,
    )
    error_code = None
    if result.timed_out:
        error_code = ErrorCode.TIMED_OUT
    elif result.oom_killed:
        error_code = ErrorCode.OOM_KILLED
    elif exit_code != 0:
        error_code = ErrorCode.NONZERO_EXIT
    return ToolOutput(
        text=formatted.text, is_error=error_code is not None, error=error_code,
        structured={
            **extra,
            "exit_code": exit_code,
            "timed_out": result.timed_out,
            "oom_killed": result.oom_killed,
            "duration_ms": round(result.duration_ms, 3),
            "truncated": formatted.truncated,
            "total_output_lines": formatted.total_lines,
            "total_output_lines_exact": ran.unseen == 0,
        },
        raw_bytes=result.stdout.total_bytes + result.stderr.total_bytes,
    )


def definition_for(declared: DeclaredTool, **hints: Any) -> ToolDefinition:
    """What the model sees of ``declared`` (``hints``: more ToolDefinition fields)."""
    a = declared.annotations
    return ToolDefinition(
        name=declared.name, description=declared.shown_description, input_model=declared.input_model,
        annotations=ToolAnnotations(read_only=a.read_only, destructive=a.destructive, idempotent=a.idempotent,
                                    open_world=a.open_world, title=a.title),
        **hints,
    )
