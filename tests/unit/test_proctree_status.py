"""Reading a process's state and groups from /proc/PID/status (a fake /proc here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandbox import proctree

STATUS = (
    "Name:\tsleep\nUmask:\t0022\nState:\t{state} ({word})\nTgid:\t42\nPid:\t42\nPPid:\t1\n"
    "Uid:\t1000\t1000\t1000\t1000\nGid:\t1000\t1000\t1000\t1000\nFDSize:\t64\nGroups:\t{groups}\n"
    "NStgid:\t42\nVmPeak:\t    2400 kB\n"
)


@pytest.fixture
def fake_proc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(proctree, "PROC", str(tmp_path))
    return tmp_path


def _process(proc: Path, pid: int, state: str, groups: str) -> None:
    (proc / str(pid)).mkdir()
    word = {"S": "sleeping", "Z": "zombie", "R": "running"}[state]
    (proc / str(pid) / "status").write_text(STATUS.format(state=state, word=word, groups=groups))


def test_the_marked_live_processes_are_found_and_the_rest_are_not(fake_proc: Path) -> None:
    marker = proctree.MARKER_BASE + 7
    _process(fake_proc, 10, "S", f"1000 {marker} ")
    _process(fake_proc, 11, "R", f"{marker}")
    _process(fake_proc, 12, "Z", f"1000 {marker} ")  # a zombie cannot be killed further
    _process(fake_proc, 13, "S", f"1000 {marker + 1} ")
    _process(fake_proc, 14, "S", "")  # no supplementary groups at all
    (fake_proc / "self").mkdir()
    assert sorted(proctree.marked_pids(marker)) == [10, 11]
    assert proctree._status_fields("12") == ("Z", [1000, marker])
    assert proctree._status_fields("14") == ("S", [])
    assert proctree._status_fields("99") is None  # gone
