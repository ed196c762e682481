"""The documentation site, built once per test session (strict, as ``make docs`` builds it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _offline_prefix() -> list[str]:
    """``unshare --net`` when the tests run as root: the build then runs in a network namespace
    with no network at all, so a build that fetched anything would fail here."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return []
    probe = subprocess.run(["unshare", "--net", "true"], capture_output=True, check=False)
    return ["unshare", "--net"] if probe.returncode == 0 else []


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The site built from this tree with ``mkdocs build --strict`` into a temporary directory."""
    site = tmp_path_factory.mktemp("site") / "site"
    argv = [*_offline_prefix(), sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
            str(ROOT / "mkdocs.yml"), "--site-dir", str(site)]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, f"the strict build failed ({' '.join(argv)}):\n{done.stdout}{done.stderr}"
    print(f"built the site in {time.monotonic() - started:.1f} s into {site}")
    yield site
