"""The audit store's error, and the messages for ids it does not know."""

from __future__ import annotations

from harness.core.errors import CallboxError, ErrorCode

__all__ = ["AuditError"]


class AuditError(CallboxError):
    """An unknown run/call/approval id, a call or approval in the wrong state, or a database
    that cannot be used; the message says what to do."""

    code = ErrorCode.INVALID_REQUEST


def unknown_run(run_id: str) -> AuditError:
    return AuditError(f"no run with id {run_id}; list them with `callbox audit`", code=ErrorCode.NOT_FOUND)


def unknown_call(run_id: str, call_id: str) -> AuditError:
    return AuditError(f"no call {call_id} in run {run_id}; a call is recorded by claim_call first",
                      code=ErrorCode.NOT_FOUND)


def unknown_approval(approval_id: str) -> AuditError:
    return AuditError(f"no approval with id {approval_id}; list them with `callbox approvals list`",
                      code=ErrorCode.NOT_FOUND)
