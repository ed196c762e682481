"""The snapshot verbs that read this machine's snapshot store refuse the Ray engine (its
snapshots stay on the nodes): a usage error, never an empty list that looks like "none"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("verb", [["snapshots"], ["rm-snapshot", "s1"], ["restore", "box1"],
                                  ["fork", "--from-snapshot", "s1"]])
def test_snapshot_verbs_that_read_the_local_store_refuse_the_ray_engine(verb: list[str], tmp_path: Path) -> None:
    token = tmp_path / "ray-token"
    token.write_text("t" * 64)
    token.chmod(0o600)
    done = subprocess.run([sys.executable, "-m", "harness.cli.main", "sandbox", *verb, "--engine", "ray",
                           "--ray-address", "10.0.0.1:6379", "--ray-token-file", str(token)],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert "on the Ray engine they stay on the nodes that took them" in done.stderr
    assert "Traceback" not in done.stderr
