"""The pre-forked spawner: real processes started on this host through it."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from sandbox.launch import Identity, SpawnerLauncher
from sandbox.process import ProcessRunner
from sandbox.spawner import Spawner, SpawnerDied
from sandbox.v1 import process_pb2


@pytest.fixture
def spawner():
    sp = Spawner()
    try:
        yield sp
    finally:
        sp.close()


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_spawned_child_output_and_exit_status(spawner, tmp_path):
    child = SpawnerLauncher(spawner).launch(
        ["sh", "-c", "echo out; echo err >&2; exit 7"], str(tmp_path), {"PATH": "/usr/bin:/bin"},
        Identity(None, None, None), with_stdin=False,
    )
    try:
        assert _read_all(child.stdout) == b"out\n"
        assert _read_all(child.stderr) == b"err\n"
        assert child.reap() == 7
    finally:
        child.close_pipes()


def test_stdin_reaches_the_child(spawner, tmp_path):
    child = SpawnerLauncher(spawner).launch(
        ["cat"], str(tmp_path), {"PATH": "/usr/bin:/bin"}, Identity(None, None, None), with_stdin=True,
    )
    try:
        assert child.stdin is not None
        os.write(child.stdin, b"through the spawner")
        os.close(child.stdin)
        child.stdin = None
        assert _read_all(child.stdout) == b"through the spawner"
        assert child.reap() == 0
    finally:
        child.close_pipes()


def test_signal_death_is_reported_like_popen(spawner, tmp_path):
    child = SpawnerLauncher(spawner).launch(
        ["sh", "-c", "kill -9 $$"], str(tmp_path), {"PATH": "/usr/bin:/bin"},
        Identity(None, None, None), with_stdin=False,
    )
    try:
        assert child.reap() == -signal.SIGKILL
    finally:
        child.close_pipes()


def test_missing_binary_raises_file_not_found(spawner, tmp_path):
    with pytest.raises(FileNotFoundError):
        SpawnerLauncher(spawner).launch(
            ["/no/such/binary"], str(tmp_path), {}, Identity(None, None, None), with_stdin=False,
        )


def test_runner_through_the_spawner_streams_and_exits(spawner, tmp_path):
    runner = ProcessRunner(None, str(tmp_path), launcher=SpawnerLauncher(spawner))
    request = process_pb2.ExecRequest(shell="printf abc; exit 4")
    events = list(runner.run(request))
    kinds = [e.WhichOneof("event") for e in events]
    assert kinds[0] == "started" and kinds[-1] == "exited"
    assert b"".join(e.output.stdout for e in events if e.WhichOneof("event") == "output") == b"abc"
    assert events[-1].exited.exit_code == 4


def test_a_dead_spawner_is_an_error_not_a_hang(tmp_path):
    sp = Spawner()
    os.kill(sp.pid, signal.SIGKILL)
    os.waitpid(sp.pid, 0)
    try:
        with pytest.raises(SpawnerDied):
            SpawnerLauncher(sp).launch(["true"], str(tmp_path), {}, Identity(None, None, None), with_stdin=False)
    finally:
        sp.close()


def _children_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return {int(p) for p in f.read().split()}
    except FileNotFoundError:
        return set()


needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="starting commands as another user needs root")


@pytest.fixture
def open_dir():
    """A directory any user may enter (pytest's tmp_path sits below a root-only one)."""
    path = Path(tempfile.mkdtemp(prefix="callbox-spawner-"))
    try:
        path.chmod(0o755)
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@needs_root
def test_a_command_gets_its_identity_marker_oom_score_and_nothing_else(spawner, open_dir):
    # Exactly the requested user, with the marker group, no capability, the OOM score,
    # stdio only, in a session of its own, in a directory only that user may enter.
    marker = 3_000_123_456
    workdir = open_dir / "private"
    workdir.mkdir(mode=0o700)
    os.chown(workdir, 1000, 1000)  # only the tool user may enter it
    script = ("id -u; id -g; id -G; cat /proc/self/oom_score_adj;"
              " grep -E '^Cap(Prm|Eff|Bnd|Amb)' /proc/self/status | grep -c ':\t0000000000000000$';"
              " ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; pwd; ps -o sid= -p $$")
    child = SpawnerLauncher(spawner).launch(
        ["sh", "-c", script], str(workdir), {"PATH": "/usr/bin:/bin"},
        Identity(1000, 1000, [1000, marker]), with_stdin=False,
    )
    try:
        lines = _read_all(child.stdout).decode().splitlines()
        assert child.reap() == 0, _read_all(child.stderr)
    finally:
        child.close_pipes()
    uid, gid, groups, oom, zero_caps, fds, cwd, sid = lines
    assert (uid, gid) == ("1000", "1000")
    assert set(groups.split()) == {"1000", str(marker)}
    assert oom == "1000"
    assert zero_caps == "3"  # permitted, effective and ambient are empty (the bounding set is the spawner's)
    assert fds.split() == ["0", "1", "2", "3"]  # stdio, and the descriptor ls itself opened
    assert cwd == str(workdir)
    assert int(sid) == child.pid  # a session of its own


def _status(pid: int, field: str) -> list[str]:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return line.split()[1:]
    raise AssertionError(f"no {field} in /proc/{pid}/status")


@needs_root
def test_the_spawner_is_root_again_after_each_start_and_leaks_no_descriptor(open_dir):
    # The spawner takes the tool user's real ids and groups for the moment of a start; an
    # inheritable descriptor it was given must not reach the command either.
    leaked_r, leaked_w = os.pipe()
    os.set_inheritable(leaked_w, True)
    sp = Spawner()
    os.close(leaked_r)
    os.close(leaked_w)
    try:
        child = SpawnerLauncher(sp).launch(
            ["sh", "-c", "ls /proc/self/fd | sort -n | tr '\\n' ' '"], str(open_dir), {"PATH": "/usr/bin:/bin"},
            Identity(1000, 1000, [1000, 3_000_000_321]), with_stdin=False,
        )
        try:
            assert _read_all(child.stdout).split() == [b"0", b"1", b"2", b"3"]
            assert child.reap() == 0
        finally:
            child.close_pipes()
        assert _status(sp.pid, "Uid") == ["0", "0", "0", "0"]
        assert _status(sp.pid, "Gid") == ["0", "0", "0", "0"]
        assert _status(sp.pid, "Groups") == []
        assert os.readlink(f"/proc/{sp.pid}/cwd") == "/"
    finally:
        sp.close()


@needs_root
def test_start_errors_name_what_failed_like_popen(spawner, open_dir):
    tmp_path = open_dir
    launcher = SpawnerLauncher(spawner)
    with pytest.raises(FileNotFoundError) as missing_dir:
        launcher.launch(["true"], str(tmp_path / "gone"), {"PATH": "/usr/bin:/bin"},
                        Identity(1000, 1000, [1000]), with_stdin=False)
    assert missing_dir.value.filename == str(tmp_path / "gone")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)  # root's: the tool user may not enter it
    with pytest.raises(PermissionError) as refused:
        launcher.launch(["true"], str(locked), {"PATH": "/usr/bin:/bin"}, Identity(1000, 1000, [1000]),
                        with_stdin=False)
    assert refused.value.filename == str(locked)
    script = tmp_path / "script"
    script.write_text("#!/bin/sh\nexit 0\n")
    script.chmod(0o644)
    with pytest.raises(PermissionError) as not_executable:
        launcher.launch([str(script)], str(tmp_path), {}, Identity(None, None, None), with_stdin=False)
    assert not_executable.value.filename == str(script)
    with pytest.raises(FileNotFoundError) as not_on_path:
        launcher.launch(["no-such-command-anywhere"], str(tmp_path), {"PATH": "/usr/bin:/bin"},
                        Identity(None, None, None), with_stdin=False)
    assert not_on_path.value.filename == "no-such-command-anywhere"
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "only-here"
    tool.write_text("#!/bin/sh\necho found\n")
    tool.chmod(0o755)
    for argv, cwd in ((["only-here"], tmp_path), (["./only-here"], tmp_path / "bin")):
        # Found on the command's own PATH, not the spawner's; a relative path from the workdir.
        child = launcher.launch(argv, str(cwd), {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
                                Identity(1000, 1000, [1000]), with_stdin=False)
        try:
            assert _read_all(child.stdout) == b"found\n"
            assert child.reap() == 0
        finally:
            child.close_pipes()


def test_back_to_back_commands_and_no_child_left_after_close(tmp_path):
    sp = Spawner()
    launcher = SpawnerLauncher(sp)
    try:
        for i in range(30):
            child = launcher.launch(["sh", "-c", f"echo {i}"], str(tmp_path), {"PATH": "/usr/bin:/bin"},
                                    Identity(None, None, None), with_stdin=False)
            try:
                assert _read_all(child.stdout) == f"{i}\n".encode()
                assert child.reap() == 0
            finally:
                child.close_pipes()
        # Every command was reaped by the spawner: nothing of them is left as its child.
        assert _children_of(sp.pid) == set()
    finally:
        sp.close()


def test_without_pidfds_an_exit_pipe_stands_in_for_them(monkeypatch, tmp_path):
    """Where the kernel has no pidfd_open (gVisor), the agent's exit fd is a pipe that turns
    readable once the child has ended, and the exit status still arrives."""
    import select

    import sandbox.spawner as spawner_module

    monkeypatch.setattr(spawner_module, "_has_pidfd", lambda: False)
    sp = Spawner()  # the forked spawner keeps the patched function
    try:
        launcher = SpawnerLauncher(sp)
        env = {"PATH": "/usr/bin:/bin"}
        waiting = launcher.launch(["sleep", "30"], str(tmp_path), env, Identity(None, None, None), with_stdin=False)
        quick = launcher.launch(["sh", "-c", "exit 3"], str(tmp_path), env, Identity(None, None, None),
                                with_stdin=False)
        try:
            quick_fd = quick.open_pidfd()
            assert select.select([quick_fd], [], [], 10)[0] == [quick_fd]
            assert quick.reap() == 3
            os.close(quick_fd)
            waiting_fd = waiting.open_pidfd()
            assert select.select([waiting_fd], [], [], 0.2)[0] == [], "readable while the child runs"
            os.kill(waiting.pid, signal.SIGKILL)
            assert select.select([waiting_fd], [], [], 10)[0] == [waiting_fd]
            assert waiting.reap() == -signal.SIGKILL
            os.close(waiting_fd)
            # Many short children in a row: none of their exits is lost.
            for code in range(20):
                child = launcher.launch(["sh", "-c", f"exit {code}"], str(tmp_path), env,
                                        Identity(None, None, None), with_stdin=False)
                try:
                    assert child.reap() == code
                finally:
                    child.close_pipes()
        finally:
            quick.close_pipes()
            waiting.close_pipes()
    finally:
        sp.close()
