"""Both Python clients against one in-process gRPC server: the same requests, the same results.

The server is a real ``grpc.server`` on a unix socket serving a canned Executor; each test runs
the synchronous and the asynchronous client and compares what the server saw and what came back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.client import AsyncExecutorClient, CallResult, ExecutorClient, ExecutorError, OutputEvent, RunInfo
from harness.v1 import executor_pb2, executor_pb2_grpc
from harness.wire import DETAIL_METADATA_KEY


class _Executor(executor_pb2_grpc.ExecutorServicer):
    def __init__(self) -> None:
        self.seen: list[tuple[str, Any, str]] = []

    def _note(self, name: str, request: Any, context: grpc.ServicerContext) -> None:
        auth = dict(context.invocation_metadata()).get("authorization", "")
        self.seen.append((name, request, str(auth)))

    def ListTools(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.ListToolsResponse:
        self._note("ListTools", request, context)
        return executor_pb2.ListToolsResponse(tools=[executor_pb2.ToolDefinition(name="shell",
                                                                                definition_json='{"name": "shell"}')])

    def CreateSandbox(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.Sandbox:
        self._note("CreateSandbox", request, context)
        return executor_pb2.Sandbox(sandbox_id="sb-1", memory_bytes=request.memory_bytes, mounts=request.mounts,
                                    tools=["shell"])

    def CallTool(self, request: Any, context: grpc.ServicerContext) -> Iterator[executor_pb2.CallToolEvent]:
        self._note("CallTool", request, context)
        yield executor_pb2.CallToolEvent(output=executor_pb2.OutputChunk(seq=0, stdout=b"out"))
        yield executor_pb2.CallToolEvent(output=executor_pb2.OutputChunk(seq=1, stderr=b"err"))
        if request.name == "no-result":
            return
        yield executor_pb2.CallToolEvent(result=executor_pb2.ToolResult(
            call_id=request.call_id, item_json='{"type": "x"}', text="ok", format=request.format, meta_json='{"a": 1}'))

    def ResolveApproval(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.Approval:
        self._note("ResolveApproval", request, context)
        return executor_pb2.Approval(approval_id=request.approval_id, state="approved", resolved_by="me")

    def GetRun(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.Run:
        self._note("GetRun", request, context)
        if request.run_id == "missing":
            detail = executor_pb2.ErrorDetail(reason=executor_pb2.ERROR_REASON_NOT_FOUND, message="no such run")
            context.set_trailing_metadata(((DETAIL_METADATA_KEY, detail.SerializeToString()),))
            context.abort(grpc.StatusCode.NOT_FOUND, "not found")
        return executor_pb2.Run(run_id=request.run_id, call_count=1,
                                calls=[executor_pb2.Call(call_id="c1", tool="shell", exit_code=3)])

    def ListRuns(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.ListRunsResponse:
        self._note("ListRuns", request, context)
        return executor_pb2.ListRunsResponse(runs=[executor_pb2.Run(run_id=f"r{i}") for i in range(request.limit)])

    def DeleteSandbox(self, request: Any, context: grpc.ServicerContext) -> executor_pb2.DeleteSandboxResponse:
        self._note("DeleteSandbox", request, context)
        return executor_pb2.DeleteSandboxResponse(cancelled_calls=2)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, _Executor]]:
    from concurrent import futures

    executor = _Executor()
    grpc_server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    executor_pb2_grpc.add_ExecutorServicer_to_server(executor, grpc_server)
    socket = tmp_path / "executor.sock"
    grpc_server.add_insecure_port(f"unix:{socket}")
    grpc_server.start()
    try:
        yield str(socket), executor
    finally:
        grpc_server.stop(grace=None)


def _sync_session(target: str) -> list[Any]:
    chunks: list[OutputEvent] = []
    with ExecutorClient(target, "tok") as client:
        out: list[Any] = [
            client.list_tools("chat", sandbox_id="sb-1"),
            client.create_sandbox(memory="1k", mounts=["/a:/b:rw", ("/c", "/d")], env={"X": "1"}),
            client.create_sandbox_info(cpus=0.5, allowed_tools=["shell"]),
            list(client.call_tool("sb-1", "shell", {"command": "ls"}, call_id="c1", fmt="anthropic")),
            client.call("sb-1", "shell", '{"command": "ls"}', call_id="c2", on_output=chunks.append),
            client.resolve_approval("ap-1", True, "fine"),
            client.get_run("r1"),
            client.list_runs(2),
            client.delete_sandbox("sb-1"),
        ]
        with pytest.raises(ExecutorError) as missing:
            client.get_run("missing")
        with pytest.raises(ExecutorError) as no_result:
            client.call("sb-1", "no-result", {})
    return [*out, chunks, (missing.value.code, missing.value.reason, missing.value.message),
            (no_result.value.reason, no_result.value.retryable)]


async def _async_session(target: str) -> list[Any]:
    chunks: list[OutputEvent] = []
    async with AsyncExecutorClient(target, "tok") as client:
        out: list[Any] = [
            await client.list_tools("chat", sandbox_id="sb-1"),
            await client.create_sandbox(memory="1k", mounts=["/a:/b:rw", ("/c", "/d")], env={"X": "1"}),
            await client.create_sandbox_info(cpus=0.5, allowed_tools=["shell"]),
            [event async for event in client.call_tool("sb-1", "shell", {"command": "ls"}, call_id="c1",
                                                      fmt="anthropic")],
            await client.call("sb-1", "shell", '{"command": "ls"}', call_id="c2", on_output=chunks.append),
            await client.resolve_approval("ap-1", True, "fine"),
            await client.get_run("r1"),
            await client.list_runs(2),
            await client.delete_sandbox("sb-1"),
        ]
        with pytest.raises(ExecutorError) as missing:
            await client.get_run("missing")
        with pytest.raises(ExecutorError) as no_result:
            await client.call("sb-1", "no-result", {})
    return [*out, chunks, (missing.value.code, missing.value.reason, missing.value.message),
            (no_result.value.reason, no_result.value.retryable)]


def test_both_clients_send_the_same_requests_and_return_the_same_results(server: tuple[str, _Executor]) -> None:
    target, executor = server
    sync_results = _sync_session(target)
    sync_seen = list(executor.seen)
    executor.seen.clear()
    async_results = asyncio.run(_async_session(target))
    assert async_results == sync_results
    assert executor.seen == sync_seen

    tools, sandbox_id, info, events, result, approval, run, runs, cancelled, chunks, missing, no_result = sync_results
    assert tools == [{"name": "shell"}]
    assert sandbox_id == "sb-1" and info.sandbox_id == "sb-1" and info.tools == ("shell",)
    assert events[:2] == [OutputEvent(0, "stdout", b"out"), OutputEvent(1, "stderr", b"err")]
    assert isinstance(events[2], CallResult) and events[2].format == "anthropic" and events[2].meta == {"a": 1}
    assert result.call_id == "c2" and result.item == {"type": "x"} and result.format == "openai"
    assert chunks == events[:2]
    assert approval.approval_id == "ap-1" and approval.resolved_by == "me" and approval.resolution_reason is None
    assert isinstance(run, RunInfo) and run.calls[0].exit_code == 3 and run.calls[0].decision is None
    assert [r.run_id for r in runs] == ["r0", "r1"]
    assert cancelled == 2
    assert missing == (grpc.StatusCode.NOT_FOUND, "NOT_FOUND", "no such run")
    assert no_result == ("INTERNAL", True)

    names = [name for name, _, _ in sync_seen]
    assert names == ["ListTools", "CreateSandbox", "CreateSandbox", "CallTool", "CallTool", "ResolveApproval",
                     "GetRun", "ListRuns", "DeleteSandbox", "GetRun", "CallTool"]
    assert {auth for _, _, auth in sync_seen} == {"Bearer tok"}
    create = sync_seen[1][1]
    assert create.memory_bytes == 1024 and not create.HasField("cpus") and dict(create.env) == {"X": "1"}
    assert [(m.source, m.target, m.read_write) for m in create.mounts] == [("/a", "/b", True), ("/c", "/d", False)]
    call = sync_seen[3][1]
    assert json.loads(call.arguments_json) == {"command": "ls"} and call.format == executor_pb2.FORMAT_ANTHROPIC


def test_bad_arguments_fail_before_any_rpc(server: tuple[str, _Executor]) -> None:
    target, executor = server
    with ExecutorClient(target, "tok") as client:
        with pytest.raises(ValueError, match="unknown format"):
            client.list_tools("yaml")
        with pytest.raises(ValueError, match="HOST:CONTAINER"):
            client.create_sandbox(mounts=["/only-one"])
    assert executor.seen == []
