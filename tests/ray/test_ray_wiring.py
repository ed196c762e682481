"""Choosing the Ray engine from the command line and a policy, on the real test cluster:
``callbox doctor`` checks it item by item, and ``callbox run`` places its sandbox on a worker,
pauses for an approval and resumes there with the printed command (no engine flags: the
choice travels in the run's checkpointed policy).

Each command is its own process, joining the cluster as a driver as a user's would (the
session's ``ray_engine`` has started the hosts and sent the image first)."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.integration.helpers import callbox

if TYPE_CHECKING:
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]

NAMESPACE = "callbox-tests"
"""The session's hosts (a second namespace would start second hosts on the same relay port)."""


def policy_file(tmp_path: Path, cluster: RayTestCluster, *, address: str | None = None, token: str | None = None,
                extra: str = "") -> Path:
    """A policy on the cluster: its address (or ``address``), a copy of its token (or ``token``)."""
    token_file = tmp_path / "ray-token"
    if token is None:
        shutil.copy(cluster.token_file, token_file)
    else:
        token_file.write_text(token)
    token_file.chmod(0o600)
    path = tmp_path / "policy.toml"
    path.write_text(f'engine = "ray"\n{extra}\n[ray]\naddress = "{address or cluster.address}"\n'
                    f'token_file = "ray-token"\nnode_ip = "{cluster.node_ip}"\nnamespace = "{NAMESPACE}"\n')
    return path


def doctor(policy: Path) -> tuple[int, dict[str, dict[str, str]], float]:
    started = time.monotonic()
    proc = callbox("doctor", "--policy", str(policy), "--json", timeout=300)
    took = time.monotonic() - started
    assert "Traceback" not in proc.stderr.decode(), proc.stderr.decode()
    return proc.returncode, {r["id"]: r for r in json.loads(proc.stdout)}, took


def test_doctor_passes_every_item_of_the_cluster(ray_engine: Any, ray_cluster: RayTestCluster,
                                                 tmp_path: Path) -> None:
    code, results, _ = doctor(policy_file(tmp_path, ray_cluster))
    assert [r["status"] for r in results.values()] == ["PASS"] * 6, results
    assert set(results) == {"ray.installed", "ray.token", "ray.cluster-auth", "ray.reachable", "ray.nodes",
                            "ray.images"}
    assert code == 0
    nodes = results["ray.nodes"]["reason"]
    for worker in ray_cluster.workers.values():
        assert f"{worker.ip} alive, capacity {ray_cluster.sandboxes_per_node}" in nodes
    images = results["ray.images"]["reason"]
    assert images.count("(current)") == 2, images
    assert all(r["scope"] == "cluster" for r in results.values())


def test_doctor_with_a_token_not_the_clusters_fails_on_its_line_at_once(
        ray_engine: Any, ray_cluster: RayTestCluster, tmp_path: Path) -> None:
    code, results, took = doctor(policy_file(tmp_path, ray_cluster, token="not-the-token-" * 4))
    assert code == 1
    assert took < 30
    assert results["ray.cluster-auth"]["status"] == "PASS"  # the cluster still refuses a caller without one
    assert results["ray.reachable"]["status"] == "FAIL"
    assert "refused the connection" in results["ray.reachable"]["reason"]
    assert "is not this cluster's" in results["ray.reachable"]["reason"]


def transcript(tmp_path: Path) -> Path:
    turns = [
        {"text": "where", "tool_calls": [{"call_id": "c1", "name": "shell",
                                          "arguments": {"command": 'echo "on $CALLBOX_NODE"'}}]},
        {"text": "note it", "tool_calls": [{"call_id": "c2", "name": "shell",
                                            "arguments": {"command": "echo second > /workspace/note"}}]},
        {"text": "done"},
    ]
    path = tmp_path / "transcript.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in turns))
    return path


def test_run_places_its_sandbox_on_a_worker_and_resumes_there(ray_engine: Any, ray_cluster: RayTestCluster,
                                                              tmp_path: Path) -> None:
    # The policy's own address answers nothing: the run works only on --ray-address, and the
    # resume (without flags) only if that choice was kept with the run.
    ask = '[tools.shell]\ndecision = "allow"\n[[tools.shell.rules]]\naction = "ask"\ncommand = "echo second*"\n'
    policy = policy_file(tmp_path, ray_cluster, address=f"{ray_cluster.node_ip}:1", extra="")
    policy.write_text(policy.read_text() + ask)
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    script = transcript(tmp_path)
    first = callbox("run", str(script), "--policy", str(policy), "--json", "--engine", "ray",
                    "--ray-address", ray_cluster.address, env=env, timeout=300)
    assert first.returncode == 3, first.stdout.decode() + first.stderr.decode()
    events = [json.loads(line) for line in first.stdout.splitlines()]
    (where,) = [e for e in events if e["event"] == "tool_result" and e["call_id"] == "c1"]
    node = where["result"]["text"].split("on ", 1)[1].split()[0]
    assert node in ray_cluster.workers, where
    ended = events[-1]
    assert ended["reason"] == "approval_pending"
    (approval,) = ended["pending_approvals"]
    assert callbox("approvals", "approve", approval, env=env).returncode == 0
    second = callbox("run", str(script), "--resume", ended["run_id"], "--json", env=env, timeout=300)
    assert second.returncode == 0, second.stdout.decode() + second.stderr.decode()
    resumed = [json.loads(line) for line in second.stdout.splitlines()]
    assert resumed[-1]["reason"] == "final"
    (noted,) = [e for e in resumed if e["event"] == "tool_result" and e["call_id"] == "c2"]
    assert not noted["result"]["is_error"], noted
