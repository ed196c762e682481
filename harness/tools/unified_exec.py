"""``exec_command`` and ``write_stdin``: Codex's unified-exec tools, on the sandbox's background jobs.

``exec_command {cmd, workdir?, shell?, login?, tty?, yield_time_ms?, max_output_tokens?}`` starts
``cmd`` as a background job (``shell -lc cmd``, or ``shell -c cmd`` with ``login: false``; on a
pseudo-terminal with ``tty: true``) and waits up to ``yield_time_ms`` for it to exit, collecting its
output. A command still running then keeps running: the result says so and names its session ID
(the job's pid), which ``write_stdin {session_id, chars?, yield_time_ms?, max_output_tokens?}``
writes to (``chars``; empty just polls), then waits ``yield_time_ms`` again and returns the output
produced since the previous call on that session. The result text is Codex's
(``codex-rs/core/src/tools/handlers/unified_exec.rs``, ``format_response``)::

    Chunk ID: 3fa9c1
    Wall time: 0.5120 seconds
    Process exited with code 0
    Original token count: 3
    Output:
    hi

with ``Process running with session ID 1234`` instead of the exit line while the command runs.

* ``yield_time_ms`` is clamped to [250, 30000] ms (defaults 10000 for ``exec_command``, 250 for
  ``write_stdin``), and never waits past the call's own deadline (the policy's default call
  timeout). The wait ends early only when the process exits. The job itself is not bounded by the
  call timeout: it runs until it exits, is ended through its session, or the sandbox goes.
* Output beyond ``max_output_tokens`` (default 10000; about 4 bytes a token, as Codex counts) keeps
  a head and a tail: ``Total output lines: N``, a blank line, then the head, Codex's marker
  ``…K tokens truncated…`` and the tail. The whole text also stays within the policy's output
  budget. ``Original token count`` is the estimate for the output before truncation.
* Each session remembers the last output chunk it returned (the job's output seq), so the next
  ``write_stdin`` returns only new output. When the sandbox's ring buffer (1 MiB per job) dropped
  output before it was read, the text says how many bytes were lost there.
* A session that exited is reported once (with its exit code; 128 + N for a signal N) and then
  forgotten: a later ``write_stdin`` on it, like one on an ID that never existed, is an error
  result naming the ID and saying to start a command with ``exec_command``.
* Without a tty, ``chars`` go to the command's stdin (jobs start with stdin open). As a terminal
  would: ``chars`` of just Ctrl-C (``\\u0003``) interrupts the command (SIGINT), and a Ctrl-D
  (``\\u0004``) at the end of ``chars`` closes stdin after the rest is written (end of input). On a
  tty the terminal itself does this.
* At most :data:`MAX_SESSIONS` jobs run per sandbox (the agent's limit); one more is an error result
  saying to end a session first.
* A cancelled ``exec_command`` call kills the job it started (its session ID was never returned);
  a cancelled ``write_stdin`` leaves its session running.
* A non-zero exit is an error result (``nonzero_exit``), an out-of-memory kill ``oom_killed``, as
  the ``shell`` tool reports them; a command still running is not an error.

Sessions are tracked per sandbox (:class:`SessionTable`, keyed by sandbox id, then pid). A job this
process has not seen (a kept sandbox reopened by another harness process) that ``exec_command``
started and is still running is taken over on the first ``write_stdin`` naming it, its output read
from the oldest the sandbox still holds.
"""

from __future__ import annotations

import contextlib
import secrets
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import OutputSink, ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.shaping import dropped_marker, head_cut, strip_terminal_codes, tail_cut
from harness.engine.agent_errors import sandbox_gone
from harness.engine.base import SandboxRuntime
from harness.engine.jobs import JobChunk, JobEnded, JobEvent, JobGap, JobInfo
from harness.tools.shell import OOM_LINE, agent_failure, command_may_have_started, count_lines

TAG = "exec_command"
"""The tag of the jobs ``exec_command`` starts (shown by ``callbox`` job listings)."""
MIN_YIELD_MS = 250
MAX_YIELD_MS = 30_000
EXEC_YIELD_MS = 10_000
WRITE_YIELD_MS = 250
DEFAULT_MAX_OUTPUT_TOKENS = 10_000
BYTES_PER_TOKEN = 4
MAX_SESSIONS = 64
"""Jobs (sessions included) one sandbox may run at once: the agent's limit (``sandbox.jobs.MAX_RUNNING``),
which refuses one more with BUSY."""
MAX_SANDBOXES = 256
"""Sandboxes whose sessions the table remembers; the least recently used one is forgotten first
(its running jobs can still be taken over, see the module's docstring)."""
DEFAULT_SHELL = "/bin/bash"
CTRL_C = "\x03"
CTRL_D = "\x04"
SESSION_WAIT_S = MAX_YIELD_MS / 1000 + 5
"""How long a call waits for another call on the same session to finish."""
EXEC_ENV = {"NO_COLOR": "1", "PAGER": "cat", "GIT_PAGER": "cat", "GH_PAGER": "cat"}
"""Added to a job's environment (the sandbox spec's ``env`` wins): no colours, no pagers, as Codex
sets for its unified exec; the agent already sets ``TERM=dumb`` and a UTF-8 locale."""


class ExecCommandArgs(BaseModel):
    """Run a command in the sandbox; return its output, or a session ID to interact with it."""

    model_config = ConfigDict(extra="forbid")

    cmd: str = Field(min_length=1, description="Shell command to execute.")
    workdir: str | None = Field(
        default=None, description="Working directory for the command. Defaults to the workspace."
    )
    shell: str = Field(default=DEFAULT_SHELL, min_length=1, description="Shell binary to launch.")
    login: bool = Field(default=True, description="True runs the shell with -l (login) semantics; false disables them.")
    tty: bool = Field(
        default=False,
        description="Whether to allocate a TTY for the command (false: plain pipes); set to true to open a PTY "
                    "and access TTY process.",
    )
    yield_time_ms: int = Field(
        default=EXEC_YIELD_MS,
        description=f"How long to wait (in milliseconds) for output before yielding "
                    f"(clamped to {MIN_YIELD_MS}-{MAX_YIELD_MS}).",
    )
    max_output_tokens: int = Field(
        default=DEFAULT_MAX_OUTPUT_TOKENS, ge=1,
        description="Maximum number of tokens to return. Excess output will be truncated.",
    )


class WriteStdinArgs(BaseModel):
    """Write characters to a running exec_command session and return its recent output."""

    model_config = ConfigDict(extra="forbid")

    session_id: int = Field(description="Identifier of the running unified exec session.")
    chars: str = Field(
        default="",
        description="Bytes to write to stdin (may be empty to poll). Without a TTY, \"\\u0003\" alone interrupts the "
                    "command (SIGINT) and a final \"\\u0004\" closes its stdin.",
    )
    yield_time_ms: int = Field(
        default=WRITE_YIELD_MS,
        description=f"How long to wait (in milliseconds) for output before yielding "
                    f"(clamped to {MIN_YIELD_MS}-{MAX_YIELD_MS}).",
    )
    max_output_tokens: int = Field(
        default=DEFAULT_MAX_OUTPUT_TOKENS, ge=1,
        description="Maximum number of tokens to return. Excess output will be truncated.",
    )


# ---- the result text (pure; tests/unit/test_unified_exec.py) ------------------------------------


def clamp_yield_ms(requested: int) -> int:
    return min(max(requested, MIN_YIELD_MS), MAX_YIELD_MS)


def approx_tokens(byte_count: int) -> int:
    """Codex's estimate: one token per 4 bytes, rounded up."""
    return -(-byte_count // BYTES_PER_TOKEN)


def token_marker(removed_tokens: int) -> str:
    """Codex's marker for a token budget."""
    return f"…{removed_tokens} tokens truncated…"


@dataclass(frozen=True)
class Truncated:
    text: str
    truncated: bool


def truncate_tokens(content: str, max_tokens: int, budget: int) -> Truncated:
    """``content`` within ``max_tokens`` (4 bytes each) and ``budget`` bytes, as Codex's
    ``formatted_truncate_text`` does it: ``Total output lines: N``, a blank line, the head, the
    ``…K tokens truncated…`` marker and the tail. Cuts never split a UTF-8 character; only a
    budget too small for the line count and the marker gives more than ``budget`` bytes."""
    limit = max(0, min(max_tokens * BYTES_PER_TOKEN, budget))
    data = content.encode("utf-8")
    if len(data) <= limit:
        return Truncated(content, False)
    prefix = f"Total output lines: {count_lines(content)}\n\n"
    reserve = len(token_marker(approx_tokens(len(data))).encode())  # its longest
    room = max(0, limit - len(prefix.encode()) - reserve)
    left = room // 2
    head_end = head_cut(data, left)
    tail_start = max(tail_cut(data, room - left), head_end)
    marker = token_marker(approx_tokens(tail_start - head_end))
    body = data[:head_end].decode("utf-8") + marker + data[tail_start:].decode("utf-8")
    return Truncated(prefix + body, True)


def format_response(*, chunk_id: str, wall_time_s: float, exit_code: int | None, session_id: int | None,
                    original_token_count: int, output: str) -> str:
    """Codex's unified-exec result text (``format_response``)."""
    sections = [f"Chunk ID: {chunk_id}", f"Wall time: {wall_time_s:.4f} seconds"]
    if exit_code is not None:
        sections.append(f"Process exited with code {exit_code}")
    if session_id is not None:
        sections.append(f"Process running with session ID {session_id}")
    sections += [f"Original token count: {original_token_count}", "Output:", output]
    return "\n".join(sections)


def exit_code_of(info: JobInfo) -> int:
    """The shell's way: the exit status, or 128 + N for a job a signal N ended."""
    if info.state == "killed" or info.exit_code is None:
        return 128 + info.signal if info.signal else -1
    return info.exit_code


def unknown_session(session_id: int) -> ToolOutput:
    return ToolOutput(
        text=f"write_stdin failed: Unknown session ID {session_id}: no running exec_command session has it in "
             "this sandbox (it exited and was reported, or never existed). Start a command with exec_command; "
             "the session ID is in its result while the command runs.",
        is_error=True, error=ErrorCode.INVALID_ARGUMENTS, structured={"session_id": session_id, "known": False},
    )


# ---- sessions ---------------------------------------------------------------------------------


@dataclass
class ExecSession:
    """One running job ``exec_command`` started: where its unread output begins."""

    pid: int
    tty: bool
    next_seq: int = 0
    """The seq of the first output chunk not yet returned to the model."""
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    """Held by the call reading or writing the session (calls on one session take turns)."""


class SessionTable:
    """The sessions of every sandbox this process runs tools in: sandbox id -> pid -> session.
    Thread-safe; a pid of one sandbox is never found in another."""

    def __init__(self, max_sandboxes: int = MAX_SANDBOXES) -> None:
        self._lock = threading.Lock()
        self._max_sandboxes = max_sandboxes
        self._sandboxes: OrderedDict[str, dict[int, ExecSession]] = OrderedDict()

    def _of(self, sandbox_id: str, *, create: bool = False) -> dict[int, ExecSession]:
        """The sandbox's sessions (marked most recently used); an empty dict not kept unless ``create``."""
        sessions = self._sandboxes.get(sandbox_id)
        if sessions is None:
            if not create:
                return {}
            sessions = self._sandboxes[sandbox_id] = {}
            while len(self._sandboxes) > self._max_sandboxes:
                self._sandboxes.popitem(last=False)
        self._sandboxes.move_to_end(sandbox_id)
        return sessions

    def get(self, sandbox_id: str, pid: int) -> ExecSession | None:
        with self._lock:
            return self._of(sandbox_id).get(pid)

    def add(self, sandbox_id: str, session: ExecSession) -> ExecSession:
        """Track ``session``, or return the one already tracked under its pid."""
        with self._lock:
            return self._of(sandbox_id, create=True).setdefault(session.pid, session)

    def forget(self, sandbox_id: str, pid: int) -> None:
        with self._lock:
            sessions = self._of(sandbox_id)
            sessions.pop(pid, None)
            if not sessions:
                self._sandboxes.pop(sandbox_id, None)

    def pids(self, sandbox_id: str) -> list[int]:
        with self._lock:
            return list(self._of(sandbox_id))


SESSIONS = SessionTable()


# ---- collecting a job's output ---------------------------------------------------------------


@dataclass
class Collected:
    """Output read from one job in one call, from the session's ``next_seq`` on."""

    next_seq: int
    output: bytearray = field(default_factory=bytearray)
    dropped_bytes: int = 0
    """Output the sandbox's ring buffer dropped before it was read."""
    ended: JobInfo | None = None

    def add(self, event: JobEvent, on_output: OutputSink | None = None) -> None:
        if isinstance(event, JobChunk):
            if event.seq < self.next_seq:
                return  # returned by an earlier call
            if event.seq > self.next_seq:  # missing, and no gap event said how much (the agent sends one)
                self.output += _lost_marker(None)
            self.output += event.data
            self.next_seq = event.seq + 1
            if on_output is not None and event.data:
                on_output(event.stream, event.data)
        elif isinstance(event, JobGap):
            if event.end_seq > self.next_seq:
                self.output += _lost_marker(event.dropped_bytes)
                self.dropped_bytes += event.dropped_bytes
                self.next_seq = event.end_seq
        elif isinstance(event, JobEnded):
            self.ended = event.info

    def read(self, events: Iterable[JobEvent], on_output: OutputSink | None = None) -> None:
        """Add ``events`` until the job ends or they stop (the attach's deadline)."""
        for event in events:
            self.add(event, on_output)
            if self.ended is not None:
                return


def _lost_marker(dropped_bytes: int | None) -> bytes:
    if dropped_bytes is None:
        return b"\n[... output dropped: the sandbox keeps the last 1 MiB of a session's output; poll sooner ...]\n"
    return dropped_marker(dropped_bytes).encode()


def read_output(runtime: SandboxRuntime, session: ExecSession, wait_s: float,
                on_output: OutputSink | None) -> Collected:
    """The session's output from its ``next_seq``, for up to ``wait_s`` seconds or until the job
    ends (the attach just stops at its deadline, leaving the job running); with no time to wait,
    what the sandbox holds. Raises AgentCallError (the sandbox is gone, the job forgotten)."""
    collected = Collected(session.next_seq)
    follow = wait_s > 0
    collected.read(runtime.agent.jobs.attach(session.pid, from_seq=session.next_seq, follow=follow,
                                             timeout=wait_s if follow else None), on_output)
    return collected


def respond(ctx: ToolContext, session: ExecSession, collected: Collected, *, started: float,
            max_output_tokens: int) -> ToolOutput:
    """The result text and facts for what one call read from ``session``."""
    ended = collected.ended
    exit_code = exit_code_of(ended) if ended is not None else None
    oom_killed = ended is not None and ended.oom_killed
    content = strip_terminal_codes(collected.output.decode("utf-8", errors="replace"))
    if oom_killed:
        content = f"{OOM_LINE}\n{content}"
    chunk_id = secrets.token_hex(3)
    wall_time_s = time.monotonic() - started
    session_id = session.pid if ended is None else None
    tokens = approx_tokens(len(content.encode("utf-8")))

    def text(output: str) -> str:
        return format_response(chunk_id=chunk_id, wall_time_s=wall_time_s, exit_code=exit_code,
                               session_id=session_id, original_token_count=tokens, output=output)

    shaped = truncate_tokens(content, max_output_tokens, ctx.output_budget - len(text("").encode()))
    error = ErrorCode.OOM_KILLED if oom_killed else ErrorCode.NONZERO_EXIT if exit_code else None
    return ToolOutput(
        text=text(shaped.text), is_error=error is not None, error=error,
        structured={
            "chunk_id": chunk_id, "wall_time_s": round(wall_time_s, 4), "running": ended is None,
            "session_id": session_id, "pid": session.pid, "tty": session.tty, "exit_code": exit_code,
            "oom_killed": oom_killed, "original_token_count": tokens, "truncated": shaped.truncated,
            "next_seq": collected.next_seq, "dropped_bytes": collected.dropped_bytes,
        },
        raw_bytes=len(collected.output),
    )


def _wait_s(ctx: ToolContext, yield_time_ms: int) -> float:
    return min(clamp_yield_ms(yield_time_ms) / 1000, ctx.remaining_s())


# ---- the handlers ------------------------------------------------------------------------------


def _forget_unknown(runtime: SandboxRuntime, table: SessionTable) -> None:
    """Once a sandbox has many tracked sessions, drop those its agent no longer remembers (ended
    ones it forgot, ``MAX_ENDED`` later): what is left is at most its running and remembered jobs."""
    tracked = table.pids(runtime.sandbox_id)
    if len(tracked) < MAX_SESSIONS:
        return
    known = {info.pid for info in runtime.agent.jobs.list()}
    for pid in tracked:
        if pid not in known:
            table.forget(runtime.sandbox_id, pid)


def run_exec_command(ctx: ToolContext, args: ExecCommandArgs, table: SessionTable = SESSIONS) -> ToolOutput:
    started = time.monotonic()
    runtime = ctx.runtime()
    argv = [args.shell, "-lc" if args.login else "-c", args.cmd]
    try:
        _forget_unknown(runtime, table)
        info = runtime.agent.jobs.start(argv, tag=TAG, cwd=args.workdir or "", env={**EXEC_ENV, **runtime.env},
                                        pty=args.tty, stdin=True)
    except AgentCallError as error:
        if error.reason == "BUSY":  # MAX_SESSIONS jobs run (or their buffers fill the agent's room)
            return ToolOutput(
                text=f"exec_command failed: {error.message.rstrip('.')}. End a session first (write_stdin it "
                     "\"exit\\n\" for a shell, or chars \"\\u0003\" to interrupt a command) or wait for one to exit, "
                     "then start this command again.",
                is_error=True, error=ErrorCode.TOOL_FAILED, structured={"reason": error.reason},
            )
        return agent_failure(error, started=command_may_have_started(error))
    session = ExecSession(info.pid, args.tty)
    try:
        collected = read_output(runtime, session, _wait_s(ctx, args.yield_time_ms), ctx.on_output)
    except AgentCallError as error:
        if error.grpc_code == "CANCELLED":  # the call was cancelled: nobody will ever know the session ID
            with contextlib.suppress(AgentCallError):
                runtime.agent.jobs.kill(info.pid)
        return agent_failure(error, started=True)
    session.next_seq = collected.next_seq
    if collected.ended is None:
        table.add(runtime.sandbox_id, session)
    return respond(ctx, session, collected, started=started, max_output_tokens=args.max_output_tokens)


def _take_over(runtime: SandboxRuntime, pid: int, table: SessionTable) -> ExecSession | None:
    """A running ``exec_command`` job of this sandbox the table does not know (started by another
    process), as a session reading from the oldest output still held; None if there is none."""
    try:
        info = runtime.agent.jobs.get(pid)
    except AgentCallError as error:
        if error.reason == "NO_SUCH_PROCESS":
            return None
        raise
    if info.tag != TAG or info.state != "running":
        return None
    return table.add(runtime.sandbox_id, ExecSession(pid, info.pty))


def _send(runtime: SandboxRuntime, session: ExecSession, chars: str) -> None:
    """``chars`` to the session's terminal or stdin; without a tty, a lone Ctrl-C is SIGINT and a
    trailing Ctrl-D closes stdin, as a terminal would make them."""
    jobs = runtime.agent.jobs
    if session.tty:
        jobs.write(session.pid, chars.encode())
    elif chars == CTRL_C:
        jobs.signal(session.pid, signal.SIGINT)
    elif chars.endswith(CTRL_D):
        jobs.write(session.pid, chars[:-1].encode(), close=True)
    else:
        jobs.write(session.pid, chars.encode())


def run_write_stdin(ctx: ToolContext, args: WriteStdinArgs, table: SessionTable = SESSIONS) -> ToolOutput:
    started = time.monotonic()
    runtime = ctx.runtime()
    pid = args.session_id
    try:
        session = table.get(runtime.sandbox_id, pid) or _take_over(runtime, pid, table)
    except AgentCallError as error:
        return agent_failure(error, started=True)
    if session is None:
        return unknown_session(pid)
    if not session.lock.acquire(timeout=SESSION_WAIT_S):
        return ToolOutput(text=f"write_stdin failed: session {pid} is busy with another call; try again.",
                          is_error=True, error=ErrorCode.TOOL_FAILED, structured={"session_id": pid})
    try:
        if table.get(runtime.sandbox_id, pid) is not session:  # reported as ended while this call waited
            return unknown_session(pid)
        refused: AgentCallError | None = None
        try:
            if args.chars:
                _send(runtime, session, args.chars)
        except AgentCallError as error:
            if sandbox_gone(error):
                return agent_failure(error, started=True)
            refused = error  # the job may have just ended: read on to see
        try:
            collected = read_output(runtime, session, 0 if refused else _wait_s(ctx, args.yield_time_ms),
                                    ctx.on_output)
        except AgentCallError as error:
            if error.reason == "NO_SUCH_PROCESS":  # the agent forgot it (256 ended jobs later)
                table.forget(runtime.sandbox_id, pid)
                return unknown_session(pid)
            return agent_failure(error, started=True)
        if refused is not None and collected.ended is None:
            return ToolOutput(text=f"write_stdin failed: the input could not be written to session {pid}: "
                                   f"{refused.message}", is_error=True, error=ErrorCode.TOOL_FAILED,
                              structured={"session_id": pid, "reason": refused.reason})
        session.next_seq = collected.next_seq
        if collected.ended is not None:
            table.forget(runtime.sandbox_id, pid)
        return respond(ctx, session, collected, started=started, max_output_tokens=args.max_output_tokens)
    finally:
        session.lock.release()


EXEC_COMMAND = Tool(
    ToolDefinition(
        name="exec_command",
        description=(
            "Runs a command in the sandbox (an isolated Linux machine with no network), returning its output or, "
            "when it is still running after yield_time_ms, a session ID for ongoing interaction with write_stdin."
        ),
        input_model=ExecCommandArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Exec command"),
        command_field="cmd",
        path_fields=("workdir",),
    ),
    run_exec_command,
)

WRITE_STDIN = Tool(
    ToolDefinition(
        name="write_stdin",
        description="Writes characters to an existing unified exec session and returns recent output.",
        input_model=WriteStdinArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Write to an exec session"),
    ),
    run_write_stdin,
)

UNIFIED_EXEC_TOOLS = (EXEC_COMMAND, WRITE_STDIN)
