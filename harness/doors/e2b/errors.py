"""What the E2B door refuses, in the two shapes the e2b SDK reads.

An :class:`E2bError` carries one of callbox's :class:`ErrorCode` values and one sentence; the
error table gives the rest. The control-plane REST API (and envd's file routes) answer it as
the table's HTTP status + ``{"code": STATUS, "message": ...}`` (the SDK raises
``NotFoundException`` for 404, ``AuthenticationException`` for 401, ...); an envd RPC answers
it as a Connect error ``{"code": "not_found", "message": ...}``, the Connect code being the
table's gRPC status in lower case, with the HTTP status the Connect protocol gives that code
(in a stream, the same JSON in the end-of-stream envelope).

The gRPC door's :class:`ServiceError` and callbox's own errors convert with
:func:`from_service_error` and :func:`from_callbox`. A refusal by a client's quota is 429
(``resource_exhausted``) with a ``Retry-After`` header (the seconds until it frees up), on
the control plane and on envd alike, also for a stream refused before it began.
"""

from __future__ import annotations

import math
from typing import Any

from harness.core.errors import ERRORS, AgentCallError, CallboxError, ErrorCode, SessionClosed
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
_CONNECT_SPELLING = {"CANCELLED": "canceled"}
"""gRPC status names Connect spells otherwise (every other one is the name in lower case)."""


class E2bError(Exception):
    """A refusal of the E2B door: an :class:`ErrorCode`, one sentence, and the HTTP status to
    send when the protocol fixes its own (405 for a wrong method, 413 for a body over the
    limit, a proxy's 502)."""

    def __init__(self, error: ErrorCode, message: str, *, status: int | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(message)
        kind = ERRORS[error]
        connect = _CONNECT_SPELLING.get(kind.grpc_status, kind.grpc_status.lower()) or "unknown"
        if connect not in CONNECT_STATUS:  # pragma: no cover - the table names gRPC status codes only
            raise ValueError(f"{error}: {kind.grpc_status!r} is not a gRPC status code")
        self.error = error
        self.connect_code = connect
        """The Connect protocol's error code (``not_found``, ``permission_denied``, ...)."""
        self.message = message
        self.status = status if status is not None else kind.http_status
        """The HTTP status of a REST (or envd file route) response."""
        self.connect_status = status if status is not None else CONNECT_STATUS[connect]
        """The HTTP status of a unary Connect error response."""
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
        return {"code": self.connect_code, "message": self.message}

    def __repr__(self) -> str:
        return f"E2bError({self.error!r}, {self.message!r}, status={self.status})"


def not_found(what: str, ident: str) -> E2bError:
    """The same words for anyone else's and for what never existed, so ids cannot be probed."""
    return E2bError(ErrorCode.NOT_FOUND, f"{what} {ident!r} not found")


def invalid(message: str) -> E2bError:
    return E2bError(ErrorCode.INVALID_REQUEST, message)


def from_service_error(error: ServiceError) -> E2bError:
    """A gRPC-door refusal (limits, quotas, overrides, a sandbox that cannot start) for E2B clients."""
    retry_after = None if error.retry_after_s is None else max(1, math.ceil(error.retry_after_s))
    return E2bError(error.error, error.message, retry_after=retry_after)


def from_quota(error: QuotaExceeded) -> E2bError:
    """A client's quota refused it: 429 (``resource_exhausted``) naming the quota, with ``Retry-After``."""
    return E2bError(ErrorCode.LIMIT_REACHED, error.message, retry_after=error.retry_after)


def from_callbox(error: CallboxError) -> E2bError:
    """callbox's own errors, by their code: a sandbox that stopped answering is unavailable,
    a session that ended is not found (E2B clients know a killed sandbox as 404)."""
    if isinstance(error, QuotaExceeded):
        return from_quota(error)
    if isinstance(error, AgentCallError) and sandbox_gone(error):
        return E2bError(ErrorCode.SANDBOX_UNAVAILABLE, error.message)
    if isinstance(error, SessionClosed):
        return E2bError(ErrorCode.NOT_FOUND, error.message)
    return E2bError(error.code, error.message)
