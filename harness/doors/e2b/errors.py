"""What the E2B door refuses, in the two shapes the e2b SDK reads.

An :class:`E2bError` carries a Connect error code (``not_found``, ``permission_denied``, ...)
and one sentence. The control-plane REST API answers it as HTTP status + ``{"code": STATUS,
"message": ...}`` (the SDK raises ``NotFoundException`` for 404, ``AuthenticationException``
for 401, ...); an envd RPC answers it as a Connect error ``{"code": "not_found", "message":
...}`` with the HTTP status the Connect protocol gives that code (in a stream, the same JSON
in the end-of-stream envelope).

The gRPC door's :class:`ServiceError` and callbox's own errors convert with
:func:`from_service_error` and :func:`from_callbox`. A refusal by a client's quota is 429
(``resource_exhausted``) with a ``Retry-After`` header (the seconds until it frees up), on
the control plane and on envd alike, also for a stream refused before it began.
"""

from __future__ import annotations

import math
from typing import Any

from harness.core.actions import ActionDenied, ApprovalPending
from harness.core.errors import AgentCallError, CallboxError, EngineUnavailable, SessionClosed, UsageError
from harness.doors.grpc.errors import ServiceError
from harness.doors.quota_ledger import QuotaExceeded
from harness.engine.agent_errors import sandbox_gone

__all__ = ["CONNECT_STATUS", "E2bError", "from_callbox", "from_quota", "from_service_error", "invalid", "not_found"]

CONNECT_STATUS: dict[str, int] = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
"""Connect error code -> the HTTP status of a unary error response (the Connect protocol's table)."""

_GRPC_TO_CONNECT = {
    "CANCELLED": "canceled",
    "UNKNOWN": "unknown",
    "INVALID_ARGUMENT": "invalid_argument",
    "DEADLINE_EXCEEDED": "deadline_exceeded",
    "NOT_FOUND": "not_found",
    "ALREADY_EXISTS": "already_exists",
    "PERMISSION_DENIED": "permission_denied",
    "RESOURCE_EXHAUSTED": "resource_exhausted",
    "FAILED_PRECONDITION": "failed_precondition",
    "ABORTED": "aborted",
    "OUT_OF_RANGE": "out_of_range",
    "UNIMPLEMENTED": "unimplemented",
    "INTERNAL": "internal",
    "UNAVAILABLE": "unavailable",
    "DATA_LOSS": "data_loss",
    "UNAUTHENTICATED": "unauthenticated",
}


class E2bError(Exception):
    """A refusal of the E2B door: a Connect code, one sentence, and the HTTP status to send."""

    def __init__(self, code: str, message: str, *, status: int | None = None, retry_after: int | None = None) -> None:
        if code not in CONNECT_STATUS:
            raise ValueError(f"not a Connect error code: {code!r}")
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status if status is not None else CONNECT_STATUS[code]
        self.retry_after = retry_after
        """Seconds until a retry may succeed (a quota's refusal): the ``Retry-After`` header."""

    def headers(self) -> list[tuple[str, str]]:
        """The response headers an error response carries besides its content type."""
        return [("retry-after", str(self.retry_after))] if self.retry_after is not None else []

    def rest_body(self) -> dict[str, Any]:
        """The control plane's error body (the SDK reads ``message``)."""
        return {"code": self.status, "message": self.message}

    def connect_body(self) -> dict[str, Any]:
        """The Connect protocol's error JSON (a unary response body, or an end-of-stream's ``error``)."""
        return {"code": self.code, "message": self.message}

    def __repr__(self) -> str:
        return f"E2bError({self.code!r}, {self.message!r}, status={self.status})"


def not_found(what: str, ident: str) -> E2bError:
    """The same words for anyone else's and for what never existed, so ids cannot be probed."""
    return E2bError("not_found", f"{what} {ident!r} not found")


def invalid(message: str) -> E2bError:
    return E2bError("invalid_argument", message)


def from_service_error(error: ServiceError) -> E2bError:
    """A gRPC-door refusal (limits, quotas, overrides, a sandbox that cannot start) for E2B clients."""
    code = _GRPC_TO_CONNECT.get(error.code.name, "unknown")
    retry_after = None if error.retry_after_s is None else max(1, math.ceil(error.retry_after_s))
    return E2bError(code, error.message, retry_after=retry_after)


def from_quota(error: QuotaExceeded) -> E2bError:
    """A client's quota refused it: 429 (``resource_exhausted``) naming the quota, with ``Retry-After``."""
    return E2bError("resource_exhausted", error.message, retry_after=error.retry_after)


def from_callbox(error: CallboxError) -> E2bError:
    """callbox's own errors: the agent's refusals keep their status (an unknown pid is
    not_found), a sandbox that stopped answering is unavailable, a policy refusal is
    permission_denied (an approval asked for: failed_precondition naming the approval)."""
    if isinstance(error, E2bError):  # pragma: no cover - E2bError is not a CallboxError
        return error
    if isinstance(error, QuotaExceeded):
        return from_quota(error)
    if isinstance(error, ActionDenied):
        return E2bError("permission_denied", error.message)
    if isinstance(error, ApprovalPending):
        return E2bError("failed_precondition", error.message)
    if isinstance(error, AgentCallError):
        if sandbox_gone(error):
            return E2bError("unavailable", error.message)
        return E2bError(_GRPC_TO_CONNECT.get(error.code, "unknown"), error.message)
    if isinstance(error, SessionClosed):
        return E2bError("not_found", error.message)
    if isinstance(error, EngineUnavailable):
        return E2bError("unavailable", error.message)
    if isinstance(error, UsageError):
        return E2bError("invalid_argument", error.message)
    return E2bError("internal", error.message)
