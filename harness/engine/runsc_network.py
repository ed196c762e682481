"""Which network stack the Docker engine's gVisor runtime (``runsc``) gives a sandbox.

``make runsc`` registers runsc with ``--network=sandbox``: gVisor's own TCP/IP stack
(netstack) in the sandbox's user-space kernel takes over the interfaces Docker made in the
container's network namespace, so every network mode works under runsc as under runc, and
``network = "none"`` still has only ``lo``. An older registration, callbox's earlier
``--network=none``, gives gVisor no network stack at all: a networked sandbox would start
with only ``lo`` and none of its network, so the engine refuses it before any container
(``SandboxSpec.for_host``) and ``callbox doctor`` says how to upgrade (``make runsc``).
``--network=host`` (the host kernel's stack behind gVisor) works but is weaker; the doctor
warns of it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

RUNSC: Final = "runsc"
NetworkStack = Literal["sandbox", "host", "none"]
DEFAULT_STACK: Final[NetworkStack] = "sandbox"
"""runsc's own default when its runtimeArgs name no ``--network``."""
UPGRADE: Final = "`sudo make runsc` registers it with gVisor's network stack (--network=sandbox)"


def network_stack(runtime_args: Sequence[str]) -> NetworkStack | str:
    """The ``--network`` of runsc's ``runtimeArgs`` (its last one wins, as in runsc's flag
    parsing); an unknown value is returned as it is."""
    stack: str = DEFAULT_STACK
    args = list(runtime_args)
    for i, arg in enumerate(args):
        name, eq, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-") or name != "network":
            continue
        if eq:
            stack = value
        elif i + 1 < len(args):
            stack = args[i + 1]
    return stack


def engine_runsc_stack(info: Mapping[str, Any]) -> NetworkStack | str | None:
    """The network stack of the runsc runtime ``docker info`` lists (None: no runsc, or an
    engine that does not list its runtimes' arguments)."""
    entry = (info.get("Runtimes") or {}).get(RUNSC)
    if not isinstance(entry, Mapping):
        return None
    args = entry.get("runtimeArgs")
    return network_stack([str(a) for a in args]) if isinstance(args, list) else DEFAULT_STACK


def networked_refusal(network: str, stack: str) -> str | None:
    """Why a sandbox with ``network`` cannot run under a runsc with ``stack`` (None: it can)."""
    if network == "none" or stack != "none":
        return None
    return (f"the Docker engine's runtime 'runsc' is registered with --network=none (gVisor without a network "
            f"stack), so a sandbox with network {network!r} would have only lo; {UPGRADE}, then restart "
            "callbox, or use network 'none' or runtime 'runc'")
