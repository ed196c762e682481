"""`make demo`, the README's first command, runs end to end (scripted model, real everything else)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]


def test_make_demo_fixes_the_sample_project_and_its_tests_pass(engine, tmp_path):
    before = (REPO / "examples/demo-project/stats/core.py").read_bytes()
    proc = subprocess.run(
        ["make", "-s", "demo"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")},
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "FAILED (failures=1)" in out  # the model saw the failing test first
    assert "M /workspace/project/stats/core.py" in out  # apply_patch changed the file
    assert "+    return sum(values) / len(values)" in out
    assert out.rstrip().endswith("OK")  # and the tests pass afterwards
    assert "reason" in out and "final" in out
    assert f"in {tmp_path / 'audit.sqlite3'}" in out
    assert (REPO / "examples/demo-project/stats/core.py").read_bytes() == before  # the original is untouched
