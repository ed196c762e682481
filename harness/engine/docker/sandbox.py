"""One running Docker sandbox: its container, socket directory, spec, the client of its agent,
and what a tool handler gets of it (``runtime``); its lifetime (pause, resume, keep-alive,
stats, snapshots) through the engine (:mod:`harness.engine.docker.living`).

Operations that need the agent (``jobs``, ``transfer``, ``forward_port``, ``snapshot``) fail
with ``SandboxPaused`` while the sandbox is paused (what this process did, or the lifetime
record another process wrote: one small file read); ``agent`` itself is not checked (the
exec paths stay as fast as before), and a call through it to a paused sandbox waits until
its deadline.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import TYPE_CHECKING

from docker.models.containers import Container

from harness.engine.agent_client import AgentClient
from harness.engine.base import SandboxRuntime
from harness.engine.docker.egress_asks import EgressAskChannel
from harness.engine.docker.lifetime import SandboxPaused
from harness.engine.docker.networks import EVENTS_FILE, EgressEvent
from harness.engine.jobs import JobsClient
from harness.engine.ports import PortForward, forward_port
from harness.engine.spec import SandboxSpec
from harness.engine.transfer import TransferClient

if TYPE_CHECKING:
    from harness.engine.docker.cgroup_stats import SandboxStats
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.snapshots import SnapshotInfo

GONE_WAIT_S = 2
"""How long ``why_gone`` waits for a container whose agent went away to stop."""

AGENT_SOCKET_NAME = "agent.sock"
"""The agent's socket in the sandbox's socket directory."""


class Sandbox:
    """A running sandbox and the client of its agent. Destroy it when done (or use ``with``)."""

    living_sandbox = True
    """It has jobs, transfers, ports, pause and resume (:class:`harness.engine.base.LivingSandbox`)."""

    def __init__(self, engine: DockerEngine, sandbox_id: str, container_id: str, socket_dir: Path,
                 spec: SandboxSpec, tool_uid: int, tool_gid: int, *, name: str | None = None,
                 owner: str | None = None, created_at: float = 0.0, expires: float = 0.0) -> None:
        self.engine = engine
        self.id = sandbox_id
        self.container_id = container_id
        self.socket_dir = socket_dir
        self.spec = spec
        self.tool_uid = tool_uid
        self.tool_gid = tool_gid
        self.agent = AgentClient(str(socket_dir / AGENT_SOCKET_NAME))
        self.proxy_url: str | None = None
        """The egress proxy (``network = "allowlist"``), as tool processes see it."""
        self._egress_offset = 0
        """Bytes of the egress proxy's log already handed out by ``new_egress_events``."""
        self._egress_asks: EgressAskChannel | None = None
        self.name = name
        """Its name, if it was created with one (then it outlives the process that created it)."""
        self.owner = owner
        """Who it belongs to, as the door that created it says (``user:1000``, ``grpc:client``)."""
        self.created_at = created_at
        self.expires = expires
        """When gc removes it (Unix time), as this process last set or read it."""
        self.paused_here = False
        """This process paused it (or found it paused) and has not resumed it."""
        self.recorded = False
        """It has a lifetime record (written or read by this process): its removal by another
        process is then seen in the record's absence (``removed``)."""
        self.agent.explain_gone = self.why_gone

    def why_gone(self) -> str | None:
        """Why its agent stopped answering, when its container's state says more than that
        the socket closed: an OOM kill (None otherwise). Under runsc a tool over the memory
        limit takes the whole sandbox down: gVisor's kernel holds every tool's memory in one
        host process, which the host's OOM killer then kills."""
        import docker.errors
        import requests

        api = self.engine.client.api
        try:
            # the agent's socket closes a moment before the engine records how the container
            # ended: wait (briefly) for the container to stop
            with contextlib.suppress(requests.exceptions.RequestException):
                api.wait(self.container_id, timeout=GONE_WAIT_S)
            state = api.inspect_container(self.container_id)["State"]
        except docker.errors.DockerException:
            return None
        if state.get("OOMKilled"):
            limit = f"limit {self.spec.memory >> 20} MiB"
            if self.spec.runtime == "runsc":
                return f"its container was killed for running out of memory ({limit}); under runsc a tool over " \
                       "the limit stops the whole sandbox"
            return f"its container was killed for running out of memory ({limit})"
        return None

    @property
    def label(self) -> str:
        """How messages name it: its name, else its id."""
        return self.name or self.id

    @property
    def paused(self) -> bool:
        """Whether it is paused (this process's knowledge, else its lifetime record)."""
        return self.engine.is_paused(self)

    @property
    def removed(self) -> bool:
        """Whether another process removed it (``callbox sandbox rm``, gc): its lifetime record
        is gone (one file check; always False for a sandbox that never had one)."""
        return self.recorded and self.engine.is_removed(self)

    def require_running(self) -> None:
        """``SandboxPaused`` if it is paused (cheap: no engine call)."""
        if self.engine.is_paused(self):
            raise SandboxPaused(self.label)

    @property
    def jobs(self) -> JobsClient:
        """Background processes and terminals of its agent."""
        self.require_running()
        return self.agent.jobs

    @property
    def transfer(self) -> TransferClient:
        """Files both ways: download, copy in and out, move, watch."""
        self.require_running()
        return self.agent.transfer

    def forward_port(self, port: int, host_port: int = 0) -> PortForward:
        """Forward ``host_port`` on the host's loopback (0: any free one) to ``port`` inside."""
        self.require_running()
        return forward_port(self.agent, port, host_port=host_port)

    def pause(self, *, to_disk: bool = False) -> None:
        """Freeze every process in it (``docker pause``); its expiry clock stops until ``resume``.
        ``to_disk``: save them to disk and stop its container instead (gVisor only)."""
        self.engine.pause(self, to_disk=to_disk)

    def resume(self) -> float:
        """Thaw it and wait until its agent answers; its new expiry (moved by the paused time)."""
        return self.engine.resume(self)

    def keep_alive(self, ttl_s: float | None = None) -> float:
        """Push its expiry to ``ttl_s`` seconds from now (default its TTL); the new expiry."""
        return self.engine.keep_alive(self, ttl_s)

    def stats(self) -> SandboxStats:
        """CPU seconds so far, memory and processes now, from its cgroup."""
        return self.engine.stats(self)

    def set_network_rules(self, allow: tuple[str, ...], deny: tuple[str, ...]) -> SandboxSpec:
        """Narrow its allowlist to ``allow``/``deny`` from its next request on; its new spec
        (see :mod:`harness.engine.docker.network_rules`)."""
        from harness.engine.docker.network_rules import set_network_rules

        return set_network_rules(self.engine, self, allow, deny)

    def snapshot(self, name: str, *, replace: bool = False, memory: bool = False) -> SnapshotInfo:
        """Store its writable places and spec on the host as snapshot ``name``; ``memory``:
        its processes and memory too (gVisor only)."""
        return self.engine.snapshot(self, name, replace=replace, memory=memory)

    def runtime(self) -> SandboxRuntime:
        """What a tool handler gets: the agent and the environment of this sandbox."""
        return SandboxRuntime(sandbox_id=self.id, agent=self.agent, env=self.spec.env, workdir=self.spec.workdir)

    def new_egress_events(self) -> list[EgressEvent]:
        """The egress proxy's decisions since the last call (empty unless allowlist)."""
        if self.spec.network != "allowlist":
            return []
        events, self._egress_offset = self.engine.networks.egress_events(self.id, offset=self._egress_offset)
        return events

    def egress_ask_channel(self) -> EgressAskChannel | None:
        """Its proxy's holds and their answers, when an ``allow_hosts`` entry asks (else None)."""
        if self.spec.network != "allowlist" or not any(h.startswith("ask ") for h in self.spec.allow_hosts):
            return None
        if self._egress_asks is None:
            self._egress_asks = EgressAskChannel(self.id, self.engine.networks.log_root / self.id, EVENTS_FILE)
        return self._egress_asks

    def keep(self, *, run_id: str, until: float | None = None) -> float:
        """Keep this sandbox for run ``run_id`` past this process (``DockerEngine.keep``); the
        time it is kept until."""
        return self.engine.keep(self, run_id=run_id, until=until).until

    @property
    def container(self) -> Container:
        """The docker SDK's high-level object for this sandbox's container (one API call)."""
        return self.engine.client.containers.get(self.container_id)

    def destroy(self) -> None:
        self.agent.close()
        self.engine.destroy(self.id, network=self.spec.network)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


if TYPE_CHECKING:
    from harness.engine.base import LivingSandbox

    def _living(box: Sandbox) -> LivingSandbox:  # mypy checks that it has the whole surface
        return box
