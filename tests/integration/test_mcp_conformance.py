"""The MCP protocol's own conformance suite against the streamable HTTP server.

Runs ``scripts/mcp-conformance.sh`` (``npx @modelcontextprotocol/conformance server``, the
version pinned there) and checks the exact outcome: the scenarios that apply to a tools-only
server pass with no failed check, and every scenario that does not apply fails for the
reason it does not apply (the server answers "method not found" for resources, prompts,
completions and logging, and "unknown tool" for the suite's fixture tools). The script's
baseline makes the suite itself exit non-zero on any other outcome, including a listed
scenario that starts passing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import unavailable

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "mcp-conformance.sh"

PASSING = {"server-initialize", "ping", "tools-list", "server-sse-multiple-streams", "dns-rebinding-protection"}
NOT_APPLICABLE = {
    # no such method on a tools-only server without logging: -32601
    "logging-set-level": "-32601",
    "tools-call-with-logging": "-32601",
    "completion-complete": "-32601",
    "resources-list": "-32601",
    "resources-read-text": "-32601",
    "resources-read-binary": "-32601",
    "resources-templates-read": "-32601",
    "resources-subscribe": "-32601",
    "resources-unsubscribe": "-32601",
    "prompts-list": "-32601",
    "prompts-get-simple": "-32601",
    "prompts-get-with-args": "-32601",
    "prompts-get-embedded-resource": "-32601",
    "prompts-get-with-image": "-32601",
    # the suite's fixture tools: the spec's protocol error for an unknown tool
    "tools-call-simple-text": "-32602: Unknown tool: test_simple_text",
    "tools-call-image": "-32602: Unknown tool: test_image_content",
    "tools-call-audio": "-32602: Unknown tool: test_audio_content",
    "tools-call-embedded-resource": "-32602: Unknown tool: test_embedded_resource",
    "tools-call-mixed-content": "-32602: Unknown tool: test_multiple_content_types",
    "tools-call-error": "-32602: Unknown tool: test_error_handling",
    "tools-call-with-progress": "-32602: Unknown tool: test_tool_with_progress",
    "tools-call-sampling": "-32602: Unknown tool: test_sampling",
    "tools-call-elicitation": "-32602: Unknown tool: test_elicitation",
    "elicitation-sep1034-defaults": "-32602: Unknown tool: test_elicitation_sep1034_defaults",
    "elicitation-sep1330-enums": "-32602: Unknown tool: test_elicitation_sep1330_enums",
}
RESULT_DIR = re.compile(r"server-(?P<scenario>.+)-\d{4}-\d{2}-\d{2}T[\d-]+Z")


def test_conformance_suite_against_the_http_server(tmp_path):
    if shutil.which("npx") is None or shutil.which("node") is None:
        unavailable("Node.js with npx is not installed (the MCP conformance suite runs with npx)")
    out = tmp_path / "results"
    env = {**os.environ, "MCP_CONFORMANCE_OUT": str(out), "MCP_CONFORMANCE_TIMEOUT": "480"}
    proc = subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=600, check=False)
    report = f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode == 0, report
    assert "Baseline check passed" in proc.stdout, report

    checks: dict[str, list[dict[str, object]]] = {}
    for directory in out.iterdir():
        match = RESULT_DIR.fullmatch(directory.name)
        assert match, directory.name
        checks[match["scenario"]] = json.loads((directory / "checks.json").read_text())
    assert set(checks) == PASSING | set(NOT_APPLICABLE), report

    for scenario in PASSING:
        statuses = [c["status"] for c in checks[scenario]]
        assert "FAILURE" not in statuses and "SUCCESS" in statuses, (scenario, checks[scenario])
    for scenario, reason in NOT_APPLICABLE.items():
        failures = [c for c in checks[scenario] if c["status"] == "FAILURE"]
        assert failures, (scenario, checks[scenario])
        for failure in failures:
            assert reason in str(failure.get("errorMessage")), (scenario, failure)
