"""The pages' examples stay true: every block is run, loaded or says why not; the policy and
configuration examples load; the policy examples decide as the pages describe; the framework
snippets are the code the interop tests run.

The rule (see tests/doc_examples.py): a block whose language reads as commands (``sh``,
``bash``, ...) carries ``<!-- not run: REASON -->`` on the line above it (``console`` and
``python`` blocks are run by tests/integration/test_doc_examples.py unless so marked); a
``toml`` block carries ``<!-- toml: policy -->``, ``<!-- toml: config -->`` or ``<!-- toml: tasks -->``
(an eval's task file) and is loaded here with that loader, or is marked ``not run``.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from harness.cli.server_config import parse_config
from harness.core.calls import Action
from harness.core.policy import load_policy, parse_policy
from harness.eval.tasks import load_tasks
from harness.tools import builtin_registry
from harness.tools.shell import SHELL
from tests.doc_examples import (
    COMMAND_LANGUAGES,
    ROOT,
    RUN_LANGUAGES,
    SNIPPET_SOURCES,
    TOML_KINDS,
    Block,
    all_blocks,
    block_with,
    fenced_blocks,
    snippet_in,
    snippet_language,
)

BLOCKS = all_blocks()
TOML_BLOCKS = [b for b in BLOCKS if b.language == "toml" and b.not_run is None and b.toml_kind in TOML_KINDS]


def problems(blocks: list[Block]) -> list[str]:
    """Every block that breaks the rule, as ``page:line: what to do``."""
    found = []
    for block in blocks:
        loose = [m for m in block.markers if m.startswith("<!-- not run") or m.startswith("<!-- toml")]
        known = [m for m in loose if (m.startswith("<!-- not run") and block.not_run)
                 or (m.startswith("<!-- toml") and block.toml_kind in TOML_KINDS)]
        for marker in loose:
            if marker not in known:
                found.append(f"{block.name}: {marker!r} is not a marker line: write <!-- not run: REASON --> "
                             f"(a reason is required) or <!-- toml: {' | '.join(TOML_KINDS)} -->")
        if block.not_run is not None and block.toml_kind is not None:
            found.append(f"{block.name}: a block is either loaded (toml: ...) or not run, not both")
        elif block.language in COMMAND_LANGUAGES - RUN_LANGUAGES and block.not_run is None:
            found.append(f"{block.name}: this {block.language} block is run by no test; make it a console block "
                         "with the output it prints, or put <!-- not run: REASON --> on the line above it")
        elif block.language == "toml" and block.not_run is None and block.toml_kind not in TOML_KINDS:
            found.append(f"{block.name}: say how this toml block is checked: put <!-- toml: policy --> or "
                         "<!-- toml: config --> (or tasks: an eval's task file) on the line above it (a unit test "
                         "loads it with that loader), "
                         "or <!-- not run: REASON -->")
        elif block.toml_kind is not None and block.language != "toml":
            found.append(f"{block.name}: <!-- toml: ... --> marks toml blocks, and this one is {block.language!r}")
    return found


def test_every_block_is_run_loaded_or_says_why_not() -> None:
    found = problems(BLOCKS)
    assert not found, "blocks of the pages that no test checks:\n" + "\n".join(found)


def test_the_rule_names_each_unmarked_or_malformed_block() -> None:
    page = "\n".join([
        "```sh", "make demo", "```",                                        # 1: unmarked
        "<!-- not run: needs the reader's cloud account -->", "```bash", "aws s3 ls", "```",
        "<!-- not run: -->", "```sh", "true", "```",                        # 9: no reason
        "```toml", "[sandbox]", "```",                                      # 12: unmarked
        "<!-- toml: policy -->", "", "```toml", "[sandbox]", "```",
        "<!-- toml: yaml -->", "```toml", "a = 1", "```",                   # 21: unknown loader
        "```console", "$ true", "```", "```python", "pass", "```", "```text", "x", "```", "```", "y", "```",
        "```json", "{}", "```",
    ])
    found = problems(fenced_blocks(page, "docs/x.md"))
    assert [f.split(":", 2)[1] for f in found] == ["1", "9", "9", "12", "21", "21"], found
    assert "a reason is required" in found[1]


@pytest.mark.parametrize("block", TOML_BLOCKS, ids=[b.name for b in TOML_BLOCKS])
def test_toml_block_loads(block: Block, tmp_path: Path) -> None:
    """Each toml block loads with the loader its marker names, from a directory where the
    places it names relative to itself exist (a mount's source, a token file)."""
    data = tomllib.loads(block.body)
    if block.toml_kind == "policy":
        for directory in _relative_mount_sources(data):
            (tmp_path / directory).mkdir(parents=True, exist_ok=True)
        parse_policy(block.body, source=block.name, base_dir=tmp_path)
    elif block.toml_kind == "tasks":  # an eval's task file: its project directories exist beside it
        for task in data.get("task", []):
            project = task.get("project")
            folder = project if isinstance(project, str) else (project or {}).get("dir")
            if isinstance(folder, str) and not os.path.isabs(folder):
                (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks.toml").write_text(block.body)
        load_tasks(tmp_path / "tasks.toml")
    else:
        token = data.get("ray", {}).get("token_file")
        if isinstance(token, str) and not os.path.isabs(token):
            (tmp_path / token).write_text("a-token-of-the-example\n")
            (tmp_path / token).chmod(0o600)
        parse_config(block.body, source=block.name, base=tmp_path)


def _relative_mount_sources(data: dict[str, Any]) -> list[str]:
    mounts = list(data.get("sandbox", {}).get("mounts", []))
    for tool in data.get("tool", []):
        mounts.extend(tool.get("mounts", []))
    roots = data.get("sandbox", {}).get("allowed_mount_roots") or []
    return [p for p in [*(m.get("source", "") for m in mounts), *roots] if p and not os.path.isabs(p)]


def test_the_policy_example_loads_and_decides_as_documented(tmp_path: Path) -> None:
    block = block_with("toml", "[[tools.shell.rules]]", "max_output_bytes = 30000")
    path = tmp_path / "policy.toml"
    path.write_text(block.body)
    policy = load_policy(path)
    policy.check_tools(t.definition for t in builtin_registry().tools())

    def decide(command: str) -> Action:
        return policy.decide(SHELL.definition, {"command": command, "workdir": None, "timeout_ms": None}).action

    assert decide("ls -la") is Action.ALLOW
    assert decide("rm -rf /workspace") is Action.DENY
    assert decide("git push origin main") is Action.ASK
    assert policy.budgets.max_output_bytes == 30000


@pytest.mark.parametrize(("name", "test_file"), sorted(SNIPPET_SOURCES.items()))
def test_the_framework_snippets_are_the_tested_code(name: str, test_file: str) -> None:
    """The pages' agent-framework snippets are copied from the interop tests that run them."""
    language = snippet_language(test_file)
    snippet = snippet_in((ROOT / test_file).read_text(), name, "//" if language == "javascript" else "#")
    assert len(snippet.splitlines()) >= (4 if language == "toml" else 8)  # a client's config can be short
    copies = [b.name for b in BLOCKS if b.language == language and b.body == snippet]
    assert copies, f"no page has the {name} snippet of {test_file} as a {language} block (copy it from there)"


def test_the_actions_example_loads_and_decides_as_documented(tmp_path: Path) -> None:
    block = block_with("toml", "[actions.port_forward]", "[[actions.copy_out.rules]]")
    path = tmp_path / "policy.toml"
    path.write_text(block.body)
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


def test_the_no_terminals_example_refuses_the_e2b_terminal_only(tmp_path: Path) -> None:
    """The Agents SDK's page: the rule refuses the shell an E2B ``pty.create`` starts (the
    argv the door records), not a command run without a terminal."""
    block = block_with("toml", 'command = "/bin/bash -i -l"')
    path = tmp_path / "policy.toml"
    path.write_text(block.body)
    actions = load_policy(path).actions
    assert actions.decide("process", {"command": ["/bin/bash", "-i", "-l"], "pty": True},
                          workdir="/workspace").action is Action.DENY
    assert actions.decide("process", {"command": "cat notes.txt", "pty": False},
                          workdir="/workspace").action is Action.ALLOW
