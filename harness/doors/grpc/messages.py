"""The gRPC door's messages: the ``Format`` enum both ways, and results and audit records as
``harness.v1`` messages."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from harness.audit.store import Approval
from harness.core.calls import ToolResult
from harness.core.formats import Format, result_item
from harness.doors.grpc.errors import invalid
from harness.v1 import executor_pb2

__all__ = ["FORMATS", "FORMAT_ENUM", "approval_message", "call_message", "json_text", "parse_format",
           "result_message"]

FORMATS: dict[int, Format] = {
    executor_pb2.FORMAT_UNSPECIFIED: "openai",
    executor_pb2.FORMAT_OPENAI: "openai",
    executor_pb2.FORMAT_CHAT: "chat",
    executor_pb2.FORMAT_ANTHROPIC: "anthropic",
    executor_pb2.FORMAT_MCP: "mcp",
}
FORMAT_ENUM: dict[str, executor_pb2.Format.ValueType] = {
    "openai": executor_pb2.FORMAT_OPENAI,
    "chat": executor_pb2.FORMAT_CHAT,
    "anthropic": executor_pb2.FORMAT_ANTHROPIC,
    "mcp": executor_pb2.FORMAT_MCP,
}


def json_text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def parse_format(value: int) -> Format:
    fmt = FORMATS.get(value)
    if fmt is None:
        raise invalid(f"format: unknown value {value}; use FORMAT_OPENAI, FORMAT_CHAT, FORMAT_ANTHROPIC or FORMAT_MCP")
    return fmt


def result_message(result: ToolResult, fmt: Format) -> executor_pb2.ToolResult:
    approval = result.meta.get("approval_id")
    return executor_pb2.ToolResult(
        call_id=result.call_id,
        format=FORMAT_ENUM[fmt],
        item_json=json_text(result_item(result, fmt)),
        is_error=result.is_error,
        error_code=result.error.value if result.error is not None else "",
        retryable=result.error.retryable if result.error is not None else False,
        text=result.text,
        structured_json=json_text(result.structured) if result.structured is not None else "",
        meta_json=json_text(result.meta),
        approval_id=approval if isinstance(approval, str) else "",
        images=[executor_pb2.ResultImage(media_type=image.media_type, data=image.data, width=image.width,
                                         height=image.height, label=image.label) for image in result.images],
    )


def approval_message(approval: Approval) -> executor_pb2.Approval:
    return executor_pb2.Approval(
        approval_id=approval.id, sandbox_id=approval.run_id, call_id=approval.call_id, tool=approval.tool,
        arguments_json=approval.arguments, rule=approval.rule, reason=approval.reason, state=approval.state,
        created_unix=approval.created, resolved_unix=approval.resolved or 0.0, resolved_by=approval.resolved_by or "",
        resolution_reason=approval.resolution_reason or "", scope=approval.scope or "",
    )


def call_message(call: Mapping[str, Any]) -> executor_pb2.Call:
    message = executor_pb2.Call(
        call_id=call["call_id"], tool=call["tool"], arguments_json=call["arguments"], state=call["state"],
        decision=call.get("decision") or "", rule=call.get("rule") or "", started_unix=call.get("started") or 0.0,
        finished_unix=call.get("finished") or 0.0, duration_ms=call.get("duration_ms") or 0.0,
        is_error=bool(call.get("is_error")), error_code=call.get("error_code") or "",
        bytes_out=call.get("bytes_out") or 0, truncated=bool(call.get("truncated")),
        result_text=call.get("result_text") or "",
    )
    if call.get("exit_code") is not None:
        message.exit_code = int(call["exit_code"])
    return message
