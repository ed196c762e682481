"""LangChain deepagents (``deepagents`` on ``langchain-e2b``'s E2B backend) drives callbox.

deepagents and langchain-e2b live in a virtualenv of their own
(tests/interop/requirements/deepagents.txt): langchain-e2b 0.0.6 requires deepagents < 0.7,
whose ``langchain-anthropic`` needs an ``anthropic`` newer than the project's pin. The driver
program (tests/interop/deepagents_driver.py) runs a deep agent whose scripted chat model calls
``write_file``, ``edit_file``, ``read_file``, ``grep`` and ``execute``, one a turn, against
``callbox serve --e2b``; this test checks the tool results the model received, and the file as
the e2b SDK reads it back from the sandbox. One server and one sandbox for the module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.interop.e2b_server import DENIED_COMMAND_REASON, E2bServer, e2b_server_fixture  # noqa: F401
from tests.interop.harness_venvs import run_driver

pytestmark = [pytest.mark.docker, pytest.mark.interop, pytest.mark.deepagents]

DRIVER = Path(__file__).with_name("deepagents_driver.py")
PROJECT = "/home/user/proj"
EDITED = "def greet():\n    return 'hello from callbox'\n"
BIG = 60_000
# What each of the driver's tool calls returns to the model, in order (its CALLS).
EXPECTED = [
    ("write_file", f"Updated file {PROJECT}/app.py"),
    ("edit_file", "Successfully replaced 1 instance(s) of the string in '/home/user/proj/app.py'"),
    ("read_file", "     1\tdef greet():\n     2\t    return 'hello from callbox'"),
    ("grep", f"{PROJECT}/app.py:\n  2:     return 'hello from callbox'"),
    ("execute", "hello from callbox\nLinux\n\n[Command succeeded with exit code 0]"),
    ("ls", f"['{PROJECT}/__pycache__', '{PROJECT}/app.py']"),
    ("glob", "['app.py']"),
    ("write_file", f"Updated file {PROJECT}/data.txt"),
    ("edit_file", "Successfully replaced 1 instance(s) of the string in '/home/user/proj/data.txt'"),
    ("execute", "partial\n\n[Command failed with exit code 3]"),
    ("execute", "Error executing command (SandboxException): Code.PERMISSION_DENIED: denied by policy rule "
                f"tools.shell.rules[0]: {DENIED_COMMAND_REASON}\n[Command failed with exit code 1]"),
    ("execute", "Command timed out after 1 seconds\n[Command failed with exit code 124]"),
]
ASYNC_EXPECTED = [
    ("write_file", f"Updated file {PROJECT}/async.txt"),
    ("execute", "26\n\n[Command succeeded with exit code 0]"),
]


def check_run(run: dict[str, Any], expected: list[tuple[str, str]], variant: str) -> None:
    """Every tool call of ``run`` returned what ``expected`` says, and each turn of its model
    received the tool results of the turns before it."""
    got = [(r["name"], r["content"]) for r in run["tool_results"]]
    for i, (want, have) in enumerate(zip(expected, got, strict=False)):
        assert have == want, f"deepagents ({variant}): call {i} ({want[0]}) returned {have[1]!r}, not {want[1]!r}"
    assert len(got) == len(expected), f"deepagents ({variant}): {len(got)} tool results, not {len(expected)}: {got}"
    contents = [content for _, content in got]
    assert run["model_received"] == [contents[:turn] for turn in range(len(expected) + 1)], run["model_received"]
    assert run["final"] == "greet() now names callbox."


def test_deep_agent_runs_its_file_and_shell_tools_in_the_sandbox(e2b_server: E2bServer) -> None:
    report: dict[str, Any] = run_driver("deepagents", DRIVER, env=e2b_server.child_env(), timeout=300)

    for tool in ("write_file", "edit_file", "read_file", "grep", "execute"):
        assert tool in report["tools_offered"], f"deepagents offered no {tool}: {report['tools_offered']}"
    check_run(report, EXPECTED, "E2BSandbox, invoke")
    check_run(report["async"], ASYNC_EXPECTED, "AsyncE2BSandbox, ainvoke")
    # The files are in the sandbox, as the e2b SDK reads them back.
    files = report["in_sandbox"]
    assert files[f"{PROJECT}/app.py"] == EDITED, files[f"{PROJECT}/app.py"]
    assert files[f"{PROJECT}/data.txt"] == "HEAD\n" + "y" * BIG + "\nTAIL\n", files[f"{PROJECT}/data.txt"][:100]
    assert files[f"{PROJECT}/async.txt"] == "written by an async agent\n"
    assert {"app.py", "data.txt", "async.txt"} <= set(report["listed"]), report["listed"]
    # The command that timed out is gone, not left running in the sandbox.
    assert not [p for p in report["processes"] if "sleep 30" in p], report["processes"]
    assert report["left_running"] == [], "deepagents: the sandbox outlived its with block"
    # What does not work: a write outside the user's places is refused, and langchain-e2b 0.0.6
    # lets the SDK's SandboxException end the run (it catches only not-found, invalid-path and
    # PermissionError). The page says so; this notices when either side changes.
    assert report["outside"] == (
        "raised SandboxException: Code.PERMISSION_DENIED: /opt/outside.txt is outside the allowed roots "
        "(/home/sandbox, /home/user, /tmp, /workspace)."), report["outside"]
