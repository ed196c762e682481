"""doctor's host.pid-max: how many live sandboxes the host's pids leave room for."""

from __future__ import annotations

from pathlib import Path

from harness.doctor.daemon_checks import PIDS_PER_IDLE_SANDBOX, check_pid_max
from harness.doctor.evidence import read_pid_max


def test_room_is_counted_and_the_fix_named_when_it_is_short() -> None:
    default = check_pid_max(32768, remote_engine=False)
    assert default.status == "PASS" and default.id == "host.pid-max"
    assert "room for about 1092 live sandboxes" in default.reason and "sysctl" not in default.reason
    short = check_pid_max(8192, remote_engine=False)
    assert f"room for about {8192 // PIDS_PER_IDLE_SANDBOX} live sandboxes" in short.reason
    assert "sysctl -w kernel.pid_max=4194304" in short.reason
    raised = check_pid_max(4194304, remote_engine=False)
    assert "room for about 139810 live sandboxes" in raised.reason and "sysctl" not in raised.reason


def test_unknown_says_why() -> None:
    remote = check_pid_max(None, remote_engine=True)
    assert remote.status == "WARN" and "unknown: the engine is on another host" in remote.reason
    unreadable = check_pid_max(None, remote_engine=False)
    assert unreadable.status == "WARN" and "not readable" in unreadable.reason


def test_read_pid_max(tmp_path: Path) -> None:
    (tmp_path / "sys/kernel").mkdir(parents=True)
    (tmp_path / "sys/kernel/pid_max").write_text("32768\n")
    assert read_pid_max(tmp_path) == 32768
    (tmp_path / "sys/kernel/pid_max").write_text("junk")
    assert read_pid_max(tmp_path) is None
    assert read_pid_max(tmp_path / "missing") is None
