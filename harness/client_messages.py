"""What the clients of :mod:`harness.client` send and get: requests, responses, results.

Both ``ExecutorClient`` and ``AsyncExecutorClient`` build every request and convert every
response here, so the two differ only in how they wait. A unary method is an :class:`Rpc`: the
stub method to call, its request, and how the response becomes the method's result. The public
names are re-exported by :mod:`harness.client`; import them from there.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import grpc

from harness.core.calls import ImagePart
from harness.core.units import parse_size
from harness.v1 import executor_pb2
from harness.wire import DETAIL_METADATA_KEY

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
    """A failed RPC: the gRPC status code, the server's reason, the error table's code (``not_found``,
    ``paused``, ...; empty when the server sent none), a sentence, whether to retry."""

    def __init__(self, code: grpc.StatusCode, reason: str, message: str, retryable: bool,
                 error_code: str = "") -> None:
        super().__init__(f"{error_code or reason}: {message}" if (error_code or reason != "UNSPECIFIED") else message)
        self.code = code
        self.reason = reason
        self.error_code = error_code
        """The code of callbox's error table; the errors reference says what it means and how to fix it."""
        self.message = message
        self.retryable = retryable

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> ExecutorError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        message = (error.details() if hasattr(error, "details") else None) or str(error)
        reason, error_code = "UNSPECIFIED", ""
        retryable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
        trailers = error.trailing_metadata() if hasattr(error, "trailing_metadata") else None
        for key, value in trailers or ():
            if key == DETAIL_METADATA_KEY and isinstance(value, bytes):
                detail = executor_pb2.ErrorDetail.FromString(value)
                reason = executor_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_")
                error_code = detail.code
                message = detail.message or message
                retryable = detail.retryable
        return cls(code, reason, message, retryable, error_code)


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
    images: tuple[ImagePart, ...] = ()
    """The pictures after ``text`` (``item`` carries them too, in the format's shape)."""

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
            images=tuple(ImagePart(media_type=image.media_type, data=image.data, width=image.width,
                                   height=image.height, label=image.label) for image in message.images),
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
    scope: str | None = None
    """An approved egress approval's: ``once`` or ``sandbox``."""

    @classmethod
    def from_proto(cls, m: executor_pb2.Approval) -> ApprovalInfo:
        return cls(
            approval_id=m.approval_id, sandbox_id=m.sandbox_id, call_id=m.call_id, tool=m.tool,
            arguments_json=m.arguments_json, rule=m.rule, reason=m.reason, state=m.state, created=m.created_unix,
            resolved=m.resolved_unix or None, resolved_by=m.resolved_by or None,
            resolution_reason=m.resolution_reason or None, scope=m.scope or None,
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


# --- requests and responses ------------------------------------------------------------


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
_T = TypeVar("_T")


@dataclass(frozen=True)
class Rpc(Generic[_T]):
    """One unary call: the stub method, its request, and how its response becomes the method's result."""

    method: str
    request: Any
    convert: Callable[[Any], _T]


def list_tools_rpc(fmt: str, sandbox_id: str) -> Rpc[list[dict[str, Any]]]:
    return Rpc("ListTools", executor_pb2.ListToolsRequest(format=_format(fmt), sandbox_id=sandbox_id),
                lambda response: [json.loads(tool.definition_json) for tool in response.tools])


def create_sandbox_rpc(
    memory: int | str | None,
    cpus: float | None,
    pids: int | None,
    network: str | None,
    mounts: Sequence[MountSpec],
    env: Mapping[str, str] | None,
    ttl_seconds: int | None,
    allowed_tools: Sequence[str] | None,
) -> Rpc[SandboxInfo]:
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
    return Rpc("CreateSandbox", request, SandboxInfo.from_proto)


def resolve_approval_rpc(approval_id: str, approve: bool, reason: str, scope: str = "") -> Rpc[ApprovalInfo]:
    request = executor_pb2.ResolveApprovalRequest(approval_id=approval_id, approve=approve, reason=reason,
                                                  scope=scope)
    return Rpc("ResolveApproval", request, ApprovalInfo.from_proto)


def get_run_rpc(run_id: str) -> Rpc[RunInfo]:
    return Rpc("GetRun", executor_pb2.GetRunRequest(run_id=run_id), RunInfo.from_proto)


def list_runs_rpc(limit: int) -> Rpc[list[RunInfo]]:
    return Rpc("ListRuns", executor_pb2.ListRunsRequest(limit=limit),
                lambda response: [RunInfo.from_proto(run) for run in response.runs])


def delete_sandbox_rpc(sandbox_id: str) -> Rpc[int]:
    return Rpc("DeleteSandbox", executor_pb2.DeleteSandboxRequest(sandbox_id=sandbox_id),
                lambda response: int(response.cancelled_calls))


def call_tool_request(sandbox_id: str, name: str, arguments: str | Mapping[str, Any], call_id: str | None,
                       fmt: str) -> executor_pb2.CallToolRequest:
    return executor_pb2.CallToolRequest(
        sandbox_id=sandbox_id, name=name, arguments_json=_arguments(arguments), call_id=call_id or "",
        format=_format(fmt),
    )


def call_event(message: executor_pb2.CallToolEvent) -> CallEvent:
    if message.WhichOneof("event") == "result":
        return CallResult.from_proto(message.result)
    chunk = message.output
    if chunk.WhichOneof("data") == "stderr":
        return OutputEvent(chunk.seq, "stderr", chunk.stderr)
    return OutputEvent(chunk.seq, "stdout", chunk.stdout)


def result_or_relay(event: CallEvent, on_output: Callable[[OutputEvent], None] | None) -> CallResult | None:
    """The call's result, or None after handing an output chunk to ``on_output``."""
    if isinstance(event, CallResult):
        return event
    if on_output is not None:
        on_output(event)
    return None


def no_result_error() -> ExecutorError:
    return ExecutorError(grpc.StatusCode.INTERNAL, "INTERNAL", "the call ended without a result", True)
