"""The real ShellManager on this host (no container): persistence, status channel, restart, timeouts.

Sessions run ``bash`` with the DirectLauncher (one test goes through the pre-forked
spawner). Killing a whole tree through the marker group needs root; without it only the
process group is killed, which covers background jobs but not ``setsid`` escapes (that
test is skipped). Waits are on events (pidfds, FIFOs, queues), each bounded.
"""

from __future__ import annotations

import os
import queue
import select
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sandbox.errors import AgentError
from sandbox.launch import SpawnerLauncher
from sandbox.shell import (
    CANCELLED_MESSAGE,
    STATUS_FD,
    RunToken,
    SessionBroken,
    ShellManager,
    ended_message,
    parse_status,
    timeout_message,
    wrap_command,
)
from sandbox.spawner import Spawner
from sandbox.v1 import errors_pb2, shell_pb2

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to set supplementary groups")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    return ws


@pytest.fixture
def manager(workspace: Path, tmp_path: Path) -> Iterator[ShellManager]:
    runtime = tmp_path / "rt"
    runtime.mkdir()
    m = ShellManager(None, str(workspace), runtime_dir=str(runtime))
    try:
        yield m
    finally:
        m.close_all()


@dataclass
class Result:
    stdout: bytes = b""
    stderr: bytes = b""
    outputs: list[shell_pb2.ShellEvent] = field(default_factory=list)
    done: shell_pb2.ShellDone | None = None


def run(manager: ShellManager, command: str, timeout_ms: int = 10_000, cap: int = 0,
        session_id: str = "", on_start: Callable[[RunToken], None] | None = None) -> Result:
    request = shell_pb2.ShellRunRequest(
        session_id=session_id, command=command, timeout_ms=timeout_ms, output_cap_bytes=cap
    )
    return run_request(manager, request, on_start)


def run_request(manager: ShellManager, request: shell_pb2.ShellRunRequest,
                on_start: Callable[[RunToken], None] | None = None) -> Result:
    result = Result()
    for event in manager.run(request, on_start):
        if event.WhichOneof("event") == "output":
            result.outputs.append(event)
            which = event.output.WhichOneof("data")
            assert which is not None
            setattr(result, which, getattr(result, which) + getattr(event.output, which))
        else:
            assert result.done is None, "more than one ShellDone"
            result.done = event.done
    assert result.done is not None, "the stream ended without ShellDone"
    return result


def gone(pid: int, timeout: float = 10.0) -> bool:
    """Wait on the pid's pidfd until it has exited (a zombie counts as gone)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
        return bool(readable)
    finally:
        os.close(fd)


def read_fifo(path: Path, timeout: float = 10.0) -> bytes:
    """Block (bounded) until a writer has opened the FIFO, written and closed it; return the bytes."""
    box: queue.Queue[bytes] = queue.Queue()
    threading.Thread(target=lambda: box.put(path.read_bytes()), daemon=True).start()
    return box.get(timeout=timeout)


# ---- pure parts ----------------------------------------------------------------------


def test_wrap_command_quotes_for_ansi_c_strings() -> None:
    line = wrap_command(b"echo 'a' \\ b\nnext\r")
    assert line.startswith(b"builtin eval $'echo \\'a\\' \\\\ b\\nnext\\r'")
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert f"{STATUS_FD}>&-".encode() in line


def test_parse_status_takes_one_record_at_a_time() -> None:
    buf = bytearray(b"0\0/tmp\0")
    assert parse_status(buf) == (0, "/tmp")
    assert buf == b""
    buf = bytearray(b"12\0/a b\0" + b"3")
    assert parse_status(buf) == (12, "/a b")
    assert buf == b"3"
    assert parse_status(buf) is None
    buf += b"\0/x"
    assert parse_status(buf) is None
    buf += b"\0"
    assert parse_status(buf) == (3, "/x")


def test_messages_match_the_published_wording() -> None:
    assert timeout_message(120_000) == "timed out: bash has not returned in 120.0 seconds and must be restarted"
    assert timeout_message(1500) == "timed out: bash has not returned in 1.5 seconds and must be restarted"
    assert ended_message(0).startswith("bash has exited with returncode 0")


# ---- persistence -----------------------------------------------------------------------


def test_state_survives_between_commands(manager: ShellManager, workspace: Path, tmp_path: Path) -> None:
    first = run(manager, f"cd {tmp_path}; export X=41; f() {{ echo fn-$1; }}; y=local-var")
    assert first.done is not None and first.done.exit_code == 0
    assert first.done.cwd == str(tmp_path)
    second = run(manager, "pwd; echo $((X + 1)); f arg; echo $y")
    assert second.stdout == f"{tmp_path}\n42\nfn-arg\nlocal-var\n".encode()
    assert second.done is not None and second.done.cwd == str(tmp_path)


def test_starts_in_the_workspace(manager: ShellManager, workspace: Path) -> None:
    r = run(manager, "pwd")
    assert r.stdout == f"{workspace}\n".encode()


def test_env_is_added_when_the_shell_starts(manager: ShellManager) -> None:
    request = shell_pb2.ShellRunRequest(command="echo $EXTRA-$PATH", env={"EXTRA": "one"})
    r = run_request(manager, request)
    assert r.stdout.startswith(b"one-/usr/local/sbin")
    # Ignored once the shell runs.
    r = run_request(manager, shell_pb2.ShellRunRequest(command="echo $EXTRA", env={"EXTRA": "two"}))
    assert r.stdout == b"one\n"
    manager.restart("", {"EXTRA": "three"})
    assert run(manager, "echo $EXTRA").stdout == b"three\n"
    with pytest.raises(AgentError):
        manager.restart("", {"A=B": "x"})


def test_exit_status_and_streams(manager: ShellManager) -> None:
    r = run(manager, "echo out; echo err >&2; (exit 7)")
    assert (r.stdout, r.stderr) == (b"out\n", b"err\n")
    assert r.done is not None and r.done.exit_code == 7
    assert not r.done.timed_out and not r.done.session_ended
    assert r.done.stdout.total_bytes == 4 and r.done.stderr.total_bytes == 4


def test_empty_output_and_empty_command(manager: ShellManager) -> None:
    for command in ("true", "", "   "):
        r = run(manager, command)
        assert (r.stdout, r.stderr, r.outputs) == (b"", b"", [])
        assert r.done is not None and r.done.exit_code == 0


def test_syntax_errors_stay_inside_the_command(manager: ShellManager) -> None:
    r = run(manager, "echo 'unterminated")
    assert r.done is not None and r.done.exit_code == 2
    assert b"unexpected EOF" in r.stderr
    r = run(manager, "if")
    assert r.done is not None and r.done.exit_code == 2
    assert run(manager, "echo still-here").stdout == b"still-here\n"


def test_loop_and_function_keywords_cannot_escape_the_wrapper(manager: ShellManager) -> None:
    r = run(manager, "break; continue; return 3; echo after")
    assert r.stdout == b"after\n"
    assert run(manager, "echo alive").stdout == b"alive\n"


def test_here_documents_quotes_and_backslashes(manager: ShellManager) -> None:
    command = "cat <<'EOF'\nit's a \\n literal $HOME\nEOF\nprintf '%s\\n' \"q'uo\\\"te\""
    r = run(manager, command)
    assert r.stdout == b"it's a \\n literal $HOME\nq'uo\"te\n"


def test_stdin_is_empty(manager: ShellManager) -> None:
    r = run(manager, "read line; echo rc=$?; cat; echo done")
    assert r.stdout == b"rc=1\ndone\n"


def test_fake_status_records_and_prompts_are_plain_output(manager: ShellManager) -> None:
    fake = "printf '0\\0/tmp\\0'; printf '$ '; printf '1\\0/\\0\\n'; echo '<<exit>>'; printf '0\\0/x\\0' >&2; echo end"
    r = run(manager, fake)
    assert r.stdout == b"0\x00/tmp\x00$ 1\x00/\x00\n<<exit>>\nend\n"
    assert r.stderr == b"0\x00/x\x00"
    assert r.done is not None and r.done.exit_code == 0
    assert r.done.cwd != "/tmp"


def test_command_cannot_reach_the_status_channel(manager: ShellManager) -> None:
    r = run(manager, f"echo x >&{STATUS_FD}; echo rc=$?; ls /proc/self/fd")
    assert b"Bad file descriptor" in r.stderr
    assert b"rc=1" in r.stdout
    assert f"\n{STATUS_FD}\n".encode() not in b"\n" + r.stdout


def test_closing_or_redirecting_the_status_fd_does_no_harm(manager: ShellManager) -> None:
    assert run(manager, f"exec {STATUS_FD}>&-; echo a").stdout == b"a\n"
    assert run(manager, f"exec {STATUS_FD}>/dev/null; echo b").stdout == b"b\n"
    assert run(manager, "exec 3>&1 4>&2; echo c >&3").stdout == b"c\n"
    assert run(manager, "echo d").stdout == b"d\n"


def test_redirecting_the_shells_stdout_for_good(manager: ShellManager) -> None:
    r = run(manager, "exec >/dev/null 2>&1; echo hidden")
    assert r.stdout == b""
    r = run(manager, "echo also-hidden; cd /")
    assert r.stdout == b""
    assert r.done is not None and r.done.cwd == "/"


def test_nul_in_command_is_rejected(manager: ShellManager) -> None:
    with pytest.raises(AgentError) as info:
        run(manager, "echo a\0b")
    assert info.value.reason == errors_pb2.ERROR_REASON_INVALID_ARGUMENT


def test_non_utf8_output_survives(manager: ShellManager) -> None:
    r = run(manager, "printf 'a\\377\\376b\\n'")
    assert r.stdout == b"a\xff\xfeb\n"


def test_large_output_is_capped_head_and_tail(manager: ShellManager) -> None:
    r = run(manager, "head -c 3000000 /dev/zero | tr '\\0' x; echo; echo END", cap=65536)
    assert r.done is not None and r.done.exit_code == 0
    assert r.done.stdout.total_bytes == 3_000_000 + 5
    assert r.done.stdout.dropped_bytes == r.done.stdout.total_bytes - 65536
    assert len(r.stdout) == 65536
    assert r.stdout.endswith(b"x\nEND\n")
    tail = [e for e in r.outputs if e.output.dropped_before]
    assert len(tail) == 1 and tail[0].output.dropped_before == r.done.stdout.dropped_bytes
    assert run(manager, "echo next").stdout == b"next\n"


# ---- background jobs ---------------------------------------------------------------------


def test_background_job_survives_between_commands_and_dies_on_restart(manager: ShellManager) -> None:
    r = run(manager, "sleep 60 & echo $!")
    pid = int(r.stdout)
    assert not gone(pid, timeout=0)
    r = run(manager, "jobs")
    assert b"sleep 60" in r.stdout
    manager.restart("")
    assert gone(pid)
    assert run(manager, "jobs").stdout == b""


def test_background_output_arrives_with_the_next_call(manager: ShellManager, tmp_path: Path) -> None:
    go, written = tmp_path / "go", tmp_path / "written"
    os.mkfifo(go)
    os.mkfifo(written)
    run(manager, f"(read x < {go}; echo late-$x; echo ok > {written}) &")
    with open(go, "w") as f:
        f.write("output\n")
    assert read_fifo(written) == b"ok\n"  # the job has written its line to the shell's stdout pipe
    r = run(manager, "echo now")
    assert r.stdout == b"late-output\nnow\n"


@needs_root
def test_restart_kills_detached_processes_too(manager: ShellManager, tmp_path: Path) -> None:
    pidfifo = tmp_path / "pid"
    os.mkfifo(pidfifo)
    r = run(manager, f"setsid sh -c 'echo $$ > {pidfifo}; exec sleep 60' >/dev/null 2>&1 & read p < {pidfifo}; "
                     "echo $p; ps -o sid= -p $p")
    pid_text, sid_text = r.stdout.split()
    pid = int(pid_text)
    assert int(sid_text) == pid  # in a session of its own: the process group kill misses it
    manager.restart("")
    assert gone(pid)


# ---- restart, timeouts, the end of bash --------------------------------------------------


def test_restart_clears_state(manager: ShellManager, tmp_path: Path) -> None:
    run(manager, f"cd {tmp_path}; export X=1; f() {{ :; }}")
    pid, cwd = manager.restart("")
    assert pid > 0 and cwd != str(tmp_path)
    r = run(manager, "echo ${X:-unset}; type f 2>&1 | head -1; pwd")
    assert r.stdout.splitlines()[0] == b"unset"
    assert b"not found" in r.stdout


def test_restart_of_a_new_session_just_starts_it(manager: ShellManager, workspace: Path) -> None:
    pid, cwd = manager.restart("fresh")
    assert cwd == str(workspace)
    assert run(manager, "echo $$", session_id="fresh").stdout == f"{pid}\n".encode()


def test_timeout_breaks_the_session_until_restart(manager: ShellManager) -> None:
    r = run(manager, "echo before; sleep 60 & wait", timeout_ms=300)
    assert r.done is not None and r.done.timed_out
    assert r.stdout == b"before\n"
    assert r.done.exit_code == -1 and r.done.cwd == ""
    for _ in range(2):
        with pytest.raises(SessionBroken) as info:
            run(manager, "echo after")
        assert info.value.message == "timed out: bash has not returned in 0.3 seconds and must be restarted"
        assert info.value.reason == errors_pb2.ERROR_REASON_SESSION_BROKEN
    manager.restart("")
    assert run(manager, "echo recovered").stdout == b"recovered\n"


def test_timeout_kills_the_running_command(manager: ShellManager) -> None:
    r = run(manager, "echo $$; sleep 60", timeout_ms=300)
    assert r.done is not None and r.done.timed_out
    assert gone(int(r.stdout))


def test_exit_ends_the_session(manager: ShellManager) -> None:
    r = run(manager, "echo bye; exit 3")
    assert r.stdout == b"bye\n"
    assert r.done is not None and r.done.session_ended and r.done.exit_code == 3
    with pytest.raises(SessionBroken) as info:
        run(manager, "echo x")
    assert info.value.message == "bash has exited with returncode 3 and must be restarted"
    manager.restart("")
    assert run(manager, "echo back").stdout == b"back\n"


def test_killed_shell_reports_the_signal(manager: ShellManager) -> None:
    r = run(manager, "kill -9 $$")
    assert r.done is not None and r.done.session_ended
    assert (r.done.exit_code, r.done.signal) == (-1, 9)
    with pytest.raises(SessionBroken) as info:
        run(manager, "true")
    assert info.value.message == ended_message(-9)


def test_exec_replacing_the_shell(manager: ShellManager) -> None:
    r = run(manager, "exec sh -c 'echo replaced; exit 5'")
    assert r.stdout == b"replaced\n"
    assert r.done is not None and r.done.session_ended and r.done.exit_code == 5
    manager.restart("")
    r = run(manager, "exec sleep 60", timeout_ms=300)
    assert r.done is not None and r.done.timed_out


def test_set_e_with_a_failing_command_ends_the_session(manager: ShellManager) -> None:
    r = run(manager, "set -e; false; echo unreachable")
    assert r.stdout == b""
    assert r.done is not None and r.done.session_ended and r.done.exit_code == 1


# ---- concurrency and cancellation --------------------------------------------------------


class Background:
    """Consume manager.run() in a thread; events and the final exception go to a queue."""

    def __init__(self, manager: ShellManager, command: str, timeout_ms: int = 10_000) -> None:
        self.items: queue.Queue[shell_pb2.ShellEvent | BaseException | None] = queue.Queue()
        self.token: RunToken | None = None
        self.started = threading.Event()
        request = shell_pb2.ShellRunRequest(command=command, timeout_ms=timeout_ms)
        self.thread = threading.Thread(target=self._consume, args=(manager, request), daemon=True)

    def _on_start(self, token: RunToken) -> None:
        self.token = token
        self.started.set()

    def _consume(self, manager: ShellManager, request: shell_pb2.ShellRunRequest) -> None:
        try:
            for event in manager.run(request, self._on_start):
                self.items.put(event)
        except BaseException as exc:
            self.items.put(exc)
        finally:
            self.items.put(None)

    def start(self) -> Background:
        self.thread.start()
        assert self.started.wait(10)
        return self

    def collect(self, timeout: float = 10.0) -> list[shell_pb2.ShellEvent | BaseException]:
        out: list[shell_pb2.ShellEvent | BaseException] = []
        while (item := self.items.get(timeout=timeout)) is not None:
            out.append(item)
        self.thread.join(timeout)
        return out


def test_concurrent_calls_are_serialized(manager: ShellManager, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    first = Background(manager, f"echo first-start; read x < {gate}; echo first-end").start()
    assert first.items.get(timeout=10).output.stdout == b"first-start\n"  # type: ignore[union-attr]
    second = Background(manager, "echo second").start()
    with open(gate, "w") as f:
        f.write("go\n")
    first_events = first.collect()
    second_events = second.collect()
    out1 = b"".join(e.output.stdout for e in first_events if isinstance(e, shell_pb2.ShellEvent)
                    and e.WhichOneof("event") == "output")
    out2 = b"".join(e.output.stdout for e in second_events if isinstance(e, shell_pb2.ShellEvent)
                    and e.WhichOneof("event") == "output")
    assert out1 == b"first-end\n"
    assert out2 == b"second\n"
    assert isinstance(second_events[-1], shell_pb2.ShellEvent) and second_events[-1].done.exit_code == 0


def test_a_waiting_call_gives_up_with_busy(manager: ShellManager, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    first = Background(manager, f"echo go; read x < {gate}").start()
    assert first.items.get(timeout=10).output.stdout == b"go\n"  # type: ignore[union-attr]
    try:
        with pytest.raises(AgentError) as info:
            run(manager, "echo second", timeout_ms=200)
        assert info.value.reason == errors_pb2.ERROR_REASON_BUSY
    finally:
        with open(gate, "w") as f:
            f.write("x\n")
    assert isinstance(first.collect()[-1], shell_pb2.ShellEvent)
    assert run(manager, "echo ok").stdout == b"ok\n"


def test_cancelling_a_call_kills_the_session(manager: ShellManager) -> None:
    call = Background(manager, "echo $$; sleep 60 & echo $!; wait").start()
    shell_pid = int(call.items.get(timeout=10).output.stdout.split()[0])  # type: ignore[union-attr]
    assert call.token is not None
    call.token.cancel()
    events = call.collect()
    assert not any(isinstance(e, shell_pb2.ShellEvent) and e.WhichOneof("event") == "done" for e in events)
    assert gone(shell_pid)
    with pytest.raises(SessionBroken) as info:
        run(manager, "true")
    assert info.value.message == CANCELLED_MESSAGE
    manager.restart("")
    assert run(manager, "echo ok").stdout == b"ok\n"


def test_closing_the_stream_mid_command_kills_the_session(manager: ShellManager) -> None:
    stream = manager.run(shell_pb2.ShellRunRequest(command="echo $$; sleep 60", timeout_ms=10_000))
    first = next(stream)
    shell_pid = int(first.output.stdout)
    stream.close()
    assert gone(shell_pid)
    with pytest.raises(SessionBroken):
        run(manager, "true")


def test_leaving_after_the_command_returned_keeps_the_session(manager: ShellManager) -> None:
    # With a 2-byte cap the tail is only sent after the status record arrived.
    stream = manager.run(shell_pb2.ShellRunRequest(command="y=kept; printf abcdef", output_cap_bytes=2))
    for event in stream:
        if event.output.dropped_before:
            break
    else:
        pytest.fail("no tail event")
    stream.close()
    assert run(manager, "echo $y").stdout == b"kept\n"


def test_cancel_after_the_command_returned_is_harmless(manager: ShellManager) -> None:
    tokens: list[RunToken] = []
    run(manager, "x=kept", on_start=tokens.append)
    tokens[0].cancel()
    assert run(manager, "echo $x").stdout == b"kept\n"


def test_sessions_are_independent(manager: ShellManager) -> None:
    run(manager, "export WHO=a", session_id="a")
    run(manager, "export WHO=b", session_id="b")
    assert run(manager, "echo $WHO", session_id="a").stdout == b"a\n"
    assert run(manager, "echo $WHO", session_id="b").stdout == b"b\n"
    assert manager.close("a")
    assert not manager.close("a")
    assert run(manager, "echo ${WHO:-new}", session_id="a").stdout == b"new\n"


def test_session_limit(workspace: Path) -> None:
    m = ShellManager(None, str(workspace), max_sessions=2)
    try:
        run(m, "true", session_id="1")
        run(m, "true", session_id="2")
        with pytest.raises(AgentError) as info:
            run(m, "true", session_id="3")
        assert info.value.reason == errors_pb2.ERROR_REASON_BUSY
    finally:
        m.close_all()


def test_close_all_kills_every_session(manager: ShellManager) -> None:
    pids = [int(run(manager, "sleep 60 & echo $!", session_id=s).stdout) for s in ("x", "y")]
    manager.close_all()
    assert all(gone(p) for p in pids)


def test_through_the_spawner(workspace: Path) -> None:
    spawner = Spawner(fresh=True)
    m = ShellManager(None, str(workspace), SpawnerLauncher(spawner))
    try:
        run(m, "cd /; v=1")
        r = run(m, "echo $v; pwd; exit 4")
        assert r.stdout == b"1\n/\n"
        assert r.done is not None and r.done.session_ended and r.done.exit_code == 4
        m.restart("")
        assert run(m, "echo again").stdout == b"again\n"
    finally:
        m.close_all()
        spawner.close()


def test_no_leftover_status_fifo(manager: ShellManager, tmp_path: Path) -> None:
    run(manager, "true")
    manager.restart("")
    assert list((tmp_path / "rt").iterdir()) == []
