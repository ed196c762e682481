"""Whether a command's exit needs a sweep: the last pid the kernel allocated, read from
/proc/loadavg (a fake one here, and the real one)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from sandbox import proctree


@pytest.fixture
def loadavg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "loadavg"
    monkeypatch.setattr(proctree, "LOADAVG", str(path))
    return path


def _write(path: Path, text: str) -> None:
    """Rewrite the file in place: the descriptor ``last_pid`` keeps open sees the new text."""
    with path.open("a+b") as f:
        f.seek(0)
        f.truncate()
        f.write(text.encode())


def test_the_last_pid_is_the_loadavg_lines_last_field(loadavg: Path) -> None:
    _write(loadavg, "0.52 0.61 0.70 3/612 48213\n")
    assert proctree.last_pid() == 48213
    _write(loadavg, "0.00 0.00 0.00 0/0 0\n")  # what gVisor writes
    assert proctree.last_pid() == 0


def test_no_loadavg_is_no_last_pid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(proctree, "LOADAVG", str(tmp_path / "missing"))
    assert proctree.last_pid() == 0


def test_no_sweep_only_when_the_leader_is_the_last_task_made_and_no_wrap_was_possible(loadavg: Path) -> None:
    _write(loadavg, "0.52 0.61 0.70 3/612 4821\n")
    now = time.monotonic()
    assert proctree.no_task_since(4821, now, 0.01)
    assert not proctree.no_task_since(4820, now, 0.01)  # a task was made after the leader
    assert not proctree.no_task_since(4821, now, 0.0)  # pid_max unknown
    assert not proctree.no_task_since(4821, now - 0.02, 0.01)  # long enough for the pids to wrap round
    _write(loadavg, "0.00 0.00 0.00 0/0 0\n")
    assert not proctree.no_task_since(0, now, 0.01)


def test_the_wrap_window_is_pid_max_creations_at_the_floor_rate() -> None:
    with open(proctree.PID_MAX) as f:
        pid_max = int(f.read())
    expected = pid_max * proctree.TASK_CREATION_FLOOR_NS / 1e9 / (os.cpu_count() or 1)
    assert proctree.wrap_window() == pytest.approx(expected)
    assert 0.0 < proctree.wrap_window() < 60.0


def test_the_real_last_pid_moves_with_every_new_process() -> None:
    before = proctree.last_pid()
    if before == 0:
        pytest.skip("this kernel's /proc/loadavg does not give the last pid")
    child = subprocess.Popen(["true"])
    child.wait()
    # This pid namespace may be shared with the rest of the machine: later pids may have
    # come since, but the child's at least moved it.
    assert proctree.last_pid() != before
