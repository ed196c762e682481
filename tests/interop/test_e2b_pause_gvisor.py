"""The E2B SDK (``e2b``, unmodified) pausing a gVisor sandbox on ``callbox serve --e2b``: with
``runtime = "runsc"`` (and network none) the door's pause goes to disk, so the sandbox's
container stops and its memory is freed; ``Sandbox.connect`` restores it, with the background
server it ran still answering on its port. One server and one sandbox (as root, with ``make
runsc``); the sandbox is killed at the end.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2b import Sandbox, SandboxState

from tests.conftest import unavailable
from tests.interop.e2b_server import E2bServer, owned_containers, policy_text, sdk_environment, serve_e2b

pytestmark = [pytest.mark.docker, pytest.mark.interop]

PORT = 8765
FETCH = (f"python3 -c \"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{PORT}/page.txt', "
         "timeout=5).read().decode().strip())\"")


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    if "runsc" not in (engine.client.info().get("Runtimes") or {}):
        unavailable("the Docker engine has no runtime runsc (run `make runsc`)", module=True)
    if os.geteuid() != 0:
        unavailable("a pause to disk runs `runsc checkpoint`, which needs root", module=True)
    policy = policy_text().replace("[sandbox]\n", '[sandbox]\nruntime = "runsc"\nnetwork = "none"\n', 1)
    with serve_e2b(engine, policy=policy) as served:
        yield served


def test_pause_of_a_gvisor_sandbox_goes_to_disk_and_connect_restores_its_processes(
        server: E2bServer, engine: Any) -> None:
    with sdk_environment(server):
        sandbox = Sandbox.create(timeout=300)
        try:
            sandbox.files.write("/tmp/page.txt", "served before the pause\n")
            served = sandbox.commands.run(f"cd /tmp && exec python3 -m http.server {PORT} --bind 127.0.0.1",
                                          background=True)
            deadline = time.monotonic() + 20
            while sandbox.commands.run(FETCH + " || true").stdout.strip() != "served before the pause":
                assert time.monotonic() < deadline, "the sandbox's server did not answer"
                time.sleep(0.1)

            sandbox.beta_pause()
            assert Sandbox.get_info(sandbox.sandbox_id).state == SandboxState.PAUSED
            [container] = owned_containers(engine, server.pid)
            # to disk: the container stopped (no memory held), not frozen
            assert engine.client.api.inspect_container(container)["State"]["Status"] == "exited"

            resumed = Sandbox.connect(sandbox.sandbox_id, timeout=120)
            assert resumed.get_info().state == SandboxState.RUNNING
            assert engine.client.api.inspect_container(container)["State"]["Status"] == "running"
            # the same server process, restored: it answers without having been started again
            assert resumed.commands.run(FETCH).stdout.strip() == "served before the pause"
            assert served.pid in [p.pid for p in resumed.commands.list()]
        finally:
            with contextlib.suppress(Exception):  # cleanup: gone already is fine
                Sandbox.kill(sandbox.sandbox_id)
