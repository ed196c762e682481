"""Choosing a node for a sandbox: spread, pack, affinity, anti-affinity and groups kept apart."""

from __future__ import annotations

import pytest

from harness.engine.placement import NodeRoom, NoNodeFits, Placement, choose_node
from harness.engine.spec import SandboxSpec

W1 = NodeRoom("w1", capacity=8, used=3)
W2 = NodeRoom("w2", capacity=8, used=1)
W3 = NodeRoom("w3", capacity=4, used=3)


def test_spread_picks_the_node_with_most_room() -> None:
    assert choose_node(Placement(), [W1, W2, W3]).name == "w2"


def test_pack_picks_the_fullest_node_with_room() -> None:
    assert choose_node(Placement(strategy="pack"), [W1, W2, W3]).name == "w3"


def test_equal_nodes_take_turns() -> None:
    a, b = NodeRoom("a", 4, 0), NodeRoom("b", 4, 0)
    assert [choose_node(Placement(), [a, b], turn=t).name for t in range(4)] == ["a", "b", "a", "b"]


def test_affinity_limits_the_nodes() -> None:
    assert choose_node(Placement(nodes=("w1",)), [W1, W2]).name == "w1"


def test_affinity_to_no_live_node_says_which_are_live() -> None:
    with pytest.raises(NoNodeFits, match=r"names no live node \(w9\); live nodes: w1, w2"):
        choose_node(Placement(nodes=("w9",)), [W1, W2])


def test_anti_affinity_avoids_nodes() -> None:
    assert choose_node(Placement(avoid_nodes=("w2",)), [W1, W2, W3]).name == "w1"


def test_group_apart_skips_nodes_holding_the_group() -> None:
    holding = NodeRoom("w2", capacity=8, used=1, groups=frozenset({"eval"}))
    assert choose_node(Placement(group="eval", apart=True), [W1, holding]).name == "w1"
    # without apart, the group does not matter
    assert choose_node(Placement(group="eval"), [W1, holding]).name == "w2"


def test_full_nodes_are_refused_with_each_reason() -> None:
    full = NodeRoom("w1", capacity=2, used=2)
    with pytest.raises(NoNodeFits) as caught:
        choose_node(Placement(avoid_nodes=("w2",)), [full, W2])
    assert "w1: full (2 of 2 sandboxes)" in str(caught.value)
    assert "w2: in placement.avoid_nodes" in str(caught.value)


def test_no_sandbox_node_at_all() -> None:
    with pytest.raises(NoNodeFits, match="no node with the callbox_sandboxes resource"):
        choose_node(Placement(), [])


def test_spec_carries_placement_and_forbids_unknown_keys() -> None:
    spec = SandboxSpec.model_validate({"placement": {"strategy": "pack", "nodes": ["w1"]}})
    assert spec.placement.strategy == "pack" and spec.placement.nodes == ("w1",)
    with pytest.raises(ValueError, match="extra"):
        SandboxSpec.model_validate({"placement": {"node": "w1"}})
