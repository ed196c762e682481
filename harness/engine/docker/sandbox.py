"""One running Docker sandbox: its container, socket directory, spec, the client of its agent,
and what a tool handler gets of it (``runtime``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from docker.models.containers import Container

from harness.engine.agent_client import AgentClient
from harness.engine.base import SandboxRuntime
from harness.engine.docker.networks import EgressEvent
from harness.engine.spec import SandboxSpec

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

AGENT_SOCKET_NAME = "agent.sock"
"""The agent's socket in the sandbox's socket directory."""


class Sandbox:
    """A running sandbox and the client of its agent. Destroy it when done (or use ``with``)."""

    def __init__(self, engine: DockerEngine, sandbox_id: str, container_id: str, socket_dir: Path,
                 spec: SandboxSpec, tool_uid: int, tool_gid: int) -> None:
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

    def runtime(self) -> SandboxRuntime:
        """What a tool handler gets: the agent and the environment of this sandbox."""
        return SandboxRuntime(sandbox_id=self.id, agent=self.agent, env=self.spec.env, workdir=self.spec.workdir)

    def new_egress_events(self) -> list[EgressEvent]:
        """The egress proxy's decisions since the last call (empty unless allowlist)."""
        if self.spec.network != "allowlist":
            return []
        events, self._egress_offset = self.engine.networks.egress_events(self.id, offset=self._egress_offset)
        return events

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
