"""How a failed call to a sandbox's agent reads on the harness side: the agent's structured
reason from the trailing metadata, or, without one, that the sandbox went away."""

from __future__ import annotations

import grpc

from harness.core.errors import AgentCallError, ErrorCode
from harness.wire import DETAIL_METADATA_KEY
from sandbox.errors import program_missing
from sandbox.v1 import errors_pb2

__all__ = ["SANDBOX_GONE", "UNREACHABLE_CODES", "sandbox_gone", "translate"]

SANDBOX_GONE = (
    "the sandbox stopped answering: its container stopped or was killed, or the Docker engine went away"
)
"""What an UNAVAILABLE without the agent's own detail means: the socket is gone or refused."""

UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})
"""gRPC codes of an agent call that never reached a live agent or lost it: with no reason
of the agent's own they mean the sandbox is gone, not a refusal."""



def sandbox_gone(error: AgentCallError) -> bool:
    """The agent call failed because the sandbox no longer answers (not a refusal)."""
    return error.reason == "UNSPECIFIED" and error.grpc_code in UNREACHABLE_CODES


def translate(error: grpc.RpcError) -> AgentCallError:
    """Build an AgentCallError from a failed RPC, using the agent's ErrorDetail if present.

    Without one, UNAVAILABLE means the connection itself failed (``Socket closed``, ``failed
    to connect``): the message then says that the sandbox went away, with gRPC's words after."""
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    message = error.details() if isinstance(error, grpc.Call) else str(error)
    reason = "UNSPECIFIED"
    retryable = code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
    trailers = error.trailing_metadata() if isinstance(error, grpc.Call) else None
    from_agent = False
    for key, value in trailers or ():
        if key == DETAIL_METADATA_KEY and isinstance(value, bytes):
            detail = errors_pb2.ErrorDetail.FromString(value)
            reason = errors_pb2.ErrorReason.Name(detail.reason).removeprefix("ERROR_REASON_")
            message = detail.message or message
            retryable = detail.retryable
            from_agent = True
    if code == grpc.StatusCode.UNAVAILABLE and not from_agent:
        message = f"{SANDBOX_GONE} ({message})" if message else SANDBOX_GONE
    failure = AgentCallError(message or code.name, reason=reason, grpc_code=code.name, retryable=retryable)
    if reason == "SPAWN_FAILED" and program_missing(failure.message):
        failure.code = ErrorCode.COMMAND_NOT_FOUND  # type: ignore[misc]  # this instance's own code
    return failure
