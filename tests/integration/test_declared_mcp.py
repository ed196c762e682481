"""``kind = "mcp"`` end to end: a real third-party MCP server (``mcp-server-git`` from PyPI,
installed once into .cache/ and mounted read-only) and a tiny stdlib server of our own that
can crash, hang or print garbage on request, both run in the real sandbox.

Through a Session (calls, ``ask`` on a glob rule, the audit, a crash, a hang and malformed
output as error results, the restart after each), ``callbox run`` with a scripted model,
and ``callbox mcp`` with the official MCP client.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.policy import load_policy
from harness.core.session import Session
from harness.tools import registry_for
from tests.conftest import IMAGE, unavailable
from tests.doc_examples import block_with
from tests.integration.helpers import callbox, grpc_door

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
MCP_SERVER_GIT = "mcp-server-git==2026.10.19"
CACHE = ROOT / ".cache" / "mcp-server-git-2026.10.19"

TINY_SERVER = r'''
import json, os, sys, time

TOOLS = [
    {"name": "echo", "description": "Echo the text back.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string", "minLength": 1}},
                     "required": ["text"]},
     "annotations": {"readOnlyHint": True}},
    {"name": "crash", "description": "Exit at once.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "hang", "description": "Never answer.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "garbage", "description": "Print what is not JSON-RPC.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "pid", "description": "The server's pid.",
     "inputSchema": {"type": "object", "properties": {}}},
    {"name": "bad name!", "description": "Cannot be mapped.", "inputSchema": {"type": "object"}},
    {"name": "odd", "description": "A schema callbox cannot check.",
     "inputSchema": {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}},
]

def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()

for line in sys.stdin:
    message = json.loads(line)
    method, ident = message.get("method"), message.get("id")
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": ident, "result": {
            "protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
            "serverInfo": {"name": "tiny", "version": "1"}}})
    elif method == "tools/list":
        # Two pages: the client must follow nextCursor.
        if message["params"].get("cursor") == "2":
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS[3:]}})
        else:
            send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS[:3], "nextCursor": "2"}})
    elif method == "tools/call":
        name, args = message["params"]["name"], message["params"].get("arguments", {})
        print("calling", name, file=sys.stderr, flush=True)
        if name == "crash":
            os._exit(3)
        if name == "hang":
            open("/tmp/tiny-hanging", "w").close()
            time.sleep(3600)
        if name == "garbage":
            sys.stdout.write("this is not json\n")
            sys.stdout.flush()
            continue
        if name == "pid":
            send({"jsonrpc": "2.0", "id": ident, "result": {
                "content": [{"type": "text", "text": str(os.getpid())}], "structuredContent": {"pid": os.getpid()}}})
            continue
        if args.get("text") == "fail":
            send({"jsonrpc": "2.0", "id": ident, "result": {
                "content": [{"type": "text", "text": "echo refused"}], "isError": True}})
            continue
        send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": args["text"]}]}})
'''


@pytest.fixture(scope="session")
def mcp_server_git() -> Path:
    """mcp-server-git and its dependencies, installed once with pip for the sandbox's Python
    (3.11, this machine's architecture) under .cache/ (ignored by git)."""
    stamp = CACHE / ".installed"
    if stamp.exists():
        return CACHE / "site"
    machine = os.uname().machine
    platforms = [f"manylinux2014_{machine}", f"manylinux_2_17_{machine}", f"manylinux_2_28_{machine}"]
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--target",
         str(CACHE / "site"), "--only-binary", ":all:", "--python-version", "3.11", "--implementation", "cp",
         *(arg for p in platforms for arg in ("--platform", p)), MCP_SERVER_GIT],
        capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode != 0:
        unavailable(f"could not install {MCP_SERVER_GIT} from PyPI: {proc.stderr.strip()[-500:]}")
    stamp.write_text(MCP_SERVER_GIT + "\n")
    return CACHE / "site"


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "project"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True)
    (repo / "README.md").write_text("hello\n")
    subprocess.run([*git, "add", "README.md"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "first commit"], check=True)
    (repo / "new.txt").write_text("untracked\n")
    # The tool user in the sandbox is not the owner of the mounted repository: let it write.
    subprocess.run(["chmod", "-R", "a+rwX", str(repo)], check=True)
    return repo


def _policy(tmp_path: Path, site: Path) -> Path:
    repo = _repo(tmp_path)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "server.py").write_text(TINY_SERVER)
    path = tmp_path / "policy.toml"
    path.write_text(textwrap.dedent(f'''
        [sandbox]
        image = "{IMAGE}"
        env = {{ GIT_CONFIG_COUNT = "1", GIT_CONFIG_KEY_0 = "safe.directory", GIT_CONFIG_VALUE_0 = "*" }}
        mounts = [{{ source = "{repo}", target = "/workspace/project", mode = "rw" }}]

        [[tool]]
        name = "git"
        kind = "mcp"
        command = ["python3", "-m", "mcp_server_git", "--repository", "/workspace/project"]
        env = {{ PYTHONPATH = "/srv/mcp-git" }}
        mounts = [{{ source = "{site}", target = "/srv/mcp-git", mode = "ro" }}]
        timeout_s = 60

        [[tool]]
        name = "tiny"
        kind = "mcp"
        command = ["python3", "-u", "/srv/tiny/server.py"]
        mounts = [{{ source = "{tiny}", target = "/srv/tiny", mode = "ro" }}]
        timeout_s = 5

        [tools."git__*"]
        decision = "allow"

        [tools.git__git_add]
        decision = "ask"

        [tools."tiny__e*"]
        decision = "allow"
    '''))
    return path


@pytest.fixture
def policy_path(tmp_path: Path, mcp_server_git: Path) -> Path:
    return _policy(tmp_path, mcp_server_git)


@pytest.fixture
def session(engine: Any, policy_path: Path, tmp_path: Path) -> Iterator[Session]:
    policy = load_policy(policy_path)
    audit = AuditStore(tmp_path / "audit.sqlite3")
    harness = Session(registry_for(policy), policy, audit)
    try:
        yield harness
    finally:
        harness.close()
        audit.close()


def _call(session: Session, name: str, arguments: dict[str, Any], call_id: str) -> ToolResult:
    return session.call(ToolCall(name=name, arguments=json.dumps(arguments), call_id=call_id))


def test_the_servers_tools_join_the_registry(engine: Any, policy_path: Path) -> None:
    registry = registry_for(load_policy(policy_path))
    names = registry.names()
    assert {"git__git_status", "git__git_log", "git__git_diff", "git__git_add", "git__git_commit"} <= set(names)
    # Both pages of the tiny server, minus the one whose name cannot be mapped and the one
    # whose schema cannot be checked.
    assert [n for n in names if n.startswith("tiny__")] == [
        "tiny__echo", "tiny__crash", "tiny__hang", "tiny__garbage", "tiny__pid"]
    echo = registry.get("tiny__echo")
    assert echo is not None and echo.definition.annotations.read_only is True
    plain = echo.definition.input_schema("plain")
    assert plain["properties"]["text"] == {"type": "string", "minLength": 1}
    assert plain["required"] == ["text"]
    status = registry.get("git__git_status")
    assert status is not None and "status" in status.definition.description.lower()
    assert status.definition.input_schema("strict")["required"] == ["repo_path"]


def test_git_status_and_log_run_in_the_sandbox(session: Session) -> None:
    status = _call(session, "git__git_status", {"repo_path": "/workspace/project"}, "c1")
    assert not status.is_error, status.text
    assert "new.txt" in status.text and "On branch main" in status.text
    log = _call(session, "git__git_log", {"repo_path": "/workspace/project"}, "c2")
    assert not log.is_error, log.text
    assert "first commit" in log.text
    bad = _call(session, "git__git_status", {}, "c3")
    assert bad.error is ErrorCode.INVALID_ARGUMENTS and "repo_path" in bad.text
    for call_id, name in (("c1", "git__git_status"), ("c2", "git__git_log")):
        record = session.audit.get_call(session.run_id, call_id)
        assert record is not None and record.tool == name


def test_an_ask_rule_on_one_server_tool_pauses_for_approval(session: Session) -> None:
    asked = _call(session, "git__git_add", {"repo_path": "/workspace/project", "files": ["new.txt"]}, "a1")
    assert asked.error is ErrorCode.APPROVAL_PENDING, asked.text
    session.audit.resolve_approval(asked.meta["approval_id"], True, by="test", reason=None)
    added = _call(session, "git__git_add", {"repo_path": "/workspace/project", "files": ["new.txt"]}, "a1")
    assert not added.is_error, added.text
    status = _call(session, "git__git_status", {"repo_path": "/workspace/project"}, "a2")
    assert "new file:   new.txt" in status.text


def test_results_errors_and_the_restart_after_a_crash(session: Session) -> None:
    echoed = _call(session, "tiny__echo", {"text": "hi there"}, "t1")
    assert not echoed.is_error and echoed.text == "hi there"
    refused = _call(session, "tiny__echo", {"text": "fail"}, "t2")
    assert refused.error is ErrorCode.TOOL_FAILED and refused.text == "echo refused"
    empty = _call(session, "tiny__echo", {"text": ""}, "t3")
    assert empty.error is ErrorCode.INVALID_ARGUMENTS and "at least 1" in empty.text
    first = _call(session, "tiny__pid", {}, "t4")
    assert first.structured is not None
    crashed = _call(session, "tiny__crash", {}, "t5")
    assert crashed.error is ErrorCode.TOOL_FAILED
    assert "the MCP server 'tiny' exited with code 3" in crashed.text
    again = _call(session, "tiny__pid", {}, "t6")
    assert again.structured is not None and again.structured["pid"] != first.structured["pid"]


def test_a_hang_and_malformed_output_are_errors_within_the_timeout(session: Session) -> None:
    started = time.monotonic()
    hung = _call(session, "tiny__hang", {}, "h1")
    assert time.monotonic() - started < 15
    assert hung.error is ErrorCode.TIMED_OUT
    assert "did not answer tools/call within 5 s" in hung.text
    started = time.monotonic()
    garbage = _call(session, "tiny__garbage", {}, "h2")
    assert time.monotonic() - started < 15
    assert garbage.error is ErrorCode.TOOL_FAILED
    assert "not a JSON-RPC message" in garbage.text and "this is not json" in garbage.text
    fine = _call(session, "tiny__echo", {"text": "back"}, "h3")
    assert fine.text == "back"


def test_killing_the_server_mid_call_is_an_error_and_the_next_call_restarts_it(session: Session) -> None:
    import threading

    assert _call(session, "tiny__echo", {"text": "up"}, "k0").text == "up"
    results: dict[str, ToolResult] = {}
    waiting = threading.Thread(target=lambda: results.update(r=_call(session, "tiny__hang", {}, "k1")))
    waiting.start()
    try:
        # Once the server is inside the call (it touches /tmp/tiny-hanging), kill it from outside
        # (the bracket keeps pkill from matching this shell's own command line).
        killed = _call(session, "shell", {"command": "for i in $(seq 100); do [ -e /tmp/tiny-hanging ] && break; "
                                                     "sleep 0.05; done; pkill -KILL -f '[/]srv/tiny/server.py'"},
                       "k2")
        assert not killed.is_error, killed.text
    finally:
        waiting.join(30)
    result = results["r"]
    assert result.error is ErrorCode.TOOL_FAILED, result.text
    assert "killed by signal 9" in result.text
    assert _call(session, "tiny__echo", {"text": "again"}, "k3").text == "again"


def test_callbox_run_calls_an_mcp_servers_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    transcript = tmp_path / "transcript.jsonl"
    transcript.write_text("".join(json.dumps(turn) + "\n" for turn in [
        {"text": "looking", "tool_calls": [
            {"call_id": "r1", "name": "git__git_status", "arguments": {"repo_path": "/workspace/project"}},
            {"call_id": "r2", "name": "tiny__echo", "arguments": {"text": "from the model"}},
        ]},
        {"text": "done"},
    ]))
    env = {"CALLBOX_AUDIT_DB": str(tmp_path / "run-audit.sqlite3")}
    proc = callbox("run", str(transcript), "--json", "--policy", str(policy_path), env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    results = {e["call_id"]: e for e in events if e["event"] == "tool_result"}
    assert "new.txt" in results["r1"]["result"]["text"]
    assert results["r2"]["result"]["text"] == "from the model"
    assert events[-1]["reason"] == "final"


def test_callbox_mcp_lists_and_calls_the_servers_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "mcp-audit.sqlite3")}
    params = StdioServerParameters(command=sys.executable, args=["-m", "harness.cli.main", "mcp", "--policy",
                                                                 str(policy_path)], env=env, cwd=str(ROOT))

    async def flow() -> None:
        with anyio.fail_after(240):
            async with Client(params) as client:
                listed = {t.name: t for t in (await client.list_tools()).tools}
                assert "git__git_status" in listed and "tiny__echo" in listed
                assert listed["git__git_status"].input_schema["required"] == ["repo_path"]
                status = await client.call_tool("git__git_status", {"repo_path": "/workspace/project"})
                assert status.is_error is False
                text = "".join(getattr(block, "text", "") for block in status.content)
                assert "new.txt" in text

    anyio.run(flow)


def test_the_grpc_door_serves_an_mcp_servers_tools(engine: Any, policy_path: Path, tmp_path: Path) -> None:
    audit = AuditStore(tmp_path / "grpc-audit.sqlite3")
    try:
        with grpc_door(load_policy(policy_path), audit) as client:
            listed = {t["name"]: t for t in client.list_tools("anthropic")}
            assert {"git__git_status", "tiny__echo"} <= set(listed)
            assert listed["git__git_status"]["input_schema"]["required"] == ["repo_path"]
            box = client.create_sandbox()
            try:
                status = client.call(box, "git__git_status", {"repo_path": "/workspace/project"})
                assert not status.is_error, status.text
                assert "new.txt" in status.text and "On branch main" in status.text
                echoed = client.call(box, "tiny__echo", {"text": "through the door"})
                assert not echoed.is_error and echoed.text == "through the door", echoed.text
                asked = client.call(box, "git__git_add", {"repo_path": "/workspace/project", "files": ["new.txt"]})
                assert asked.is_error and asked.error_code == "approval_pending", asked.text
            finally:
                client.delete_sandbox(box)
    finally:
        audit.close()


def test_the_readme_example_lists_the_server_and_decides_as_documented(
    engine: Any, mcp_server_git: Path, tmp_path: Path
) -> None:
    block = block_with("toml", 'kind = "mcp"', "/home/me/mcp-git").body
    assert 'source = "/home/me/mcp-git"' in block
    repo = _repo(tmp_path)
    path = tmp_path / "policy.toml"
    path.write_text(f'[sandbox]\nimage = "{IMAGE}"\n'
                    f'mounts = [{{ source = "{repo}", target = "/workspace/project", mode = "ro" }}]\n\n'
                    + block.replace("/home/me/mcp-git", str(mcp_server_git)))
    policy = load_policy(path)
    registry = registry_for(policy)
    policy.check_tools(t.definition for t in registry.tools())
    status, log = registry.get("git__git_status"), registry.get("git__git_log")
    assert status is not None and log is not None
    args = {"repo_path": "/workspace/project"}
    assert policy.decide(status.definition, args).action.value == "allow"
    assert policy.decide(log.definition, args).action.value == "ask"
