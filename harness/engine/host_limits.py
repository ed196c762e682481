"""What the machine that runs the sandboxes has, and where its Docker engine is: what a
sandbox spec is checked against (:meth:`harness.engine.spec.SandboxSpec.for_host`)."""

from __future__ import annotations

import os
from dataclasses import dataclass

__all__ = ["HostLimits", "docker_host_dirs", "engine_is_local"]


def engine_is_local() -> bool:
    """Whether the Docker engine (DOCKER_HOST) runs on this machine."""
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith("unix://")


def docker_host_dirs() -> tuple[str, ...]:
    """The directory of DOCKER_HOST's unix socket, if it names one."""
    host = os.environ.get("DOCKER_HOST", "")
    if host.startswith("unix://") and len(host) > len("unix://"):
        return (os.path.dirname(host.removeprefix("unix://")) or "/",)
    return ()


@dataclass(frozen=True)
class HostLimits:
    """What the machine that runs the sandboxes has; a spec's limits must fit in it."""

    cpus: int | None = None
    """CPUs of the host (None: unknown, not checked)."""
    memory: int | None = None
    """Bytes of memory of the host (None: unknown, not checked)."""
    where: str = "this host"
    """How messages name the host."""
    engine_paths: tuple[str, ...] = ()
    """Container-engine directories no mount may expose (e.g. the engine's data root)."""
    runsc_network: str | None = None
    """The network stack of the engine's gVisor runtime (``runsc_network.network_stack``;
    None: unknown, not checked)."""

    @classmethod
    def local(cls) -> HostLimits:
        """This machine's CPUs and memory; nothing when the engine is remote (DOCKER_HOST)."""
        if not engine_is_local():
            return cls(where="the Docker engine's host")
        import psutil

        return cls(cpus=os.cpu_count(), memory=psutil.virtual_memory().total)
