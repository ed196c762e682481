"""The real ProcessRunner on this host (no container): output, stdin, caps, deadlines, tree kills.

Tree kills rely on the marker supplementary group, which only root can set: those tests
skip when not running as root. Waits are on events (a pidfd, a queue, a threading.Event),
each bounded, never sleep-then-check.
"""

from __future__ import annotations

import os
import queue
import select
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox import proctree
from sandbox.errors import AgentError
from sandbox.process import BASE_ENV, Execution, ProcessRunner
from sandbox.v1 import errors_pb2, process_pb2

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set supplementary groups")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def runner(workspace: Path) -> ProcessRunner:
    return ProcessRunner(user=None, workspace=str(workspace))


@dataclass
class Run:
    events: list[process_pb2.ExecEvent] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def started(self) -> process_pb2.Started:
        assert self.events[0].WhichOneof("event") == "started"
        return self.events[0].started

    @property
    def outputs(self) -> list[process_pb2.Output]:
        return [e.output for e in self.events if e.WhichOneof("event") == "output"]

    @property
    def exited(self) -> process_pb2.Exited:
        assert self.events[-1].WhichOneof("event") == "exited"
        return self.events[-1].exited

    def data(self, stream: str) -> bytes:
        return b"".join(getattr(o, stream) for o in self.outputs if o.WhichOneof("data") == stream)

    @property
    def stdout(self) -> bytes:
        return self.data("stdout")

    @property
    def stderr(self) -> bytes:
        return self.data("stderr")


def run(
    runner: ProcessRunner,
    request: process_pb2.ExecRequest,
    on_start: Callable[[Execution], None] | None = None,
) -> Run:
    result = Run()
    t0 = time.monotonic()
    result.events = list(runner.run(request, on_start=on_start))
    result.seconds = time.monotonic() - t0
    return result


def shell(command: str, **kwargs: object) -> process_pb2.ExecRequest:
    return process_pb2.ExecRequest(shell=command, **kwargs)  # type: ignore[arg-type]


def argv(*args: str, **kwargs: object) -> process_pb2.ExecRequest:
    return process_pb2.ExecRequest(argv=process_pb2.Argv(args=list(args)), **kwargs)  # type: ignore[arg-type]


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait (on the process's pidfd) until it has exited; True if it did within the timeout."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def live_and_marked(pid: int, marker: int) -> bool:
    """True if the pid is a live (non-zombie) process carrying the marker group."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    state = fields.get("State", "").split()[:1]
    groups = {int(g) for g in fields.get("Groups", "").split()}
    return state != ["Z"] and marker in groups


def read_pid(path: Path) -> int:
    assert path.exists(), f"{path.name} was never written: the command did not get that far"
    return int(path.read_text().split()[0])


class Background:
    """Consume runner.run() in a thread, pushing events to a queue."""

    def __init__(self, runner: ProcessRunner, request: process_pb2.ExecRequest) -> None:
        self.events: queue.Queue[process_pb2.ExecEvent | BaseException | None] = queue.Queue()
        self.started = threading.Event()
        self.execution: Execution | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._consume, args=(runner, request), daemon=True)

    def _on_start(self, execution: Execution) -> None:
        self.execution = execution
        self.started.set()

    def _consume(self, runner: ProcessRunner, request: process_pb2.ExecRequest) -> None:
        try:
            for event in runner.run(request, on_start=self._on_start):
                self.events.put(event)
        except BaseException as exc:  # handed to the test thread
            self.events.put(exc)
        finally:
            self.events.put(None)
            self.done.set()

    def start(self) -> Background:
        self._thread.start()
        assert self.started.wait(timeout=10), "the command never started"
        return self

    def next_event(self, timeout: float = 10.0) -> process_pb2.ExecEvent | None:
        item = self.events.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        return item

    def wait_for_stdout(self, needle: bytes, timeout: float = 10.0) -> bytes:
        seen = b""
        deadline = time.monotonic() + timeout
        while needle not in seen:
            event = self.next_event(timeout=max(0.0, deadline - time.monotonic()))
            assert event is not None, f"stream ended before {needle!r}; got {seen!r}"
            if event.WhichOneof("event") == "output":
                seen += event.output.stdout
        return seen

    def rest(self, timeout: float = 10.0) -> list[process_pb2.ExecEvent]:
        out = []
        deadline = time.monotonic() + timeout
        while True:
            event = self.next_event(timeout=max(0.0, deadline - time.monotonic()))
            if event is None:
                return out
            out.append(event)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


# ---- running commands --------------------------------------------------------------------


def test_argv_command(runner: ProcessRunner) -> None:
    r = run(runner, argv("echo", "hello", "world $HOME"))
    assert r.stdout == b"hello world $HOME\n"
    assert r.exited.exit_code == 0
    assert r.exited.signal == 0


def test_shell_command(runner: ProcessRunner) -> None:
    r = run(runner, shell("x=4; echo $((x * 10)) | tr 0 2"))
    assert r.stdout == b"42\n"


def test_event_order_and_started(runner: ProcessRunner) -> None:
    r = run(runner, shell("echo a; echo b >&2; echo c", exec_id="my-id"))
    kinds = [e.WhichOneof("event") for e in r.events]
    assert kinds[0] == "started"
    assert kinds[-1] == "exited"
    assert set(kinds[1:-1]) == {"output"}
    assert r.started.exec_id == "my-id"
    assert r.started.pid > 0
    assert [o.seq for o in r.outputs] == list(range(len(r.outputs)))


def test_exec_id_is_generated_when_empty(runner: ProcessRunner) -> None:
    a = run(runner, argv("true")).started.exec_id
    b = run(runner, argv("true")).started.exec_id
    assert a and b and a != b


def test_non_zero_exit_is_data(runner: ProcessRunner) -> None:
    r = run(runner, shell("echo partial; exit 42"))
    assert r.exited.exit_code == 42
    assert r.exited.signal == 0
    assert r.exited.timed_out is False
    assert r.exited.oom_killed is False
    assert r.stdout == b"partial\n"


def test_death_by_signal_is_reported(runner: ProcessRunner) -> None:
    r = run(runner, shell("kill -KILL $$"))
    assert r.exited.signal == signal.SIGKILL
    assert r.exited.exit_code == -1
    assert r.exited.timed_out is False


def test_stdout_and_stderr_are_separate(runner: ProcessRunner) -> None:
    r = run(runner, shell("echo out1; echo err1 >&2; echo out2; printf err2 >&2"))
    assert r.stdout == b"out1\nout2\n"
    assert r.stderr == b"err1\nerr2"
    assert r.exited.stdout.total_bytes == 10
    assert r.exited.stderr.total_bytes == 9
    assert r.exited.stdout.dropped_bytes == 0


def test_binary_output_is_exact(runner: ProcessRunner) -> None:
    r = run(runner, shell(r"printf '\x00\xff\xfe\n\x01'"))
    assert r.stdout == b"\x00\xff\xfe\n\x01"


def test_cwd_defaults_to_the_workspace(runner: ProcessRunner, workspace: Path) -> None:
    assert run(runner, argv("pwd")).stdout.decode().strip() == str(workspace)


def test_cwd_from_the_request(runner: ProcessRunner, tmp_path: Path) -> None:
    other = tmp_path / "other"
    other.mkdir()
    assert run(runner, argv("pwd", cwd=str(other))).stdout.decode().strip() == str(other)


def test_environment_is_minimal_plus_the_request(runner: ProcessRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBOX_HOST_SECRET", "leak")
    r = run(runner, argv("env", env={"FOO": "bar baz"}))
    env = dict(line.split("=", 1) for line in r.stdout.decode().splitlines())
    assert env["FOO"] == "bar baz"
    assert env["PATH"] == BASE_ENV["PATH"]
    assert env["LANG"] == "C.UTF-8"
    assert "CALLBOX_HOST_SECRET" not in env
    assert set(env) == {*BASE_ENV, "FOO"}


def test_stdin_is_delivered_in_full(runner: ProcessRunner) -> None:
    data = os.urandom(1 << 20)
    r = run(runner, argv("cat", stdin=data, output_cap_bytes=4 << 20))
    assert r.exited.exit_code == 0
    assert r.exited.stdout.total_bytes == len(data)
    assert r.stdout == data


def test_stdin_not_read_by_the_command_does_not_hang(runner: ProcessRunner) -> None:
    r = run(runner, argv("true", stdin=os.urandom(1 << 20)))
    assert r.exited.exit_code == 0
    assert r.seconds < 5


def test_no_stdin_means_end_of_file(runner: ProcessRunner) -> None:
    r = run(runner, shell("cat; echo rc=$?"))
    assert r.stdout == b"rc=0\n"


# ---- output cap ----------------------------------------------------------------------------


def test_output_cap_keeps_head_and_tail_with_the_exact_dropped_count(runner: ProcessRunner) -> None:
    r = run(runner, shell("head -c 10000000 /dev/zero", output_cap_bytes=1000))
    assert r.exited.exit_code == 0
    assert r.exited.stdout.total_bytes == 10_000_000
    assert r.exited.stdout.dropped_bytes == 9_999_000
    gaps = [o for o in r.outputs if o.dropped_before]
    assert len(gaps) == 1
    assert gaps[0].dropped_before == 9_999_000
    assert len(gaps[0].stdout) == 500
    assert gaps[0] is r.outputs[-1]
    assert len(r.stdout) == 1000
    assert r.stdout == b"\0" * 1000


def test_output_cap_places_the_right_bytes(runner: ProcessRunner) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 200_001)).encode()
    r = run(runner, shell("seq 1 200000", output_cap_bytes=1001))
    head = b"".join(o.stdout for o in r.outputs if not o.dropped_before)
    tail = b"".join(o.stdout for o in r.outputs if o.dropped_before)
    assert head == expected[:501]
    assert tail == expected[-500:]
    assert r.exited.stdout.dropped_bytes == len(expected) - 1001
    assert r.exited.stdout.total_bytes == len(expected)


def test_output_cap_applies_per_stream(runner: ProcessRunner) -> None:
    r = run(runner, shell("head -c 5000 /dev/zero; head -c 50 /dev/zero >&2", output_cap_bytes=100))
    assert r.exited.stdout.dropped_bytes == 4900
    assert r.exited.stderr.dropped_bytes == 0
    assert len(r.stderr) == 50


def test_output_under_the_cap_is_not_truncated(runner: ProcessRunner) -> None:
    r = run(runner, shell("seq 1 100", output_cap_bytes=1 << 20))
    assert r.stdout == "".join(f"{i}\n" for i in range(1, 101)).encode()
    assert all(o.dropped_before == 0 for o in r.outputs)


# ---- deadlines and tree kills ---------------------------------------------------------------


@needs_root
def test_running_command_carries_the_marker_group(runner: ProcessRunner) -> None:
    markers: list[int] = []
    r = run(runner, shell("grep ^Groups: /proc/self/status"), on_start=lambda e: markers.append(e.marker))
    assert markers
    groups = {int(g) for g in r.stdout.decode().split()[1:]}
    assert markers[0] in groups


@needs_root
def test_timeout_kills_the_whole_tree(runner: ProcessRunner, workspace: Path) -> None:
    # A child that traps SIGTERM and keeps running, a double-forked setsid daemon, and a
    # leader that ignores SIGTERM (set last: an ignored signal cannot be trapped by children).
    script = """
        bash -c 'trap "echo seen > term.seen" TERM; echo $$ > child.pid; while :; do sleep 1; done' &
        ( setsid bash -c 'echo $$ > daemon.pid; exec sleep 100' & )
        trap '' TERM
        while [ ! -s child.pid ] || [ ! -s daemon.pid ]; do sleep 0.01; done
        echo ready
        sleep 100
    """
    markers: list[int] = []
    timeout_ms = 1500
    r = run(
        runner,
        shell(script, timeout_ms=timeout_ms, kill_grace_ms=300),
        on_start=lambda e: markers.append(e.marker),
    )
    marker = markers[0]
    assert r.stdout == b"ready\n"
    assert r.exited.timed_out is True
    assert r.exited.oom_killed is False
    # The leader ignored SIGTERM, so the grace ran out and it was SIGKILLed.
    assert r.exited.signal == signal.SIGKILL
    assert r.exited.exit_code == -1
    assert r.seconds < timeout_ms / 1000 + 2
    assert r.exited.duration.ToNanoseconds() / 1e9 < timeout_ms / 1000 + 2
    assert r.exited.duration.ToNanoseconds() / 1e9 >= timeout_ms / 1000 - 0.05

    # SIGTERM went to a child, not only the leader.
    assert (workspace / "term.seen").exists()
    for name in ("child.pid", "daemon.pid"):
        pid = read_pid(workspace / name)
        assert wait_gone(pid, timeout=2), f"{name} ({pid}) survived the timeout"
        assert not live_and_marked(pid, marker)
        if Path(f"/proc/{pid}").exists():  # a zombie not yet reaped by its new parent
            assert "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
        else:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    assert list(proctree.marked_pids(marker)) == []


def test_timeout_of_a_command_that_dies_of_sigterm(runner: ProcessRunner) -> None:
    r = run(runner, argv("sleep", "100", timeout_ms=300))
    assert r.exited.timed_out is True
    assert r.exited.signal == signal.SIGTERM
    assert r.seconds < 0.3 + 2


def test_command_finishing_before_the_deadline_is_not_timed_out(runner: ProcessRunner) -> None:
    r = run(runner, argv("true", timeout_ms=5000))
    assert r.exited.timed_out is False
    assert r.seconds < 2


@needs_root
def test_background_process_is_killed_when_the_leader_exits(runner: ProcessRunner, workspace: Path) -> None:
    markers: list[int] = []
    gen = runner.run(shell("sleep 100 & echo $! > bg.pid; echo done"), on_start=lambda e: markers.append(e.marker))
    t0 = time.monotonic()
    events = []
    try:
        for event in gen:
            events.append(event)
            if event.WhichOneof("event") == "exited":
                # Killed when the leader exited, before the stream ended, not only at cleanup.
                bg = read_pid(workspace / "bg.pid")
                assert wait_gone(bg, timeout=1), "the background sleep outlived its command"
                assert not live_and_marked(bg, markers[0])
    finally:
        gen.close()
    elapsed = time.monotonic() - t0
    assert events[-1].exited.exit_code == 0
    assert b"".join(e.output.stdout for e in events if e.WhichOneof("event") == "output") == b"done\n"
    # It held the stdout pipe: without the kill the agent would wait out the 2 s drain limit.
    assert elapsed < 1.5


# ---- errors ----------------------------------------------------------------------------------


def _reason(exc: pytest.ExceptionInfo[AgentError]) -> int:
    return int(exc.value.reason)


def test_spawn_failure_missing_executable(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, argv("/nonexistent/definitely-not-here", exec_id="spawn-1"))
    assert _reason(info) == errors_pb2.ERROR_REASON_SPAWN_FAILED
    assert info.value.message == "/nonexistent/definitely-not-here: no such file or directory"
    # Nothing is left registered under that id.
    with pytest.raises(AgentError) as again:
        runner.signal("spawn-1", signal.SIGTERM)
    assert _reason(again) == errors_pb2.ERROR_REASON_NO_SUCH_PROCESS


def test_spawn_failure_not_executable(runner: ProcessRunner, workspace: Path) -> None:
    script = workspace / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(AgentError) as info:
        run(runner, argv(str(script)))
    assert _reason(info) == errors_pb2.ERROR_REASON_SPAWN_FAILED
    assert info.value.message == (f"{script}: permission denied: the file is not executable (no x permission); "
                                  f"`chmod +x {script}`, or run it with its interpreter (e.g. `sh {script}`)")


def _spawn_failure(runner: ProcessRunner, *args: str) -> str:
    with pytest.raises(AgentError) as info:
        run(runner, argv(*args))
    assert _reason(info) == errors_pb2.ERROR_REASON_SPAWN_FAILED
    return info.value.message


def test_spawn_failure_words_it_as_a_shell_would(runner: ProcessRunner, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    script = workspace / "lost.sh"
    script.write_text("#!/no/such/interpreter\necho hi\n")
    script.chmod(0o755)
    assert _spawn_failure(runner, "/etc") == "/etc: is a directory, not a program"
    assert _spawn_failure(runner, "./sub") == "./sub: is a directory, not a program"
    assert _spawn_failure(runner, "no-such-command-here") == "no-such-command-here: command not found"
    assert _spawn_failure(runner, "./nothing") == "./nothing: no such file or directory"
    assert _spawn_failure(runner, "./lost.sh") == (
        "./lost.sh: cannot run it: its interpreter /no/such/interpreter (its #! line) does not exist in the sandbox")


def test_which_spawn_failures_are_a_missing_program() -> None:
    from sandbox.errors import program_missing

    assert program_missing("nosuch: command not found") and program_missing("./x: no such file or directory")
    assert not program_missing("/etc: is a directory, not a program")
    assert not program_missing("./x: cannot run it: its interpreter /x (its #! line) does not exist in the sandbox")


def test_missing_cwd_is_a_spawn_failure(runner: ProcessRunner, tmp_path: Path) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, argv("true", cwd=str(tmp_path / "missing")))
    assert _reason(info) == errors_pb2.ERROR_REASON_SPAWN_FAILED
    assert "does not exist" in info.value.message


def test_cwd_that_is_a_file_is_a_spawn_failure(runner: ProcessRunner, workspace: Path) -> None:
    (workspace / "f").write_text("x")
    with pytest.raises(AgentError) as info:
        run(runner, argv("true", cwd=str(workspace / "f")))
    assert _reason(info) == errors_pb2.ERROR_REASON_SPAWN_FAILED


def test_empty_request_is_invalid(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, process_pb2.ExecRequest())
    assert _reason(info) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


def test_empty_argv_is_invalid(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, process_pb2.ExecRequest(argv=process_pb2.Argv()))
    assert _reason(info) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


def test_nul_in_argv_is_invalid(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, argv("echo", "a\0b"))
    assert _reason(info) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


def test_timeout_above_the_maximum_is_invalid(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        run(runner, argv("true", timeout_ms=25 * 3600 * 1000))
    assert _reason(info) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


def test_signal_to_an_unknown_exec_id(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        runner.signal("nobody", signal.SIGTERM)
    assert _reason(info) == errors_pb2.ERROR_REASON_NO_SUCH_PROCESS
    assert "nobody" in info.value.message


def test_signal_with_a_bad_number(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as info:
        runner.signal("nobody", 9999)
    assert _reason(info) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


# ---- Signal and cancellation of a running command --------------------------------------------


@needs_root
def test_signal_delivers_sigterm_to_a_running_command(runner: ProcessRunner) -> None:
    # The leader traps SIGTERM and then waits for its background child, which traps it too:
    # the command only ends (and prints both lines) if the signal reached the whole group.
    script = """
        trap 'echo got-term' TERM
        bash -c 'trap "echo child-term; exit 3" TERM; echo ready; while :; do sleep 1; done' &
        wait
        wait
        exit 7
    """
    bg = Background(runner, shell(script, exec_id="sig-1", timeout_ms=30_000)).start()
    try:
        seen = bg.wait_for_stdout(b"ready")
        t0 = time.monotonic()
        delivered = runner.signal("sig-1", signal.SIGTERM)
        rest = bg.rest(timeout=10)
    finally:
        if bg.execution is not None:
            bg.execution.cancel()
        bg.join(10)
    # Several processes were alive; one may be gone by the time the scan reaches it.
    assert delivered >= 1
    assert time.monotonic() - t0 < 5
    exited = rest[-1].exited
    out = seen + b"".join(e.output.stdout for e in rest if e.WhichOneof("event") == "output")
    assert b"got-term\n" in out
    assert b"child-term\n" in out
    assert exited.exit_code == 7
    assert exited.timed_out is False
    # Done: the id is no longer known.
    with pytest.raises(AgentError) as info:
        runner.signal("sig-1", signal.SIGTERM)
    assert int(info.value.reason) == errors_pb2.ERROR_REASON_NO_SUCH_PROCESS


@needs_root
def test_signal_ends_a_plain_command(runner: ProcessRunner) -> None:
    bg = Background(runner, argv("sleep", "100", exec_id="sig-2")).start()
    try:
        assert runner.signal("sig-2", signal.SIGTERM) == 1
        rest = bg.rest(timeout=10)
    finally:
        if bg.execution is not None:
            bg.execution.cancel()
        bg.join(10)
    assert rest[-1].exited.signal == signal.SIGTERM
    assert rest[-1].exited.exit_code == -1
    assert rest[-1].exited.timed_out is False


def test_duplicate_exec_id_is_refused_while_running(runner: ProcessRunner) -> None:
    bg = Background(runner, argv("sleep", "100", exec_id="dup")).start()
    try:
        with pytest.raises(AgentError) as info:
            run(runner, argv("true", exec_id="dup"))
        assert int(info.value.reason) == errors_pb2.ERROR_REASON_INVALID_ARGUMENT
        assert "already running" in info.value.message
    finally:
        assert bg.execution is not None
        bg.execution.cancel()
        bg.join(10)
    assert bg.done.is_set()


def test_cancel_kills_the_command_promptly(runner: ProcessRunner) -> None:
    bg = Background(runner, argv("sleep", "100", timeout_ms=60_000))
    t0 = time.monotonic()
    bg.start()
    assert bg.execution is not None
    bg.execution.cancel()
    assert bg.done.wait(timeout=5), "the command outlived its cancellation"
    elapsed = time.monotonic() - t0
    rest = bg.rest(timeout=1)
    exited = rest[-1].exited
    assert exited.signal == signal.SIGKILL
    assert exited.timed_out is False
    assert elapsed < 5
    pid = rest[0].started.pid
    assert wait_gone(pid, timeout=1)


def test_cancel_all_kills_every_running_command(runner: ProcessRunner) -> None:
    runs = [Background(runner, argv("sleep", "100", exec_id=f"all-{i}")).start() for i in range(3)]
    runner.cancel_all()
    for bg in runs:
        assert bg.done.wait(timeout=5)
        assert bg.rest(timeout=1)[-1].exited.signal == signal.SIGKILL


def test_stop_ends_running_commands_with_an_error_not_an_exit_and_refuses_new_ones(runner: ProcessRunner) -> None:
    # The agent is stopping (SIGTERM from `docker stop` or a daemon shutdown): a killed
    # command must not look like one that died of its own SIGKILL.
    bg = Background(runner, argv("sleep", "100", exec_id="stopping")).start()
    assert bg.next_event().WhichOneof("event") == "started"
    runner.stop("its container is being stopped")
    assert bg.done.wait(timeout=5)
    with pytest.raises(AgentError) as info:
        bg.next_event(timeout=1)
    assert info.value.code.name == "UNAVAILABLE"
    assert info.value.message == "the sandbox is stopping (its container is being stopped); the command was killed"
    with pytest.raises(AgentError, match="the sandbox is stopping"):
        run(runner, argv("true"))


def test_cancel_after_the_command_finished_is_harmless(runner: ProcessRunner) -> None:
    executions: list[Execution] = []
    r = run(runner, argv("true"), on_start=executions.append)
    executions[0].cancel()  # the wake pipe is closed: must not raise or write to a reused fd
    assert executions[0].cancelled.is_set()
    assert r.exited.exit_code == 0
