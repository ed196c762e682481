"""`callbox sandbox ...` without Docker: parsing (options between NAME and `-- CMD`), the usage
errors decided before any engine is contacted, `cp`'s endpoints, the policy gate's wiring
(a real audit store file), and the local side of `attach` (raw mode, size, signals, keys) on
a real pseudo-terminal.

DOCKER_HOST names a socket nobody listens on, so a path that wrongly reaches for the engine
ends with 125 instead of touching a real one.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import pty
import signal
import struct
import sys
import termios
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.cli import main as cli
from harness.cli.sandbox_common import guarded, json_errors
from harness.cli.sandbox_files import plan_copy, sandbox_path, split_endpoint
from harness.cli.sandbox_jobs import job_exit_code
from harness.cli.sandbox_terminal import DETACH_SIGNAL, LocalTerminal, _keys, _session
from harness.core.actions import ActionDenied, ApprovalPending
from harness.core.policy import parse_policy
from harness.engine.jobs import JobChunk, JobEnded, JobGap, JobInfo


@pytest.fixture(autouse=True)
def no_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such-docker.sock")
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "audit.sqlite3"))
    monkeypatch.setenv("CALLBOX_SNAPSHOT_DIR", str(tmp_path / "snapshots"))
    with open(os.devnull) as devnull:
        monkeypatch.setattr(sys, "stdin", devnull)
        yield


def parse(*argv: str) -> argparse.Namespace:
    return cli.build_parser().parse_args(["sandbox", *argv])


def usage_error(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """Run the CLI; assert exit 2 with one `callbox:` line and no output; return the line."""
    code = cli.main(["sandbox", *argv])
    captured = capsys.readouterr()
    assert code == 2, (code, captured.err)
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("callbox: "), captured.err
    assert captured.out == ""
    return lines[0]


# ---- parsing ---------------------------------------------------------------------------------------


def test_exec_options_sit_between_the_name_and_the_command() -> None:
    args = parse("exec", "web", "--background", "--tag", "srv", "--", "python3", "-m", "http.server", "--bind", "x")
    assert (args.name, args.background, args.tag) == ("web", True, "srv")
    assert args.cmd == ["python3", "-m", "http.server", "--bind", "x"]


def test_everything_after_the_first_double_dash_is_the_command() -> None:
    assert parse("exec", "web", "--", "--json", "--", "-x").cmd == ["--json", "--", "-x"]
    assert parse("exec", "web", "ls").cmd == ["ls"]
    assert parse("attach", "web", "--", "tty").cmd == ["tty"]
    args = parse("attach", "web", "--pid", "42")
    assert (args.pid, args.cmd) == (42, [])


def test_a_word_between_the_name_and_the_double_dash_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    line = usage_error(capsys, "exec", "web", "stray", "--json", "--", "true")
    assert "'stray' before --" in line


@pytest.mark.parametrize(("argv", "expected"), [
    (["exec", "web", "--background", "--timeout", "5", "--", "sleep", "9"], "--timeout is for a foreground"),
    (["exec", "web", "--tag", "t", "--", "true"], "add --background"),
    (["exec", "web"], "no command given"),
    (["attach", "web", "--pid", "3", "--", "bash"], "not both"),
    (["new", "--ttl", "5"], "shortest time-to-live"),
    (["new", "--ttl", "1e12"], "at most"),
    (["new", "--name", "Not A Name"], "is not valid"),
    (["snapshot", "web", "Bad/Name"], "snapshot name"),
    (["fork", "--name", "UPPER", "web"], "is not valid"),
    (["fork"], "one of the arguments"),
    (["fork", "web", "--from-snapshot", "s"], "not allowed with"),
    (["logs", "web", "3", "--from-seq", "-1"], "negative"),
    (["kill", "web", "3", "--signal", "NOPE"], "not a signal"),
    (["kill", "web", "3", "--signal", "999"], "not a signal number"),
    (["port", "web", "0"], "not a port from 1 to 65535"),
    (["port", "web", "8000", "--host-port", "70000"], "not a port from 0 to 65535"),
    (["cp", "a", "b"], "neither side is in a sandbox"),
    (["cp", "web:/a", "db:/b"], "both sides are in a sandbox"),
    (["cp", "web:/a", ""], "host path is empty"),
])
def test_usage_errors_come_before_the_engine(capsys: pytest.CaptureFixture[str], argv: list[str],
                                             expected: str) -> None:
    assert expected in usage_error(capsys, *argv)


def test_signals_by_name_or_number() -> None:
    assert parse("kill", "web", "3", "--signal", "term").signal == signal.SIGTERM
    assert parse("kill", "web", "3", "-s", "SIGINT").signal == signal.SIGINT
    assert parse("kill", "web", "3", "-s", "9").signal == 9
    assert parse("kill", "web", "3").signal is None


def test_without_an_engine_a_verb_ends_with_one_line_and_125(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sandbox", "ls", "--json"]) == 125
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1


def test_snapshots_need_no_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["sandbox", "snapshots", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert cli.main(["sandbox", "rm-snapshot", "nope"]) == 4  # not found
    assert "callbox sandbox snapshots" in capsys.readouterr().err


# ---- cp's endpoints ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("web:/workspace/x", ("web", "/workspace/x")),
    ("web:", ("web", "")),
    ("0123456789ab:rel", ("0123456789ab", "rel")),
    ("./web:x", None),
    ("/abs/web:x", None),
    ("Web:/x", None),
    ("plain", None),
])
def test_an_endpoint_is_in_a_sandbox_when_a_name_comes_before_the_colon(text: str,
                                                                          expected: tuple[str, str] | None) -> None:
    assert split_endpoint(text) == expected


def test_sandbox_paths_are_absolute_against_the_workdir() -> None:
    assert sandbox_path("", "/workspace") == "/workspace"
    assert sandbox_path("src/a.py", "/workspace") == "/workspace/src/a.py"
    assert sandbox_path("/tmp/x/", "/workspace") == "/tmp/x"
    assert sandbox_path("../etc/passwd", "/workspace") == "/etc/passwd"  # what the policy's path rules see


def test_the_direction_of_a_copy() -> None:
    assert plan_copy("web:/workspace/out", "here") == ("out", "web", "/workspace/out", "here")
    assert plan_copy("./proj", "web:") == ("in", "web", "", "./proj")


# ---- the gate ---------------------------------------------------------------------------------------


def gate_args(tmp_path: Path, approval: str | None = None, as_json: bool = False) -> argparse.Namespace:
    return argparse.Namespace(audit_db=tmp_path / "audit.sqlite3", approval=approval, json=as_json)


def test_an_ask_rule_pends_then_its_approval_allows_one_repeat(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    policy = parse_policy('[actions.port_forward]\ndecision = "ask"\n')
    details = {"sandbox": "web", "port": 8000, "host_port": 0}
    with pytest.raises(ApprovalPending) as pending, json_errors(gate_args(tmp_path, as_json=True)), \
            guarded(gate_args(tmp_path), policy, "0123456789ab", "port_forward", details):
        pytest.fail("an ask rule let the action through")
    shown = json.loads(capsys.readouterr().out)
    assert shown["error"] == "approval_pending" and shown["approval_id"] == pending.value.approval_id
    assert f"--approval {pending.value.approval_id}" in pending.value.message
    assert pending.value.exit_code == 3  # waiting for a person

    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        approval = audit.resolve_approval(pending.value.approval_id, True, by="alice", reason=None)
        assert approval.arguments and json.loads(approval.arguments)["actor"] == f"user:{os.getuid()}"
    with guarded(gate_args(tmp_path, pending.value.approval_id), policy, "0123456789ab", "port_forward",
                 details) as ticket:
        ticket.outcome["connections"] = 2
    with pytest.raises(ActionDenied, match="already used"), \
            guarded(gate_args(tmp_path, pending.value.approval_id), policy, "0123456789ab", "port_forward", details):
        pass
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        calls = audit.calls_for_run("0123456789ab")
    assert [c["tool"] for c in calls] == ["sandbox.port_forward", "sandbox.port_forward"]


def test_port_forwarding_is_denied_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ActionDenied) as denied, json_errors(gate_args(tmp_path, as_json=True)), \
            guarded(gate_args(tmp_path), parse_policy(""), "0123456789ab", "port_forward", {"port": 22}):
        pytest.fail("port forwarding was allowed without a policy saying so")
    assert "actions.port_forward" in denied.value.message and denied.value.exit_code == 6
    assert json.loads(capsys.readouterr().out)["error"] == "denied"


# ---- jobs -------------------------------------------------------------------------------------------


def info(state: str, exit_code: int | None = None, sig: int = 0) -> JobInfo:
    return JobInfo(pid=7, tag="", command=["x"], state=state, exit_code=exit_code, signal=sig, pty=True,
                   started_at=0.0, duration_s=0.0, next_seq=0, output_bytes=0, dropped_bytes=0, oom_killed=False)


def test_a_jobs_exit_code_is_the_shells() -> None:
    assert job_exit_code(info("exited", 3)) == 3
    assert job_exit_code(info("exited", 0)) == 0
    assert job_exit_code(info("killed", sig=9)) == 137
    assert job_exit_code(info("killed", sig=15)) == 143


# ---- attach's local side ----------------------------------------------------------------------------


class FakeJobs:
    """What `_keys` and `_session` use of a JobsClient: writes recorded, events given."""

    def __init__(self, events: list[Any] | None = None) -> None:
        self.written: list[tuple[int, bytes, bool]] = []
        self.attached: list[tuple[int, bool]] = []
        self._events = events or []

    def write(self, pid: int, data: bytes, *, close: bool = False) -> None:
        self.written.append((pid, data, close))

    def resize(self, pid: int, rows: int, cols: int) -> None:
        raise AssertionError("no resize expected")

    def attach(self, pid: int, *, follow: bool = False) -> Iterator[Any]:
        self.attached.append((pid, follow))
        yield from self._events


class Pipe:
    """The write end of the pipe stdin reads."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    def write(self, data: bytes) -> None:
        assert self.fd is not None
        os.write(self.fd, data)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pipe]:
    """stdin is the read end of a pipe."""
    read, write = os.pipe()
    pipe = Pipe(write)
    with os.fdopen(read, "rb", buffering=0) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        try:
            yield pipe
        finally:
            pipe.close()


class Woken(LocalTerminal):
    woken = 0

    def wake_main(self) -> None:
        self.woken += 1


def test_the_detach_key_sends_what_came_before_it_then_wakes_the_main_thread(piped: Pipe) -> None:
    piped.write(b"echo hi\r\x1dnot sent")
    jobs, detached, local = FakeJobs(), threading.Event(), Woken()
    _keys(jobs, 7, local, detached)  # type: ignore[arg-type]
    assert jobs.written == [(7, b"echo hi\r", False)] and detached.is_set() and local.woken == 1


def test_the_end_of_piped_input_closes_the_jobs_input(piped: Pipe) -> None:
    piped.write(b"exit\n")
    piped.close()
    jobs, detached = FakeJobs(), threading.Event()
    _keys(jobs, 7, LocalTerminal(), detached)  # type: ignore[arg-type]
    assert jobs.written == [(7, b"exit\n", False), (7, b"", True)] and not detached.is_set()


def test_a_session_writes_the_output_and_returns_how_the_job_ended(piped: Pipe,
                                                                  capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    piped.close()
    ended = info("exited", 5)
    jobs = FakeJobs([JobGap(0, 2, 100), JobChunk(2, "stdout", b"out\r\n"), JobEnded(ended)])
    assert _session(jobs, 7, LocalTerminal()) == (ended, False)  # type: ignore[arg-type]
    assert capfdbinary.readouterr().out == b"\n[callbox: 100 bytes (chunks 0-1) dropped]\nout\r\n"
    assert jobs.attached == [(7, True)]


@pytest.fixture
def terminal(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """stdin is the slave side of a new pseudo-terminal of 30 x 100; yields its descriptor."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 100, 0, 0))
    with os.fdopen(slave, "rb", buffering=0, closefd=False) as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        try:
            yield slave
        finally:
            os.close(slave)
            os.close(master)


def test_raw_mode_is_set_and_always_restored(terminal: int) -> None:
    local = LocalTerminal()
    assert local.is_tty and local.size() == (30, 100)
    before = termios.tcgetattr(terminal)
    with pytest.raises(RuntimeError), local.raw():
        assert not termios.tcgetattr(terminal)[3] & (termios.ICANON | termios.ECHO | termios.ISIG)
        raise RuntimeError("an error while attached")
    assert termios.tcgetattr(terminal) == before


def test_signals_resize_detach_and_end_and_the_handlers_come_back(terminal: int) -> None:
    local = LocalTerminal()
    sizes: list[tuple[int, int]] = []
    detaches: list[bool] = []
    before = {s: signal.getsignal(s) for s in (signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP, DETACH_SIGNAL)}
    with local.signals(on_resize=lambda rows, cols: sizes.append((rows, cols)),
                       on_detach=lambda: detaches.append(True)):
        fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
        signal.raise_signal(signal.SIGWINCH)
        woke = threading.Thread(target=local.wake_main)
        woke.start()
        woke.join()
        with pytest.raises(SystemExit) as ended:
            signal.raise_signal(signal.SIGTERM)
        assert ended.value.code == 128 + signal.SIGTERM
    assert sizes == [(40, 120)] and detaches == [True]
    assert {s: signal.getsignal(s) for s in before} == before
