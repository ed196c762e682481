"""A small typed client for the callbox executor service (``callbox serve --grpc``).

Synchronous::

    from harness.client import ExecutorClient

    with ExecutorClient("unix:/run/callbox/executor.sock", token) as client:
        tools = client.list_tools("openai")              # definitions for the model's tools list
        box = client.create_sandbox(memory="256m")       # its id is also the run id
        for event in client.call_tool(box, "shell", {"command": "ls"}, call_id="c1"):
            ...                                          # OutputEvent chunks, then one CallResult
        result = client.call(box, "shell", '{"command": "ls"}', call_id="c2")
        conversation.append(result.item)                 # the item for the same call_id, shaped for fmt
        client.delete_sandbox(box)

Asynchronous: :class:`AsyncExecutorClient` has the same methods as coroutines, and
``call_tool`` is an async iterator.

``target`` is ``unix:/path``, a socket path (starting with ``/``, ``./`` or ``~``), or
``host:port`` (None: the server's default socket); ``token`` None means ``CALLBOX_TOKEN``
or the token file (:func:`harness.doors.grpc.tokens.client_token`). With ``tls_ca`` (a PEM path or
bytes) or ``tls=True`` the channel uses TLS (``tls_server_name`` overrides the name the
certificate is checked against). The default ``timeout`` (60 s) applies to the unary
methods; ``call_tool`` has no deadline unless given one. An RPC that fails raises
:class:`ExecutorError` with the gRPC ``code``, the server's ``reason`` (``"NOT_FOUND"``,
``"LIMIT_REACHED"``, ...), its ``message`` and ``retryable``. A tool call
that fails for the model (bad arguments, denied, non-zero exit, timed out) is not an error:
it is a ``CallResult`` with ``is_error`` set, to be handed to the model. ``timeout`` on a
method is the RPC deadline in seconds: a ``call_tool`` whose deadline passes (or whose
iterator is closed early) kills the tool's processes in the sandbox.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

import grpc
import grpc.aio

from harness.core.units import parse_size
from harness.doors.grpc.tokens import client_token
from harness.v1 import executor_pb2, executor_pb2_grpc
from harness.wire import DETAIL_METADATA_KEY, MAX_MESSAGE_BYTES

__all__ = [
    "ApprovalInfo",
    "AsyncExecutorClient",
    "CallEvent",
    "CallInfo",
    "CallResult",
    "ExecutorClient",
    "ExecutorError",
    "OutputEvent",
    "RunInfo",
    "SandboxInfo",
]

FormatName = Literal["openai", "chat", "anthropic", "mcp"]
_FORMATS: dict[str, executor_pb2.Format.ValueType] = {
    "openai": executor_pb2.FORMAT_OPENAI,
    "chat": executor_pb2.FORMAT_CHAT,
    "anthropic": executor_pb2.FORMAT_ANTHROPIC,
    "mcp": executor_pb2.FORMAT_MCP,
}
_FORMAT_NAMES = {value: name for name, value in _FORMATS.items()}


# --- results -----------------------------------------------------------------------------------------


class ExecutorError(Exception):
    """A failed RPC: the gRPC status code, the server's reason, a sentence, whether to retry."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str, retryable: bool) -> None:
        super().__init__(f"{reason}: {message}" if reason != "UNSPECIFIED" else message)
        self.code = code
        self.reason = reason
        self.message = message
        self.retryable = retryable

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> ExecutorError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = (error.details() if hasattr(error, "details") else None) or str(error)
        reason = "UNSPECIFIED"
        retryable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
        trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        for key, value in trailers or ():
            if key == DETAIL_METADATA_KEY and isinstance(value, bytes):
                detail = executor_pb2.ErrorDetail.FromString(value)
                reason = executor_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_")
                message = detail.message or message
                retryable = detail.retryable
        return cls(code, reason, message, retryable)


@dataclass(frozen=True)
class OutputEvent:
    """A chunk of a running tool's output."""

    seq: int
    stream: Literal["stdout", "stderr"]
    data: bytes


@dataclass(frozen=True)
class CallResult:
    """The final result of a tool call; ``item`` is what to append to the model's context."""

    call_id: str
    item: dict[str, Any]
    is_error: bool
    text: str
    format: str
    error_code: str | None = None
    retryable: bool = False
    approval_id: str | None = None
    structured: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, message: executor_pb2.ToolResult) -> CallResult:
        return cls(
            call_id=message.call_id,
            item=json.loads(message.item_json),
            is_error=message.is_error,
            text=message.text,
            format=_FORMAT_NAMES.get(message.format, "openai"),
            error_code=message.error_code or None,
            retryable=message.retryable,
            approval_id=message.approval_id or None,
            structured=json.loads(message.structured_json) if message.structured_json else None,
            meta=json.loads(message.meta_json) if message.meta_json else {},
        )


CallEvent = OutputEvent | CallResult


@dataclass(frozen=True)
class SandboxInfo:
    sandbox_id: str
    memory_bytes: int
    cpus: float
    pids: int
    network: str
    workdir: str
    ttl_seconds: int
    tools: tuple[str, ...]
    created: float
    expires: float
    image: str
    mounts: tuple[tuple[str, str, bool], ...]
    """(host source, sandbox target, read_write)"""

    @classmethod
    def from_proto(cls, m: executor_pb2.Sandbox) -> SandboxInfo:
        return cls(
            sandbox_id=m.sandbox_id, memory_bytes=m.memory_bytes, cpus=m.cpus, pids=m.pids, network=m.network,
            workdir=m.workdir, ttl_seconds=m.ttl_seconds, tools=tuple(m.tools), created=m.created_unix,
            expires=m.expires_unix, image=m.image,
            mounts=tuple((x.source, x.target, x.read_write) for x in m.mounts),
        )


@dataclass(frozen=True)
class ApprovalInfo:
    approval_id: str
    sandbox_id: str
    call_id: str
    tool: str
    arguments_json: str
    rule: str
    reason: str
    state: str
    created: float
    resolved: float | None
    resolved_by: str | None
    resolution_reason: str | None

    @classmethod
    def from_proto(cls, m: executor_pb2.Approval) -> ApprovalInfo:
        return cls(
            approval_id=m.approval_id, sandbox_id=m.sandbox_id, call_id=m.call_id, tool=m.tool,
            arguments_json=m.arguments_json, rule=m.rule, reason=m.reason, state=m.state, created=m.created_unix,
            resolved=m.resolved_unix or None, resolved_by=m.resolved_by or None,
            resolution_reason=m.resolution_reason or None,
        )


@dataclass(frozen=True)
class CallInfo:
    call_id: str
    tool: str
    arguments_json: str
    state: str
    decision: str | None
    rule: str | None
    started: float
    finished: float | None
    duration_ms: float
    exit_code: int | None
    is_error: bool
    error_code: str | None
    bytes_out: int
    truncated: bool
    result_text: str

    @classmethod
    def from_proto(cls, m: executor_pb2.Call) -> CallInfo:
        return cls(
            call_id=m.call_id, tool=m.tool, arguments_json=m.arguments_json, state=m.state,
            decision=m.decision or None, rule=m.rule or None, started=m.started_unix,
            finished=m.finished_unix or None, duration_ms=m.duration_ms,
            exit_code=m.exit_code if m.HasField("exit_code") else None, is_error=m.is_error,
            error_code=m.error_code or None, bytes_out=m.bytes_out, truncated=m.truncated,
            result_text=m.result_text,
        )


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    created: float
    ended: float | None
    end_reason: str | None
    live: bool
    call_count: int
    calls: tuple[CallInfo, ...] = ()
    approvals: tuple[ApprovalInfo, ...] = ()

    @classmethod
    def from_proto(cls, m: executor_pb2.Run) -> RunInfo:
        return cls(
            run_id=m.run_id, created=m.created_unix, ended=m.ended_unix or None, end_reason=m.end_reason or None,
            live=m.live, call_count=m.call_count, calls=tuple(CallInfo.from_proto(c) for c in m.calls),
            approvals=tuple(ApprovalInfo.from_proto(a) for a in m.approvals),
        )


# --- requests (shared by both clients) ---------------------------------------------------------------


def _target(target: str | None) -> str:
    if not target:
        from harness.doors.grpc.server import default_socket_path

        return f"unix:{default_socket_path()}"
    if target.startswith(("/", "./", "../", "~")):  # a socket path
        return f"unix:{os.path.abspath(os.path.expanduser(target))}"
    return target  # unix:PATH, host:port, or any gRPC target (dns:///host:port, ...)


def _format(fmt: str) -> executor_pb2.Format.ValueType:
    value = _FORMATS.get(fmt.strip().lower())
    if value is None:
        raise ValueError(f"unknown format {fmt!r}; choose one of: {', '.join(_FORMATS)}")
    return value


def _arguments(arguments: str | Mapping[str, Any]) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(dict(arguments), ensure_ascii=False)


def _mount(spec: str | tuple[str, str] | tuple[str, str, bool]) -> executor_pb2.Mount:
    if isinstance(spec, str):
        parts = spec.split(":")
        mode = parts.pop() if len(parts) == 3 else "ro"
        if len(parts) != 2 or mode not in ("ro", "rw"):
            raise ValueError(f"mount {spec!r}: use HOST:CONTAINER[:ro|rw]")
        return executor_pb2.Mount(source=parts[0], target=parts[1], read_write=mode == "rw")
    if len(spec) == 2:
        return executor_pb2.Mount(source=spec[0], target=spec[1])
    source, target, read_write = spec
    return executor_pb2.Mount(source=source, target=target, read_write=bool(read_write))


MountSpec = str | tuple[str, str] | tuple[str, str, bool]


def _create_request(
    memory: int | str | None,
    cpus: float | None,
    pids: int | None,
    network: str | None,
    mounts: Sequence[MountSpec],
    env: Mapping[str, str] | None,
    ttl_seconds: int | None,
    allowed_tools: Sequence[str] | None,
) -> executor_pb2.CreateSandboxRequest:
    request = executor_pb2.CreateSandboxRequest(
        mounts=[_mount(m) for m in mounts], env=dict(env or {}), allowed_tools=list(allowed_tools or ()),
    )
    if memory is not None:
        request.memory_bytes = parse_size(memory)
    if cpus is not None:
        request.cpus = cpus
    if pids is not None:
        request.pids = pids
    if network is not None:
        request.network = network
    if ttl_seconds is not None:
        request.ttl_seconds = ttl_seconds
    return request


def _event(message: executor_pb2.CallToolEvent) -> CallEvent:
    if message.WhichOneof("event") == "result":
        return CallResult.from_proto(message.result)
    chunk = message.output
    if chunk.WhichOneof("data") == "stderr":
        return OutputEvent(chunk.seq, "stderr", chunk.stderr)
    return OutputEvent(chunk.seq, "stdout", chunk.stdout)


def _ca_bytes(tls_ca: str | Path | bytes | None) -> bytes | None:
    if tls_ca is None or isinstance(tls_ca, bytes):
        return tls_ca
    return Path(tls_ca).expanduser().read_bytes()


def _channel_options(tls_server_name: str | None) -> list[tuple[str, Any]]:
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
        ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
        ("grpc.enable_retries", 0),
    ]
    if tls_server_name:
        options.append(("grpc.ssl_target_name_override", tls_server_name))
    return options


def _use_tls(tls: bool | None, tls_ca: object) -> bool:
    return tls if tls is not None else tls_ca is not None


# --- the synchronous client ----------------------------------------------------------------------------


class ExecutorClient:
    """Blocking client; one channel, safe to share between threads."""

    def __init__(
        self,
        target: str | None = None,
        token: str | None = None,
        *,
        tls_ca: str | Path | bytes | None = None,
        tls: bool | None = None,
        tls_server_name: str | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        self.target = _target(target)
        self._metadata = (("authorization", f"Bearer {token or client_token()}"),)
        self.timeout = timeout
        options = _channel_options(tls_server_name)
        if _use_tls(tls, tls_ca):
            credentials = grpc.ssl_channel_credentials(root_certificates=_ca_bytes(tls_ca))
            self.channel = grpc.secure_channel(self.target, credentials, options=options)
        else:
            self.channel = grpc.insecure_channel(self.target, options=options)
        self.stub = executor_pb2_grpc.ExecutorStub(self.channel)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ExecutorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, method: Callable[..., Any], request: Any, timeout: float | None) -> Any:
        try:
            return method(request, metadata=self._metadata, timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None

    def list_tools(self, fmt: FormatName | str = "openai", *, sandbox_id: str = "",
                   timeout: float | None = None) -> list[dict[str, Any]]:
        """Tool definitions in ``fmt``'s shape (for the model's tools list)."""
        response = self._unary(self.stub.ListTools,
                               executor_pb2.ListToolsRequest(format=_format(fmt), sandbox_id=sandbox_id), timeout)
        return [json.loads(tool.definition_json) for tool in response.tools]

    def create_sandbox(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> str:
        """Start a sandbox (overrides may only tighten the server's policy); its id."""
        return self.create_sandbox_info(
            memory=memory, cpus=cpus, pids=pids, network=network, mounts=mounts, env=env, ttl_seconds=ttl_seconds,
            allowed_tools=allowed_tools, timeout=timeout,
        ).sandbox_id

    def create_sandbox_info(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> SandboxInfo:
        """Like ``create_sandbox``, returning the sandbox's effective settings."""
        request = _create_request(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return SandboxInfo.from_proto(self._unary(self.stub.CreateSandbox, request, timeout))

    def call_tool(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
    ) -> Iterator[CallEvent]:
        """Run a tool call: OutputEvent chunks while it runs, then the CallResult.

        ``timeout`` (seconds, default none) is the RPC deadline; closing the iterator early
        cancels the call. Either kills the tool's processes in the sandbox."""
        request = executor_pb2.CallToolRequest(
            sandbox_id=sandbox_id, name=name, arguments_json=_arguments(arguments), call_id=call_id or "",
            format=_format(fmt),
        )
        stream = self.stub.CallTool(request, metadata=self._metadata, timeout=timeout)
        try:
            for message in stream:
                yield _event(message)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        finally:
            stream.cancel()

    def call(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
    ) -> CallResult:
        """Run a tool call to the end; ``on_output`` sees each output chunk."""
        for event in self.call_tool(sandbox_id, name, arguments, call_id, fmt, timeout=timeout):
            if isinstance(event, CallResult):
                return event
            if on_output is not None:
                on_output(event)
        raise ExecutorError(grpc.StatusCode.INTERNAL, "INTERNAL", "the call ended without a result", True)

    def resolve_approval(self, approval_id: str, approve: bool, reason: str = "", *,
                         timeout: float | None = None) -> ApprovalInfo:
        """Approve or deny a pending call; then send the same call again to run it."""
        request = executor_pb2.ResolveApprovalRequest(approval_id=approval_id, approve=approve, reason=reason)
        return ApprovalInfo.from_proto(self._unary(self.stub.ResolveApproval, request, timeout))

    def get_run(self, run_id: str, *, timeout: float | None = None) -> RunInfo:
        return RunInfo.from_proto(self._unary(self.stub.GetRun, executor_pb2.GetRunRequest(run_id=run_id), timeout))

    def list_runs(self, limit: int = 50, *, timeout: float | None = None) -> list[RunInfo]:
        response = self._unary(self.stub.ListRuns, executor_pb2.ListRunsRequest(limit=limit), timeout)
        return [RunInfo.from_proto(run) for run in response.runs]

    def delete_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> int:
        """Destroy the sandbox; how many running calls were cancelled."""
        response = self._unary(self.stub.DeleteSandbox, executor_pb2.DeleteSandboxRequest(sandbox_id=sandbox_id),
                               timeout)
        return int(response.cancelled_calls)


# --- the asynchronous client -----------------------------------------------------------------------------


class AsyncExecutorClient:
    """The same methods as :class:`ExecutorClient` on ``grpc.aio``; ``call_tool`` is an async iterator."""

    def __init__(
        self,
        target: str | None = None,
        token: str | None = None,
        *,
        tls_ca: str | Path | bytes | None = None,
        tls: bool | None = None,
        tls_server_name: str | None = None,
        timeout: float | None = 60.0,
    ) -> None:
        self.target = _target(target)
        self._metadata = (("authorization", f"Bearer {token or client_token()}"),)
        self.timeout = timeout
        options = _channel_options(tls_server_name)
        if _use_tls(tls, tls_ca):
            credentials = grpc.ssl_channel_credentials(root_certificates=_ca_bytes(tls_ca))
            self.channel = grpc.aio.secure_channel(self.target, credentials, options=options)
        else:
            self.channel = grpc.aio.insecure_channel(self.target, options=options)
        self.stub = executor_pb2_grpc.ExecutorStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncExecutorClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def _unary(self, method: Callable[..., Any], request: Any, timeout: float | None) -> Any:
        try:
            return await method(request, metadata=self._metadata,
                                timeout=timeout if timeout is not None else self.timeout)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None

    async def list_tools(self, fmt: FormatName | str = "openai", *, sandbox_id: str = "",
                         timeout: float | None = None) -> list[dict[str, Any]]:
        response = await self._unary(
            self.stub.ListTools, executor_pb2.ListToolsRequest(format=_format(fmt), sandbox_id=sandbox_id), timeout)
        return [json.loads(tool.definition_json) for tool in response.tools]

    async def create_sandbox(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> str:
        info = await self.create_sandbox_info(
            memory=memory, cpus=cpus, pids=pids, network=network, mounts=mounts, env=env, ttl_seconds=ttl_seconds,
            allowed_tools=allowed_tools, timeout=timeout,
        )
        return info.sandbox_id

    async def create_sandbox_info(
        self,
        *,
        memory: int | str | None = None,
        cpus: float | None = None,
        pids: int | None = None,
        network: str | None = None,
        mounts: Sequence[MountSpec] = (),
        env: Mapping[str, str] | None = None,
        ttl_seconds: int | None = None,
        allowed_tools: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> SandboxInfo:
        request = _create_request(memory, cpus, pids, network, mounts, env, ttl_seconds, allowed_tools)
        return SandboxInfo.from_proto(await self._unary(self.stub.CreateSandbox, request, timeout))

    async def call_tool(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[CallEvent]:
        request = executor_pb2.CallToolRequest(
            sandbox_id=sandbox_id, name=name, arguments_json=_arguments(arguments), call_id=call_id or "",
            format=_format(fmt),
        )
        stream = self.stub.CallTool(request, metadata=self._metadata, timeout=timeout)
        try:
            async for message in stream:
                yield _event(message)
        except grpc.RpcError as error:
            raise ExecutorError.from_rpc(error) from None
        finally:
            stream.cancel()

    async def call(
        self,
        sandbox_id: str,
        name: str,
        arguments: str | Mapping[str, Any],
        call_id: str | None = None,
        fmt: FormatName | str = "openai",
        *,
        timeout: float | None = None,
        on_output: Callable[[OutputEvent], None] | None = None,
    ) -> CallResult:
        async for event in self.call_tool(sandbox_id, name, arguments, call_id, fmt, timeout=timeout):
            if isinstance(event, CallResult):
                return event
            if on_output is not None:
                on_output(event)
        raise ExecutorError(grpc.StatusCode.INTERNAL, "INTERNAL", "the call ended without a result", True)

    async def resolve_approval(self, approval_id: str, approve: bool, reason: str = "", *,
                               timeout: float | None = None) -> ApprovalInfo:
        request = executor_pb2.ResolveApprovalRequest(approval_id=approval_id, approve=approve, reason=reason)
        return ApprovalInfo.from_proto(await self._unary(self.stub.ResolveApproval, request, timeout))

    async def get_run(self, run_id: str, *, timeout: float | None = None) -> RunInfo:
        message = await self._unary(self.stub.GetRun, executor_pb2.GetRunRequest(run_id=run_id), timeout)
        return RunInfo.from_proto(message)

    async def list_runs(self, limit: int = 50, *, timeout: float | None = None) -> list[RunInfo]:
        response = await self._unary(self.stub.ListRuns, executor_pb2.ListRunsRequest(limit=limit), timeout)
        return [RunInfo.from_proto(run) for run in response.runs]

    async def delete_sandbox(self, sandbox_id: str, *, timeout: float | None = None) -> int:
        response = await self._unary(
            self.stub.DeleteSandbox, executor_pb2.DeleteSandboxRequest(sandbox_id=sandbox_id), timeout)
        return int(response.cancelled_calls)
