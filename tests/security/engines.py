"""The host side of a sandbox for the security tests, under either test engine.

``CALLBOX_TEST_ENGINE=docker`` (the default) runs every sandbox on this machine's Docker
engine; ``ray`` runs it on a worker node of the Ray test cluster (tests/ray/cluster.py), in
that node's own dockerd. A test that reads the host side of a sandbox (the container's
configuration, its writable layer, its agent socket directory) asks here, so it reads the
node's view whichever engine made the sandbox, and its assertions stay the same.

The test cluster's nodes are network namespaces of this machine: they share its filesystem
and its kernel, so a node's dockerd socket and a sandbox's socket directory are paths this
process can open, and a bind mount's source on the node is a path of this machine.
"""

from __future__ import annotations

import functools
import ipaddress
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from harness.engine.docker import labels
from tests.conftest import ENGINE

if TYPE_CHECKING:
    import docker
    from docker.models.containers import Container

ON_RAY = ENGINE == "ray"
"""The sandboxes of this session are remote (on the Ray test cluster's worker nodes)."""

NETWORKED = ('the Ray engine runs network = "none" sandboxes only and refuses "open" and "allowlist" by '
             "design (the egress proxy's decisions would stay on the node, out of the audit log); "
             'network = "none" runs remotely in test_isolation, test_attacks and test_recon_probe')
"""Why the tests of networked sandboxes (their egress proxy, packet filter, test destination
and networks between sandboxes) do not run on the Ray engine."""


def not_on_ray(reason: str) -> pytest.MarkDecorator:
    """Skip a test (or a module, as ``pytestmark``) under ``CALLBOX_TEST_ENGINE=ray``: it
    concerns more than one sandbox or this machine itself, and ``reason`` says what."""
    return pytest.mark.skipif(ON_RAY, reason=f"not a single-sandbox check on the Ray engine: {reason}")


@functools.cache
def _node_client(node: str) -> docker.DockerClient:
    """A client of ``node``'s own dockerd, kept for the session (one per node)."""
    import docker

    from tests.ray.layout import WORKERS

    by_name = {worker.name: worker for worker in WORKERS}
    if node not in by_name:
        raise AssertionError(f"sandbox on node {node!r}, which is no worker of the test cluster ({', '.join(by_name)})")
    return docker.DockerClient(base_url=by_name[node].docker_host, timeout=120)


def docker_client(box: Any) -> docker.DockerClient:
    """The Docker engine that runs ``box``: this machine's, or its Ray node's own dockerd."""
    if ON_RAY:
        return _node_client(box.node)
    return box.engine.client  # type: ignore[no-any-return]


def container(box: Any) -> Container:
    """``box``'s container as its own engine reports it."""
    return docker_client(box).containers.get(box.container_id)


def socket_dir(box: Any) -> Path:
    """The directory of ``box``'s agent socket on the machine that runs it. On a Ray node it is
    the node engine's (its run root), recorded in the container's label by that engine."""
    if ON_RAY:
        return Path(container(box).labels[labels.SOCKET_DIR])
    return Path(box.socket_dir)


def machine(box: Any) -> str:
    """The machine that runs ``box``: its Ray node's name, or ``local``."""
    return str(box.node) if ON_RAY else "local"


def beside(box: Any) -> dict[str, Any]:
    """Spec fields that put a new sandbox on the same machine as ``box`` (its Ray node), so a
    measurement in ``box`` sees what an attack from the new one does to its neighbours."""
    if ON_RAY:
        return {"placement": {"nodes": [box.node]}}
    return {}


def listening_neighbours(box: Any, engine: Any) -> list[tuple[str, int]]:
    """``(address, port)`` of services next to ``box``'s container that really listen or that
    a container network would route to, none of which a ``network = "none"`` sandbox may reach.

    Docker: the engine's default bridge gateway (this machine) at Docker's TCP port. A Ray
    node's dockerd has no bridge network (the Ray engine runs ``network = "none"`` sandboxes
    only); what listens beside a sandbox there is its node's relay, which reaches every agent
    socket of the node, and the cluster's GCS, which runs code on every node."""
    if ON_RAY:
        relay_host, relay_port = box.handle.relay_address.rsplit(":", 1)
        gcs_host, gcs_port = engine.settings.address.rsplit(":", 1)
        return [(relay_host, int(relay_port)), (gcs_host, int(gcs_port))]
    ipam = engine.client.networks.get("bridge").attrs["IPAM"]["Config"][0]
    return [(ipam.get("Gateway") or str(ipaddress.ip_network(ipam["Subnet"])[1]), 2375)]
