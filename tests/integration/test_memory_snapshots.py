"""Memory snapshots under gVisor on the real engine (``runtime = "runsc"``, as root): a Python
REPL (a background job) holds a variable and a server listens on a port; a memory snapshot
keeps both. A fork of the snapshot runs beside the original with its own state, and the
original, removed and restored by name, has its REPL's variable and its server again.
A pause to disk saves a fourth one's processes and stops its container; resume restores them.
Under runc, ``--memory`` and a pause to disk are refused, naming the runtime to use. At most
two gVisor sandboxes at once."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.docker import disk_pause
from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.docker.lifetime import SandboxPaused, read_record
from harness.engine.jobs import JobChunk
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, unavailable
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

PORT = 8765
ANSWER_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def life(engine) -> Iterator[DockerEngine]:  # type: ignore[no-untyped-def]
    if "runsc" not in (engine.client.info().get("Runtimes") or {}):
        unavailable("the Docker engine has no runtime runsc (run `make runsc`)", module=True)
    if os.geteuid() != 0:
        unavailable("memory snapshots run `runsc checkpoint`, which needs root", module=True)
    root = Path(tempfile.mkdtemp(prefix="cbx-memsnap-", dir="/tmp"))
    snapshots = Path(tempfile.mkdtemp(prefix="cbx-memsnap-store-"))
    eng = DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=snapshots)
    try:
        yield eng
    finally:
        for info in eng.list_sandboxes(stats=False):
            if info.name is not None and info.name.startswith("t-mem"):
                eng.remove(info.sandbox_id)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(snapshots, ignore_errors=True)


def _repl_says(box: Sandbox, pid: int, expression: str) -> str:
    """What the REPL job ``pid`` prints for ``expression`` (a marker line around it)."""
    marker = f"@{time.monotonic_ns()}@"
    box.agent.jobs.write(pid, f"print({marker!r} + str({expression}) + {marker!r})\n".encode())
    seen = b""
    for event in box.agent.jobs.attach(pid, follow=True, timeout=ANSWER_TIMEOUT_S):
        if not isinstance(event, JobChunk):
            continue
        seen += event.data
        text = seen.decode(errors="replace")
        if text.count(marker) >= 2:
            return text.split(marker)[-2]
    raise AssertionError(f"the REPL did not answer {expression}; its output: {seen[-500:]!r}")


def _served(box: Sandbox) -> str:
    """The page the sandbox's server answers on its port (waits until it answers)."""
    fetch = (f"import urllib.request, time\nfor _ in range(200):\n    try:\n"
             f"        print(urllib.request.urlopen('http://127.0.0.1:{PORT}/page.txt', timeout=2).read().decode())\n"
             f"        break\n    except OSError:\n        time.sleep(0.05)\n")
    result = run(box, ["python3", "-c", fetch])
    assert result.exit_code == 0, result.stderr.data()
    return result.stdout.data().decode().strip()


def _repl_pid(box: Sandbox) -> int:
    return next(job.pid for job in box.agent.jobs.list() if job.tag == "repl" and job.state == "running")


def test_a_memory_snapshot_keeps_processes_through_a_fork_and_a_restore(life: DockerEngine) -> None:
    original = life.create(SandboxSpec(image=IMAGE, runtime="runsc"), name="t-mem-orig")
    repl = original.agent.jobs.start(["python3", "-u", "-i", "-q"], tag="repl", stdin=True).pid
    original.agent.jobs.write(repl, b"kept = 'the value before the snapshot'\n")
    assert run(original, "echo served > /tmp/page.txt").exit_code == 0
    original.agent.jobs.start(["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"], cwd="/tmp")
    assert _served(original) == "served"
    assert _repl_says(original, repl, "kept") == "the value before the snapshot"

    info = original.snapshot("t-mem-snap", memory=True)
    assert info.memory is not None and info.memory.runtime == "runsc" and info.memory.bytes > 0
    manifest = json.loads((info.directory / "manifest.json").read_text())
    assert manifest["memory"]["directory"] == "memory" and (info.directory / "memory").is_dir()
    # The original runs on (its agent listens again) and changes its state after the snapshot.
    original.agent.jobs.write(repl, b"kept = 'changed in the original'\n")
    assert run(original, "echo changed > /tmp/page.txt").exit_code == 0

    fork = life.fork("t-mem-snap", from_snapshot=True, name="t-mem-fork")
    try:
        # The fork resumed the REPL with the variable as it was, and the server answers.
        assert _repl_says(fork, _repl_pid(fork), "kept") == "the value before the snapshot"
        assert _served(fork) == "served"
        # Its own state: a change in the fork is not the original's, nor the other way.
        fork.agent.jobs.write(_repl_pid(fork), b"kept = 'changed in the fork'\n")
        assert _repl_says(fork, _repl_pid(fork), "kept") == "changed in the fork"
        assert _repl_says(original, repl, "kept") == "changed in the original"
        assert _served(original) == "changed"
    finally:
        fork.destroy()

    life.remove("t-mem-orig")
    restored = life.restore("t-mem-orig")
    assert restored.name == "t-mem-orig"
    assert _repl_says(restored, _repl_pid(restored), "kept") == "the value before the snapshot"
    assert _served(restored) == "served"


def _state(life: DockerEngine, box: Sandbox) -> str:
    return str(life.client.api.inspect_container(box.container_id)["State"]["Status"])


def test_a_pause_to_disk_stops_the_container_and_resume_restores_its_processes(life: DockerEngine) -> None:
    box = life.create(SandboxSpec(image=IMAGE, runtime="runsc"), name="t-mem-disk")
    repl = box.agent.jobs.start(["python3", "-u", "-i", "-q"], tag="repl", stdin=True).pid
    box.agent.jobs.write(repl, b"kept = 'the value before the pause'\n")
    assert run(box, "echo before the pause > /tmp/page.txt").exit_code == 0
    box.agent.jobs.start(["python3", "-m", "http.server", str(PORT), "--bind", "127.0.0.1"], cwd="/tmp")
    assert _served(box) == "before the pause"
    expires = box.expires

    box.pause(to_disk=True)
    paused_at = time.time()
    image = disk_pause.image_dir(life.run_root, box.id)
    assert _state(life, box) == "exited" and (image / "checkpoint.img").is_file()
    record = read_record(life.run_root, box.id)
    assert record is not None and record.paused_to_disk and record.is_paused
    with pytest.raises(SandboxPaused):
        box.require_running()
    # Another process sees it paused to disk, and gc keeps it.
    other = DockerEngine(life.client, run_root=life.run_root, reap_on_start=False)
    [shown] = [i for i in other.list_sandboxes() if i.name == "t-mem-disk"]
    assert (shown.state, shown.paused_to_disk) == ("paused", True)
    assert box.id not in other.gc()
    reopened = other.open("t-mem-disk")
    assert reopened.paused

    # The other process resumes it: the same container, the processes where they were.
    resuming = time.time()
    new_expiry = reopened.resume()
    assert new_expiry >= expires + (resuming - paused_at)  # the clock stood still while paused
    assert _state(life, box) == "running" and not image.exists()
    assert not read_record(life.run_root, box.id).paused_to_disk  # type: ignore[union-attr]
    assert _repl_says(reopened, repl, "kept") == "the value before the pause"
    assert _served(reopened) == "before the pause"
    reopened.agent.close()

    # Removed while paused to disk: its image goes with it.
    box.pause(to_disk=True)
    assert image.is_dir()
    life.remove("t-mem-disk")
    life.drain(60)
    assert not image.exists() and not life.client.api.containers(all=True, filters={"id": box.container_id})


def test_a_memory_snapshot_or_a_pause_to_disk_under_runc_is_refused_naming_runsc(life: DockerEngine) -> None:
    box = life.create(SandboxSpec(image=IMAGE, runtime="runc"))
    try:
        with pytest.raises(CallboxError) as refused:
            box.snapshot("t-mem-runc", memory=True)
        assert refused.value.code == ErrorCode.NOT_SUPPORTED
        assert 'runtime = "runsc"' in str(refused.value) and "CRIU" in str(refused.value)
        assert not (life.snapshot_store.root / "t-mem-runc").exists()  # refused before anything was written
        with pytest.raises(CallboxError) as refused:
            box.pause(to_disk=True)
        assert refused.value.code == ErrorCode.NOT_SUPPORTED and "CRIU" in str(refused.value)
        assert "--to-disk" in str(refused.value)
        # never a freezer pause instead
        assert not box.paused and _state(life, box) == "running"
    finally:
        box.destroy()
