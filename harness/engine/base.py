"""What the core needs from wherever sandboxes live, and what a tool gets to run in one.

The session core and the tools depend on these interfaces only; Docker
(:mod:`harness.engine.docker`) is the first implementation. A second kind of sandbox (a warm
pool, another runtime, another machine) implements :class:`Engine` and :class:`Sandbox` and
plugs in through a session's ``engine_factory``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard

from harness.engine.agent_client import AgentClient
from harness.engine.spec import SandboxSpec

if TYPE_CHECKING:
    from harness.engine.docker.snapshots import SnapshotInfo
    from harness.engine.jobs import JobsClient
    from harness.engine.ports import PortForward
    from harness.engine.transfer import TransferClient

__all__ = ["RUN_OWNER", "EgressRecord", "Engine", "LivingSandbox", "PoolEntry", "Sandbox", "SandboxRuntime",
           "SnapshotKeeper", "is_living", "keeps_snapshots", "owner_run", "run_owner"]

RUN_OWNER = "run:"
"""How a sandbox's owner names the run it serves: ``run:<run id>`` (a server's sandbox, whose
run id is the id its clients know, e.g. an E2B ``sandbox_id``; a paused run's kept sandbox)."""


def run_owner(run_id: str) -> str:
    """The owner of a sandbox that serves run ``run_id``."""
    return f"{RUN_OWNER}{run_id}"


def owner_run(owner: str | None) -> str | None:
    """The run an owner string names (``run:<run id>``), None for any other owner."""
    if owner is None or not owner.startswith(RUN_OWNER) or len(owner) == len(RUN_OWNER):
        return None
    return owner[len(RUN_OWNER):]


class EgressRecord(Protocol):
    """One decision of a sandbox's egress proxy, as the audit store keeps it."""

    @property
    def raw(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class SandboxRuntime:
    """What a tool handler runs against: the sandbox's agent and the environment its
    processes get. A handler never sees the engine or the container."""

    sandbox_id: str
    agent: AgentClient
    env: Mapping[str, str]
    """Extra environment for every process a tool starts (the spec's ``env``)."""
    workdir: str
    """Where relative paths and commands start."""


class Sandbox(Protocol):
    """One running sandbox, destroyed when its session ends."""

    @property
    def id(self) -> str: ...

    @property
    def spec(self) -> SandboxSpec: ...

    @property
    def agent(self) -> AgentClient: ...

    def runtime(self) -> SandboxRuntime:
        """The handle a tool handler gets."""
        ...

    def new_egress_events(self) -> list[Any]:
        """Egress proxy decisions since the last call, each with a ``raw`` dict (empty unless
        the sandbox's network is an allowlist)."""
        ...

    def keep(self, *, run_id: str, until: float | None = None) -> float:
        """Let this sandbox outlive the process (a paused run resumes in it later, through
        :meth:`Engine.attach`) until ``until`` (Unix time; default its own expiry). Returns
        the time it is kept until."""
        ...

    def destroy(self) -> None: ...


class Engine(Protocol):
    """Starts sandboxes (and, for runs paused with their sandbox kept, finds them again)."""

    def create(self, spec: SandboxSpec, *, owner: str | None = None) -> Sandbox:
        """Start a sandbox for ``spec``. ``owner``: who it belongs to (``run:<run id>`` for a
        run's sandbox, :func:`run_owner`), which the engine keeps with it so an operator finds
        it by that run's id (``callbox sandbox ls``, ``callbox sandbox exec RUN_ID``)."""
        ...

    def attach(self, sandbox_id: str) -> Sandbox: ...


class LivingSandbox(Protocol):
    """A sandbox with a life of its own beyond one tool call: jobs, transfers, ports, pause and
    resume, keep-alive and stats. The Docker engine's sandboxes and the Ray engine's are; the
    doors that manage sandboxes (the gRPC Sandboxes service, the E2B API) need one."""

    id: str
    spec: SandboxSpec
    agent: AgentClient
    tool_uid: int
    tool_gid: int
    expires: float

    @property
    def paused(self) -> bool: ...

    @property
    def removed(self) -> bool:
        """Whether it was removed from outside this process (``callbox sandbox rm``, gc of
        another process): cheap, no engine call; False when that cannot be told cheaply."""
        ...

    @property
    def jobs(self) -> JobsClient: ...

    @property
    def transfer(self) -> TransferClient: ...

    def require_running(self) -> None: ...

    def forward_port(self, port: int, host_port: int = 0) -> PortForward: ...

    def pause(self, *, to_disk: bool = False) -> None: ...

    def resume(self) -> float: ...

    def keep_alive(self, ttl_s: float | None = None) -> float: ...

    def stats(self) -> Any: ...

    def destroy(self) -> None: ...


def is_living(box: object) -> TypeGuard[LivingSandbox]:
    """Whether ``box`` is a :class:`LivingSandbox` (its class says so with ``living_sandbox``;
    nothing of the sandbox is asked: its properties may call its engine)."""
    return bool(getattr(type(box), "living_sandbox", False))


class SnapshotKeeper(Protocol):
    """An engine that keeps named snapshots of its sandboxes' files and forks sandboxes from
    them or from live ones (the Docker engine on this machine, the Ray engine on its nodes).
    Its sandboxes are its own: ``sandbox`` arguments take what it created."""

    def snapshot(self, sandbox: Any, name: str, *, replace: bool = False, owner: str | None = None) -> SnapshotInfo:
        ...

    def snapshots(self) -> list[SnapshotInfo]: ...

    def remove_snapshot(self, name: str) -> None: ...

    def snapshot_spec(self, name: str) -> SandboxSpec: ...

    def restore_snapshot_files(self, sandbox: Any, name: str) -> None: ...

    def snapshot_note(self, name: str, file: str) -> bytes | None: ...

    def write_snapshot_note(self, name: str, file: str, data: bytes) -> None: ...

    def fork(self, source: Any, *, from_snapshot: bool = False, name: str | None = None, owner: str | None = None,
             ttl_s: float | None = None) -> Any: ...


def keeps_snapshots(engine: object) -> TypeGuard[SnapshotKeeper]:
    """Whether ``engine`` is a :class:`SnapshotKeeper` (its class says so with ``keeps_snapshots``)."""
    return bool(getattr(type(engine), "keeps_snapshots", False))


@dataclass(frozen=True)
class PoolEntry:
    """A spec an engine's warm pool keeps (:mod:`harness.engine.docker.pool`) with a floor
    (``size``) and ceiling (``max``) of its own and, optionally, ``prepare``: run in each of its
    sandboxes once started, before it is pooled (it raises to refuse the sandbox). ``label``
    names the entry in the log."""

    spec: SandboxSpec
    size: int
    max: int
    prepare: Callable[[LivingSandbox], None] | None = None
    label: str = ""
