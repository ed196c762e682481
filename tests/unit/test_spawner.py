"""The pre-forked spawner: real processes started on this host through it."""

from __future__ import annotations

import os
import signal

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
