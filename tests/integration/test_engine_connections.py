"""The harness's connections to the Docker engine: one pool for the socket, as wide as the
requests the harness runs at once, never closed while a request still uses it.

docker-py keys its unix-socket pools by the whole URL and keeps the 25 last used, so a
burst of creates (each naming its own container) evicted and closed a pool that was still
lending connections; a request that then returned its connection to it while it overflowed
failed with urllib3's ``AttributeError: 'NoneType' object has no attribute 'qsize'``.
Real engine, real requests (inspecting containers that do not exist: a cheap 404).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import docker
import docker.errors
import pytest

from harness.engine.docker.client import ENGINE_CONNECTIONS, OnePoolAdapter, connect_client

pytestmark = pytest.mark.docker

BURST = 100


@pytest.fixture(scope="module")
def client() -> Iterator[docker.DockerClient]:
    client = connect_client()
    try:
        yield client
    finally:
        client.close()


def _missing(client: docker.DockerClient, name: str = "") -> None:
    with pytest.raises(docker.errors.NotFound):
        client.api.inspect_container(name or f"cbx-missing-{uuid.uuid4().hex}")


def test_requests_to_many_urls_share_one_pool_that_stays_open(client: docker.DockerClient) -> None:
    adapter = client.api.get_adapter(OnePoolAdapter.POOL_KEY)
    assert isinstance(adapter, OnePoolAdapter)
    pool = adapter.get_connection("http+docker://localhost/v1.44/containers/first/json")
    for _ in range(40):  # more distinct URLs than docker-py's 25 pools
        _missing(client)
    assert pool.pool is not None, "the pool was closed while the client still uses it"
    assert adapter.get_connection("http+docker://localhost/v1.44/images/other/json") is pool
    assert pool.pool.maxsize == ENGINE_CONNECTIONS


def test_a_burst_of_concurrent_requests_keeps_every_connection(client: docker.DockerClient,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    barrier = threading.Barrier(BURST)
    name = f"cbx-missing-{uuid.uuid4().hex}"  # one URL: docker-py's pool of 10 for it overflowed
    errors: list[BaseException] = []

    def one() -> None:
        try:
            barrier.wait(timeout=30)
            _missing(client, name)
        except BaseException as exc:  # any failure is the test's finding
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(BURST)]
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert errors == []
    # A pool narrower than the burst discards the connections it cannot keep, with a warning each.
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
