"""``bash``: a persistent bash session in the run's sandbox (Anthropic ``bash_20250124`` semantics).

Arguments ``{command?, restart?}``, as the model was trained on them. One session per
sandbox (session id ``"default"`` in the agent's Shell service, see ``sandbox/shell.py``):
``cd``, variables, functions and background jobs (``cmd &``) survive between calls; the
agent, not prompt scraping, reports when a command returned, so output that looks like a
prompt or a sentinel is returned verbatim.

What the model reads, matched to Anthropic's reference implementation (the
computer-use demo's ``BashTool20250124`` and its sample loop):

* a command that returned: its output, nothing else (no exit-code header: the reference
  adds none); a non-zero exit status is *not* an error result. stdout comes first, then
  stderr (each with one trailing newline removed, joined by a newline), as the reference
  returns them in its ``output`` and ``error`` fields. Deviation: the reference's loop
  shows only stderr, flagged as an error, whenever stderr is non-empty, dropping stdout;
  here both are kept and stderr alone does not make an error. Empty output is an empty,
  successful result. Bytes that are not UTF-8 become U+FFFD in the text. Output beyond
  the agent's cap keeps head and tail with a ``[... N bytes dropped ...]`` marker; the
  harness then applies the model's output budget. Output that background jobs write
  between calls arrives at the start of the next call's output (the reference's
  buffers behave the same way).
* ``restart: true``: the session's whole process tree is killed and a fresh shell
  started; the text is ``tool has been restarted.`` A ``command`` sent along with
  ``restart`` is ignored, as in the reference.
* neither argument: the error result ``no command provided.`` (the reference's text)
  followed by how to fix the call.
* timeout (the policy's default call timeout; this interface has no timeout argument):
  the error result ``timed out: bash has not returned in N seconds and must be
  restarted``, N printed like the reference's float (``30.0``). The agent kills the
  session's tree at once (the reference leaves the stuck shell alive); every later
  command gets the same error until a restart, as in the reference.
* bash itself ended (``exit``, ``exec``, ``set -e`` plus a failing command, killed):
  the output, then ``bash has exited with returncode N and must be restarted`` as an
  error result, on that call and on every later one until a restart. Deviation: the
  reference reports ``bash has exited with returncode N`` (with a "tool must be
  restarted" system note) only on the *next* call, after the exiting call itself has
  waited out its whole timeout.
* the session's shell gets the sandbox spec's ``env`` (as ``callbox exec`` commands do).
* a call made while another command runs in the session waits for it (serialized), up
  to its own timeout; then it gets an error result saying bash is busy.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine.exec_result import OutputStreams, StreamResult
from sandbox.shell import ended_message, timeout_message

SESSION_ID = "default"
AGENT_OUTPUT_CAP = 1 << 20
RESTARTED = "tool has been restarted."
NO_COMMAND = (
    "no command provided. Pass `command` with the bash command to run, "
    "or `restart: true` to restart the bash session."
)


NO_BASH_HINT = (
    ". This sandbox's image has no bash, which this tool's persistent session needs; the shell "
    "tool runs a command string with the image's /bin/sh instead"
)


class BashArgs(BaseModel):
    """Run commands in a persistent bash session."""

    model_config = ConfigDict(extra="forbid")

    command: str | None = Field(
        default=None, description="The bash command to run. Required unless the tool is being restarted."
    )
    restart: bool | None = Field(
        default=None, description="Specifying true will restart this tool. Otherwise, leave this unspecified."
    )


def _text(stream: StreamResult) -> str:
    return stream.rendered().decode("utf-8", errors="replace").removesuffix("\n")


def _join(*parts: str) -> str:
    return "\n".join(p for p in parts if p)


def run_bash(ctx: ToolContext, args: BashArgs) -> ToolOutput:
    if args.restart:
        try:
            runtime = ctx.runtime()
            runtime.agent.shell_restart(SESSION_ID, env=runtime.env)
        except AgentCallError as error:
            return ToolOutput(text=f"bash could not be restarted: {error.message}", is_error=True,
                              error=ErrorCode.TOOL_FAILED)
        return ToolOutput(text=RESTARTED, structured={"restarted": True})
    if args.command is None:
        return ToolOutput(text=NO_COMMAND, is_error=True, error=ErrorCode.INVALID_ARGUMENTS)

    timeout_ms = max(1, int(ctx.timeout_for(None) * 1000))
    streams = OutputStreams()
    done = None
    runtime = ctx.runtime()
    try:
        for event in runtime.agent.shell_run(
            args.command, session_id=SESSION_ID, timeout_ms=timeout_ms, output_cap_bytes=AGENT_OUTPUT_CAP,
            env=runtime.env,
        ):
            kind = event.WhichOneof("event")
            if kind == "output":
                chunk = streams.add(event.output)
                if chunk is not None and chunk[1] and ctx.on_output is not None:
                    ctx.on_output(*chunk)
            elif kind == "done":
                done = event.done
    except AgentCallError as error:
        if error.reason == "SESSION_BROKEN":
            return ToolOutput(text=error.message, is_error=True, error=ErrorCode.TOOL_FAILED)
        if error.reason == "BUSY":
            return ToolOutput(text=f"bash is busy: {error.message}", is_error=True, error=ErrorCode.TOOL_FAILED)
        hint = NO_BASH_HINT if error.message.startswith("bash: command not found") else ""
        return ToolOutput(text=f"bash could not run the command: {error.message}{hint}", is_error=True,
                          error=ErrorCode.TOOL_FAILED)
    if done is None:
        return ToolOutput(text="bash could not run the command: the agent ended the stream early",
                          is_error=True, error=ErrorCode.TOOL_FAILED)
    streams.finish(done.stdout, done.stderr)
    structured = {
        "exit_code": done.exit_code,
        "cwd": done.cwd,
        "timed_out": done.timed_out,
        "session_ended": done.session_ended,
        "duration_ms": round(done.duration.ToNanoseconds() / 1e6, 3),
        "truncated": streams.truncated,
    }
    raw_bytes = done.stdout.total_bytes + done.stderr.total_bytes
    output = _join(_text(streams.stdout), _text(streams.stderr))
    if done.timed_out:
        return ToolOutput(text=timeout_message(timeout_ms), is_error=True, error=ErrorCode.TIMED_OUT,
                          structured=structured, raw_bytes=raw_bytes)
    if done.session_ended:
        returncode = -done.signal if done.signal else done.exit_code
        return ToolOutput(text=_join(output, ended_message(returncode)), is_error=True,
                          error=ErrorCode.TOOL_FAILED, structured=structured, raw_bytes=raw_bytes)
    return ToolOutput(text=output, structured=structured, raw_bytes=raw_bytes)


BASH = Tool(
    ToolDefinition(
        name="bash",
        description=(
            "Run commands in a persistent bash session in an isolated Linux sandbox with no network. "
            "State (working directory, environment variables, functions, background jobs) persists "
            "between calls; `restart: true` starts a fresh session. Commands get no stdin: do not run "
            "interactive programs. Returns the command's output (stdout, then stderr)."
        ),
        input_model=BashArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Bash session"),
        command_field="command",
    ),
    run_bash,
)
