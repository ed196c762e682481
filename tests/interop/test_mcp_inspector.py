"""The MCP Inspector's CLI (``@modelcontextprotocol/inspector --cli``, the version pinned in
scripts/npm-tools/package-lock.json, installed under .cache/npm by scripts/setup-npm-tools.sh,
which ``make test`` runs) lists callbox's tools and calls one over stdio.

The Inspector needs Node 22; the script installs a Node 22 binary from the npm registry next
to it, and the tests run the Inspector with that one. Without the installed tools the tests
skip with the reason (fail under CI=true).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import unavailable
from tests.interop.conftest import CALLBOX, ROOT

pytestmark = [pytest.mark.interop, pytest.mark.docker]

BIN = ROOT / ".cache" / "npm" / "node_modules" / ".bin"
TIMEOUT_S = 180


def _inspector(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    node, inspector = BIN / "node", BIN / "inspector"
    if not (node.exists() and inspector.exists()):
        unavailable("the MCP Inspector is not installed under .cache/npm (run scripts/setup-npm-tools.sh or "
                    "`make test`; it needs npm)")
    env = {**env, "PATH": f"{BIN}{os.pathsep}{env.get('PATH', '')}",
           "MCP_CATALOG_PATH": str(tmp_path / "inspector-catalog.json")}  # not ~/.mcp-inspector
    return subprocess.run([str(node), str(inspector), "--cli", *args], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=TIMEOUT_S, check=False)


def test_inspector_lists_the_tools_over_stdio(policy: Path, callbox_env: dict[str, str], tmp_path: Path):
    proc = _inspector(tmp_path, callbox_env, CALLBOX, "mcp", "--policy", str(policy), "--method", "tools/list")
    assert proc.returncode == 0, proc
    tools = {tool["name"]: tool for tool in json.loads(proc.stdout)["tools"]}
    assert {"shell", "bash", "read_file", "write_file", "apply_patch", "str_replace_based_edit_tool"} <= set(tools)
    shell = tools["shell"]
    assert shell["inputSchema"]["required"] == ["command"]  # only what a call must give
    assert shell["annotations"]["destructiveHint"] is True
    assert tools["read_file"]["annotations"]["readOnlyHint"] is True


def test_inspector_calls_shell_over_stdio(policy: Path, callbox_env: dict[str, str], tmp_path: Path):
    proc = _inspector(tmp_path, callbox_env, CALLBOX, "mcp", "--policy", str(policy), "--method", "tools/call",
                      "--tool-name", "shell", "--tool-arg", "command=echo hello from $(id -un)")
    assert proc.returncode == 0, proc
    result = json.loads(proc.stdout)
    assert result["isError"] is False, result
    assert result["content"][0]["text"].endswith("Output:\nhello from user\n"), result
    assert result["structuredContent"]["exit_code"] == 0
    assert result["_meta"]["callbox/call_id"] == "mcp-000001"


def test_inspector_call_with_a_wrong_argument_gets_a_readable_error(policy: Path, callbox_env: dict[str, str],
                                                                     tmp_path: Path):
    # --tool-arg parses JSON values: 5 is a number, not the string shell's command must be
    proc = _inspector(tmp_path, callbox_env, CALLBOX, "mcp", "--policy", str(policy), "--method", "tools/call",
                      "--tool-name", "shell", "--tool-arg", "command=5")
    result = json.loads(proc.stdout)
    assert result["isError"] is True, (proc, result)
    assert "argument 'command' must be a string, got 5" in result["content"][0]["text"]
