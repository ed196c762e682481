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


def test_make_demo_desktop_adds_two_tasks_with_the_browser_and_saves_its_screenshots(engine, tmp_path):
    from harness.core.images import read_header

    shots = tmp_path / "shots"
    proc = subprocess.run(
        ["make", "-s", "demo-desktop"], cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
        env={**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3"), "CALLBOX_DEMO_SCREENSHOTS": str(shots)},
    )
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert '- button "Add" [ref=e3]' in out  # the refs the transcript clicks are the page's
    assert out.count("✓ browser_") == 6 and "✗" not in out
    assert '- text: "2 tasks."' in out and '- text: "Buy milk"' in out
    assert "[LOG] added task: Buy milk" in out
    [run_dir] = list(shots.iterdir())
    pictures = {path.name: read_header(path.read_bytes()) for path in run_dir.iterdir()}
    assert pictures["call_desktop_shot-1.png"] == ("image/png", 1280, 800)
    assert set(pictures) == {"call_desktop_shot-1.png", "call_page_shot-1.png"}
    assert pictures["call_page_shot-1.png"][0] == "image/png"
    assert f"The screenshots the agent took, in {run_dir}/" in out
