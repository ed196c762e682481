"""Snapshots and forks on the real engine: a snapshot holds the writable places (workspace,
home, /tmp) and the spec, says what it did not capture (the mounts, named); a fork from it
has the files after the original is destroyed; a live fork; and a named sandbox restored
from its snapshot after the Docker daemon restarted (its container gone, its record listed
as ``gone``). The restart stops every container on the engine, so it is done once."""

from __future__ import annotations

import os
import shutil
import signal
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.docker.engine import DockerEngine, SandboxGone, SandboxNotFound
from harness.engine.docker.snapshots import SnapshotExists, SnapshotNotFound
from harness.engine.spec import Mount, SandboxSpec
from tests.conftest import IMAGE, unavailable
from tests.integration.helpers import run
from tests.integration.test_daemon_restart import (
    START_DEADLINE_S,
    STOP_DEADLINE_S,
    _alive,
    _answers,
    _dockerd_pid,
    _start_daemon,
    _under_systemd,
    _wait_until,
)

pytestmark = pytest.mark.docker

FILES = (
    "mkdir -p /workspace/src /workspace/bin ~/.config && echo source > /workspace/src/a.txt && "
    "ln -s src/a.txt /workspace/link && printf '#!/bin/sh\\necho ran\\n' > /workspace/bin/run.sh && "
    "chmod 755 /workspace/bin/run.sh && echo home > ~/.config/x && echo tmp > /tmp/t.txt && "
    "echo host > /workspace/project/host.txt && head -c 20000000 /dev/urandom > /workspace/blob && "
    "md5sum /workspace/blob | cut -c1-32"
)
CHECK = ("cat /workspace/src/a.txt ~/.config/x /tmp/t.txt /workspace/project/host.txt && readlink /workspace/link && "
         "/workspace/bin/run.sh && md5sum /workspace/blob | cut -c1-32")


@pytest.fixture(scope="module")
def life(engine) -> Iterator[DockerEngine]:  # type: ignore[no-untyped-def]
    root = Path(tempfile.mkdtemp(prefix="cbx-snap-", dir="/tmp"))
    snapshots = Path(tempfile.mkdtemp(prefix="cbx-snapshots-"))
    eng = DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=snapshots)
    try:
        yield eng
    finally:
        for info in eng.list_sandboxes(stats=False):
            if info.name is not None and info.name.startswith("t-"):
                eng.remove(info.sandbox_id)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(snapshots, ignore_errors=True)


@pytest.fixture
def host_dirs(tmp_path: Path) -> tuple[Path, Path]:
    project, data = tmp_path / "project", tmp_path / "data"
    project.mkdir()
    data.mkdir()
    project.chmod(0o777)  # writable by the tool user
    tmp_path.chmod(0o755)
    (data / "readme").write_text("read only\n")
    return project, data


def test_snapshot_then_fork_after_the_original_is_destroyed(life: DockerEngine, host_dirs: tuple[Path, Path]) -> None:
    project, data = host_dirs
    spec = SandboxSpec(image=IMAGE, memory="1g", mounts=(
        Mount(source=project, target="/workspace/project", read_only=False),
        Mount(source=data, target="/data"),
    ))
    original = life.create(spec, name="t-orig", owner="user:test")
    forked = None
    try:
        digest = run(original, FILES).stdout.data().strip()
        info = original.snapshot("t-snap")
        assert info.captured == ["/home/sandbox", "/tmp", "/workspace"]
        assert (info.source_sandbox_id, info.source_name, info.owner) == (original.id, "t-orig", "user:test")
        assert [(link.path, link.target) for link in info.links] == [("/workspace/link", "src/a.txt")]
        assert any(f"read-write mount /workspace/project (host {project})" in n for n in info.not_captured)
        assert any(f"read-only mount /data (host {data})" in n for n in info.not_captured)
        assert "/workspace/project (a mount: the host's data, not copied)" in info.skipped
        (workspace,) = [p for p in info.places if p.path == "/workspace"]
        assert workspace.bytes >= 20_000_000 and workspace.files == 3
        with tarfile.open(info.directory / workspace.file) as tar:
            assert not any(name.startswith("project") for name in tar.getnames())
        assert [s.name for s in life.snapshots()] == ["t-snap"]
        with pytest.raises(SnapshotExists):
            original.snapshot("t-snap")

        original.destroy()
        with pytest.raises(SandboxNotFound):
            life.open("t-orig")
        assert life.drain(60)  # the container's removal runs in the background; wait for it
        assert not life.client.api.containers(all=True, filters={"id": original.container_id})

        forked = life.fork("t-snap", from_snapshot=True, name="t-fork")
        assert (forked.name, forked.owner) == ("t-fork", "user:test")
        assert forked.spec.mounts == spec.for_host().mounts  # the same host directories again
        result = run(forked, CHECK)
        assert result.exit_code == 0, result.stderr.data()
        assert result.stdout.data() == b"source\nhome\ntmp\nhost\nsrc/a.txt\nran\n" + digest + b"\n"

        # a live fork: snapshotted on the way, nothing of the temporary snapshot left
        live = life.fork(forked)
        try:
            assert run(live, "cat /workspace/src/a.txt").stdout.data() == b"source\n"
        finally:
            live.destroy()
        assert sorted(p.name for p in life.snapshot_store.root.iterdir()) == ["t-snap"]
    finally:
        original.destroy()
        if forked is not None:
            forked.destroy()
    life.remove_snapshot("t-snap")
    assert life.snapshots() == []
    with pytest.raises(SnapshotNotFound):
        life.remove_snapshot("t-snap")


@pytest.mark.engine_restart  # stops dockerd: run alone (make test runs it after the rest)
def test_restore_after_the_docker_daemon_restarts(life: DockerEngine) -> None:
    client = life.client
    if client.info().get("LiveRestoreEnabled"):
        unavailable("live-restore is on: sandboxes survive a daemon restart")
    pid = _dockerd_pid()
    systemd = _under_systemd(pid)
    box = life.create(SandboxSpec(image=IMAGE), name="t-restore", owner="user:test")
    stopped = False
    restored = None
    try:
        assert run(box, "echo kept > /workspace/f && echo gone-too > /workspace/g").exit_code == 0
        box.snapshot("t-restore-1")
        assert run(box, "rm /workspace/g").exit_code == 0  # after the snapshot: not restored
        os.kill(pid, signal.SIGTERM)
        stopped = True
        _wait_until("dockerd exiting", lambda: not _alive(pid), STOP_DEADLINE_S)
        _start_daemon(systemd)
        stopped = False
        _wait_until("the engine answering", lambda: _answers(client), START_DEADLINE_S)

        assert box.id in life.gc()  # its container stopped with the daemon: removed, the name kept
        (listed,) = [i for i in life.list_sandboxes() if i.name == "t-restore"]
        assert (listed.state, listed.sandbox_id, listed.owner) == ("gone", box.id, "user:test")
        with pytest.raises(SandboxGone, match=r"sandbox t-restore is gone.*callbox sandbox restore t-restore"):
            life.open("t-restore")

        restored = life.restore("t-restore")
        assert (restored.name, restored.owner) == ("t-restore", "user:test") and restored.id != box.id
        assert run(restored, "cat /workspace/f /workspace/g").stdout.data() == b"kept\ngone-too\n"
        assert [i.state for i in life.list_sandboxes() if i.name == "t-restore"] == ["running"]
    finally:
        if stopped or not _answers(client):
            _wait_until("dockerd exiting", lambda: not _alive(pid), STOP_DEADLINE_S)
            _start_daemon(systemd)
            _wait_until("the engine answering", lambda: _answers(client), START_DEADLINE_S)
        life.remove(restored.id if restored is not None else box.id)
        life.remove_snapshot("t-restore-1")
