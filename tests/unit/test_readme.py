"""The README's examples stay true: its policy example loads and decides as described."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.core.calls import Action
from harness.core.policy import load_policy
from harness.tools import builtin_registry
from harness.tools.shell import SHELL
from tests.readme_examples import SNIPPET_SOURCES, snippet_in

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_policy_example_loads_and_decides_as_documented(tmp_path):
    block = README.read_text().split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "policy.toml"
    path.write_text(block)
    policy = load_policy(path)
    policy.check_tools(t.definition for t in builtin_registry().tools())

    def decide(command: str) -> Action:
        return policy.decide(SHELL.definition, {"command": command, "workdir": None, "timeout_ms": None}).action

    assert decide("ls -la") is Action.ALLOW
    assert decide("rm -rf /workspace") is Action.DENY
    assert decide("git push origin main") is Action.ASK
    assert policy.budgets.max_output_bytes == 30000


@pytest.mark.parametrize(("name", "test_file"), sorted(SNIPPET_SOURCES.items()))
def test_readme_framework_snippets_are_the_tested_code(name: str, test_file: str) -> None:
    """The README's agent-framework snippets are copied from the interop tests that run them."""
    snippet = snippet_in((README.parents[0] / test_file).read_text(), name)
    assert len(snippet.splitlines()) >= 8
    assert f"```python\n{snippet}```" in README.read_text(), f"the README's {name} snippet differs from {test_file}"


def test_readme_actions_example_loads_and_decides_as_documented(tmp_path: Path) -> None:
    blocks = [b.split("```", 1)[0] for b in README.read_text().split("```toml\n")[1:]]
    block = next(b for b in blocks if "[actions." in b)
    path = tmp_path / "policy.toml"
    path.write_text(block)
    policy = load_policy(path)
    assert any("actions.port_forward.rules[0]" in line for line in policy.loosened())

    def decide(action: str, **details: object) -> Action:
        return policy.actions.decide(action, details, workdir="/workspace").action

    assert decide("port_forward", port=8000) is Action.ALLOW
    assert decide("port_forward", port=8085) is Action.ALLOW
    assert decide("port_forward", port=22) is Action.DENY
    assert decide("copy_out", path="/workspace/app/.env") is Action.DENY
    assert decide("copy_out", path="/workspace/app/main.py") is Action.ALLOW
    assert decide("process", command="python3 -m http.server 8000") is Action.ASK
    assert decide("snapshot", name="s") is Action.ALLOW
