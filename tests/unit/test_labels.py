"""Owner labels, liveness of the owner process, expiry and orphan decisions (no container)."""

from __future__ import annotations

import os
import socket
import subprocess

import psutil
import pytest

from harness.engine.docker import labels
from harness.engine.docker.labels import Owner, is_expired, is_orphaned, owner_alive

HOST = socket.gethostname()


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a real process that has exited and been reaped."""
    proc = subprocess.Popen(["sleep", "0"])
    proc.wait()
    assert proc.returncode == 0
    return proc.pid


def test_label_format() -> None:
    assert Owner("box", 123, 1700000000.256).label() == "box/123/1700000000.26"


def test_label_round_trip() -> None:
    owner = Owner("build-01.example", 4321, 1712345678.5)
    assert Owner.parse(owner.label()) == owner


def test_current_owner_round_trips_within_label_precision() -> None:
    owner = Owner.current()
    assert owner.host == HOST
    assert owner.pid == os.getpid()
    parsed = Owner.parse(owner.label())
    assert parsed is not None
    assert (parsed.host, parsed.pid) == (owner.host, owner.pid)
    assert abs(parsed.started - owner.started) <= 0.005 + 1e-9


def test_host_containing_slashes_is_kept_whole() -> None:
    owner = Owner("a/b/c", 12, 3.5)
    assert Owner.parse(owner.label()) == owner


@pytest.mark.parametrize(
    "text",
    ["", "garbage", "host/12", "host/notapid/1.0", "host/12/notatime", "host//1.0", "host/12/", "/"],
)
def test_parse_garbage_is_none(text: str) -> None:
    assert Owner.parse(text) is None


def test_this_process_is_alive() -> None:
    assert owner_alive(Owner.current(), HOST) is True


def test_this_process_is_alive_after_a_label_round_trip() -> None:
    parsed = Owner.parse(Owner.current().label())
    assert parsed is not None
    assert owner_alive(parsed, HOST) is True


def test_exited_process_is_not_alive(dead_pid: int) -> None:
    assert owner_alive(Owner(HOST, dead_pid, 1_000_000.0), HOST) is False


def test_other_host_is_unknown() -> None:
    assert owner_alive(Owner(HOST + "-elsewhere", os.getpid(), 1.0), HOST) is None


def test_reused_pid_with_another_start_time_is_not_the_owner() -> None:
    me = Owner.current()
    assert owner_alive(Owner(HOST, me.pid, me.started - 3600), HOST) is False
    assert owner_alive(Owner(HOST, me.pid, me.started + 1.0), HOST) is False


def test_live_child_process_is_alive_then_dead_after_exit() -> None:
    proc = subprocess.Popen(["sleep", "30"])
    try:
        owner = Owner(HOST, proc.pid, psutil.Process(proc.pid).create_time())
        assert owner_alive(owner, HOST) is True
    finally:
        proc.kill()
        proc.wait()
    assert owner_alive(owner, HOST) is False


# ---- is_expired ------------------------------------------------------------------------


def test_future_expiry_is_not_expired() -> None:
    assert is_expired({labels.EXPIRES: "2000"}, now=1999.0) is False


def test_past_expiry_is_expired() -> None:
    assert is_expired({labels.EXPIRES: "2000"}, now=2000.5) is True


def test_expiry_at_now_is_expired() -> None:
    assert is_expired({labels.EXPIRES: "2000"}, now=2000.0) is True


def test_missing_expiry_is_expired() -> None:
    assert is_expired({}, now=1.0) is True


def test_garbage_expiry_is_expired() -> None:
    assert is_expired({labels.EXPIRES: "tomorrow"}, now=1.0) is True


def test_fractional_expiry() -> None:
    assert is_expired({labels.EXPIRES: "100.75"}, now=100.5) is False


# ---- is_orphaned -----------------------------------------------------------------------


def test_sandbox_of_this_process_is_not_orphaned() -> None:
    assert is_orphaned({labels.OWNER: Owner.current().label()}, HOST) is False


def test_sandbox_of_an_exited_process_is_orphaned(dead_pid: int) -> None:
    assert is_orphaned({labels.OWNER: Owner(HOST, dead_pid, 5.0).label()}, HOST) is True


def test_sandbox_of_a_reused_pid_is_orphaned() -> None:
    me = Owner.current()
    assert is_orphaned({labels.OWNER: Owner(HOST, me.pid, me.started - 60).label()}, HOST) is True


def test_sandbox_owned_on_another_host_is_not_orphaned() -> None:
    assert is_orphaned({labels.OWNER: Owner("other-host", 1, 1.0).label()}, HOST) is False


def test_sandbox_without_an_owner_label_is_orphaned() -> None:
    assert is_orphaned({labels.MANAGED: "1"}, HOST) is True


def test_sandbox_with_a_garbage_owner_label_is_orphaned() -> None:
    assert is_orphaned({labels.OWNER: "not-an-owner"}, HOST) is True


@pytest.mark.parametrize("pid", ["-1", "0", "99999999999999999999"])
def test_out_of_range_owner_pid_is_orphaned_not_an_exception(pid: str) -> None:
    """gc must not crash on a malformed label: an impossible pid owns nothing."""
    assert is_orphaned({labels.OWNER: f"{HOST}/{pid}/1.00"}, HOST) is True
