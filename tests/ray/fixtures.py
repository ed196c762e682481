"""Fixtures of the Ray tests (a plugin of tests/conftest.py, so tests/security can run against
the Ray engine too): the real three-node Ray cluster of tests/ray/cluster.py, built once per
session and removed at its end, whatever happened in between, and one RayEngine on it for the
whole session.

Building it needs root, iproute2, nsenter, dockerd and ray; without them the Ray tests skip
saying why, and fail under CI=true.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

from tests.conftest import unavailable

if TYPE_CHECKING:
    from tests.ray.cluster import RayTestCluster


def _disconnect_driver() -> None:
    """Shut this process's Ray driver down if it is connected: a driver left connected to a GCS
    that went away exits its whole process after a minute."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayTestCluster]:
    """The running cluster; this process may drive it (``use_as_driver`` is applied):
    ``ray.init(address=ray_cluster.address, _node_ip_address=ray_cluster.node_ip)``."""
    try:
        import ray  # noqa: F401
    except ImportError:
        unavailable("the Ray tests need ray: pip install 'callbox[ray]'")
    from tests.ray.cluster import ClusterUnavailable, RayTestCluster, check_prerequisites

    try:
        check_prerequisites()
    except ClusterUnavailable as exc:
        unavailable(str(exc))
    cluster = RayTestCluster()
    saved = {key: os.environ.get(key) for key in cluster.driver_env()}
    cluster.up(owner=os.getpid())  # removes what it built if it fails; refuses another session's cluster
    try:
        cluster.use_as_driver()
        yield cluster
    finally:
        try:
            _disconnect_driver()
        finally:
            cluster.down()
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture(scope="module")
def ray_driver(ray_engine: Any) -> Any:
    """The ``ray`` module, connected to the cluster as a driver (the session's engine connected it)."""
    import ray

    assert ray.is_initialized()
    return ray


@pytest.fixture(scope="session")
def ray_engine(ray_cluster: RayTestCluster) -> Iterator[Any]:
    """A RayEngine on the cluster for the session (its connect sends the sandbox image to the
    workers, which start without it); every sandbox left is removed at the end."""
    import ray

    from harness.engine.ray.engine import RayEngine
    from harness.engine.ray.settings import RaySettings

    if ray.is_initialized():
        ray.shutdown()
    settings = RaySettings(address=ray_cluster.address, token_file=ray_cluster.token_file,
                           node_ip=ray_cluster.node_ip, namespace="callbox-tests")
    engine = RayEngine.connect(settings)
    try:
        yield engine
    finally:
        try:
            for info in engine.list_sandboxes(stats=False):
                engine.remove(info.sandbox_id)
            engine.close()
        finally:
            ray.shutdown()
