"""One sandbox on a Ray node, as the harness uses it: the same surface as a local Docker
sandbox (agent, jobs, transfers, ports, pause, resume, keep-alive, stats, snapshots, keep,
destroy), with its agent reached through its node's relay and its lifetime through its host.

When the node dies the engine marks the sandbox lost; a call that then finds the agent gone
says so (``sandbox lost with its node NODE``) instead of the usual "the container stopped".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.agent_client import AgentClient
from harness.engine.base import SandboxRuntime
from harness.engine.docker.lifetime import SandboxPaused
from harness.engine.jobs import JobsClient
from harness.engine.ports import PortForward, forward_port
from harness.engine.ray.host import SandboxHandle
from harness.engine.ray.hosts import Host, SandboxLost, ask
from harness.engine.spec import SandboxSpec
from harness.engine.transfer import TransferClient

if TYPE_CHECKING:
    from harness.engine.docker.cgroup_stats import SandboxStats
    from harness.engine.docker.snapshots import SnapshotInfo
    from harness.engine.ray.engine import RayEngine

LOST_CHECK_S = 8.0
"""How long a call that lost its agent waits to learn whether the node died (Ray declares a
dead node within seconds)."""


class RaySandbox:
    """A sandbox on a node of a Ray cluster. Destroy it when done (or use ``with``)."""

    living_sandbox = True
    """It has jobs, transfers, ports, pause and resume (:class:`harness.engine.base.LivingSandbox`)."""

    def __init__(self, engine: RayEngine, host: Host, handle: SandboxHandle) -> None:
        self.engine = engine
        self.host = host
        self.handle = handle
        self.id = handle.sandbox_id
        self.container_id = handle.container_id
        self.spec = SandboxSpec.model_validate(handle.spec)
        self.tool_uid = handle.tool_uid
        self.tool_gid = handle.tool_gid
        self.name = handle.name
        self.owner = handle.owner
        self.created_at = handle.created_at
        self.expires = handle.expires
        self.paused_here = handle.paused
        self.lost: str | None = None
        """Why it is gone with its node (set by the engine when the node dies)."""
        self.proxy_url: str | None = None
        self.agent = AgentClient.over_relay(handle.relay_address, handle.certificate_pem, handle.sandbox_id,
                                            handle.token)
        self.agent.explain_gone = self.why_gone

    @property
    def node(self) -> str:
        """The name of the node it runs on."""
        return self.handle.node

    @property
    def label(self) -> str:
        return self.name or self.id

    def _ask(self, method: str, *args: Any) -> Any:
        if self.lost is not None:
            raise SandboxLost(self.lost)
        return ask(self.host, method, *args)

    def why_gone(self) -> str | None:
        """Why its agent stopped answering: its node died (waits briefly until the cluster knows),
        or what its host says (an OOM kill)."""
        if self.lost is None:
            self.lost = self.engine.node_lost(self.host, within=LOST_CHECK_S)
        if self.lost is not None:
            return self.lost
        try:
            reason: str | None = self._ask("why_gone", self.id)
        except Exception:
            return f"the host of node {self.node} did not answer (restarting?); the sandbox may live on"
        return reason

    @property
    def paused(self) -> bool:
        """Whether this process paused it (no call to its node: a pause made elsewhere, by
        another process, shows once this one asks the node, through ``engine.is_paused``)."""
        return self.paused_here

    @property
    def removed(self) -> bool:
        """Never known cheaply here (its records are on its node): a removal shows when its
        agent stops answering."""
        return False

    def require_running(self) -> None:
        if self.paused_here:
            raise SandboxPaused(self.label)

    @property
    def jobs(self) -> JobsClient:
        self.require_running()
        return self.agent.jobs

    @property
    def transfer(self) -> TransferClient:
        self.require_running()
        return self.agent.transfer

    def forward_port(self, port: int, host_port: int = 0) -> PortForward:
        """Forward ``host_port`` on this machine's loopback to ``port`` inside (through the relay)."""
        self.require_running()
        return forward_port(self.agent, port, host_port=host_port)

    def pause(self, *, to_disk: bool = False) -> None:
        if to_disk:
            raise CallboxError("the Ray engine pauses a sandbox in memory only: a pause to disk (--to-disk) needs the "
                               "Docker engine and gVisor", code=ErrorCode.NOT_SUPPORTED)
        self.engine.pause(self)

    def resume(self) -> float:
        return self.engine.resume(self)

    def keep_alive(self, ttl_s: float | None = None) -> float:
        return self.engine.keep_alive(self, ttl_s)

    def stats(self) -> SandboxStats:
        return self.engine.stats(self)

    def snapshot(self, name: str, *, replace: bool = False, memory: bool = False) -> SnapshotInfo:
        if memory:
            raise CallboxError("the Ray engine keeps a snapshot's files only: memory snapshots (--memory) need the "
                               "Docker engine and gVisor", code=ErrorCode.NOT_SUPPORTED)
        return self.engine.snapshot(self, name, replace=replace)

    def runtime(self) -> SandboxRuntime:
        return SandboxRuntime(sandbox_id=self.id, agent=self.agent, env=self.spec.env, workdir=self.spec.workdir)

    def new_egress_events(self) -> list[Any]:
        """Always empty: the Ray engine runs ``network = "none"`` sandboxes only."""
        return []

    def keep(self, *, run_id: str, until: float | None = None) -> float:
        return self.engine.keep(self, run_id=run_id, until=until).until

    def destroy(self) -> None:
        self.agent.close()
        self.engine.destroy(self.id, network=self.spec.network)

    def __enter__(self) -> RaySandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


if TYPE_CHECKING:
    from harness.engine.base import LivingSandbox

    def _living(box: RaySandbox) -> LivingSandbox:  # mypy checks that it has the whole surface
        return box
