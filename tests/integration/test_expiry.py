"""A sandbox stops itself at its expiry, even if no harness ever runs again; gc then removes it."""

from __future__ import annotations

import time

import pytest

from harness.engine.docker.engine import write_expiry
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker


# Alone: between the expiry and the agent's next look at it (up to 5 s), a gc of any other
# process on the engine removes the sandbox as expired, and the container never stops on its own.
@pytest.mark.alone
def test_expired_sandbox_stops_on_its_own_and_gc_removes_it(engine):
    box = engine.create(SandboxSpec(image=IMAGE))
    try:
        api = engine.client.api
        assert api.inspect_container(box.container_id)["State"]["Running"]
        write_expiry(box.socket_dir, time.time() + 1)
        # wait on the engine's own event: the container exits once the agent stops
        status = api.wait(box.container_id, timeout=30)
        assert status["StatusCode"] == 0
        assert box.id in engine.gc()
        assert not api.containers(all=True, filters={"id": box.container_id})
        assert not box.socket_dir.exists()
    finally:
        engine.destroy(box.id)


def test_a_live_sandbox_is_not_removed_by_gc(engine):
    box = engine.create(SandboxSpec(image=IMAGE))
    try:
        assert box.id not in engine.gc()
        assert engine.client.api.inspect_container(box.container_id)["State"]["Running"]
    finally:
        engine.destroy(box.id)
