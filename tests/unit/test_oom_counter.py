"""The cgroup OOM-kill counter: read from a descriptor kept open, afresh on every read."""

from __future__ import annotations

from pathlib import Path

from sandbox.cgroup import oom_kill_count


def test_the_counter_is_read_afresh_from_the_kept_descriptor(tmp_path: Path) -> None:
    counter = tmp_path / "memory.oom_control"
    counter.write_bytes(b"oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
    candidates = (str(tmp_path / "missing"), str(counter))
    assert oom_kill_count(candidates) == 3
    with counter.open("r+b") as f:  # the same file, rewritten in place: the kept descriptor sees it
        f.write(b"oom_kill_disable 0\nunder_oom 0\noom_kill 17\n")
    assert oom_kill_count(candidates) == 17


def test_the_v2_layout_and_a_key_that_only_ends_in_oom_kill(tmp_path: Path) -> None:
    events = tmp_path / "memory.events"
    events.write_bytes(b"low 0\nhigh 0\nmax 4\nxoom_kill 9\noom 2\noom_kill 2\noom_group_kill 0\n")
    assert oom_kill_count((str(events),)) == 2


def test_no_readable_counter_is_none(tmp_path: Path) -> None:
    no_key = tmp_path / "other"
    no_key.write_bytes(b"max 4\n")
    assert oom_kill_count((str(tmp_path / "missing"), str(no_key))) is None
