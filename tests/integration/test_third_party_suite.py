"""A real third-party project's test suite in the sandbox: more-itertools, from its PyPI sdist.

The sdist (pinned version and sha256) is fetched once with the harness's own pip into the
pytest cache, unpacked, mounted read-only and run with stdlib ``unittest`` (the sandbox has
no network and the suite needs nothing else). The sandbox must give exactly the result a plain
hardened ``docker run`` of the same image gives: the same number of tests, the same outcome.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import Policy
from harness.core.session import Session
from harness.engine.spec import Mount, SandboxSpec
from harness.tools import builtin_registry
from tests.conftest import IMAGE, unavailable
from tests.integration.helpers import callbox

pytestmark = pytest.mark.docker

PROJECT = "more-itertools"
VERSION = "11.2.1"
SDIST = f"more_itertools-{VERSION}.tar.gz"
SDIST_SHA256 = "cbf08fd0af284dc69718b9b76a8e6203df624d70209ea511e4219d350c856f63"
TARGET = "/mnt/more-itertools"
COMMAND = ["python3", "-m", "unittest", "discover", "-s", "tests", "-t", "."]
ENV = {"PYTHONDONTWRITEBYTECODE": "1"}
RUN_TIMEOUT_S = 400
SUMMARY = re.compile(r"^Ran (\d+) tests? in \d+(?:\.\d+)?s\n\n(OK(?: \(.*\))?|FAILED \(.*\))$", re.MULTILINE)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download(cache: Path) -> Path:
    """The pinned sdist, from the cache or from PyPI (skip, or fail under CI=true, if unreachable)."""
    sdist = cache / SDIST
    if not sdist.is_file():
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               "--disable-pip-version-check", f"{PROJECT}=={VERSION}", "-d", str(cache)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except subprocess.TimeoutExpired:
            unavailable(f"pip download {PROJECT}=={VERSION} took over 300 s: is PyPI reachable?")
        if proc.returncode != 0 or not sdist.is_file():
            tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-5:])
            unavailable(f"could not download the {PROJECT} {VERSION} sdist from PyPI:\n{tail}")
    actual = _sha256(sdist)
    if actual != SDIST_SHA256:
        sdist.unlink()
        pytest.fail(f"{SDIST} has sha256 {actual}, expected {SDIST_SHA256}; removed it from the cache")
    return sdist


@pytest.fixture(scope="module")
def project(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    # pytest's cache keeps the download between sessions; without it (-p no:cacheprovider)
    # the session's temporary directory holds it.
    cache_plugin = getattr(request.config, "cache", None)
    cache = (Path(cache_plugin.mkdir("callbox-sdists")) if cache_plugin is not None
             else tmp_path_factory.mktemp("callbox-sdists"))
    sdist = _download(cache)
    root = tmp_path_factory.mktemp("third-party")
    with tarfile.open(sdist) as tar:
        tar.extractall(root, filter="data")
    tree = root / f"more_itertools-{VERSION}"
    assert (tree / "tests").is_dir() and (tree / "more_itertools").is_dir(), sorted(p.name for p in tree.iterdir())
    for path in (tree, *tree.rglob("*")):
        if path.is_dir():
            path.chmod(0o755)
    return tree


def _summary(output: str) -> tuple[int, str]:
    """(tests run, outcome line) from unittest's output; exactly one summary must be there."""
    found = SUMMARY.findall(output)
    assert len(found) == 1, output[-3000:]
    ran, outcome = found[0]
    return int(ran), outcome


@pytest.fixture(scope="module")
def baseline(engine: Any, project: Path) -> tuple[int, str]:
    """The same suite in a plain hardened ``docker run --rm`` of the same image."""
    out = engine.client.containers.run(
        IMAGE,
        entrypoint=COMMAND[:1],
        command=COMMAND[1:],
        user="1000:1000",
        network_mode="none",
        read_only=True,
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        tmpfs={"/tmp": ""},
        volumes={str(project): {"bind": TARGET, "mode": "ro"}},
        working_dir=TARGET,
        environment=ENV,
        remove=True,
        stdout=True,
        stderr=True,
    )
    ran, outcome = _summary(out.decode(errors="replace"))
    assert ran > 100
    return ran, outcome


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_suite_through_callbox_exec(baseline, project):
    env_args = [arg for key, value in ENV.items() for arg in ("--env", f"{key}={value}")]
    proc = callbox("exec", "--image", IMAGE, "--timeout", str(RUN_TIMEOUT_S), "--mount", f"{project}:{TARGET}:ro",
                   "--workdir", TARGET, *env_args, "--", *COMMAND, timeout=RUN_TIMEOUT_S + 60)
    output = proc.stdout.decode(errors="replace") + proc.stderr.decode(errors="replace")
    assert _summary(output) == baseline
    assert proc.returncode == (0 if baseline[1].startswith("OK") else 1), output[-2000:]


@pytest.mark.timeout(RUN_TIMEOUT_S + 120)
def test_suite_through_the_shell_tool(engine, baseline, project, tmp_path):
    spec = SandboxSpec(image=IMAGE, mounts=(Mount(source=project, target=TARGET),), env=ENV)
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        builtin_registry(), Policy(), audit, spec=spec, engine_factory=lambda: engine
    ) as harness:
        args = {"command": " ".join(COMMAND) + " 2>&1", "workdir": TARGET, "timeout_ms": RUN_TIMEOUT_S * 1000}
        result = harness.call(ToolCall("shell", args, "suite"))
    assert _summary(result.text) == baseline
    assert result.is_error is (not baseline[1].startswith("OK")), result.text[-2000:]
