"""``callbox doctor``'s Ray items, judged from hand-written evidence (gathering it from a real
cluster is tests/ray/test_ray_wiring.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.doctor.ray_checks import (
    RayEvidence,
    check_cluster_auth,
    check_images,
    check_installed,
    check_nodes,
    check_reachable,
    check_token,
    ray_checks,
)
from harness.doctor.report import render_text
from harness.engine.ray.preflight import NodeView
from harness.engine.ray.settings import RaySettings

W1 = NodeView("a" * 56, "10.250.0.2", "w1host", True, {"callbox_sandboxes": 8.0, "CPU": 2.0})
W2 = NodeView("b" * 56, "10.250.0.3", "w2host", True, {"callbox_sandboxes": 4.0})
HEAD = NodeView("c" * 56, "10.250.0.1", "head", True, {"CPU": 1.0})


@pytest.fixture
def settings(tmp_path: Path) -> RaySettings:
    token = tmp_path / "ray-token"
    token.write_text("f" * 64)
    token.chmod(0o600)
    return RaySettings(address="10.250.0.1:6379", token_file=token)


def healthy(settings: RaySettings) -> RayEvidence:
    return RayEvidence(settings=settings, version="2.60.0", unauthenticated_answer="refused", join_s=1.5,
                       nodes=[HEAD, W1, W2], images={"w1": "sha256:" + "1" * 64, "w2": "sha256:" + "1" * 64},
                       local_image="sha256:" + "1" * 64)


def test_a_healthy_cluster_passes_every_item(settings: RaySettings) -> None:
    results = ray_checks(healthy(settings))
    assert [(r.id, r.status) for r in results] == [
        ("ray.installed", "PASS"), ("ray.token", "PASS"), ("ray.cluster-auth", "PASS"), ("ray.reachable", "PASS"),
        ("ray.nodes", "PASS"), ("ray.images", "PASS")]
    assert {r.scope for r in results} == {"cluster"}
    nodes = check_nodes(healthy(settings)).reason
    assert nodes == ("2 alive, 12 sandboxes in all: w1host 10.250.0.2 alive, capacity 8; "
                     "w2host 10.250.0.3 alive, capacity 4")
    assert check_images(healthy(settings)).reason == "w1 111111111111 (current); w2 111111111111 (current)"
    assert "joined 10.250.0.1:6379 (namespace callbox) in 1.5 s, then left" in check_reachable(healthy(settings)).reason
    text = render_text(results)
    assert text.endswith("callbox doctor: 6 checks, 6 pass, 0 warn, 0 fail")  # no CIS numbering without containers


def test_no_ray_fails_naming_the_install(settings: RaySettings) -> None:
    ev = RayEvidence(settings=settings, version_problem="the Ray engine needs Ray ...: pip install 'callbox[ray]'")
    result = check_installed(ev)
    assert (result.status, result.reason) == ("FAIL", ev.version_problem)


def test_token_items(settings: RaySettings, tmp_path: Path) -> None:
    ev = healthy(settings)
    ev.auth_mode_env = "disabled"
    result = check_token(ev)
    assert result.status == "FAIL" and "RAY_AUTH_MODE=disabled" in result.reason and "unset it" in result.reason
    ev = healthy(settings)
    ev.token_problem = "ray.token_file '/x' is accessible by group or others (mode 0644); ... `chmod 600 /x`"
    assert check_token(ev).status == "FAIL" and "chmod 600" in check_token(ev).reason
    loose = RayEvidence(settings=RaySettings(address="10.250.0.1:6379", allow_unauthenticated=True))
    result = check_token(loose)
    assert result.status == "WARN" and "set token_file" in result.reason
    both = healthy(settings.model_copy(update={"allow_unauthenticated": True}))
    result = check_token(both)
    assert result.status == "WARN" and "remove it" in result.reason


@pytest.mark.parametrize(("answer", "status", "says"), [
    ("refused", "PASS", "was refused (UNAUTHENTICATED)"),
    ("answered", "FAIL", "answered a call without a token: whoever reaches it can run any code"),
    ("the cluster does not answer (no Ray cluster answers at ...)", "WARN", "not checked: the cluster does not"),
])
def test_the_cluster_must_refuse_callers_without_a_token(settings: RaySettings, answer: str, status: str,
                                                         says: str) -> None:
    ev = healthy(settings)
    ev.unauthenticated_answer = answer
    result = check_cluster_auth(ev)
    assert result.status == status
    assert says in result.reason


def test_an_unreachable_cluster_fails_and_leaves_the_rest_unchecked(settings: RaySettings) -> None:
    ev = RayEvidence(settings=settings, version="2.60.0", unauthenticated_answer="the cluster does not answer (x)",
                     reach_problem="no Ray cluster answers at 10.250.0.1:6379 (Connection refused); check ...")
    statuses = {r.id: r.status for r in ray_checks(ev)}
    assert statuses == {"ray.installed": "PASS", "ray.token": "PASS", "ray.cluster-auth": "WARN",
                        "ray.reachable": "FAIL", "ray.nodes": "WARN", "ray.images": "WARN"}
    assert check_reachable(ev).reason == ev.reach_problem


def test_nodes_without_room_or_dead_ones(settings: RaySettings) -> None:
    ev = healthy(settings)
    ev.nodes = [HEAD]
    result = check_nodes(ev)
    assert result.status == "FAIL" and "no node advertises callbox_sandboxes" in result.reason
    assert "--resources='{\"callbox_sandboxes\": N}'" in result.reason
    dead = NodeView("d" * 56, "10.250.0.3", "w2host", False, {"callbox_sandboxes": 4.0})
    ev.nodes = [HEAD, W1, dead]
    result = check_nodes(ev)
    assert result.status == "WARN"
    assert result.reason == ("1 alive, 8 sandboxes in all: w1host 10.250.0.2 alive, capacity 8; "
                             "w2host 10.250.0.3 dead, capacity 4")
    ev.nodes = [dead]
    assert check_nodes(ev).status == "FAIL"
    ev.nodes = [HEAD, W1, dead, W2]  # w2 died and came back (a new Ray node at the same address)
    result = check_nodes(ev)
    assert result.status == "PASS" and "dead" not in result.reason


def test_images_missing_stale_or_not_checked(settings: RaySettings) -> None:
    ev = healthy(settings)
    ev.images = {"w1": None, "w2": "sha256:" + "2" * 64}
    result = check_images(ev)
    assert result.status == "FAIL"
    assert result.reason.startswith("w1 missing; w2 stale (222222222222, this machine has 111111111111)")
    ev = healthy(settings)
    ev.local_image = None
    assert check_images(ev).status == "WARN"
    assert "this machine's image was not found" in check_images(ev).reason
    ev = healthy(settings)
    ev.images, ev.images_note = None, "this Ray engine cannot say its nodes' images yet"
    result = check_images(ev)
    assert (result.status, result.reason) == ("WARN", "not checked: this Ray engine cannot say its nodes' images yet")
