"""``callbox sandbox`` verbs on the Ray engine, as a user types them: each command is its own
process and its own Ray driver; the sandbox lives on a worker node between them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]


def callbox(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], capture_output=True, text=True,
                          timeout=240, check=False)


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
