"""exec_command and write_stdin without a sandbox: the result text, clamping, truncation, the
session table and the seq bookkeeping (harness/tools/unified_exec.py).

The handlers run against a scripted stand-in for the agent's jobs client (what it answers is
the contract of harness/engine/jobs.py); the real one is exercised in
tests/integration/test_unified_exec.py.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.calls import Action
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.policy import Policy, parse_policy
from harness.core.validation import validate_call
from harness.engine.base import SandboxRuntime
from harness.engine.jobs import JobChunk, JobEnded, JobEvent, JobGap, JobInfo, JobLive
from harness.tools import builtin_registry
from harness.tools.unified_exec import (
    EXEC_COMMAND,
    MAX_SESSIONS,
    TAG,
    WRITE_STDIN,
    Collected,
    ExecSession,
    SessionTable,
    approx_tokens,
    clamp_yield_ms,
    exit_code_of,
    format_response,
    run_exec_command,
    run_write_stdin,
    token_marker,
    truncate_tokens,
)

# ---- the result text ---------------------------------------------------------------------------


def test_format_response_of_an_exited_command():
    text = format_response(chunk_id="3fa9c1", wall_time_s=0.512, exit_code=0, session_id=None,
                           original_token_count=1, output="hi\n")
    assert text == ("Chunk ID: 3fa9c1\nWall time: 0.5120 seconds\nProcess exited with code 0\n"
                    "Original token count: 1\nOutput:\nhi\n")


def test_format_response_of_a_running_command():
    text = format_response(chunk_id="000abc", wall_time_s=10.00004, exit_code=None, session_id=4242,
                           original_token_count=0, output="")
    assert text == ("Chunk ID: 000abc\nWall time: 10.0000 seconds\nProcess running with session ID 4242\n"
                    "Original token count: 0\nOutput:\n")


@pytest.mark.parametrize(("requested", "used"), [
    (-5, 250), (0, 250), (249, 250), (250, 250), (10_000, 10_000), (30_000, 30_000), (30_001, 30_000), (10**9, 30_000),
])
def test_yield_time_is_clamped(requested: int, used: int):
    assert clamp_yield_ms(requested) == used


@pytest.mark.parametrize(("size", "tokens"), [(0, 0), (1, 1), (4, 1), (5, 2), (40_000, 10_000)])
def test_token_estimate_is_four_bytes_rounded_up(size: int, tokens: int):
    assert approx_tokens(size) == tokens


def test_exit_code_is_the_status_or_128_plus_the_signal():
    assert exit_code_of(info(1, state="exited", exit_code=3)) == 3
    assert exit_code_of(info(1, state="killed", exit_code=None, signal_=9)) == 137


# ---- truncation ---------------------------------------------------------------------------------

NUMBERS = "".join(f"{i}\n" for i in range(1, 101))  # 292 bytes, 100 lines


def test_output_within_the_token_budget_is_whole():
    assert truncate_tokens(NUMBERS, 73, 10_000).text == NUMBERS  # 73 tokens = 292 bytes
    assert not truncate_tokens(NUMBERS, 73, 10_000).truncated


def test_output_over_the_token_budget_keeps_head_and_tail_with_codex_marker():
    shaped = truncate_tokens(NUMBERS, 25, 10_000)  # 100 bytes
    assert shaped.truncated
    assert shaped.text.startswith("Total output lines: 100\n\n1\n2\n")
    assert shaped.text.endswith("99\n100\n")
    assert "tokens truncated…" in shaped.text
    assert len(shaped.text.encode()) <= 100
    head, _, rest = shaped.text.removeprefix("Total output lines: 100\n\n").partition("…")
    removed = rest.split(" ")[0]
    tail = rest.split("truncated…", 1)[1]
    assert int(removed) == approx_tokens(len(NUMBERS) - len(head) - len(tail))


def test_the_byte_budget_wins_when_smaller_than_the_tokens():
    shaped = truncate_tokens(NUMBERS, 10_000, 80)
    assert shaped.truncated and len(shaped.text.encode()) <= 80


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=0, max_size=400), tokens=st.integers(1, 120), budget=st.integers(60, 600))
def test_truncation_fits_never_splits_characters_and_keeps_the_ends(text: str, tokens: int, budget: int):
    shaped = truncate_tokens(text, tokens, budget)
    limit = min(tokens * 4, budget)
    data = shaped.text.encode("utf-8")  # decodes: no split character
    if len(text.encode()) <= limit:
        assert shaped.text == text
    else:
        body = shaped.text.split("\n\n", 1)[1]
        head, _, rest = body.partition("…")
        tail = rest.split("truncated…", 1)[1]
        assert text.startswith(head) and text.endswith(tail)
        # Only a limit too small for the line count and the marker is exceeded, keeping nothing.
        assert len(data) <= limit or head == tail == ""


def test_token_marker():
    assert token_marker(12) == "…12 tokens truncated…"


# ---- the session table ---------------------------------------------------------------------------


def test_sessions_of_one_sandbox_are_not_found_in_another():
    table = SessionTable()
    table.add("sb-a", ExecSession(7, tty=False))
    assert table.get("sb-a", 7) is not None
    assert table.get("sb-b", 7) is None
    table.forget("sb-b", 7)
    assert table.pids("sb-a") == [7]


def test_add_keeps_the_session_already_tracked():
    table = SessionTable()
    first = table.add("sb", ExecSession(7, tty=False, next_seq=5))
    assert table.add("sb", ExecSession(7, tty=False)) is first


def test_the_least_recently_used_sandbox_is_forgotten_beyond_the_cap():
    table = SessionTable(max_sandboxes=2)
    table.add("a", ExecSession(1, tty=False))
    table.add("b", ExecSession(2, tty=False))
    table.get("a", 1)  # a is used again: b is now the oldest
    table.add("c", ExecSession(3, tty=False))
    assert (table.get("a", 1) is not None, table.get("b", 2), table.get("c", 3) is not None) == (True, None, True)


def test_the_table_is_safe_across_threads():
    table = SessionTable()

    def work(n: int) -> None:
        for pid in range(200):
            table.add(f"sb-{n % 4}", ExecSession(pid, tty=False))
            table.forget(f"sb-{n % 4}", pid - 1)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(table.pids(f"sb-{n}") == [199] for n in range(4))


# ---- seq bookkeeping ------------------------------------------------------------------------------


def test_chunks_already_returned_are_skipped_and_the_cursor_follows():
    collected = Collected(next_seq=2)
    collected.read([JobChunk(1, "stdout", b"old"), JobChunk(2, "stdout", b"a"), JobChunk(3, "stderr", b"b")])
    assert (bytes(collected.output), collected.next_seq, collected.ended) == (b"ab", 4, None)


def test_a_gap_is_stated_where_it_happened():
    collected = Collected(next_seq=0)
    collected.read([JobGap(0, 5, 1234), JobChunk(5, "stdout", b"tail")])
    assert bytes(collected.output) == b"\n[... 1234 bytes of output dropped ...]\ntail"
    assert (collected.next_seq, collected.dropped_bytes) == (6, 1234)


def test_missing_chunks_without_a_gap_event_are_stated_too():
    collected = Collected(next_seq=0)
    collected.read([JobChunk(3, "stdout", b"x")])
    assert b"output dropped" in collected.output and collected.output.endswith(b"x") and collected.next_seq == 4


def test_reading_stops_at_the_end_and_streams_chunks():
    seen: list[tuple[str, bytes]] = []
    ended = info(9, state="exited", exit_code=0)
    collected = Collected(next_seq=0)
    collected.read(iter([JobChunk(0, "stdout", b"a"), JobLive(ended), JobEnded(ended), JobChunk(1, "stdout", b"z")]),
                   lambda stream, data: seen.append((stream, data)))
    assert (bytes(collected.output), collected.ended, seen) == (b"a", ended, [("stdout", b"a")])


# ---- the handlers, against a scripted jobs client -----------------------------------------------


def info(pid: int, *, state: str = "running", exit_code: int | None = None, signal_: int = 0, tag: str = TAG,
         pty: bool = False, next_seq: int = 0, oom_killed: bool = False) -> JobInfo:
    return JobInfo(pid=pid, tag=tag, command=["/bin/bash", "-lc", "x"], state=state, exit_code=exit_code,
                   signal=signal_, pty=pty, started_at=0.0, duration_s=0.0, next_seq=next_seq, output_bytes=0,
                   dropped_bytes=0, oom_killed=oom_killed)


@dataclass
class FakeJob:
    info: JobInfo
    chunks: list[bytes] = field(default_factory=list)
    written: list[tuple[bytes, bool]] = field(default_factory=list)
    signals: list[int] = field(default_factory=list)
    echo: bool = True
    """Writing a line makes the job print it back, like a REPL."""


class FakeJobs:
    """What the agent's jobs client answers, scripted: a following attach of a running job just
    stops (its deadline), an ended job's ends with JobEnded, as does a replay of an ended job;
    more than MAX_SESSIONS running jobs is BUSY."""

    def __init__(self) -> None:
        self.jobs: dict[int, FakeJob] = {}
        self.started: list[dict[str, Any]] = []
        self.next_pid = 100
        self.script: dict[str, tuple[list[bytes], str, int | None]] = {}

    def start(self, command: list[str], **options: Any) -> JobInfo:
        if sum(job.info.state == "running" for job in self.jobs.values()) >= MAX_SESSIONS:
            raise AgentCallError(f"{MAX_SESSIONS} jobs are already running in this sandbox; kill one", reason="BUSY",
                                 grpc_code="RESOURCE_EXHAUSTED", retryable=False)
        self.started.append({"command": command, **options})
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        chunks, state, code = self.script.get(command[-1], ([], "running", None))
        job = FakeJob(info(pid, state=state, exit_code=code, tag=options.get("tag", ""), pty=options["pty"]),
                      list(chunks))
        self.jobs[pid] = job
        return job.info

    def get(self, pid: int) -> JobInfo:
        if pid not in self.jobs:
            raise AgentCallError(f"no job {pid}", reason="NO_SUCH_PROCESS", grpc_code="NOT_FOUND", retryable=False)
        return self.jobs[pid].info

    def list(self) -> list[JobInfo]:
        return [job.info for job in self.jobs.values()]

    def attach(self, pid: int, *, from_seq: int = 0, follow: bool = False,
               timeout: float | None = None) -> Iterator[JobEvent]:
        job = self.jobs[pid]
        for seq in range(from_seq, len(job.chunks)):
            yield JobChunk(seq, "stdout", job.chunks[seq])
        if job.info.state != "running":
            yield JobEnded(job.info)

    def write(self, pid: int, data: bytes, *, close: bool = False) -> None:
        job = self.jobs[pid]
        if job.info.state != "running":
            raise AgentCallError("the job has ended", reason="NO_SUCH_PROCESS", grpc_code="NOT_FOUND", retryable=False)
        job.written.append((data, close))
        if job.echo and data:
            job.chunks.append(b"got " + data)

    def kill(self, pid: int) -> JobInfo:
        self.jobs[pid].info = info(pid, state="killed", signal_=9)
        return self.jobs[pid].info

    def signal(self, pid: int, signum: int) -> int:
        self.jobs[pid].signals.append(signum)
        return 1

    def end(self, pid: int, code: int) -> None:
        job = self.jobs[pid]
        job.info = info(pid, state="exited", exit_code=code)


class FakeSandbox:
    def __init__(self, sandbox_id: str, jobs: FakeJobs) -> None:
        self.sandbox_id = sandbox_id
        self.jobs = jobs

    def runtime(self) -> SandboxRuntime:
        return SandboxRuntime(self.sandbox_id, SimpleNamespace(jobs=self.jobs), {"SPEC": "1"}, "/workspace")  # type: ignore[arg-type]


class Provider:
    def __init__(self, sandbox: FakeSandbox) -> None:
        self._sandbox = sandbox

    def sandbox(self) -> FakeSandbox:
        return self._sandbox


def context(sandbox: FakeSandbox, budget: int = 30_000) -> ToolContext:
    return ToolContext(run_id="r", call_id="c", provider=Provider(sandbox), default_timeout_s=60,  # type: ignore[arg-type]
                       timeout_ceiling_s=600, output_budget=budget)


@pytest.fixture
def jobs() -> FakeJobs:
    return FakeJobs()


@pytest.fixture
def table() -> SessionTable:
    return SessionTable()


def exec_command(jobs: FakeJobs, table: SessionTable, sandbox_id: str = "sb", **arguments: Any) -> Any:
    args = validate_call(EXEC_COMMAND.definition, {"yield_time_ms": 250, **arguments})
    return run_exec_command(context(FakeSandbox(sandbox_id, jobs)), args, table)


def write_stdin(jobs: FakeJobs, table: SessionTable, sandbox_id: str = "sb", **arguments: Any) -> Any:
    args = validate_call(WRITE_STDIN.definition, arguments)
    return run_write_stdin(context(FakeSandbox(sandbox_id, jobs)), args, table)


def test_a_quick_command_reports_its_exit_and_is_not_kept(jobs: FakeJobs, table: SessionTable):
    jobs.script["echo hi"] = ([b"hi\n"], "exited", 0)
    result = exec_command(jobs, table, cmd="echo hi")
    assert result.text.startswith("Chunk ID: ")
    assert "\nProcess exited with code 0\nOriginal token count: 1\nOutput:\nhi\n" in result.text
    assert not result.is_error and result.structured["running"] is False
    assert table.pids("sb") == []
    started = jobs.started[0]
    assert started["command"] == ["/bin/bash", "-lc", "echo hi"]
    assert (started["tag"], started["pty"], started["stdin"], started["cwd"]) == (TAG, False, True, "")
    assert started["env"]["SPEC"] == "1" and started["env"]["PAGER"] == "cat"


def test_shell_login_tty_and_workdir_shape_the_job(jobs: FakeJobs, table: SessionTable):
    exec_command(jobs, table, cmd="ls", shell="/bin/sh", login=False, tty=True, workdir="/tmp")
    started = jobs.started[0]
    assert (started["command"], started["pty"], started["cwd"]) == (["/bin/sh", "-c", "ls"], True, "/tmp")


def test_a_failing_command_is_a_nonzero_exit_error(jobs: FakeJobs, table: SessionTable):
    jobs.script["false"] = ([], "exited", 1)
    result = exec_command(jobs, table, cmd="false")
    assert result.is_error and result.error == "nonzero_exit" and "Process exited with code 1" in result.text


def test_a_running_command_gets_a_session_and_write_stdin_returns_only_new_output(jobs: FakeJobs, table: SessionTable):
    jobs.script["repl"] = ([b"ready\n"], "running", None)
    first = exec_command(jobs, table, cmd="repl")
    pid = first.structured["session_id"]
    assert f"\nProcess running with session ID {pid}\n" in first.text and first.text.endswith("Output:\nready\n")
    assert not first.is_error and table.pids("sb") == [pid]

    second = write_stdin(jobs, table, session_id=pid, chars="1+1\n")
    assert jobs.jobs[pid].written == [(b"1+1\n", False)]
    assert second.text.endswith("Output:\ngot 1+1\n")  # not "ready" again
    assert second.structured["next_seq"] == 2

    polled = write_stdin(jobs, table, session_id=pid)
    assert polled.text.endswith("Output:\n") and jobs.jobs[pid].written == [(b"1+1\n", False)]

    jobs.jobs[pid].chunks.append(b"bye\n")
    jobs.end(pid, 0)
    last = write_stdin(jobs, table, session_id=pid)
    assert "Process exited with code 0" in last.text and last.text.endswith("Output:\nbye\n")
    assert "session ID" not in last.text and table.pids("sb") == []

    gone = write_stdin(jobs, table, session_id=pid, chars="x")  # reported once, then forgotten
    assert gone.is_error and gone.error == "invalid_arguments"
    assert f"Unknown session ID {pid}" in gone.text and "exec_command" in gone.text


def test_unknown_session_id_is_an_error_naming_it(jobs: FakeJobs, table: SessionTable):
    result = write_stdin(jobs, table, session_id=31337)
    assert result.is_error and "Unknown session ID 31337" in result.text
    assert "Start a command with exec_command" in result.text


def test_a_session_is_not_reachable_from_another_sandbox(jobs: FakeJobs, table: SessionTable):
    pid = exec_command(jobs, table, sandbox_id="a", cmd="repl").structured["session_id"]
    other = FakeJobs()
    assert write_stdin(other, table, sandbox_id="b", session_id=pid).is_error
    assert table.pids("a") == [pid]


def test_a_running_job_started_elsewhere_is_taken_over(jobs: FakeJobs, table: SessionTable):
    pid = exec_command(jobs, table, cmd="repl").structured["session_id"]
    jobs.jobs[pid].chunks[:] = [b"earlier\n"]
    fresh = SessionTable()  # another harness process: knows nothing of the session
    result = write_stdin(jobs, fresh, session_id=pid)
    assert "Process running" in result.text and result.text.endswith("Output:\nearlier\n")
    assert fresh.pids("sb") == [pid]


def test_jobs_not_started_by_exec_command_or_ended_are_not_taken_over(jobs: FakeJobs, table: SessionTable):
    jobs.jobs[5] = FakeJob(info(5, tag="server"))
    jobs.jobs[6] = FakeJob(info(6, state="exited", exit_code=0))
    assert write_stdin(jobs, table, session_id=5).is_error
    assert write_stdin(jobs, table, session_id=6).is_error


def test_ctrl_c_and_ctrl_d_without_a_tty(jobs: FakeJobs, table: SessionTable):
    pid = exec_command(jobs, table, cmd="cat").structured["session_id"]
    write_stdin(jobs, table, session_id=pid, chars="\u0003")
    assert jobs.jobs[pid].signals == [signal.SIGINT] and jobs.jobs[pid].written == []
    write_stdin(jobs, table, session_id=pid, chars="last line\n\u0004")
    assert jobs.jobs[pid].written == [(b"last line\n", True)]


def test_on_a_tty_control_characters_go_to_the_terminal(jobs: FakeJobs, table: SessionTable):
    pid = exec_command(jobs, table, cmd="bash -i", tty=True).structured["session_id"]
    write_stdin(jobs, table, session_id=pid, chars="\u0003")
    assert jobs.jobs[pid].written == [(b"\x03", False)] and jobs.jobs[pid].signals == []


def test_input_to_a_job_that_just_ended_reports_the_exit(jobs: FakeJobs, table: SessionTable):
    pid = exec_command(jobs, table, cmd="repl").structured["session_id"]
    jobs.end(pid, 2)
    result = write_stdin(jobs, table, session_id=pid, chars="more\n")
    assert "Process exited with code 2" in result.text and table.pids("sb") == []


def test_at_most_max_sessions_run_per_sandbox(jobs: FakeJobs, table: SessionTable):
    pids = [exec_command(jobs, table, cmd="repl").structured["session_id"] for _ in range(MAX_SESSIONS)]
    refused = exec_command(jobs, table, cmd="repl")
    assert refused.is_error and refused.text.startswith(f"exec_command failed: {MAX_SESSIONS} jobs are already running")
    assert "End a session first" in refused.text
    assert len(jobs.started) == MAX_SESSIONS
    assert not exec_command(FakeJobs(), table, sandbox_id="other", cmd="repl").is_error  # per sandbox
    jobs.end(pids[0], 0)  # an ended session frees its place
    assert not exec_command(jobs, table, cmd="repl").is_error
    del jobs.jobs[pids[0]]  # the agent forgot it: so does the table, once it is that full
    exec_command(jobs, table, cmd="repl")
    assert pids[0] not in table.pids("sb") and pids[1] in table.pids("sb")


def test_output_is_truncated_to_max_output_tokens(jobs: FakeJobs, table: SessionTable):
    jobs.script["big"] = ([NUMBERS.encode()], "exited", 0)
    result = exec_command(jobs, table, cmd="big", max_output_tokens=25)
    assert "Original token count: 73\nOutput:\nTotal output lines: 100\n\n1\n" in result.text
    assert "tokens truncated…" in result.text and result.text.endswith("100\n") and result.structured["truncated"]


def test_the_whole_text_stays_within_the_output_budget(jobs: FakeJobs, table: SessionTable):
    jobs.script["big"] = ([b"x" * 5000], "exited", 0)
    args = validate_call(EXEC_COMMAND.definition, {"cmd": "big", "yield_time_ms": 250})
    result = run_exec_command(context(FakeSandbox("sb", jobs), budget=1000), args, table)
    assert len(result.text.encode()) <= 1000 and "tokens truncated" in result.text


def test_a_start_refused_by_the_agent_is_an_error_result(jobs: FakeJobs, table: SessionTable):
    def refuse(command: list[str], **options: Any) -> JobInfo:
        raise AgentCallError("no such file: /bin/zsh", reason="SPAWN_FAILED", grpc_code="FAILED_PRECONDITION",
                             retryable=False)

    jobs.start = refuse  # type: ignore[method-assign]
    result = exec_command(jobs, table, cmd="ls", shell="/bin/zsh")
    assert result.is_error and result.error == "tool_failed" and "/bin/zsh" in result.text


def test_a_cancelled_exec_command_kills_its_job(jobs: FakeJobs, table: SessionTable):
    def cancelled(pid: int, **options: Any) -> Iterator[JobEvent]:
        raise AgentCallError("Cancelled", reason="UNSPECIFIED", grpc_code="CANCELLED", retryable=False)
        yield

    jobs.attach = cancelled  # type: ignore[method-assign]
    result = exec_command(jobs, table, cmd="sleep 600")
    assert result.is_error and table.pids("sb") == []
    assert [job.info.state for job in jobs.jobs.values()] == ["killed"]


# ---- registration and policy -----------------------------------------------------------------------


def test_both_tools_are_built_in_and_exposed_by_default():
    registry = builtin_registry()
    assert {"exec_command", "write_stdin"} <= set(registry.exposed_names(Policy()))


def test_schemas_match_codex_argument_names():
    exec_schema = EXEC_COMMAND.definition.input_schema("plain")
    assert list(exec_schema["properties"]) == ["cmd", "workdir", "shell", "login", "tty", "yield_time_ms",
                                               "max_output_tokens"]
    assert exec_schema["required"] == ["cmd"]
    write_schema = WRITE_STDIN.definition.input_schema("plain")
    assert list(write_schema["properties"]) == ["session_id", "chars", "yield_time_ms", "max_output_tokens"]
    assert write_schema["required"] == ["session_id"]
    assert write_schema["properties"]["session_id"]["type"] == "integer"
    strict = EXEC_COMMAND.definition.input_schema("strict")
    assert sorted(strict["required"]) == sorted(strict["properties"]) and strict["additionalProperties"] is False


def test_policy_command_rules_apply_to_exec_command_cmd():
    policy = parse_policy('[[tools.exec_command.rules]]\naction = "deny"\ncommand = "*rm -rf*"\n')
    assert policy.decide(EXEC_COMMAND.definition, {"cmd": "cd x && rm -rf /tmp/x"}).action is Action.DENY
    assert policy.decide(EXEC_COMMAND.definition, {"cmd": "ls"}).action is not Action.DENY
