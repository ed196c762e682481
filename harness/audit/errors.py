"""The audit store's error, and the messages for ids it does not know."""

from __future__ import annotations

from harness.core.errors import CallboxError

__all__ = ["AuditError"]


class AuditError(CallboxError):
    """An unknown run/call/approval id, a call or approval in the wrong state, or a database
    that cannot be used; the message says what to do."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


def unknown_run(run_id: str) -> AuditError:
    return AuditError(f"no run with id {run_id}; list them with `callbox audit`")


def unknown_call(run_id: str, call_id: str) -> AuditError:
    return AuditError(f"no call {call_id} in run {run_id}; a call is recorded by claim_call first")


def unknown_approval(approval_id: str) -> AuditError:
    return AuditError(f"no approval with id {approval_id}; list them with `callbox approvals list`")
