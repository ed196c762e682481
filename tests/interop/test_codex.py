"""The Codex CLI (``@openai/codex``, pinned in scripts/npm-tools/package-lock.json, installed
under .cache/npm by scripts/setup-npm-tools.sh, which ``make test`` runs) uses callbox's
tools over streamable HTTP (``callbox serve --mcp-http`` with a token), configured as a user
configures it (tests/interop/codex_config.toml, the file docs/use-from/codex.md shows).

``codex exec`` runs with a ``CODEX_HOME`` of its own whose ``config.toml`` adds a model
provider: a loopback stub of the OpenAI Responses API (tests/interop/model_stubs.py). The
stub finds callbox's tools among those Codex offers: it writes a file, reads it back with
``shell``, runs a command that fails, then answers in text. callbox records the three calls in
its audit store, and each result (made in the sandbox) comes back to the stub in the next
request's ``function_call_output``. Without its token, ``codex exec`` stops before asking the
model anything (the server is ``required``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from tests.conftest import unavailable
from tests.interop.conftest import ROOT
from tests.interop.model_stubs import OpenAIResponsesStub, ScriptedCall, tool_ending

pytestmark = [pytest.mark.interop, pytest.mark.docker, pytest.mark.codex]

BIN = ROOT / ".cache" / "npm" / "node_modules" / ".bin"
CONFIG = Path(__file__).with_name("codex_config.toml")
RUN_TIMEOUT_S = 240
FINAL = "the sandbox answered"
NOTE = "/workspace/note.txt"
COMMAND = f"cat {NOTE} && echo codex: $((6 * 7)) from $(id -un)"
FAILING = "cat /workspace/missing.txt"


def _model_provider(url: str) -> str:
    """The test's part of config.toml: the stub as the model, nothing else on the network."""
    return (f'model_provider = "callbox_stub"\nmodel = "stub-model"\napproval_policy = "never"\n'
            f'check_for_update_on_startup = false\n\n'
            f'[model_providers.callbox_stub]\nname = "loopback stub"\nbase_url = "{url}/v1"\n'
            f'wire_api = "responses"\nrequest_max_retries = 0\nstream_max_retries = 0\n\n')


def test_codex_exec_runs_callbox_tools_over_mcp_http(mcp_http_token: tuple[str, str], callbox_env: dict[str, str],
                                                     tmp_path: Path):
    mcp_http_url, token = mcp_http_token
    codex = BIN / "codex"
    if not codex.exists():
        unavailable("the Codex CLI is not installed under .cache/npm (run scripts/setup-npm-tools.sh or "
                    "`make test`; it needs npm)")
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    script = [ScriptedCall(tool_ending("__write_file", "mcp__callbox__"), {"path": NOTE, "content": "from codex\n"}),
              ScriptedCall(tool_ending("__shell", "mcp__callbox__"), {"command": COMMAND}),
              ScriptedCall(tool_ending("__shell", "mcp__callbox__"), {"command": FAILING})]
    with OpenAIResponsesStub(script, FINAL) as stub:
        (home / "config.toml").write_text(_model_provider(stub.url) + CONFIG.read_text())
        env = {**os.environ, "CODEX_HOME": str(home), "CALLBOX_TOKEN": token,
               "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
        # as the page shows it, with the address the test's server announced
        argv = [str(codex), "exec", "--json", "--skip-git-repo-check", "--sandbox", "read-only",
                "--disable", "shell_tool", "-c", f'mcp_servers.callbox.url="{mcp_http_url}"', "-C", str(work),
                "Say hello from the sandbox."]
        unset = {k: v for k, v in env.items() if k != "CALLBOX_TOKEN"}
        refused = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=unset,
                                 timeout=RUN_TIMEOUT_S, check=False)
        assert refused.returncode != 0 and "CALLBOX_TOKEN" in refused.stderr, refused  # required = true
        assert not stub.requests and not stub.other_requests
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                              timeout=RUN_TIMEOUT_S, check=False)
    assert stub.refused == [], stub.refused  # a request the real API would refuse
    assert proc.returncode == 0, proc
    assert stub.requests, f"Codex never offered the model callbox's tools: {proc.stdout}{proc.stderr}"
    offered = stub.tool_names(stub.requests[0])
    assert "mcp__callbox__shell" in offered, offered
    assert "exec_command" not in offered and "shell" not in offered, f"Codex's own shell is offered: {offered}"
    assert stub.other_requests == [], stub.other_requests  # only the Responses API, nothing else
    assert stub.called == ["mcp__callbox__write_file", "mcp__callbox__shell", "mcp__callbox__shell"], stub.called
    # each result reaches the model in the request right after its call
    assert [len(stub.tool_results(body)) for body in stub.requests] == [0, 1, 2, 3], stub.requests
    results = stub.tool_results(stub.requests[3])  # the last request carries every result so far
    # Codex gives the model a result's structuredContent (callbox's carries the result's text
    # under "text") after a line of its own timing; a failed command's too, with its exit code
    structured = [json.loads(result.split("Output:\n", 1)[1]) for result in results]
    assert structured[0]["bytes_written"] == len("from codex\n"), results
    assert structured[1]["text"].endswith("Output:\nfrom codex\ncodex: 42 from user\n"), results
    assert structured[2]["exit_code"] == 1 and "No such file or directory" in structured[2]["text"], results
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert {"type": "agent_message", "text": FINAL}.items() <= events[-2]["item"].items(), events
    audit = AuditStore(Path(callbox_env["CALLBOX_AUDIT_DB"]))
    try:
        calls = audit.recent_calls()
    finally:
        audit.close()
    ran = [(call["tool"], json.loads(call["arguments"]).get("command"), call["exit_code"]) for call in calls]
    assert sorted(ran) == sorted([("write_file", None, None), ("shell", COMMAND, 0), ("shell", FAILING, 1)]), calls
