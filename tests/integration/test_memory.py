"""The memory tool end to end: two ``callbox run`` processes with scripted Anthropic-format
transcripts (the second reads what the first wrote; the sandbox between them is gone and
never held the memory); the MCP door over HTTP with two bearer tokens, where a ``client``
scope keeps each client's memory from the other, through the official ``mcp`` client; and the
gRPC door, which serves the tool with its plain schema in its client's scope."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from harness.audit.store import AuditStore
from harness.core.policy import parse_policy
from harness.doors.grpc.tokens import TokenSet
from harness.doors.mcp.http import serve_mcp_http
from tests.conftest import IMAGE
from tests.integration.helpers import callbox, grpc_door

pytestmark = pytest.mark.docker

ALICE = "alice-memory-token-0123456789abcdef"
BOB = "bob-memory-token-0123456789abcdefgh"
NOTE = "# Progress\n- the parser is done\n- next: the report\n"


def _transcript(path: Path, turns: list[dict[str, Any]]) -> Path:
    path.write_text(json.dumps({"format": "anthropic"}) + "\n" + "".join(json.dumps(t) + "\n" for t in turns))
    return path


def _memory(call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"call_id": call_id, "name": "memory", "arguments": arguments}


def _results(stdout: bytes) -> dict[str, dict[str, Any]]:
    events = [json.loads(line) for line in stdout.splitlines()]
    assert events[-1]["event"] == "run_ended" and events[-1]["reason"] == "final", events[-1]
    return {e["call_id"]: e for e in events if e["event"] == "tool_result"}


def test_a_second_run_reads_what_the_first_wrote(engine: Any, tmp_path: Path) -> None:
    store = tmp_path / "memory-store"
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"

        [tools.memory]
        decision = "allow"

        [memory]
        root = "{store}"
        project = "report-tool"
    """))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    first = _transcript(tmp_path / "first.jsonl", [
        {"text": "Checking my memory first.", "tool_calls": [_memory("toolu_01", command="view", path="/memories")]},
        {"tool_calls": [_memory("toolu_02", command="create", path="/memories/progress.md", file_text=NOTE),
                        {"call_id": "toolu_03", "name": "shell", "arguments": {"command": "echo working"}}]},
        {"text": "Progress recorded."},
    ])
    second = _transcript(tmp_path / "second.jsonl", [
        {"tool_calls": [_memory("toolu_11", command="view", path="/memories")]},
        {"tool_calls": [_memory("toolu_12", command="view", path="/memories/progress.md")]},
        {"tool_calls": [{"call_id": "toolu_13", "name": "shell", "arguments": {
            "command": "test -e /memories && echo in-the-sandbox || echo not-in-the-sandbox"}}]},
        {"text": "The parser is done; next is the report."},
    ])
    ran = callbox("run", str(first), "--policy", str(policy), "--json", env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    results = _results(ran.stdout)
    assert "excluding hidden items and node_modules" in json.dumps(results["toolu_01"])
    assert "File created successfully at: /memories/progress.md" in json.dumps(results["toolu_02"])
    assert (store / "projects" / "report-tool" / "memories" / "progress.md").read_text() == NOTE

    again = callbox("run", str(second), "--policy", str(policy), "--json", env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    results = _results(again.stdout)
    assert "/memories/progress.md" in json.dumps(results["toolu_11"])
    shown = json.dumps(results["toolu_12"])
    assert "with line numbers" in shown and "     2\\t- the parser is done" in shown, shown
    assert "not-in-the-sandbox" in json.dumps(results["toolu_13"])  # kept on the host, not in the sandbox


def test_through_the_mcp_door_a_client_cannot_read_another_client_s_memory(tmp_path: Path) -> None:
    store = tmp_path / "memory-store"
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[sandbox]\nimage = "{IMAGE}"\n\n[tools.memory]\ndecision = "allow"\n\n'
                      f'[memory]\nscope = "client"\nroot = "{store}"\n')
    tokens = TokenSet({"alice": ALICE, "bob": BOB}, source="test tokens")
    server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=tmp_path / "audit.sqlite3", tokens=tokens)

    def session(token: str) -> Client:
        return Client(streamable_http_client(
            server.url, http_client=create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})))

    def text(result: Any) -> str:
        return "".join(getattr(block, "text", "") for block in result.content)

    async def flow() -> dict[str, Any]:
        with anyio.fail_after(120):
            async with session(ALICE) as alice:
                names = [tool.name for tool in (await alice.list_tools()).tools]
                made = await alice.call_tool("memory", {"command": "create", "path": "/memories/secret.md",
                                                        "file_text": "alice's plan\n"})
            async with session(BOB) as bob:
                listing = await bob.call_tool("memory", {"command": "view", "path": "/memories"})
                direct = await bob.call_tool("memory", {"command": "view", "path": "/memories/secret.md"})
                climb = await bob.call_tool("memory", {"command": "view",
                                                       "path": "/memories/../../../alice/default/memories/secret.md"})
                own = await bob.call_tool("memory", {"command": "create", "path": "/memories/secret.md",
                                                     "file_text": "bob's plan\n"})
            async with session(ALICE) as alice:  # a new session of alice's: her memory outlived the first
                back = await alice.call_tool("memory", {"command": "view", "path": "/memories/secret.md"})
            return {"names": names, "made": made, "listing": listing, "direct": direct, "climb": climb, "own": own,
                    "back": back}

    try:
        got = anyio.run(flow)
    finally:
        server.stop()
    assert "memory" in got["names"]
    assert not got["made"].is_error, text(got["made"])
    assert not got["listing"].is_error and "secret.md" not in text(got["listing"])
    assert got["direct"].is_error and text(got["direct"]) == (
        "The path /memories/secret.md does not exist. Please provide a valid path.")
    assert got["climb"].is_error and "`..`" in text(got["climb"]) and "alice's plan" not in text(got["climb"])
    assert not got["own"].is_error
    assert not got["back"].is_error and "alice's plan" in text(got["back"]) and "bob" not in text(got["back"])
    assert (store / "clients" / "alice" / "default" / "memories" / "secret.md").read_text() == "alice's plan\n"
    assert (store / "clients" / "bob" / "default" / "memories" / "secret.md").read_text() == "bob's plan\n"


def test_the_grpc_door_serves_it_with_a_plain_schema_in_its_client_s_scope(engine: Any, tmp_path: Path) -> None:
    store = tmp_path / "memory-store"
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n\n[tools.memory]\ndecision = "allow"\n\n'
                          f'[memory]\nscope = "client"\nroot = "{store}"\n')
    with AuditStore(tmp_path / "audit.sqlite3") as audit, grpc_door(policy, audit) as client:
        (tool,) = [t for t in client.list_tools("anthropic") if t["name"] == "memory"]
        assert tool["input_schema"]["required"] == ["command"] and "type" not in tool  # a plain function here
        sandbox = client.create_sandbox()
        made = client.call(sandbox, "memory", {"command": "create", "path": "/memories/n.md", "file_text": "hi\n"},
                           fmt="anthropic")
        seen = client.call(sandbox, "memory", {"command": "view", "path": "/memories/n.md"})
        client.delete_sandbox(sandbox)
    assert not made.is_error and made.item["content"] == "File created successfully at: /memories/n.md"
    assert seen.text.endswith("     1\thi") and seen.structured == {"command": "view", "scope": "client:tester/default"}
    assert (store / "clients" / "tester" / "default" / "memories" / "n.md").read_text() == "hi\n"
