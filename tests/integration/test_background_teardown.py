"""``destroy`` returns at once and the removal happens in the background, leak-free.

Real engine throughout. Each test's engine has a run root of its own, so what it leaves
behind is exact: no container, network or socket directory of its sandboxes after a drain.
The only thing not real is the fault in ``test_a_removal_that_fails_is_retried``: our own
removal step raises once before doing the real removal (Docker itself cannot be made to
fail a removal once, on cue).
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from harness.core.errors import EngineUnavailable
from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.docker.kept import expiry_passed
from harness.engine.docker.lifetime import judge, read_record
from harness.engine.docker.networks import network_name, proxy_name
from harness.engine.docker.teardown import Removal
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

DRAIN_S = 120.0
"""A bound for the drains here (they wait on the removals, this only stops a hung test)."""
BURST = 12


@pytest.fixture
def own_engine(engine: DockerEngine) -> Iterator[DockerEngine]:
    run_root = Path(tempfile.mkdtemp(prefix="cbx-td-", dir="/tmp"))
    eng = DockerEngine(engine.client, run_root=run_root, reap_on_start=False)
    try:
        yield eng
    finally:
        eng.close(DRAIN_S)
        for c in _containers(eng):
            eng.client.api.remove_container(c["Id"], force=True, v=True)
        shutil.rmtree(run_root, ignore_errors=True)


def _spec(**fields: Any) -> SandboxSpec:
    return SandboxSpec(image=IMAGE, memory="128m", pids=64, **fields)


def _containers(eng: DockerEngine, ids: set[str] | None = None) -> list[dict[str, Any]]:
    """Containers (sandboxes and egress proxies) of ``eng``'s run root, or of ``ids``."""
    found = eng.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
    return [c for c in found
            if str((c.get("Labels") or {}).get(labels.SOCKET_DIR, "")).startswith(f"{eng.run_root}/")
            or (ids is not None and (c.get("Labels") or {}).get(labels.SANDBOX_ID) in ids)]


def _networks(eng: DockerEngine, ids: set[str]) -> list[str]:
    return [n["Name"] for n in eng.client.api.networks(filters={"label": labels.MANAGED})
            if (n.get("Labels") or {}).get(labels.SANDBOX_ID) in ids]


def _socket_dirs(eng: DockerEngine) -> list[str]:
    return sorted(p.name for p in eng.run_root.iterdir() if p.is_dir() and len(p.name) == 12) \
        if eng.run_root.exists() else []


def _assert_nothing_left(eng: DockerEngine, ids: set[str]) -> None:
    assert _containers(eng, ids) == []
    assert _networks(eng, ids) == []
    assert _socket_dirs(eng) == []


def test_destroy_returns_and_a_drain_removes_everything(own_engine: DockerEngine) -> None:
    eng = own_engine
    box = eng.create(_spec())
    socket_dir = box.socket_dir
    box.destroy()
    # Right away: not listed for this process, unusable, its expiry set (its agent stops itself).
    assert box.id not in {i.sandbox_id for i in eng.list_sandboxes(stats=False)}
    assert box.id in eng.teardown.removing()
    expiry = socket_dir / "expires"
    assert expiry_passed(str(socket_dir), time.time()) or not expiry.exists()  # (or already removed)
    assert eng.drain(DRAIN_S)
    _assert_nothing_left(eng, {box.id})
    assert eng.teardown.removing() == set()


def test_a_destroyed_name_is_free_at_once(own_engine: DockerEngine) -> None:
    eng = own_engine
    first = eng.create(_spec(), name="td-name")
    second: Sandbox | None = None
    try:
        first.destroy()
        assert read_record(eng.run_root, first.id) is None
        second = eng.create(_spec(), name="td-name")  # before the first one's removal is done
        assert second.id != first.id
        assert [i.sandbox_id for i in eng.list_sandboxes(stats=False) if i.name == "td-name"] == [second.id]
    finally:
        if second is not None:
            second.destroy()
    assert eng.drain(DRAIN_S)
    _assert_nothing_left(eng, {first.id, second.id})


def test_remove_returns_once_the_container_is_gone(own_engine: DockerEngine) -> None:
    """``remove`` (``callbox sandbox rm``) waits for its own removal, unlike ``destroy``."""
    eng = own_engine
    box = eng.create(_spec(), name="td-rm")
    assert eng.remove("td-rm") == box.id
    assert not eng.client.api.containers(all=True, filters={"id": box.container_id})
    assert box.id not in eng.teardown.removing()


def test_a_burst_of_destroys_leaves_nothing(own_engine: DockerEngine) -> None:
    eng = own_engine
    networked = eng.networks.packet_filter.problem() is None
    specs = [_spec(network="open") if networked and i == 0 else
             _spec(network="allowlist", allow_hosts=("example.com",)) if networked and i == 1 else _spec()
             for i in range(BURST)]
    with ThreadPoolExecutor(4) as threads:
        boxes = list(threads.map(eng.create, specs))
    ids = {b.id for b in boxes}
    try:
        for box in boxes:
            box.destroy()
        assert not ids & {i.sandbox_id for i in eng.list_sandboxes(stats=False)}
    finally:
        assert eng.drain(DRAIN_S)
    _assert_nothing_left(eng, ids)
    if networked:
        assert not [c for c in eng.client.api.containers(all=True, filters={"name": proxy_name(boxes[1].id)})]
        assert not eng.client.api.networks(names=[network_name(boxes[0].id)])


def test_a_removal_that_fails_is_retried(own_engine: DockerEngine, caplog: pytest.LogCaptureFixture) -> None:
    eng = own_engine
    real = eng.teardown.remove_now
    attempts: list[str] = []

    def flaky(removal: Removal) -> None:
        attempts.append(removal.sandbox_id)
        if len(attempts) == 1:
            raise docker.errors.APIError("injected: the engine refused the removal once")
        real(removal)

    eng.teardown.remove_now = flaky  # type: ignore[method-assign]
    box = eng.create(_spec())
    with caplog.at_level(logging.WARNING, logger="callbox.engine"):
        box.destroy()
        assert eng.drain(DRAIN_S)
    assert attempts == [box.id, box.id]
    assert any("retrying" in r.getMessage() and box.id in r.getMessage() for r in caplog.records)
    _assert_nothing_left(eng, {box.id})


def test_close_drains_and_later_destroys_are_synchronous(own_engine: DockerEngine) -> None:
    eng = own_engine
    boxes = [eng.create(_spec()) for _ in range(3)]
    for box in boxes:
        box.destroy()
    assert eng.close(DRAIN_S)
    _assert_nothing_left(eng, {b.id for b in boxes})
    late = eng.create(_spec())
    late.destroy()  # closed: removed before destroy returns
    assert eng.teardown.pending() == 0
    _assert_nothing_left(eng, {late.id})


def _child(code: str, run_root: Path) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import os
        from pathlib import Path
        from harness.engine.docker.engine import DockerEngine
        from harness.engine.spec import SandboxSpec
        engine = DockerEngine.connect(run_root=Path({str(run_root)!r}), reap_on_start=False)
    """) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False)


def test_a_process_that_exits_right_after_destroy_leaves_nothing(own_engine: DockerEngine) -> None:
    """Exit drains: the child returns from ``destroy`` and ends at once; by the time it is gone
    so is its sandbox."""
    child = _child(f"""
        box = engine.create(SandboxSpec(image={IMAGE!r}))
        box.destroy()
        print(box.id, engine.teardown.pending(), flush=True)
    """, own_engine.run_root)
    assert child.returncode == 0, child.stderr
    sandbox_id, pending = child.stdout.split()
    assert pending == "1"  # it really was still pending when the child began to exit
    _assert_nothing_left(own_engine, {sandbox_id})


def test_callbox_exec_leaves_no_container(engine: DockerEngine) -> None:
    """The CLI destroys its sandbox and exits at once: the exit drains the removal."""
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "exec", "--image", IMAGE, "--", "true"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    found = engine.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
    assert [c["Names"] for c in found if f"/{proc.pid}/" in (c.get("Labels") or {}).get(labels.OWNER, "")] == []


def test_gc_of_a_later_process_removes_what_a_crashed_one_left(own_engine: DockerEngine) -> None:
    """A process that dies between ``destroy`` and its background removal (here: the removal is
    never queued, then ``os._exit``) leaves a container whose owner (this test) still lives; its
    expiry file, set by ``destroy``, makes gc remove it. The verdict is gc's own (``judge`` on what
    ``reaper.gc`` reads): a whole-engine gc would also judge other sessions' sandboxes."""
    eng = own_engine
    box = eng.create(_spec(), name="td-crash")
    try:
        child = _child(f"""
            engine.teardown.submit = lambda removal: None
            engine.destroy({box.id!r})
            os._exit(0)
        """, eng.run_root)
        assert child.returncode == 0, child.stderr
        (found,) = _containers(eng, {box.id})
        lab = found.get("Labels") or {}
        now = time.time()
        verdict = judge(state=found.get("State"), record=read_record(eng.run_root, box.id), kept_until=None, now=now,
                        label_expired=labels.is_expired(lab, now), orphaned=labels.is_orphaned(lab, eng.hostname),
                        expiry_file_passed=expiry_passed(lab.get(labels.SOCKET_DIR), now))
        assert verdict.remove, verdict
    finally:
        box.destroy()
    assert eng.drain(DRAIN_S)
    _assert_nothing_left(eng, {box.id})


def test_destroy_on_an_engine_that_is_not_there_says_so(tmp_path: Path) -> None:
    """Nothing listens on the engine's socket (dockerd stopped): a clear error at once, as before,
    and nothing queued to retry (a process exiting then would wait in vain)."""
    client = docker.DockerClient(base_url=f"unix://{tmp_path}/no-dockerd.sock", version="1.41")
    eng = DockerEngine(client, run_root=tmp_path / "run", reap_on_start=False)
    with pytest.raises(EngineUnavailable, match="lost the Docker engine"):
        eng.destroy("0123456789ab")
    assert eng.teardown.pending() == 0
    assert eng.close(1.0)
