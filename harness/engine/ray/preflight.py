"""Before the harness joins a Ray cluster as a driver: checks that fail in seconds, saying why.

``ray.init`` to an address where no cluster answers does not give up: it retries for minutes
(measured with Ray 2.60: still retrying after 300 s), and bounding it with Ray's own reconnect
settings makes Ray abort the whole process. A driver on a machine that is not a node of the
cluster waits 60 s and then says only "Failed to connect". So before ``ray.init``:

* :func:`probe_gcs` makes one gRPC call to the cluster's control store (GCS) with the token,
  with a deadline of a few seconds, needing nothing of Ray (the call is sent as bytes): no
  answer, a refused token, or a peer that is no Ray GCS are each a clear
  :class:`~harness.core.errors.EngineUnavailable`;
* :func:`cluster_nodes` reads the nodes from the GCS (through ray's own GCS client, once the
  probe has shown it answers), and :func:`check_driver_node` refuses a machine that has no
  raylet of the cluster, which a driver needs.

:func:`use_token` puts the settings' token into this process's environment and makes an
already imported ray read it again (ray reads its authentication settings when first
imported).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass, field
from typing import Any

from harness.core.errors import CallboxError, EngineUnavailable, ErrorCode
from harness.engine.ray.settings import RaySettings

__all__ = ["NodeView", "RayMissing", "check_driver_node", "cluster_nodes", "disconnect_driver", "local_address",
           "preflight", "probe_gcs", "ray_version", "use_token"]

PROBE_TIMEOUT_S = 5.0
"""The longest the GCS probe waits for an answer."""
GET_CLUSTER_ID = "/ray.rpc.NodeInfoGcsService/GetClusterId"
"""The first call a Ray driver makes to the GCS (its request is an empty message)."""
CAPACITY_RESOURCE = "callbox_sandboxes"
MIN_RAY_VERSION = (2, 52)
"""Token authentication (``RAY_AUTH_MODE=token``) arrived in Ray 2.52."""
INSTALL_HINT = "pip install 'callbox[ray]'"


class RayMissing(CallboxError):
    """The Ray engine was chosen, but this Python has no (recent enough) ray."""

    code = ErrorCode.ENGINE_UNAVAILABLE


def ray_version() -> str:
    """The installed ray's version, without importing it; RayMissing naming the fix when there
    is none or it predates token authentication."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise RayMissing(f"the Ray engine needs Ray, which this Python ({sys.executable}) does not have: "
                         f"{INSTALL_HINT}")
    try:
        version = importlib.metadata.version("ray")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    if _version_tuple(version) < MIN_RAY_VERSION:
        wanted = ".".join(map(str, MIN_RAY_VERSION))
        raise RayMissing(f"ray {version} is older than {wanted}, the first with token authentication: {INSTALL_HINT} "
                         f"(or pip install 'ray>={wanted}')")
    return version


def _version_tuple(version: str) -> tuple[int, ...]:
    parts: list[int] = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            return (0,)
        parts.append(int(digits))
    return tuple(parts)


def _module(name: str) -> Any:
    """A module of ray's that has no type information (its compiled core, generated code)."""
    import importlib

    return importlib.import_module(name)


def _token(settings: RaySettings) -> str | None:
    if settings.token_file is None:
        return None
    try:
        return settings.token_file.read_text().strip()
    except OSError as exc:
        raise EngineUnavailable(f"ray.token_file {settings.token_file} cannot be read: {exc.strerror or exc}") from None


def probe_gcs(settings: RaySettings, *, timeout: float = PROBE_TIMEOUT_S, with_token: bool = True) -> bytes:
    """One call to the cluster's GCS (``with_token``: with the settings' token), within
    ``timeout`` seconds; the cluster's id (bytes of the reply). EngineUnavailable saying what
    failed: nothing answers, the token is refused, or the peer is no Ray GCS. For the address
    ``auto`` nothing is probed (b"")."""
    import grpc

    gcs = settings.gcs
    if gcs is None:
        return b""
    host, port = gcs
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    token = _token(settings) if with_token else None
    metadata = [("authorization", f"Bearer {token}")] if token else None
    where = f"the Ray cluster at {settings.address}"
    with grpc.insecure_channel(target) as channel:
        method = channel.unary_unary(GET_CLUSTER_ID)
        try:
            reply: bytes = method(b"", timeout=timeout, metadata=metadata)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            if code == grpc.StatusCode.UNAUTHENTICATED:
                fix = ("the token in ray.token_file is not this cluster's: copy the head's token there "
                       "(`ray get-auth-token` on the head)" if token else
                       "it requires a token: set ray.token_file (--ray-token-file) to its token's file")
                raise EngineUnavailable(f"{where} refused the connection ({details}); {fix}") from None
            if code == grpc.StatusCode.UNIMPLEMENTED:
                raise EngineUnavailable(f"{target} answers, but is not a Ray GCS ({details}); give the address "
                                        "`ray start --head` printed (its --port, 6379 by default)") from None
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise EngineUnavailable(f"{where} did not answer within {timeout:g} s; check the address and that "
                                        "the head node runs (`ray status` there)") from None
            raise EngineUnavailable(f"no Ray cluster answers at {settings.address} ({_short(details)}); check the "
                                    "address and that the head node runs (`ray start --head` there)") from None
    return reply


def _short(details: str | None) -> str:
    text = (details or "no answer").strip()
    return text.rsplit(": ", 1)[-1] if len(text) > 120 else text


def use_token(settings: RaySettings) -> None:
    """Put the settings' token into this process's environment for ray (token mode and the
    file); when ray is imported already, make it read its authentication settings again."""
    env = settings.auth_environment()
    if not env:
        return
    os.environ.update(env)
    if "ray" in sys.modules:
        raylet = _module("ray._raylet")
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


@dataclass(frozen=True)
class NodeView:
    """One node as the GCS reports it."""

    node_id: str
    address: str
    hostname: str
    alive: bool
    resources: dict[str, float] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def capacity(self) -> int:
        """How many sandboxes it may hold (0: no sandbox node)."""
        return int(self.resources.get(CAPACITY_RESOURCE, 0))

    @property
    def name(self) -> str:
        return self.labels.get("callbox.node") or self.hostname or self.address


def cluster_nodes(settings: RaySettings, *, timeout: float = PROBE_TIMEOUT_S) -> list[NodeView]:
    """Every node the GCS knows (alive or dead), through ray's GCS client; no driver joins.
    Call after :func:`probe_gcs` (a GCS that does not answer keeps ray's client waiting)."""
    ray_version()
    use_token(settings)
    if settings.gcs is None:
        raise EngineUnavailable("the nodes of ray.address = \"auto\" are read through a driver; give HOST:PORT")
    alive_state = _module("ray.core.generated.gcs_pb2").GcsNodeInfo.GcsNodeState.ALIVE
    try:
        infos = _module("ray._raylet").GcsClient(address=settings.address).get_all_node_info(timeout=timeout)
    except Exception as exc:  # ray's RpcError and friends: one message for a user
        raise EngineUnavailable(f"cannot read the nodes of the Ray cluster at {settings.address}: {exc}") from None
    return [NodeView(node_id=bytes(info.node_id).hex(), address=info.node_manager_address,
                     hostname=info.node_manager_hostname, alive=info.state == alive_state,
                     resources=dict(info.resources_total), labels=dict(info.labels))
            for info in infos.values()]


def local_address(settings: RaySettings) -> str | None:
    """The address this machine has in the cluster: ``node_ip``, else the one that routes to
    the GCS (what Ray picks); None when the GCS is on loopback (Ray then uses the machine's)."""
    if settings.node_ip is not None:
        return settings.node_ip
    gcs = settings.gcs
    if gcs is None:
        return None
    try:
        if ipaddress.ip_address(gcs[0]).is_loopback:
            return None
    except ValueError:
        pass  # a host name
    try:
        family = socket.AF_INET6 if ":" in gcs[0] else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((gcs[0], gcs[1]))  # no packet: only the route is chosen
            return str(probe.getsockname()[0])
    except OSError:
        return None


def check_driver_node(settings: RaySettings, nodes: list[NodeView]) -> None:
    """EngineUnavailable when this machine has no live raylet of the cluster: a Ray driver
    joins through the raylet of its own machine (without one ``ray.init`` waits a minute)."""
    here = local_address(settings)
    if here is None:
        return
    alive = [node for node in nodes if node.alive]
    if any(node.address == here for node in alive):
        return
    known = ", ".join(sorted(f"{node.name} {node.address}" for node in alive)) or "none alive"
    raise EngineUnavailable(
        f"this machine ({here}) is not a node of the Ray cluster at {settings.address} (its nodes: {known}); "
        f"a Ray driver joins through a raylet of its own: run `ray start --address={settings.address}` here "
        "first, or set ray.node_ip to this machine's address in the cluster")


def preflight(settings: RaySettings, *, timeout: float = PROBE_TIMEOUT_S) -> list[NodeView]:
    """Everything above, in order (ray installed, the GCS answers and takes the token, this
    machine is a node); the cluster's nodes. Each failure is a CallboxError saying why."""
    ray_version()
    probe_gcs(settings, timeout=timeout)
    if settings.gcs is None:
        return []
    nodes = cluster_nodes(settings, timeout=timeout)
    check_driver_node(settings, nodes)
    return nodes


def disconnect_driver() -> None:
    """Leave the cluster if this process joined it as a driver (``ray.shutdown``); a driver
    left connected to a GCS that goes away ends its whole process a minute later."""
    if "ray" in sys.modules:
        ray = _module("ray")
        if ray.is_initialized():
            ray.shutdown()


def node_summary(nodes: list[NodeView]) -> list[dict[str, Any]]:
    """The nodes as plain values (for ``--json`` output and logs)."""
    return [{"name": n.name, "address": n.address, "alive": n.alive, "capacity": n.capacity} for n in nodes]
