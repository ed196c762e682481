"""``shell``: run one command line with bash in the run's sandbox (Codex-style result text).

The result text is what Codex-trained models expect::

    Exit code: 0
    Wall time: 0.2 seconds
    Output:
    ...

A timeout or an OOM kill says so in words; output beyond the agent's cap keeps its
head and tail with a marker (the harness then applies the model's output budget).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.calls import ErrorCode, ToolOutput
from harness.context import ToolContext
from harness.errors import AgentCallError
from harness.exec_result import ExecResult, collect, gap_marker
from harness.registry import Tool, ToolAnnotations, ToolDefinition

AGENT_OUTPUT_CAP = 1 << 20


class ShellArgs(BaseModel):
    """Run a shell command in the sandbox and return its exit code and output."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(min_length=1, description="The command line, run with `bash -c` in the sandbox.")
    workdir: str | None = Field(
        default=None, description="Working directory inside the sandbox (default: the workspace)."
    )
    timeout_ms: int | None = Field(
        default=None, ge=1, description="Kill the command after this many milliseconds (capped by policy)."
    )


def _render(result: ExecResult, output: bytes, timeout_s: float) -> str:
    lines = [f"Exit code: {result.shell_exit_code}", f"Wall time: {result.duration_ms / 1000:.1f} seconds"]
    if result.timed_out:
        lines.append(f"The command timed out after {timeout_s:g} seconds and its processes were killed.")
    elif result.oom_killed:
        lines.append("The command was killed by the out-of-memory killer (sandbox memory limit).")
    lines.append("Output:")
    return "\n".join(lines) + "\n" + output.decode("utf-8", errors="replace")


def run_shell(ctx: ToolContext, args: ShellArgs) -> ToolOutput:
    timeout_s = ctx.timeout_for(args.timeout_ms / 1000 if args.timeout_ms else None)
    sandbox = ctx.sandbox()

    combined = bytearray()  # stdout and stderr in arrival order, as a terminal shows them

    def forward(stream: str, data: bytes, dropped_before: int) -> None:
        if dropped_before:
            combined.extend(gap_marker(dropped_before))
        combined.extend(data)
        if ctx.on_output is not None:
            ctx.on_output(stream, data)

    try:
        events = sandbox.agent.exec(
            args.command, cwd=args.workdir or "", timeout_ms=max(1, int(timeout_s * 1000)),
            output_cap_bytes=AGENT_OUTPUT_CAP,
        )
        result = collect(events, on_output=forward)
    except AgentCallError as error:
        return ToolOutput(text=f"The command could not be run: {error.message}", is_error=True,
                          error=ErrorCode.TOOL_FAILED)
    error_code = None
    if result.timed_out:
        error_code = ErrorCode.TIMED_OUT
    elif result.oom_killed:
        error_code = ErrorCode.OOM_KILLED
    elif result.shell_exit_code != 0:
        error_code = ErrorCode.NONZERO_EXIT
    return ToolOutput(
        text=_render(result, bytes(combined), timeout_s),
        is_error=error_code is not None,
        error=error_code,
        structured={
            "exit_code": result.shell_exit_code,
            "timed_out": result.timed_out,
            "oom_killed": result.oom_killed,
            "duration_ms": round(result.duration_ms, 3),
            "truncated": result.stdout.truncated or result.stderr.truncated,
        },
        raw_bytes=result.stdout.total_bytes + result.stderr.total_bytes,
    )


SHELL = Tool(
    ToolDefinition(
        name="shell",
        description=(
            "Run a shell command (bash) in an isolated, disposable Linux sandbox with no network. "
            "Returns the exit code, the wall time and the combined output."
        ),
        input_model=ShellArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Shell command"),
        command_field="command",
        path_fields=("workdir",),
    ),
    run_shell,
)
