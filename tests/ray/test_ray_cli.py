"""``callbox sandbox`` verbs on the Ray engine, as a user types them: each command is its own
process and its own Ray driver; the sandbox lives on a worker node between them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]


def callbox(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], capture_output=True, text=True,
                          timeout=240, check=False, env={**os.environ, **(env or {})})


def test_sandbox_verbs_on_the_cluster(ray_cluster: RayTestCluster, ray_engine: Any, tmp_path: Path) -> None:
    token = tmp_path / "ray-token"
    shutil.copy(ray_cluster.token_file, token)
    token.chmod(0o600)
    flags = ["--engine", "ray", "--ray-address", ray_cluster.address, "--ray-token-file", str(token)]
    name = f"cli-{uuid.uuid4().hex[:8]}"
    made = callbox("sandbox", "new", "--name", name, "--ttl", "600", "--json", *flags)
    assert made.returncode == 0, made.stderr
    try:
        ran = callbox("sandbox", "exec", *flags, name, "--", "sh", "-c", 'echo "$CALLBOX_NODE" > /workspace/n; '
                      "cat /workspace/n")
        assert ran.returncode == 0, ran.stderr
        node = ran.stdout.strip()
        assert node in ("w1", "w2"), ran.stdout
        listed = callbox("sandbox", "ls", "--json", *flags)
        assert listed.returncode == 0, listed.stderr
        assert name in {entry.get("name") for entry in json.loads(listed.stdout)}, listed.stdout
        assert ray_engine.open(name).node == node  # the same sandbox, seen from this process too
    finally:
        removed = callbox("sandbox", "rm", name, *flags)
    assert removed.returncode == 0, removed.stderr
    gone = callbox("sandbox", "exec", *flags, name, "--", "true")
    assert gone.returncode != 0 and name in gone.stderr, (gone.stdout, gone.stderr)


def test_snapshot_verbs_on_the_cluster_with_the_engine_from_the_environment(
        ray_cluster: RayTestCluster, ray_engine: Any, tmp_path: Path) -> None:
    """snapshot, snapshots, fork --from-snapshot, restore and rm-snapshot ask the nodes, with
    the cluster named once in the environment instead of flags on every command."""
    token = tmp_path / "ray-token"
    shutil.copy(ray_cluster.token_file, token)
    token.chmod(0o600)
    env = {"CALLBOX_ENGINE": "ray", "CALLBOX_RAY_ADDRESS": ray_cluster.address, "CALLBOX_RAY_TOKEN_FILE": str(token)}
    name, snap = f"cli-{uuid.uuid4().hex[:8]}", f"s-{uuid.uuid4().hex[:8]}"
    fork = f"{name}-fork"
    assert callbox("sandbox", "new", "--name", name, "--ttl", "600", env=env).returncode == 0
    try:
        wrote = callbox("sandbox", "exec", name, "--", "sh", "-c", "echo kept > /workspace/f", env=env)
        assert wrote.returncode == 0, wrote.stderr
        taken = callbox("sandbox", "snapshot", name, snap, env=env)
        node = ray_engine.open(name).node
        assert taken.returncode == 0 and f"on node {node}" in taken.stdout, (taken.stdout, taken.stderr)
        listed = callbox("sandbox", "snapshots", "--json", env=env)
        assert listed.returncode == 0, listed.stderr
        assert snap in {entry["name"] for entry in json.loads(listed.stdout)}, listed.stdout

        forked = callbox("sandbox", "fork", "--from-snapshot", snap, "--name", fork, env=env)
        assert forked.returncode == 0, forked.stderr
        shown = callbox("sandbox", "exec", fork, "--", "cat", "/workspace/f", env=env)
        assert (shown.returncode, shown.stdout) == (0, "kept\n"), shown.stderr

        # The snapshot as an archive, imported onto the other node (verified there); a changed byte is refused.
        other = "w2" if node == "w1" else "w1"
        archive = tmp_path / "snap.tar"
        exported = callbox("sandbox", "export-snapshot", snap, "-o", str(archive), env=env)
        assert exported.returncode == 0, exported.stderr
        imported = callbox("sandbox", "import-snapshot", str(archive), "--name", f"{snap}-moved", "--node", other,
                           env=env)
        assert imported.returncode == 0 and f"on node {other}" in imported.stdout, (imported.stdout, imported.stderr)
        assert [h.name for h in ray_engine.snapshot_holders(f"{snap}-moved")] == [other]
        with tarfile.open(archive) as tar:
            (member,) = [m for m in tar.getmembers() if m.name.endswith("_workspace.tar")]
        spoiled = bytearray(archive.read_bytes())
        spoiled[member.offset_data + member.size // 2] ^= 0x01
        archive.write_bytes(spoiled)
        refused = callbox("sandbox", "import-snapshot", str(archive), "--name", f"{snap}-spoiled", "--node", other,
                          env=env)
        assert refused.returncode != 0 and f"refused: {member.name}: its SHA-256" in refused.stderr, refused.stderr
        assert ray_engine.snapshot_holders(f"{snap}-spoiled") == []

        # The sandbox's container vanishes from its node (its name and snapshot stay): restore it.
        client = ray_cluster.docker_client(node)
        try:
            for container in client.containers.list(all=True, filters={"label": f"callbox.name={name}"},
                                                        ignore_removed=True):
                container.remove(force=True)
        finally:
            client.close()
        restored = callbox("sandbox", "restore", name, env=env)
        assert restored.returncode == 0 and snap in restored.stdout, (restored.stdout, restored.stderr)
        again = callbox("sandbox", "exec", name, "--", "cat", "/workspace/f", env=env)
        assert (again.returncode, again.stdout) == (0, "kept\n"), again.stderr

        removed = callbox("sandbox", "rm-snapshot", snap, env=env)
        assert removed.returncode == 0, removed.stderr
        after = callbox("sandbox", "snapshots", "--json", env=env)
        assert snap not in {entry["name"] for entry in json.loads(after.stdout)}, after.stdout
        missing = callbox("sandbox", "rm-snapshot", snap, env=env)
        assert missing.returncode != 0 and snap in missing.stderr and "Traceback" not in missing.stderr
    finally:
        for each in (fork, name):
            callbox("sandbox", "rm", each, env=env)
        for info in ray_engine.snapshots():
            if info.name in (snap, f"{snap}-moved"):
                ray_engine.remove_snapshot(info.name)


def test_an_eval_runs_its_trials_on_the_cluster_nodes_and_leaves_nothing_there(
        ray_cluster: RayTestCluster, ray_engine: Any, tmp_path: Path) -> None:
    """``callbox eval --engine ray``: each trial's sandbox is on a worker node (its acceptance
    check reads the node's name in the sandbox), the pool the eval enabled on the nodes is
    emptied at its end, and no sandbox is left behind."""
    token = tmp_path / "ray-token"
    shutil.copy(ray_cluster.token_file, token)
    token.chmod(0o600)
    flags = ["--engine", "ray", "--ray-address", ray_cluster.address, "--ray-token-file", str(token)]
    tasks = tmp_path / "tasks.toml"
    tasks.write_text('[[task]]\nid = "on-a-node"\ninstruction = "Write the node\'s name into node.txt."\n'
                     "acceptance = [{ command = \"grep -qx 'w[12]' node.txt\", timeout_s = 30 }]\n")
    transcripts = tmp_path / "transcripts"
    transcripts.mkdir()
    (transcripts / "on-a-node.jsonl").write_text(
        '{"text": "Noting it.", "tool_calls": [{"name": "shell", "arguments": '
        '{"command": "echo \\"$CALLBOX_NODE\\" > node.txt && cat node.txt"}}]}\n'
        '{"text": "node.txt names the node."}\n')
    live_before = ray_engine.sandbox_census()[0]
    out = tmp_path / "out"
    ran = callbox("eval", str(tasks), "--transcripts", str(transcripts), "--trials", "2", "--concurrency", "2",
                  "--out", str(out), *flags)
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted((r["trial"], r["passed"], r["reason"]) for r in results) == [
        (1, True, "final:accepted"), (2, True, "final:accepted")], results
    assert "pass@1 100.0% (2 of 2 trials passed)" in ran.stdout, ran.stdout
    assert ray_engine.pooled_count() == 0
    assert ray_engine.sandbox_census()[0] == live_before
