"""Living sandboxes on the real engine: a named sandbox reopened by another engine instance
(another process would do the same: everything it needs is on the host), its TTL and
keep-alive, and pause: no CPU while frozen (read from the cgroup), the expiry clock
stopped, the expiry moved by the paused time on resume, a paused sandbox removed. What gc
decides for named and paused sandboxes is unit-tested (tests/unit/test_lifetime_records.py)."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engine.docker.engine import (
    DockerEngine,
    NameInUse,
    SandboxNotFound,
    SandboxPaused,
)
from harness.engine.docker.lifetime import read_record
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def engines(engine) -> Iterator[tuple[DockerEngine, DockerEngine]]:  # type: ignore[no-untyped-def]
    """Two engine instances sharing a run root of this module's own (short: sun_path)."""
    root = Path(tempfile.mkdtemp(prefix="cbx-life-", dir="/tmp"))
    snapshots = Path(tempfile.mkdtemp(prefix="cbx-life-snaps-"))
    first = DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=snapshots)
    second = DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=snapshots)
    try:
        yield first, second
    finally:
        for info in first.list_sandboxes(stats=False):
            if info.name is not None and info.name.startswith("t-"):
                first.remove(info.sandbox_id)
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(snapshots, ignore_errors=True)


def _expiry_file(box) -> float:  # type: ignore[no-untyped-def]
    return float((box.socket_dir / "expires").read_text())


def test_a_named_sandbox_is_opened_elsewhere_and_kept_alive(engines) -> None:  # type: ignore[no-untyped-def]
    first, second = engines
    box = first.create(SandboxSpec(image=IMAGE), name="t-named", ttl_s=120, owner="user:test")
    try:
        assert box.expires == pytest.approx(time.time() + 120, abs=5)
        assert run(box, "echo hello > /workspace/note").exit_code == 0
        with pytest.raises(NameInUse, match=r"named t-named already exists .*`callbox sandbox rm t-named`"):
            second.create(SandboxSpec(image=IMAGE), name="t-named")

        again = second.open("t-named")
        assert (again.id, again.name, again.owner) == (box.id, "t-named", "user:test")
        assert run(again, ["cat", "/workspace/note"]).stdout.data() == b"hello\n"
        assert second.open(box.id).id == box.id  # by id too
        (listed,) = [i for i in second.list_sandboxes() if i.sandbox_id == box.id]
        assert (listed.name, listed.owner, listed.state) == ("t-named", "user:test", "running")
        assert listed.cpu_usage_s is not None and listed.cpu_usage_s > 0 and listed.memory_bytes
        assert listed.expires == pytest.approx(box.expires, abs=1)

        expires = again.keep_alive(900)
        assert expires == pytest.approx(time.time() + 900, abs=5)
        assert _expiry_file(box) == pytest.approx(expires, abs=1)  # what the agent obeys
        record = read_record(first.run_root, box.id)
        assert record is not None and record.expires == expires and record.ttl_s == 120
        assert box.id not in first.gc()  # a live named sandbox stays
        assert first.keep_alive(box) == pytest.approx(time.time() + 120, abs=5)  # its own TTL
        with pytest.raises(SandboxNotFound, match="no sandbox named t-nobody"):
            second.open("t-nobody")
    finally:
        first.remove("t-named")
    with pytest.raises(SandboxNotFound):
        second.open("t-named")
    assert not first.client.api.containers(all=True, filters={"id": box.container_id})
    assert read_record(first.run_root, box.id) is None


def test_pause_freezes_cpu_and_stops_the_expiry_clock(engines) -> None:  # type: ignore[no-untyped-def]
    first, second = engines
    box = first.create(SandboxSpec(image=IMAGE), name="t-pause", ttl_s=60)
    try:
        box.jobs.start("while :; do :; done", tag="busy")
        start = box.stats().cpu_usage_s
        deadline = time.monotonic() + 10
        while box.stats().cpu_usage_s < start + 0.2:  # the loop runs
            assert time.monotonic() < deadline, "the busy loop never used CPU"
            time.sleep(0.02)

        before = box.expires
        t0 = time.monotonic()
        box.pause()
        pause_s = time.monotonic() - t0
        paused_at = time.time()
        frozen = box.stats()
        with pytest.raises(SandboxPaused, match="sandbox t-pause is paused; resume it with `callbox sandbox resume "
                                                "t-pause`"):
            box.jobs.list()
        elsewhere = second.open("t-pause")  # returned paused, without waiting for its agent
        assert elsewhere.paused
        with pytest.raises(SandboxPaused):
            elsewhere.transfer.download("/workspace")
        (listed,) = [i for i in second.list_sandboxes() if i.sandbox_id == box.id]
        assert listed.state == "paused" and listed.paused_at == pytest.approx(paused_at, abs=1)

        assert box.id not in second.gc()  # (that it spares one past its expiry is a unit test)
        time.sleep(1.0)  # the interval measured: a second of frozen busy loop
        after = box.stats()
        assert after.cpu_usage_s - frozen.cpu_usage_s < 0.01, (frozen, after)

        paused_for = time.time() - paused_at
        t0 = time.monotonic()
        expires = elsewhere.resume()
        resume_s = time.monotonic() - t0
        assert expires - before == pytest.approx(paused_for, abs=1.0)
        assert _expiry_file(box) == pytest.approx(expires, abs=1)
        assert not box.paused and not elsewhere.paused
        assert run(box, ["echo", "awake"]).stdout.data() == b"awake\n"
        thawed = box.stats().cpu_usage_s
        deadline = time.monotonic() + 10
        while box.stats().cpu_usage_s < thawed + 0.1:  # the loop runs again
            assert time.monotonic() < deadline, "the busy loop did not resume"
            time.sleep(0.02)
        print(f"pause {pause_s * 1000:.0f} ms, resume (until the agent answers) {resume_s * 1000:.0f} ms")
    finally:
        first.remove("t-pause")


def test_a_paused_sandbox_can_be_removed(engines) -> None:  # type: ignore[no-untyped-def]
    first, _ = engines
    box = first.create(SandboxSpec(image=IMAGE), owner="user:test")
    try:
        box.pause()
    finally:
        first.remove(box.id)
    assert not first.client.api.containers(all=True, filters={"id": box.container_id})
    assert read_record(first.run_root, box.id) is None
