"""The MCP server end to end: the official ``mcp`` client, a real engine, no mocks.

Every behaviour runs over stdio (a child process, as Claude Desktop/Code run it) in both
protocol eras the SDK client speaks (``auto`` picks 2026-07-28 over stdio, ``legacy`` the
2025-11-25 handshake) and over streamable HTTP (a server thread on 127.0.0.1; ``auto``
falls back to the handshake, because that server only advertises session-bearing
versions). Sandboxes are checked with the docker SDK through their ``callbox/sandbox_id``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from harness.audit.store import AuditStore
from harness.core.errors import UsageError
from harness.doors.mcp.http import McpHttpServer, parse_addr, serve_mcp_http
from harness.tools import builtin_registry
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
TRANSPORTS = ["stdio", "stdio-legacy", "http"]
FLOW_TIMEOUT_S = 120
LONG_COMMAND = "for i in 1 2 3; do echo $i; sleep 0.3; done"


def _policy(tmp_path: Path, tables: str = "", *, top: str = "") -> Path:
    """A policy using the test image; ``top`` holds top-level keys, ``tables`` more tables."""
    path = tmp_path / "policy.toml"
    path.write_text(f'{top}\n[sandbox]\nimage = "{IMAGE}"\n' + textwrap.dedent(tables))
    return path


class Servers:
    """Where a test's MCP clients connect: a stdio child process per client, or an HTTP
    server thread (stopped at teardown)."""

    def __init__(self, tmp_path: Path) -> None:
        self.audit_path = tmp_path / "audit.sqlite3"
        self.env = {**os.environ, "CALLBOX_AUDIT_DB": str(self.audit_path)}
        self._shared: dict[Path, McpHttpServer] = {}
        self._started: list[McpHttpServer] = []

    def stdio_params(self, policy: Path) -> StdioServerParameters:
        code = f"from pathlib import Path; from harness.doors.mcp.stdio import run_mcp_stdio; " \
               f"run_mcp_stdio(policy_path=Path({str(policy)!r}))"
        return StdioServerParameters(command=sys.executable, args=["-c", code], env=self.env, cwd=str(ROOT))

    def http(self, policy: Path, **options: Any) -> McpHttpServer:
        """The test's HTTP server for ``policy`` (a dedicated one when ``options`` are given)."""
        if not options and policy in self._shared:
            return self._shared[policy]
        server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=self.audit_path, **options)
        self._started.append(server)
        if not options:
            self._shared[policy] = server
        return server

    def client(self, transport: str, policy: Path, **client_options: Any) -> Client:
        if transport == "http":
            return Client(self.http(policy).url, **client_options)
        mode = "legacy" if transport == "stdio-legacy" else "auto"
        return Client(self.stdio_params(policy), mode=mode, **client_options)

    def audit(self) -> AuditStore:
        return AuditStore(self.audit_path)

    def close(self) -> None:
        for server in self._started:
            server.stop()


@pytest.fixture
def servers(engine, tmp_path: Path) -> Iterator[Servers]:  # type: ignore[no-untyped-def]
    found = Servers(tmp_path)
    try:
        yield found
    finally:
        found.close()


def _run(flow: Callable[[], Any]) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(FLOW_TIMEOUT_S):
            return await flow()

    return anyio.run(bounded)


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _containers(engine: Any, sandbox_id: str) -> list[Any]:
    return engine.client.containers.list(all=True, filters={"label": f"callbox.sandbox-id={sandbox_id}"},
                                        ignore_removed=True)


def _wait_gone(engine: Any, sandbox_id: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while _containers(engine, sandbox_id):
        assert time.monotonic() < deadline, f"sandbox {sandbox_id} still exists {timeout} s after its session ended"
        time.sleep(0.2)


# ---- listing ----------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_initialize_and_list_tools(servers, tmp_path, transport):
    policy = _policy(tmp_path)
    registry = builtin_registry(python=False, computer=False, browser=False)  # what a policy naming none is served

    async def flow() -> None:
        async with servers.client(transport, policy) as client:
            assert client.server_info is not None and client.server_info.name == "callbox"
            expected_era = "2025-11-25" if transport != "stdio" else "2026-07-28"
            assert client.protocol_version == expected_era
            assert client.server_capabilities.tools is not None
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == registry.names()
            for tool in listed.tools:
                definition = registry.get(tool.name).definition
                assert tool.description == definition.description
                assert tool.input_schema == definition.input_schema("plain")
                hints = definition.annotations
                assert tool.annotations is not None
                assert tool.annotations.read_only_hint is hints.read_only
                assert tool.annotations.destructive_hint is hints.destructive
                assert tool.annotations.idempotent_hint is hints.idempotent
                assert tool.annotations.open_world_hint is hints.open_world
                assert tool.annotations.title == hints.title
            by_name = {t.name: t for t in listed.tools}
            assert by_name["read_file"].annotations.read_only_hint is True
            assert by_name["shell"].annotations.read_only_hint is False

    _run(flow)


def test_tools_list_follows_allowed_tools_and_hidden_tools_are_unknown(servers, tmp_path):
    policy = _policy(tmp_path, top='allowed_tools = ["shell", "read_file"]')

    async def flow() -> None:
        async with servers.client("stdio", policy) as client:
            listed = await client.list_tools()
            assert [t.name for t in listed.tools] == ["shell", "read_file"]
            with pytest.raises(MCPError) as info:
                await client.call_tool("write_file", {"path": "x", "content": "y"})
            assert info.value.code == -32602
            assert "Unknown tool: write_file" in info.value.message
            assert "shell, read_file" in info.value.message

    _run(flow)


# ---- calls ------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_tool_results_errors_and_protocol_errors(servers, tmp_path, transport, engine):
    policy = _policy(tmp_path)

    async def flow() -> dict[str, Any]:
        async with servers.client(transport, policy) as client:
            ok = await client.call_tool("shell", {"command": "echo hi"})
            assert ok.is_error is False
            assert "hi" in _text(ok) and "Exit code: 0" in _text(ok)
            assert ok.structured_content is not None and ok.structured_content["exit_code"] == 0
            assert ok.structured_content["text"] == _text(ok)  # for clients that read only structuredContent
            meta = ok.meta or {}
            assert meta["callbox/call_id"] == "mcp-000001"
            run_id, sandbox_id = meta["callbox/run_id"], meta["callbox/sandbox_id"]

            failed = await client.call_tool("shell", {"command": "echo oops >&2; exit 3"})
            assert failed.is_error is True
            assert "Exit code: 3" in _text(failed) and "oops" in _text(failed)
            assert failed.meta["callbox/error"] == "nonzero_exit"

            invalid = await client.call_tool("shell", {"cmd": "ls"})
            assert invalid.is_error is True
            assert "invalid arguments for tool 'shell'" in _text(invalid)
            assert "missing required argument 'command'" in _text(invalid)
            assert "unexpected argument 'cmd'" in _text(invalid)

            with pytest.raises(MCPError) as info:
                await client.call_tool("no_such_tool", {})
            assert info.value.code == -32602
            assert info.value.message.startswith("Unknown tool: no_such_tool; the available tools are: shell, ")

            # One sandbox per session: what one call writes, the next call sees.
            wrote = await client.call_tool("write_file", {"path": "/workspace/note.txt", "content": "kept\n"})
            assert wrote.is_error is False, _text(wrote)
            read = await client.call_tool("shell", {"command": "cat /workspace/note.txt"})
            assert "kept" in _text(read)
            assert read.meta["callbox/sandbox_id"] == sandbox_id
            assert len(_containers(engine, sandbox_id)) == 1
            return {"run_id": run_id, "sandbox_id": sandbox_id}

    seen = _run(flow)
    _wait_gone(engine, seen["sandbox_id"])
    with servers.audit() as audit:
        calls = {c["call_id"]: c for c in audit.calls_for_run(seen["run_id"])}
        assert set(calls) == {f"mcp-{n:06d}" for n in range(1, 7)}
        assert calls["mcp-000001"]["tool"] == "shell" and calls["mcp-000001"]["exit_code"] == 0
        assert calls["mcp-000004"]["tool"] == "no_such_tool"  # the unknown tool is audited too
        run = audit.get_run(seen["run_id"])
        assert run.end_reason == "mcp_session_ended"
        assert run.meta["door"] == "mcp"
        assert run.meta["transport"] == ("http" if transport == "http" else "stdio")
        assert run.meta["client"].startswith("mcp/")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_progress_notifications_stream_the_output(servers, tmp_path, transport):
    policy = _policy(tmp_path)
    updates: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, total, message))

    async def flow() -> None:
        async with servers.client(transport, policy) as client:
            result = await client.call_tool("shell", {"command": LONG_COMMAND}, progress_callback=on_progress)
            assert result.is_error is False
            assert "1\n2\n3\n" in _text(result)

    _run(flow)
    assert len(updates) >= 2, updates
    progress = [p for p, _, _ in updates]
    assert progress == sorted(progress) and len(set(progress)) == len(progress)
    assert "".join(m or "" for _, _, m in updates) == "1\n2\n3\n"
    # They arrived while the command ran, not all at the end: the first one came well
    # before the last (the command takes about 0.9 s).
    assert progress[-1] - progress[0] >= 0.4


def test_progress_heartbeat_while_a_command_is_silent(servers, tmp_path):
    policy = _policy(tmp_path)
    updates: list[tuple[float, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        updates.append((progress, message))

    async def flow() -> None:
        async with servers.client("http", policy) as client:
            result = await client.call_tool("shell", {"command": "sleep 5.6; echo done"}, progress_callback=on_progress)
            assert result.is_error is False

    _run(flow)
    messages = [m for _, m in updates]
    assert "still running after 5 s" in messages, updates
    assert messages[-1] == "done\n"
    assert [p for p, _ in updates] == sorted(p for p, _ in updates)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_approval_pending_then_approved_runs_exactly_once(servers, tmp_path, transport):
    policy = _policy(tmp_path, """
        [tools.shell]
        decision = "ask"
    """)
    command = {"command": "echo ran >> /tmp/count; wc -l < /tmp/count"}

    async def flow() -> None:
        async with servers.client(transport, policy) as client:
            pending = await client.call_tool("shell", command)
            assert pending.is_error is True
            approval_id = pending.meta["callbox/approval_id"]
            assert pending.meta["callbox/error"] == "approval_pending"
            text = _text(pending)
            assert f"pending as approval {approval_id}" in text
            assert f"callbox approvals approve {approval_id}" in text
            assert "send exactly the same call again" in text
            assert "callbox/sandbox_id" not in pending.meta  # nothing ran, no sandbox started

            again = await client.call_tool("shell", command)  # not approved yet: the same approval
            assert again.is_error is True and again.meta["callbox/approval_id"] == approval_id
            assert again.meta["callbox/call_id"] == pending.meta["callbox/call_id"]

            with servers.audit() as audit:
                audit.resolve_approval(approval_id, True, by="test", reason=None)

            # Resent (twice, concurrently) after approval: it runs exactly once.
            results: list[Any] = []

            async def resend() -> None:
                results.append(await client.call_tool("shell", command))

            async with anyio.create_task_group() as tg:
                tg.start_soon(resend)
                tg.start_soon(resend)
            for ran in results:
                assert ran.is_error is False, _text(ran)
                assert ran.meta["callbox/call_id"] == pending.meta["callbox/call_id"]
            assert _text(results[0]) == _text(results[1])
            assert _text(results[0]).rstrip().endswith("\n1")

            # The next identical call is a new call, asking again.
            fresh = await client.call_tool("shell", command)
            assert fresh.is_error is True
            assert fresh.meta["callbox/approval_id"] != approval_id
            assert fresh.meta["callbox/call_id"] != pending.meta["callbox/call_id"]
            count = await client.call_tool("read_file", {"path": "/tmp/count"})
            assert _text(count).count("ran") == 1

            # Denied: the resend gets the denial, once; then it asks again.
            with servers.audit() as audit:
                audit.resolve_approval(fresh.meta["callbox/approval_id"], False, by="test", reason="not today")
            denied = await client.call_tool("shell", command)
            assert denied.is_error is True and denied.meta["callbox/error"] == "approval_denied"
            assert "not today" in _text(denied)
            after = await client.call_tool("shell", command)
            assert after.meta["callbox/error"] == "approval_pending"

    _run(flow)


def test_client_call_id_in_meta_is_an_idempotency_key(servers, tmp_path):
    policy = _policy(tmp_path)

    async def flow() -> None:
        async with servers.client("http", policy) as client:
            args = {"command": "echo x >> /tmp/n; wc -l < /tmp/n; date +%s%N"}
            first = await client.call_tool("shell", args, meta={"callbox/call_id": "client-7"})
            second = await client.call_tool("shell", args, meta={"callbox/call_id": "client-7"})
            assert first.meta["callbox/call_id"] == second.meta["callbox/call_id"] == "client-7"
            assert _text(first) == _text(second)  # the recorded result, not a second run
            third = await client.call_tool("shell", args)
            assert "Output:\n2\n" in _text(third)

    _run(flow)


# ---- session lifecycle --------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_session_end_removes_the_sandbox(servers, tmp_path, transport, engine):
    policy = _policy(tmp_path)

    async def flow() -> tuple[str, str]:
        async with servers.client(transport, policy) as client:
            first = await client.call_tool("shell", {"command": "touch /workspace/mine"})
            sandbox_id = first.meta["callbox/sandbox_id"]
            assert len(_containers(engine, sandbox_id)) == 1
        # A new session gets a new sandbox: the file is not there.
        async with servers.client(transport, policy) as client:
            other = await client.call_tool("shell", {"command": "ls /workspace/mine"})
            assert other.is_error is True
            other_id = other.meta["callbox/sandbox_id"]
            assert other_id != sandbox_id
        return sandbox_id, other_id

    first_id, second_id = _run(flow)
    _wait_gone(engine, first_id)
    _wait_gone(engine, second_id)


def test_http_idle_session_times_out_and_its_sandbox_goes(servers, tmp_path, engine):
    policy = _policy(tmp_path)
    server = servers.http(policy, idle_timeout_s=1.5)

    async def flow() -> str:
        # A client that goes away without DELETE (a crash): only the idle timeout ends it.
        async with Client(streamable_http_client(server.url, terminate_on_close=False)) as client:
            result = await client.call_tool("shell", {"command": "true"})
            return str(result.meta["callbox/sandbox_id"])

    sandbox_id = _run(flow)
    assert len(_containers(engine, sandbox_id)) == 1
    _wait_gone(engine, sandbox_id, timeout=20)


def test_http_session_whose_client_left_without_delete_ends_after_the_grace(servers, tmp_path, engine):
    policy = _policy(tmp_path)
    server = servers.http(policy, idle_timeout_s=None, abandoned_grace_s=0.5)

    async def flow() -> str:
        # A client that holds a GET stream while it lives and exits without DELETE (Claude Code
        # does): its stream closing, then the grace, end the session; no idle timeout here.
        async with Client(streamable_http_client(server.url, terminate_on_close=False)) as client:
            result = await client.call_tool("shell", {"command": "true"})
            return str(result.meta["callbox/sandbox_id"])

    sandbox_id = _run(flow)
    _wait_gone(engine, sandbox_id, timeout=20)
    assert server.service.live_sessions() == []


def test_http_shutdown_ends_live_sessions(servers, tmp_path, engine):
    policy = _policy(tmp_path)
    server = servers.http(policy, idle_timeout_s=None)
    seen: dict[str, str] = {}

    async def flow() -> None:
        with contextlib.suppress(Exception):  # the client notices its server went away
            async with Client(server.url) as client:
                result = await client.call_tool("shell", {"command": "true"})
                seen["sandbox_id"] = result.meta["callbox/sandbox_id"]
                assert len(_containers(engine, seen["sandbox_id"])) == 1
                await anyio.to_thread.run_sync(server.stop)
                assert server.service.live_sessions() == []

    _run(flow)
    assert _containers(engine, seen["sandbox_id"]) == []


def test_http_refuses_the_sessionless_protocol_with_the_versions_it_serves(servers, tmp_path):
    policy = _policy(tmp_path)

    async def flow() -> None:
        async with Client(servers.http(policy).url, mode="2026-07-28") as client:
            with pytest.raises(MCPError) as info:
                await client.list_tools()
            assert info.value.code == -32022
            assert "one sandbox per MCP session" in info.value.message
            assert "2025-11-25" in info.value.data["supported"]

    _run(flow)


def test_stdio_stdout_is_only_json_rpc_and_sigterm_removes_the_sandbox(servers, tmp_path, engine):
    """The raw wire, without the SDK client: every stdout line is a JSON-RPC message (logs
    go to stderr), and SIGTERM mid-session still destroys the session's sandbox."""
    policy = _policy(tmp_path)
    params = servers.stdio_params(policy)
    proc = subprocess.Popen([params.command, *params.args], cwd=params.cwd, env=params.env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert proc.stdin is not None and proc.stdout is not None

        def send(message: dict[str, Any]) -> None:
            proc.stdin.write((json.dumps(message) + "\n").encode())  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]

        def receive(request_id: int) -> dict[str, Any]:
            while True:
                line = proc.stdout.readline()  # type: ignore[union-attr]
                assert line, f"server closed stdout; stderr: {proc.stderr.read().decode()}"  # type: ignore[union-attr]
                message = json.loads(line)  # every line is JSON ...
                assert message.get("jsonrpc") == "2.0"  # ... and JSON-RPC
                if message.get("id") == request_id:
                    return message

        send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}})
        assert receive(1)["result"]["serverInfo"]["name"] == "callbox"
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "shell", "arguments": {"command": "echo on-stdout; echo on-stderr >&2"},
            "_meta": {"progressToken": "t1"}}})
        result = receive(2)["result"]
        assert result["isError"] is False and "on-stdout" in result["content"][0]["text"]
        sandbox_id = result["_meta"]["callbox/sandbox_id"]
        assert len(_containers(engine, sandbox_id)) == 1

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        for line in proc.stdout.read().splitlines():  # nothing but JSON-RPC after that either
            assert json.loads(line)["jsonrpc"] == "2.0"
        assert _containers(engine, sandbox_id) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


# ---- cancellation -------------------------------------------------------------------------

# The leader starts a child that ignores SIGTERM and a grandchild in a session of its own,
# records their pids, says so on stdout, and waits: cancelling the call must kill all three.
TREE = ("(trap '' TERM; exec sleep 300) & echo $! > /tmp/child; setsid sleep 301 & echo $! > /tmp/grandchild; "
        "echo $$ > /tmp/leader; echo started; wait")
# Waits (bounded by `timeout`) for each recorded process to be gone; `tail --pid` returns
# when the process exits, so nothing polls here beyond tail's own 50 ms check.
AWAIT_GONE = ("for f in leader child grandchild; do timeout 15 tail --pid=$(cat /tmp/$f) -s 0.05 -f /dev/null "
              "|| echo \"$f still running\"; done; pgrep -a -f 'sleep 30[01]' || echo 'no sleep left'")


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_cancelled_call_kills_its_process_tree(servers, tmp_path, transport):
    policy = _policy(tmp_path)

    async def flow() -> None:
        async with servers.client(transport, policy) as client:
            started = anyio.Event()

            async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                if message and "started" in message:
                    started.set()

            async with anyio.create_task_group() as tg:
                long_call = {"command": TREE, "timeout_ms": 300_000}  # no timeout kills it first
                tg.start_soon(partial(client.call_tool, "shell", long_call, progress_callback=on_progress))
                await started.wait()
                tg.cancel_scope.cancel()  # the SDK sends notifications/cancelled

            checked = await client.call_tool("shell", {"command": AWAIT_GONE, "timeout_ms": 60_000})
            assert checked.is_error is False, _text(checked)
            assert "still running" not in _text(checked)
            assert "no sleep left" in _text(checked), _text(checked)

    _run(flow)


# ---- stdin that is not JSON-RPC ------------------------------------------------------------


def _callbox_mcp(tmp_path: Path, stdin: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    return subprocess.run([str(ROOT / ".venv" / "bin" / "callbox"), "mcp", "--policy", str(_policy(tmp_path))],
                          input=stdin, capture_output=True, text=True, env=env, timeout=60, check=False)


def test_stdin_that_is_not_json_rpc_is_answered_reported_and_exits_2(tmp_path):
    proc = _callbox_mcp(tmp_path, "garbage\n")
    assert proc.returncode == 2, proc
    [reply] = [json.loads(line) for line in proc.stdout.splitlines()]
    assert reply["jsonrpc"] == "2.0" and reply["id"] is None
    assert reply["error"]["code"] == -32700
    assert "stdin line 1 is not JSON" in reply["error"]["message"]
    assert "stdin line 1 is not JSON (Invalid JSON: expected value at line 1 column 1): 'garbage'" in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("callbox: stdin carried 1 line that is not JSON-RPC (the first: stdin line 1 "), last
    assert "Traceback" not in proc.stderr


def test_stdin_mixing_json_rpc_and_other_json_serves_the_messages_and_exits_2(tmp_path):
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    proc = subprocess.Popen([str(ROOT / ".venv" / "bin" / "callbox"), "mcp", "--policy", str(_policy(tmp_path))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

        def exchange(line: str) -> dict[str, Any]:
            proc.stdin.write(line + "\n")  # type: ignore[union-attr]
            proc.stdin.flush()  # type: ignore[union-attr]
            reply = proc.stdout.readline()  # type: ignore[union-attr]
            assert reply, proc.stderr.read()  # type: ignore[union-attr]
            return json.loads(reply)  # type: ignore[no-any-return]

        initialize = exchange(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "0"}}}))
        assert initialize["result"]["serverInfo"]["name"] == "callbox"
        refused = exchange("\n" + json.dumps({"hello": "world"}))  # the blank line is skipped
        assert refused["id"] is None and refused["error"]["code"] == -32600  # JSON, but not JSON-RPC
        proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
        assert exchange(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "ping"})) == {
            "jsonrpc": "2.0", "id": 2, "result": {}}  # still serving after the refused line
        proc.stdin.close()
        assert proc.wait(timeout=30) == 2
        stderr = proc.stderr.read()
        assert "stdin line 3 is JSON but not a JSON-RPC message: '{\"hello\": \"world\"}'" in stderr
        assert stderr.strip().splitlines()[-1].startswith("callbox: stdin carried 1 line that is not JSON-RPC")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_stdin_that_ends_at_once_exits_0_quietly(tmp_path):
    proc = _callbox_mcp(tmp_path, "")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


# ---- addresses (no engine needed, but cheap enough to keep here) ----------------------------


def test_parse_addr_and_non_loopback_refusal(tmp_path):
    assert parse_addr("127.0.0.1:8765") == ("127.0.0.1", 8765)
    assert parse_addr(":8765") == ("127.0.0.1", 8765)
    assert parse_addr("8765") == ("127.0.0.1", 8765)
    assert parse_addr("[::1]:9") == ("::1", 9)
    for bad in ("127.0.0.1:x", "host:70000", "[::1]9"):
        with pytest.raises(UsageError):
            parse_addr(bad)
    with pytest.raises(UsageError, match="no authentication"):
        serve_mcp_http("0.0.0.0:0", policy_path=_policy(tmp_path), audit_path=tmp_path / "a.db")
