"""Where a sandbox runs when an engine has more than one node: the spec's ``placement`` and the
choice of a node for it.

A node is offered with its capacity (how many sandboxes it may hold), how many it holds now,
and the placement groups of those. ``choose_node`` is pure, so every rule is unit-tested
without a cluster:

- ``strategy = "spread"`` (the default) picks the node with the most free room, ``"pack"``
  the one with the least (that still has room), so idle nodes stay idle;
- ``nodes`` (affinity): only these nodes may hold it;
- ``avoid_nodes`` (anti-affinity to nodes): never these;
- ``group`` with ``apart = true`` (anti-affinity between sandboxes): never a node that already
  holds a sandbox of the same group.

An engine with one node (Docker's) ignores placement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.core.errors import CallboxError, ErrorCode

__all__ = ["NoNodeFits", "NodeRoom", "Placement", "choose_node"]


class Placement(BaseModel):
    """Where a sandbox may run on a multi-node engine (the Ray engine); ignored by Docker's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    strategy: Literal["spread", "pack"] = "spread"
    """``spread``: the node with the most free room; ``pack``: the fullest node with room left."""
    nodes: tuple[str, ...] = ()
    """Affinity: the node names this sandbox may run on (empty: any)."""
    avoid_nodes: tuple[str, ...] = ()
    """Anti-affinity: node names it must not run on."""
    group: str = Field(default="", max_length=64)
    """A placement group name, for ``apart``."""
    apart: bool = False
    """With ``group``: never on a node that already holds a sandbox of the same group."""


@dataclass(frozen=True)
class NodeRoom:
    """A node as placement sees it."""

    name: str
    capacity: int
    """How many sandboxes it may hold (its ``callbox_sandboxes`` resource)."""
    used: int
    """How many it holds now (and creates on their way)."""
    groups: frozenset[str] = field(default_factory=frozenset)
    """Placement groups of the sandboxes it holds."""

    @property
    def free(self) -> int:
        return self.capacity - self.used


class NoNodeFits(CallboxError):
    """No node may take the sandbox now; the message says why for each node."""

    code = ErrorCode.LIMIT_REACHED


def choose_node(placement: Placement, nodes: Sequence[NodeRoom], *, turn: int = 0) -> NodeRoom:
    """The node for a sandbox with ``placement``; ties are broken by ``turn`` (a counter the
    engine advances per create), so equal nodes take turns. ``NoNodeFits`` names why each
    node was passed over."""
    reasons: list[str] = []
    fits: list[NodeRoom] = []
    if placement.nodes:
        unknown = sorted(set(placement.nodes) - {n.name for n in nodes})
        if unknown and len(unknown) == len(placement.nodes):
            known = ", ".join(sorted(n.name for n in nodes)) or "none"
            raise NoNodeFits(f"placement.nodes names no live node ({', '.join(unknown)}); live nodes: {known}")
    for node in nodes:
        why = _passed_over(placement, node)
        if why:
            reasons.append(f"{node.name}: {why}")
        else:
            fits.append(node)
    if not fits:
        detail = "; ".join(reasons) if reasons else "the cluster has no node with the callbox_sandboxes resource"
        raise NoNodeFits(f"no node can take this sandbox now ({detail})")
    sign = -1 if placement.strategy == "spread" else 1
    best = min(node.free * sign for node in fits)
    tied = sorted((node for node in fits if node.free * sign == best), key=lambda n: n.name)
    return tied[turn % len(tied)]


def _passed_over(placement: Placement, node: NodeRoom) -> str | None:
    if placement.nodes and node.name not in placement.nodes:
        return "not in placement.nodes"
    if node.name in placement.avoid_nodes:
        return "in placement.avoid_nodes"
    if placement.apart and placement.group and placement.group in node.groups:
        return f"already holds a sandbox of group {placement.group!r} (placement.apart)"
    if node.free <= 0:
        return f"full ({node.used} of {node.capacity} sandboxes)"
    return None
