"""Harbor (``harbor`` 0.26.0, unmodified) running a task of ours with ``harbor run -e e2b`` on callbox.

The task (``tests/interop/harbor_tasks/sum``, Harbor's task format: ``task.toml``,
``instruction.md``, ``environment/Dockerfile`` FROM E2B's base image, ``solution/solve.sh``,
``tests/test.sh`` writing the reward) runs with the ``oracle`` agent, which needs no model,
beside a broken copy whose solution writes a wrong answer: one job of two trials, as Harbor's
CLI runs it from its own virtualenv (Python >= 3.12) with only the E2B variables pointing it
at callbox. Harbor builds the task's template through callbox's template API (once: both
trials have the same environment), starts a sandbox per trial, uploads the solution and the
tests as root, runs them and downloads the verifier's output. The trial results Harbor writes
say reward 1.0 for the task and 0.0 for the broken copy, without an exception. The server's
policy is :data:`POLICY`, the one docs/use-from/harbor.md gives; the images the build made
are removed at the end, and the server checks no sandbox outlived it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.interop.e2b_server import E2bServer, policy_text, serve_e2b
from tests.interop.harness_venvs import venv_python
from tests.support.template_store import template_store

pytestmark = [pytest.mark.docker, pytest.mark.interop, pytest.mark.harbor]

ROOT = Path(__file__).resolve().parents[2]
TASK = Path(__file__).with_name("harbor_tasks") / "sum"
PAGE = ROOT / "docs" / "use-from" / "harbor.md"
POLICY = """\
[sandbox]
root_commands = true                             # Harbor sets up, copies files and runs the oracle as root
scratch_dirs = ["/logs", "/tests", "/solution"]  # where Harbor writes, beside the read-only root
"""
"""The policy Harbor needs (beside the test image); docs/use-from/harbor.md shows it."""
HARBOR_OPTIONS = ("-e", "e2b", "--ek", "restore_login_path=false", "--ek", "image_user=user")
"""What ``harbor run`` needs to run on callbox; docs/use-from/harbor.md shows them."""
BROKEN_SOLUTION = "#!/bin/bash\necho 41 > /app/answer.txt\n"
RUN_TIMEOUT_S = 600


def _policy_extra() -> str:
    return POLICY.removeprefix("[sandbox]\n")


@pytest.fixture(scope="module")
def server(engine: Any) -> Iterator[E2bServer]:
    """One server with :data:`POLICY` and a template store of its own (its images removed at the end)."""
    with template_store(engine.client, prefix="cbx-tpl-harbor-"), \
            serve_e2b(engine, policy=policy_text(_policy_extra())) as served:
        yield served


def _dataset(directory: Path) -> Path:
    """The task and its broken copy, side by side: a dataset of two tasks."""
    dataset = directory / "dataset"
    shutil.copytree(TASK, dataset / "sum")
    shutil.copytree(TASK, dataset / "sum-broken")
    solve = dataset / "sum-broken" / "solution" / "solve.sh"
    solve.write_text(BROKEN_SOLUTION)
    solve.chmod(0o755)
    return dataset


def _trials(jobs: Path) -> dict[str, dict[str, Any]]:
    """Each trial's result.json that Harbor wrote, by task name."""
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(jobs.glob("*/*/result.json")):
        result = json.loads(path.read_text())
        found[result["task_name"]] = result
    return found


@pytest.mark.timeout(RUN_TIMEOUT_S + 900)  # the venv is made on first use (pip, a few minutes)
def test_harbor_runs_a_task_with_the_oracle_and_a_broken_solution_scores_0(server: E2bServer,
                                                                          tmp_path: Path) -> None:
    harbor = venv_python("harbor").with_name("harbor")
    jobs = tmp_path / "jobs"
    command = [str(harbor), "run", "-p", str(_dataset(tmp_path)), "-a", "oracle", *HARBOR_OPTIONS,
               "-o", str(jobs), "--job-name", "callbox", "-n", "2", "-q", "-y"]
    # LiteLLM (which Harbor imports) would fetch its model price list from the internet first.
    env = {**server.child_env(), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HOME": str(tmp_path)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=tmp_path)
    trials = _trials(jobs)
    said = f"harbor run exited {done.returncode}:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}\n" \
           f"--- callbox\n{server.log()[-4000:]}"
    assert done.returncode == 0, said
    assert sorted(trials) == ["sum", "sum-broken"], said
    for name, reward in (("sum", 1.0), ("sum-broken", 0.0)):
        trial = trials[name]
        assert trial["exception_info"] is None, f"{name}: {trial['exception_info']}\n{said}"
        assert trial["verifier_result"]["rewards"] == {"reward": reward}, f"{name}: {trial['verifier_result']}"
    broken = (jobs / "callbox" / trials["sum-broken"]["trial_name"] / "verifier" / "test-stdout.txt").read_text()
    assert "expected 42, got: 41" in broken, broken
    # Both trials used one template, built once through callbox's build API (the same environment).
    templates = httpx.get(f"{server.url}/templates", headers={"X-API-Key": server.api_key}, timeout=30).json()
    assert [(t["names"][0][:7], t["buildCount"]) for t in templates] == [("harbor-", 1)], templates


def test_the_page_shows_this_tests_policy_options_and_dockerfile() -> None:
    page = PAGE.read_text()
    assert f"```toml\n{POLICY}```" in page
    assert " ".join(HARBOR_OPTIONS) in page
    assert f"```dockerfile\n{(TASK / 'environment' / 'Dockerfile').read_text()}```" in page
