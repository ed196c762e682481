"""Ports without a network: a background ``python3 -m http.server`` in a sandbox with network
"none", reached from the host through forward_port (one Ports.Connect tunnel per connection,
over the agent's socket) with urllib."""

from __future__ import annotations

import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from harness.core.errors import AgentCallError
from harness.engine.jobs import JobChunk, JobEnded
from harness.engine.ports import forward_port
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

PORT = 8000
SITE = "/workspace/site"
READY_TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def box(engine: Any) -> Iterator[Any]:
    sandbox = engine.create(SandboxSpec(image=IMAGE))
    try:
        assert sandbox.spec.network == "none"
        yield sandbox
    finally:
        sandbox.destroy()


@pytest.fixture(scope="module")
def web(box: Any) -> Iterator[int]:
    """http.server serving SITE on the sandbox's loopback, as a background job; ready once it
    has printed that it serves (it listens before it prints)."""
    box.agent.make_dir(SITE, parents=True, exist_ok=True)
    job = box.agent.jobs.start(["python3", "-u", "-m", "http.server", str(PORT), "--bind", "127.0.0.1",
                                "--directory", SITE])
    try:
        output = b""
        for event in box.agent.jobs.attach(job.pid, follow=True, timeout=READY_TIMEOUT_S):
            if isinstance(event, JobChunk):
                output += event.data
                if b"Serving HTTP" in output:
                    break
            elif isinstance(event, JobEnded):
                pytest.fail(f"http.server ended before serving: {output!r}")
        else:
            pytest.fail(f"http.server did not serve within {READY_TIMEOUT_S:g} s: {output!r}")
        yield PORT
    finally:
        box.agent.jobs.kill(job.pid)


def test_a_workspace_file_over_http_through_a_forward(box: Any, web: int) -> None:
    blob = os.urandom(4 << 20)
    box.agent.write_file(f"{SITE}/blob.bin", blob)
    peers: list[tuple[str, int]] = []
    with forward_port(box.agent, web, on_connection=peers.append) as forward:
        url = f"http://{forward.address}"
        with urllib.request.urlopen(f"{url}/blob.bin", timeout=30) as response:
            assert response.status == 200
            assert response.read() == blob
        with urllib.request.urlopen(f"{url}/", timeout=30) as response:
            assert b"blob.bin" in response.read()
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{url}/nothing-here", timeout=30)
        assert missing.value.code == 404
        assert forward.connections == 3
        assert [host for host, _ in peers] == ["127.0.0.1"] * 3


def test_a_port_nothing_listens_on_is_refused(box: Any, web: int) -> None:
    with pytest.raises(AgentCallError) as refused:
        box.agent.ports.connect(web + 1)
    assert refused.value.reason == "CONNECTION_REFUSED"
    assert f"port {web + 1}" in refused.value.message
    with forward_port(box.agent, web + 1) as forward:
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            urllib.request.urlopen(f"http://{forward.address}/", timeout=30)
        assert forward.connections == 1
    # A raw tunnel speaking HTTP itself, half-closing after its request.
    with box.agent.ports.connect(web) as tunnel:
        tunnel.send(b"HEAD / HTTP/1.0\r\n\r\n")
        tunnel.shutdown_write()
        assert b"".join(tunnel.recv()).startswith(b"HTTP/1.0 200")
