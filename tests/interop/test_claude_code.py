"""Claude Code (the CLI that ``claude-agent-sdk``, pinned in pyproject's dev extras, bundles)
uses callbox as its only tools: ``callbox mcp`` over stdio and ``callbox serve --mcp-http``
(with a token), with Claude Code's built-in tools switched off.

The model is a loopback stub of the Anthropic Messages API (tests/interop/model_stubs.py),
reached through ``ANTHROPIC_BASE_URL`` with a dummy key. It finds callbox's tools among those
Claude Code offers (``mcp__SERVER__TOOL``): it writes a file and reads it back with ``shell``
on the stdio door, looks for it on the HTTP door (another session, so another sandbox: the
command fails), then answers in text. callbox records the three calls in its audit store, and
each result (made in the sandbox) comes back to the stub in the next request's
``tool_result``, the failure flagged ``is_error``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from harness.audit.store import AuditStore
from tests.interop.conftest import CALLBOX
from tests.interop.model_stubs import AnthropicMessagesStub, ScriptedCall, tool_ending

pytestmark = [pytest.mark.interop, pytest.mark.docker, pytest.mark.claude_code]

RUN_TIMEOUT_S = 240
FINAL = "both doors answered"
NOTE = "/workspace/note.txt"
STDIO_COMMAND = f"cat {NOTE} && echo stdio: $((6 * 7)) from $(id -un)"
HTTP_COMMAND = f"cat {NOTE}"
"""On the other door, so in another sandbox: the file is not there, and the non-zero exit
comes back as an error result."""


def test_claude_code_runs_callbox_tools_over_stdio_and_http(policy: Path, callbox_env: dict[str, str],
                                                            mcp_http_token: tuple[str, str], tmp_path: Path):
    mcp_http_url, token = mcp_http_token
    script = [ScriptedCall(tool_ending("__write_file", "mcp__callbox__"), {"path": NOTE, "content": "from claude\n"}),
              ScriptedCall(tool_ending("__shell", "mcp__callbox__"), {"command": STDIO_COMMAND}),
              ScriptedCall(tool_ending("__shell", "mcp__callbox_http__"), {"command": HTTP_COMMAND})]
    messages: list[Any] = []
    audit_db, workdir = callbox_env["CALLBOX_AUDIT_DB"], tmp_path
    with AnthropicMessagesStub(script, FINAL) as stub:
        model_env = {
            "ANTHROPIC_BASE_URL": stub.url,  # the model: the stub on loopback
            "ANTHROPIC_API_KEY": "sk-ant-stub",
            "CLAUDE_CONFIG_DIR": str(tmp_path / "claude-config"),  # not ~/.claude
        }

        async def snippet() -> None:
            # README: claude-code snippet start
            from claude_agent_sdk import ClaudeAgentOptions, query

            options = ClaudeAgentOptions(
                tools=[],  # no built-in tools: callbox's are the only ones
                mcp_servers={
                    "callbox": {"type": "stdio", "command": CALLBOX, "args": ["mcp", "--policy", str(policy)],
                                "env": {"CALLBOX_AUDIT_DB": audit_db}},
                    "callbox_http": {"type": "http", "url": mcp_http_url,  # callbox serve --mcp-http
                                     "headers": {"Authorization": f"Bearer {token}"}},
                },
                strict_mcp_config=True,  # only these servers, whatever the settings files say
                allowed_tools=["mcp__callbox", "mcp__callbox_http"],  # their tools run without asking
                env={**model_env, "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"},
                cwd=str(workdir),
            )
            async for message in query(prompt="Say hello from both sandboxes.", options=options):
                messages.append(message)
            print(messages[-1].result)  # the final ResultMessage
            # README: claude-code snippet end

        async def run() -> None:
            with anyio.fail_after(RUN_TIMEOUT_S):
                await snippet()

        anyio.run(run)

    assert stub.refused == [], stub.refused  # a request the real API would refuse
    result = messages[-1]
    assert getattr(result, "result", None) == FINAL, messages
    assert not result.is_error, result
    assert stub.requests, f"Claude Code never offered the model callbox's tools: {stub.other_requests} {messages}"
    offered = stub.tool_names(stub.requests[0])
    assert "mcp__callbox__shell" in offered and "mcp__callbox_http__shell" in offered, offered
    # no built-in tool (Claude Code adds a placeholder the model is told never to call)
    assert {name for name in offered if not name.startswith("mcp__")} <= {"DeferredToolPlaceholder"}, offered
    assert stub.other_requests == [], stub.other_requests  # only the Messages API, nothing else
    assert stub.called == ["mcp__callbox__write_file", "mcp__callbox__shell", "mcp__callbox_http__shell"], stub.called
    # each result reaches the model in the request right after its call
    assert [len(stub.tool_results(body)) for body in stub.requests] == [0, 1, 2, 3], stub.requests
    results = stub.tool_results(stub.requests[3])  # the last request carries every result so far
    # Claude Code gives the model a result's structuredContent when it has one (callbox's carries
    # the result's text under "text"), and an error result's text
    assert json.loads(results[0])["bytes_written"] == len("from claude\n"), results
    assert json.loads(results[1])["text"].endswith("Output:\nfrom claude\nstdio: 42 from user\n"), results
    assert "Exit code: 1" in results[2] and "No such file or directory" in results[2], results
    assert stub.tool_result_errors(stub.requests[3]) == [False, False, True]
    audit = AuditStore(Path(audit_db))
    try:
        calls = audit.recent_calls()
    finally:
        audit.close()
    ran = sorted((call["tool"], json.loads(call["arguments"]).get("command"), call["exit_code"]) for call in calls)
    assert ran == sorted([("write_file", None, None), ("shell", STDIO_COMMAND, 0), ("shell", HTTP_COMMAND, 1)]), calls
