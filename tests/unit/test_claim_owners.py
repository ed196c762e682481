"""When the process holding a call's claim is provably gone (harness.audit.owners): a dead
pid, a pid reused by a process that started at another time, a zombie, another boot of this
machine; and when it may be alive: a live owner, another host, another pid namespace, a
start time that cannot be read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from harness.audit.owners import BOOT_ID_PATH, ClaimOwner, ProcessFacts, owner_gone, probe, this_process

HERE = ClaimOwner("box/100/1000.00", "box", 100, 1000.0, "boot-a", "pid:[1]")
STARTED = 2000.0


def owner(pid: int = 4242, *, host: str = "box", boot: str | None = "boot-a", ns: str | None = "pid:[1]",
          started: float = STARTED) -> ClaimOwner:
    return ClaimOwner(f"{host}/{pid}/{started:.2f}", host, pid, started, boot, ns)


class Lookup:
    """Stands for looking a pid up on this machine: always ``facts``, noting each pid asked."""

    def __init__(self, facts: ProcessFacts) -> None:
        self.facts = facts
        self.seen: list[int] = []

    def __call__(self, pid: int) -> ProcessFacts:
        self.seen.append(pid)
        return self.facts


def look(facts: ProcessFacts) -> Lookup:
    return Lookup(facts)


def test_a_pid_that_no_longer_exists_is_gone() -> None:
    lookup = look(ProcessFacts(exists=False))
    assert owner_gone(owner(), HERE, lookup) is True
    assert lookup.seen == [4242]


def test_a_pid_reused_by_a_process_that_started_at_another_time_is_gone() -> None:
    assert owner_gone(owner(), HERE, look(ProcessFacts(True, STARTED + 7.5))) is True


def test_the_owner_itself_alive_is_not_gone() -> None:
    assert owner_gone(owner(), HERE, look(ProcessFacts(True, STARTED + 0.01))) is False


def test_a_zombie_owner_runs_nothing_any_more() -> None:
    assert owner_gone(owner(), HERE, look(ProcessFacts(True, STARTED, zombie=True))) is True


def test_a_start_time_that_cannot_be_read_is_not_proof() -> None:
    assert owner_gone(owner(), HERE, look(ProcessFacts(True, None))) is False


def test_another_boot_of_this_machine_is_gone_without_looking_at_the_pid() -> None:
    lookup = look(ProcessFacts(True, STARTED))  # a live process with the same pid and start: irrelevant
    assert owner_gone(owner(boot="boot-before"), HERE, lookup) is True
    assert lookup.seen == []


def test_another_host_may_be_alive() -> None:
    assert owner_gone(owner(host="other"), HERE, look(ProcessFacts(exists=False))) is False
    assert owner_gone(owner(host="other", boot="boot-b"), HERE, look(ProcessFacts(False))) is False


def test_another_pid_namespace_on_this_kernel_may_be_alive() -> None:
    assert owner_gone(owner(ns="pid:[2]"), HERE, look(ProcessFacts(exists=False))) is False


def test_a_record_from_before_the_columns_is_judged_by_its_label() -> None:
    old = ClaimOwner.from_columns("box/4242/2000.00", None, None, None, None)
    assert old == ClaimOwner("box/4242/2000.00", "box", 4242, 2000.0)
    assert owner_gone(old, HERE, look(ProcessFacts(exists=False))) is True
    assert owner_gone(old, HERE, look(ProcessFacts(True, 2000.0))) is False
    assert ClaimOwner.from_columns("not a label", 1, "b", 1.0, None) is None


def test_this_process_is_never_gone_to_itself() -> None:
    me = this_process()
    assert owner_gone(me, me, look(ProcessFacts(exists=False))) is False
    assert owner_gone(me) is False


@pytest.mark.skipif(not BOOT_ID_PATH.exists(), reason="no boot id outside Linux")
def test_this_process_records_its_pid_start_boot_and_namespace() -> None:
    me = this_process()
    assert me.pid == os.getpid()
    assert me.boot_id == BOOT_ID_PATH.read_text().strip()
    assert me.pid_ns == os.readlink("/proc/self/ns/pid")
    assert abs(me.started - psutil.Process().create_time()) < 0.01
    assert me.columns() == (me.label, me.pid, me.boot_id, me.started, me.pid_ns)


def test_probe_tells_a_live_process_from_a_dead_one(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        alive = probe(child.pid)
        assert alive.exists and not alive.zombie and alive.started == psutil.Process(child.pid).create_time()
        dead = ClaimOwner(f"{this_process().host}/{child.pid}/{alive.started:.2f}", this_process().host, child.pid,
                          alive.started or 0.0, this_process().boot_id, this_process().pid_ns)
        assert owner_gone(dead) is False
    finally:
        child.communicate(b"")
    assert probe(child.pid) == ProcessFacts(exists=False)
    assert owner_gone(dead) is True
