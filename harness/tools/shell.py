"""``shell``: run one command line with bash in the run's sandbox (Codex-style result text).

The result text is what Codex-trained models read after a shell call (openai/codex,
``format_exec_output_for_model_freeform``)::

    Exit code: 0
    Wall time: 0.2 seconds
    Output:
    ...

and, when the output did not fit::

    Exit code: 0
    Wall time: 1 seconds
    Total output lines: 20000
    Output:
    line 1
    ...
    line 8…113466 chars truncated…line 19996
    ...

* ``Wall time`` is rounded to tenths of a second and printed the way Rust prints an
  ``f32`` (``0``, ``0.2``, ``12``), as Codex does.
* A timeout puts Codex's line ``command timed out after N milliseconds`` (N the time the
  command ran) before the output, with exit code 124; an out-of-memory kill puts
  ``command was killed by the out-of-memory killer (sandbox memory limit)`` there, with
  exit code 137; a signal gives 128 + N.
* Output beyond the budget keeps a head and a tail with Codex's byte-policy marker
  ``…N chars truncated…`` between them (N counts the characters removed, plus the bytes the
  sandbox's own output cap dropped, which were never decoded); ``Total output lines`` is
  printed only then. It counts the lines that reached the harness: all of them up to
  :data:`AGENT_OUTPUT_CAP` bytes per stream, a lower bound beyond (see there). Cuts never split a
  UTF-8 character (they use :mod:`harness.core.shaping`'s cut helpers).

Budget: unlike Codex, whose marker and header come on top of its byte budget, the whole
result text here stays within ``ToolContext.output_budget`` (the policy's
``max_output_bytes``), so the dispatcher's own, generic truncation never applies on top.
Terminal escape sequences are stripped before measuring (the dispatcher would strip them
anyway), so the budget is spent on text the model actually reads.

A sandbox that is gone (its container removed or stopped, the engine away) is the
retryable ``sandbox_unavailable``, worded like the file tools' (``the sandbox did not
answer. ...``); ``structured["command_started"]`` says whether the command had started
before it went away (``null`` when that cannot be told: the request reached the agent, which
was lost before it reported the start), so a caller knows whether sending it again could
repeat its effects.

Streaming: every output chunk reaches ``ToolContext.on_output`` as ``(stream, bytes)`` while
the command runs (the sandbox streams the head of each stream live; a tail kept by its
output cap arrives when the command ends).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.shaping import head_cut, strip_terminal_codes, tail_cut
from harness.engine.agent_errors import SANDBOX_GONE, sandbox_gone
from harness.engine.exec_result import ExecResult, collect
from sandbox.v1 import process_pb2

AGENT_OUTPUT_CAP = 8 << 20
"""Bytes per stream the sandbox keeps (head + tail) when the output budget is smaller.

Larger than the agent's 1 MiB default because ``Total output lines`` can only count the
lines that reach the harness: up to this much output per stream the count is exact; beyond
it the sandbox drops the middle unseen and the count is a lower bound
(``structured["total_output_lines_exact"]`` is then false)."""
MAX_AGENT_OUTPUT_CAP = 32 << 20
OOM_LINE = "command was killed by the out-of-memory killer (sandbox memory limit)"


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


# ---- the result text (pure; tests/unit/test_shell_format.py) ------------------------------------


def wall_time(duration_ms: float) -> str:
    """Seconds rounded to tenths, printed like Rust's ``Display`` for ``f32`` (``0``, ``0.2``, ``3``)."""
    tenths = int(max(0.0, duration_ms) / 100 + 0.5)  # round half away from zero, like f32::round
    whole, frac = divmod(tenths, 10)
    return f"{whole}" if frac == 0 else f"{whole}.{frac}"


def count_lines(text: str) -> int:
    """Lines as Rust's ``str::lines`` counts them: a final line without a newline counts."""
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def truncation_marker(removed: int) -> str:
    """Codex's marker for a byte budget (``truncate_middle_chars``)."""
    return f"…{removed} chars truncated…"


@dataclass(frozen=True)
class FormattedExec:
    text: str
    truncated: bool
    total_lines: int
    removed_chars: int
    """Characters cut out here, plus bytes the sandbox dropped (``unseen_bytes``)."""


def format_exec_output(
    *,
    exit_code: int,
    duration_ms: float,
    output: str,
    budget: int,
    timed_out: bool = False,
    oom_killed: bool = False,
    unseen_bytes: int = 0,
    notes: Sequence[str] = (),
) -> FormattedExec:
    """The Codex result text for one command, at most ``budget`` UTF-8 bytes when it can be.

    ``output`` is stdout and stderr as they arrived; ``unseen_bytes`` is what the sandbox's
    output cap dropped from the middle (always inside the part cut here; see ``run_shell``).
    ``notes`` are header lines after ``Wall time`` (a lowered timeout). Only a budget too
    small for the header itself can make the text longer than ``budget``.
    """
    content = strip_terminal_codes(output)
    if timed_out:
        content = f"command timed out after {int(duration_ms)} milliseconds\n{content}"
    elif oom_killed:
        content = f"{OOM_LINE}\n{content}"
    total_lines = count_lines(content)
    header = [f"Exit code: {exit_code}", f"Wall time: {wall_time(duration_ms)} seconds", *filter(None, notes)]

    def assemble(body: str, *, with_total: bool) -> str:
        lines = [*header, f"Total output lines: {total_lines}"] if with_total else list(header)
        return "\n".join([*lines, "Output:", body])

    data = content.encode("utf-8")
    fixed = len(assemble("", with_total=False).encode())
    if unseen_bytes == 0 and fixed + len(data) <= budget:
        return FormattedExec(assemble(content, with_total=False), False, total_lines, 0)

    fixed = len(assemble("", with_total=True).encode())
    # The marker's digits count too: reserve the longest it can be.
    reserve = len(truncation_marker(len(data) + unseen_bytes).encode())
    room = max(0, budget - fixed - reserve)
    left = room // 2  # Codex's split_budget: the tail gets the odd byte
    head_end = head_cut(data, left)
    tail_start = max(tail_cut(data, room - left), head_end)
    removed = len(data[head_end:tail_start].decode("utf-8")) + unseen_bytes
    body = data[:head_end].decode("utf-8") + truncation_marker(removed) + data[tail_start:].decode("utf-8")
    return FormattedExec(assemble(body, with_total=True), True, total_lines, removed)


# ---- the handler ------------------------------------------------------------------------------


def agent_output_cap(budget: int) -> int:
    """Per-stream cap for the sandbox: never below the model's budget.

    With a cap of at least the budget, whatever the sandbox drops lies between a head and a
    tail that are each at least half the budget long, so it always falls inside the part
    :func:`format_exec_output` cuts out, and one marker can account for both.
    """
    return min(max(AGENT_OUTPUT_CAP, budget), MAX_AGENT_OUTPUT_CAP)


@dataclass(frozen=True)
class Ran:
    """One finished exec: the result, stdout and stderr interleaved as they arrived (as a
    terminal shows them), and the bytes the sandbox's output cap dropped unseen."""

    result: ExecResult
    combined: bytes
    unseen: int


@dataclass(frozen=True)
class NotRan:
    """An exec the agent failed (or lost) before it ended; ``started``: whether the process
    had started (None: not known)."""

    error: AgentCallError
    started: bool | None


def run_in_sandbox(
    ctx: ToolContext,
    command: str | Sequence[str],
    *,
    timeout_s: float | None,
    env: Mapping[str, str] | None = None,
    cwd: str = "",
    stdin: bytes = b"",
    streamed: Collection[str] = ("stdout", "stderr"),
) -> Ran | NotRan:
    """Run ``command`` (``bash -c`` when a string, executed directly when an argv) with
    ``env`` added to the sandbox's environment, within the call's timeout (``timeout_s``
    asked for, clamped to the policy's ceiling); the ``streamed`` streams reach
    ``ctx.on_output`` as they arrive."""
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
            command if isinstance(command, str) else list(command), cwd=cwd, env={**runtime.env, **(env or {})},
            stdin=stdin, timeout_ms=max(1, int(seconds * 1000)), output_cap_bytes=agent_output_cap(ctx.output_budget),
        )
        result = collect(watch(events), on_output=forward)
    except AgentCallError as error:
        return NotRan(error, started or command_may_have_started(error))
    return Ran(result, bytes(combined), unseen)


def exec_output(ran: Ran, budget: int, *, notes: Sequence[str] = (), **extra: object) -> ToolOutput:
    """A finished exec as the model reads it: Codex's ``Exit code / Wall time / Output`` text
    within ``budget`` bytes (``notes`` as header lines), the error code of a timeout, OOM
    kill or non-zero exit, and the structured facts (plus ``extra``)."""
    result = ran.result
    exit_code = result.shell_exit_code  # 124 after a timeout (Codex's code too), 128+N for signal N
    formatted = format_exec_output(
        exit_code=exit_code, duration_ms=result.duration_ms, output=ran.combined.decode("utf-8", errors="replace"),
        budget=budget, timed_out=result.timed_out, oom_killed=result.oom_killed, unseen_bytes=ran.unseen,
        notes=notes,
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


def run_shell(ctx: ToolContext, args: ShellArgs) -> ToolOutput:
    timeout = ctx.call_timeout(args.timeout_ms / 1000 if args.timeout_ms else None, argument="timeout_ms",
                               unit_s=0.001)
    ran = run_in_sandbox(ctx, args.command, timeout_s=timeout.seconds, cwd=args.workdir or "")
    if isinstance(ran, NotRan):
        return agent_failure(ran.error, started=ran.started)
    return exec_output(ran, ctx.output_budget, notes=(timeout.note(),))


def command_may_have_started(error: AgentCallError) -> bool | None:
    """For an exec that failed before its Started event arrived: False when the command
    surely did not start (the agent refused it, or the connection to the agent could not
    be made, so the request never left), None when that cannot be told (the agent may have
    started it and been lost before it said so)."""
    if error.reason != "UNSPECIFIED" or "failed to connect" in error.message:
        return False
    return None


def agent_failure(error: AgentCallError, *, started: bool | None) -> ToolOutput:
    """The error result for an exec the agent failed or could not run; ``started`` is
    whether the command had started (None: not known)."""
    structured: dict[str, object] = {"reason": error.reason, "command_started": started}
    if sandbox_gone(error):
        # The ledger's word for a call that may have had effects: it is never run again.
        structured["outcome"] = "not_run" if started is False else "unknown"
        then = ("The command had started and may have had effects before it went away" if started
                else "The command did not start" if started is False
                else "It is not known whether the command started: it may have had effects")
        # Lost contact is worded like the file tools'; an agent that said why it stopped
        # answering (its container is being stopped) speaks for itself.
        lead = "the sandbox did not answer. " if error.message.startswith(SANDBOX_GONE) else ""
        return ToolOutput(text=f"{lead}{error.message.rstrip('.')}. {then}.", is_error=True,
                          error=ErrorCode.SANDBOX_UNAVAILABLE, structured=structured)
    return ToolOutput(text=f"The command could not be run: {error.message}", is_error=True,
                      error=ErrorCode.TOOL_FAILED, structured=structured)


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
