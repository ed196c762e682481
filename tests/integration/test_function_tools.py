"""Function tools end to end: real engine, real image, real doors. A ``@function_tool`` that
reads and runs things in the sandbox through ``ctx.runtime().agent``, called after the
built-in ``write_file`` through a Session, the MCP door (streamable HTTP, the official
``mcp`` client) and the gRPC door (``ExecutorClient``); the policy's ``deny`` and ``ask``
apply to it as to a built-in."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from harness.audit.store import AuditStore
from harness.client import ExecutorClient, OutputEvent
from harness.core.calls import ErrorCode, ToolCall
from harness.core.policy import Policy, parse_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.doors.grpc.server import serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.doors.mcp.http import serve_mcp_http
from harness.doors.mcp.service import McpToolService
from harness.engine.exec_result import collect
from harness.tools import builtin_registry
from harness.tools.function import FunctionContext, function_tool
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN = "token-of-the-function-tool-test-0123"
FLOW_TIMEOUT_S = 120


@function_tool(read_only=True)
def word_stats(ctx: FunctionContext, path: str, min_length: int = 1) -> dict[str, Any]:
    """Count the lines (with wc in the sandbox) and words of a text file in the sandbox.

    Args:
        path: The file, absolute or relative to the workspace.
        min_length: Count only words at least this long.
    """
    runtime = ctx.runtime()
    text = runtime.agent.read_file(path).data.decode()
    events = runtime.agent.exec(["wc", "-l", path], cwd=runtime.workdir, env=runtime.env,
                                timeout_ms=ctx.timeout_ms())
    on_output = ctx.on_output
    result = collect(events, on_output=(lambda stream, data, _seq: on_output(stream, data)) if on_output else None)
    return {"lines": int(result.stdout.data().split()[0]), "words": sum(len(w) >= min_length for w in text.split()),
            "sandbox": runtime.sandbox_id, "call_id": ctx.call_id}


@function_tool
def explode(ctx: FunctionContext, path: str) -> str:
    """Read a file in the sandbox, then fail.

    Args:
        path: The file.
    """
    size = len(ctx.runtime().agent.read_file(path).data)
    raise RuntimeError(f"refusing a file of {size} bytes")


@function_tool(read_only=True)
def headline(title: str) -> dict[str, Any]:
    """Make a headline whose structured result has its own "text" field.

    Args:
        title: The words of the headline.
    """
    return {"text": title.upper(), "length": len(title)}


def _registry() -> ToolRegistry:
    return builtin_registry().add(word_stats, explode, headline)


def _policy(extra: str = "") -> Policy:
    return parse_policy(f'[sandbox]\nimage = "{IMAGE}"\nmemory = "256m"\n' + textwrap.dedent(extra))


POEM = "the quick brown fox\njumps over\nthe lazy dog\n"


@pytest.fixture
def audit(tmp_path: Path) -> Iterator[AuditStore]:
    with AuditStore(tmp_path / "audit.sqlite3") as store:
        yield store


def test_through_a_session(engine, audit):  # type: ignore[no-untyped-def]
    with Session(_registry(), _policy(), audit) as session:
        wrote = session.call(ToolCall("write_file", {"path": "notes/poem.txt", "content": POEM}, "c-1"))
        assert not wrote.is_error, wrote.text
        chunks: list[tuple[str, bytes]] = []
        stats = session.call(ToolCall("word_stats", '{"path": "notes/poem.txt", "min_length": 4}', "c-2"),
                             on_output=lambda stream, data: chunks.append((stream, data)))
        assert not stats.is_error, stats.text
        box = session.active_sandbox
        assert box is not None
        assert stats.structured == {"lines": 3, "words": 5, "sandbox": box.id, "call_id": "c-2"}
        assert stats.text == f'{{"lines": 3, "words": 5, "sandbox": "{box.id}", "call_id": "c-2"}}'
        assert b"".join(d for s, d in chunks if s == "stdout").startswith(b"3 ")  # streamed while it ran

        missing = session.call(ToolCall("word_stats", {"path": "nope.txt"}, "c-3"))
        assert (missing.is_error, missing.error) == (True, ErrorCode.TOOL_FAILED)
        assert missing.text.startswith("tool 'word_stats' failed: AgentCallError: ") and "nope.txt" in missing.text
        assert missing.structured == {"exception": "AgentCallError", "reason": "NOT_FOUND"}

        raised = session.call(ToolCall("explode", {"path": "notes/poem.txt"}, "c-4"))
        assert raised.error is ErrorCode.TOOL_FAILED
        assert raised.text == f"tool 'explode' failed: RuntimeError: refusing a file of {len(POEM)} bytes"
        record = audit.get_call(session.run_id, "c-4")
        assert record is not None and record.result is not None and record.result.error is ErrorCode.TOOL_FAILED


def test_policy_deny_and_ask_apply_to_function_tools(engine, audit):  # type: ignore[no-untyped-def]
    policy = _policy("""
        [tools.explode]
        decision = "deny"
        [tools.word_stats]
        decision = "ask"
    """)
    with Session(_registry(), policy, audit) as session:
        denied = session.call(ToolCall("explode", {"path": "x"}, "c-1"))
        assert (denied.error, denied.meta["decision"]) == (ErrorCode.DENIED, "deny")
        record = audit.get_call(session.run_id, "c-1")
        assert record is not None and record.decision is not None and record.decision.rule.startswith("tools.explode")
        session.call(ToolCall("write_file", {"path": "poem.txt", "content": POEM}, "c-2"))
        pending = session.call(ToolCall("word_stats", {"path": "poem.txt"}, "c-3"))
        assert pending.error is ErrorCode.APPROVAL_PENDING
        audit.resolve_approval(pending.meta["approval_id"], True, by="test", reason=None)
        approved = session.call(ToolCall("word_stats", {"path": "poem.txt"}, "c-3"))
        assert not approved.is_error, approved.text
        assert approved.structured is not None and approved.structured["lines"] == 3
        assert approved.meta["decision"] == "approved"


def _run(flow: Any) -> Any:
    async def bounded() -> Any:
        with anyio.fail_after(FLOW_TIMEOUT_S):
            return await flow()

    return anyio.run(bounded)


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def test_through_the_mcp_door(engine, tmp_path):  # type: ignore[no-untyped-def]
    policy = _policy("""
        [tools.explode]
        decision = "ask"
    """)
    audit = AuditStore(tmp_path / "audit.sqlite3")
    server = serve_mcp_http(service=McpToolService(_registry(), policy, audit, owns_audit=True))

    async def flow() -> None:
        async with Client(server.url) as client:
            listed = {t.name: t for t in (await client.list_tools()).tools}
            tool = listed["word_stats"]
            assert tool.description == word_stats.definition.description
            assert tool.input_schema == word_stats.definition.input_schema("plain")
            assert tool.input_schema["required"] == ["path"]
            assert tool.annotations is not None and tool.annotations.read_only_hint is True
            wrote = await client.call_tool("write_file", {"path": "poem.txt", "content": POEM})
            assert wrote.is_error is False, _text(wrote)
            stats = await client.call_tool("word_stats", {"path": "poem.txt"})
            assert stats.is_error is False, _text(stats)
            assert stats.structured_content is not None
            assert (stats.structured_content["lines"], stats.structured_content["words"]) == (3, 9)
            assert stats.structured_content["sandbox"] == (stats.meta or {})["callbox/sandbox_id"]
            titled = await client.call_tool("headline", {"title": "sandboxed"})
            assert titled.is_error is False, _text(titled)
            assert titled.structured_content == {"text": "SANDBOXED", "length": 9}  # the tool's own "text" stays
            asked = await client.call_tool("explode", {"path": "poem.txt"})
            assert asked.is_error is True and asked.meta["callbox/error"] == "approval_pending"
            with AuditStore(tmp_path / "audit.sqlite3") as store:
                store.resolve_approval(asked.meta["callbox/approval_id"], True, by="test", reason=None)
            failed = await client.call_tool("explode", {"path": "poem.txt"})
            assert failed.is_error is True and failed.meta["callbox/error"] == "tool_failed"
            assert _text(failed) == f"tool 'explode' failed: RuntimeError: refusing a file of {len(POEM)} bytes"

    try:
        _run(flow)
    finally:
        server.stop()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for the unix socket (sun_path is 108 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_through_the_grpc_door(engine, audit, short_dir):  # type: ignore[no-untyped-def]
    policy = _policy("""
        [tools.explode]
        decision = "deny"
    """)
    server = serve_grpc(str(short_dir / "x.sock"), policy=policy, audit=audit, registry=_registry(),
                        tokens=TokenSet({"tester": TOKEN}, source="test tokens"), announce=None)
    try:
        with ExecutorClient(server.target, TOKEN) as client:
            openai = {t["name"]: t for t in client.list_tools("openai")}
            assert openai["word_stats"]["parameters"] == word_stats.definition.input_schema("strict")
            assert openai["word_stats"]["strict"] is True
            box = client.create_sandbox()
            try:
                wrote = client.call(box, "write_file", {"path": "poem.txt", "content": POEM})
                assert not wrote.is_error, wrote.text
                chunks: list[OutputEvent] = []
                stats = client.call(box, "word_stats", {"path": "poem.txt", "min_length": 5}, call_id="g-1",
                                    fmt="anthropic", on_output=chunks.append)
                assert not stats.is_error, stats.text
                assert stats.structured is not None
                assert stats.structured.pop("sandbox")  # the engine's id of the sandbox, not the door's
                assert stats.structured == {"lines": 3, "words": 3, "call_id": "g-1"}
                assert stats.item == {"type": "tool_result", "tool_use_id": "g-1", "content": stats.text,
                                      "is_error": False}
                assert b"".join(c.data for c in chunks).startswith(b"3 ")
                denied = client.call(box, "explode", {"path": "poem.txt"})
                assert denied.is_error and denied.error_code == "denied"
            finally:
                client.delete_sandbox(box)
    finally:
        server.stop(grace=1)
