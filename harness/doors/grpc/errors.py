"""The gRPC door's errors: one table from ErrorDetail reason to status code and retryability.

A refused request ends with a status code and an ``ErrorDetail`` (reason, one sentence,
``retryable``, and for an action waiting for a person ``approval_id``) in the trailing
metadata under ``DETAIL_METADATA_KEY``. A refusal by a client's quota (:func:`quota_refused`) is
RESOURCE_EXHAUSTED, LIMIT_REACHED, with a sentence naming the quota and when it frees up, and
the milliseconds until then in the trailer ``grpc-retry-pushback-ms`` (the key gRPC's retry
policy honours). :func:`action_refused` and :func:`sandbox_failure`
say how the policy's refusals of sandbox actions and the engine's and agent's errors read.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

import grpc

from harness.core.actions import ActionDenied, ApprovalPending
from harness.core.errors import AgentCallError, CallboxError, EngineUnavailable, ImageNotFound, UsageError
from harness.doors.quota_ledger import QuotaExceeded
from harness.engine.agent_errors import sandbox_gone
from harness.engine.docker.kept import SandboxExpired
from harness.engine.docker.lifetime import SandboxPaused
from harness.engine.docker.snapshots import SnapshotExists, SnapshotNotFound
from harness.engine.spec import SpecError
from harness.v1 import executor_pb2
from harness.wire import DETAIL_METADATA_KEY

__all__ = ["Reason", "ServiceError", "abort", "action_refused", "creation_failure", "denied", "handle_errors",
           "handle_errors_any", "handle_stream_errors", "invalid", "not_found", "paused", "quota_refused",
           "sandbox_failure"]

log = logging.getLogger("callbox.executor")

Reason = executor_pb2.ErrorReason
_CODES: dict[int, grpc.StatusCode] = {
    Reason.ERROR_REASON_INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.ERROR_REASON_UNAUTHENTICATED: grpc.StatusCode.UNAUTHENTICATED,
    Reason.ERROR_REASON_NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    Reason.ERROR_REASON_PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    Reason.ERROR_REASON_LIMIT_REACHED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.ERROR_REASON_SANDBOX_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.ERROR_REASON_ALREADY_RESOLVED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.ERROR_REASON_SHUTTING_DOWN: grpc.StatusCode.UNAVAILABLE,
    Reason.ERROR_REASON_INTERNAL: grpc.StatusCode.INTERNAL,
    Reason.ERROR_REASON_APPROVAL_PENDING: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.ERROR_REASON_PAUSED: grpc.StatusCode.FAILED_PRECONDITION,
}
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"
_RETRYABLE = frozenset(
    {Reason.ERROR_REASON_LIMIT_REACHED, Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, Reason.ERROR_REASON_SHUTTING_DOWN}
)


class ServiceError(Exception):
    """A request the service refuses: a status code, an ErrorDetail reason, one sentence."""

    def __init__(
        self,
        reason: executor_pb2.ErrorReason.ValueType,
        message: str,
        *,
        code: grpc.StatusCode | None = None,
        retryable: bool | None = None,
        approval_id: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code: grpc.StatusCode = code or _CODES.get(reason, grpc.StatusCode.UNKNOWN)
        self.retryable = reason in _RETRYABLE if retryable is None else retryable
        self.approval_id = approval_id
        self.retry_after_s = retry_after_s
        """When a retry may succeed (a quota's refusal): sent as ``grpc-retry-pushback-ms``."""

    def detail(self) -> executor_pb2.ErrorDetail:
        return executor_pb2.ErrorDetail(reason=self.reason, message=self.message, retryable=self.retryable,
                                        approval_id=self.approval_id)


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    """End the RPC with the error's status code and its ErrorDetail in the trailing metadata."""
    trailers: list[tuple[str, str | bytes]] = [(DETAIL_METADATA_KEY, error.detail().SerializeToString())]
    if error.retry_after_s is not None:
        trailers.append((RETRY_PUSHBACK_KEY, str(max(0, math.ceil(error.retry_after_s * 1000)))))
    context.set_trailing_metadata(tuple(trailers))
    context.abort(error.code, error.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def not_found(kind: str, ident: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_NOT_FOUND, f"no {kind} with id {ident!r} for this client")


def denied(message: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_PERMISSION_DENIED, message)


def invalid(message: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_INVALID_ARGUMENT, message)


def quota_refused(error: QuotaExceeded) -> ServiceError:
    """A client's quota refused the request: RESOURCE_EXHAUSTED, the retry time in the trailer."""
    return ServiceError(Reason.ERROR_REASON_LIMIT_REACHED, error.message, retryable=error.retryable,
                        retry_after_s=error.retry_after_s if error.retryable else None)


def paused(sandbox_id: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_PAUSED,
                        f"sandbox {sandbox_id} is paused; resume it first (Sandboxes.Resume)")


def action_refused(error: ActionDenied | ApprovalPending) -> ServiceError:
    """The policy's refusal of a sandbox action: PERMISSION_DENIED naming the key, or an
    approval to resolve (FAILED_PRECONDITION, APPROVAL_PENDING, ``approval_id``)."""
    if isinstance(error, ApprovalPending):
        return ServiceError(
            Reason.ERROR_REASON_APPROVAL_PENDING,
            f"{error.rule}: this {error.action} needs a person's approval; it is pending as approval "
            f"{error.approval_id}: resolve it with Executor.ResolveApproval, then send the same request again "
            "with approval_id set",
            approval_id=error.approval_id,
        )
    return denied(error.message)


# The agent's reasons that have a reason of their own here; the others keep the agent's status code.
_AGENT_REASONS: dict[str, executor_pb2.ErrorReason.ValueType] = {
    "INVALID_ARGUMENT": Reason.ERROR_REASON_INVALID_ARGUMENT,
    "NOT_FOUND": Reason.ERROR_REASON_NOT_FOUND,
    "NO_SUCH_PROCESS": Reason.ERROR_REASON_NOT_FOUND,
    "PERMISSION_DENIED": Reason.ERROR_REASON_PERMISSION_DENIED,
    "PATH_ESCAPE": Reason.ERROR_REASON_PERMISSION_DENIED,
    "BUSY": Reason.ERROR_REASON_LIMIT_REACHED,
}


def sandbox_failure(error: CallboxError, sandbox_id: str = "") -> ServiceError:
    """How an error of a sandbox operation (the engine's, the agent's, the policy's) reads."""
    if isinstance(error, ActionDenied | ApprovalPending):
        return action_refused(error)
    if isinstance(error, QuotaExceeded):
        return quota_refused(error)
    if isinstance(error, SandboxPaused):
        return paused(sandbox_id or error.name_or_id)
    if isinstance(error, AgentCallError):
        if sandbox_gone(error):
            return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message,
                                code=grpc.StatusCode.FAILED_PRECONDITION, retryable=False)
        code = getattr(grpc.StatusCode, error.code, grpc.StatusCode.UNKNOWN)
        reason = _AGENT_REASONS.get(error.reason, Reason.ERROR_REASON_UNSPECIFIED)
        return ServiceError(reason, error.message, code=code, retryable=error.retryable)
    if isinstance(error, SnapshotNotFound):
        return not_found("snapshot", error.name)
    if isinstance(error, SnapshotExists):
        return ServiceError(Reason.ERROR_REASON_INVALID_ARGUMENT, error.message,
                            code=grpc.StatusCode.ALREADY_EXISTS, retryable=False)
    if isinstance(error, UsageError):
        return invalid(error.message)
    if isinstance(error, SandboxExpired):
        return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message,
                            code=grpc.StatusCode.FAILED_PRECONDITION, retryable=False)
    if isinstance(error, EngineUnavailable):
        return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message)
    return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message,
                        code=grpc.StatusCode.FAILED_PRECONDITION, retryable=False)



def handle_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Unary handlers: ServiceError -> status + detail; anything else -> INTERNAL, logged."""

    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ServiceError as error:
            failure = error
        except QuotaExceeded as error:
            failure = quota_refused(error)
        except Exception:
            log.exception("%s failed", method.__name__)
            failure = ServiceError(Reason.ERROR_REASON_INTERNAL, f"{method.__name__} failed inside the server (a bug); "
                                   "the error is in the server log")
        abort(context, failure)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _failure(name: str, exc: BaseException, context: grpc.ServicerContext) -> ServiceError | None:
    """The error to end the RPC with; None when the client has gone (nothing reaches it)."""
    if not context.is_active():
        log.debug("%s ended after its client went away: %s", name, exc)
        return None
    if isinstance(exc, ServiceError):
        return exc
    if isinstance(exc, CallboxError):
        return sandbox_failure(exc)
    log.error("%s failed", name, exc_info=exc)
    return ServiceError(Reason.ERROR_REASON_INTERNAL, f"{name} failed inside the server (a bug); "
                        "the error is in the server log")


def handle_errors_any(method: Callable[..., Any]) -> Callable[..., Any]:
    """Unary responses (the request a message or a stream): as :func:`handle_errors`, and a
    CallboxError reads as :func:`sandbox_failure` says. Raise, never ``abort``, inside."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:
            failure = _failure(method.__name__, exc, context)
        if failure is not None:
            abort(context, failure)
        return None

    return wrapper


def handle_stream_errors(method: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """Streamed responses: errors raised before or while streaming end the RPC as in
    :func:`handle_errors_any`."""

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from method(self, request, context)
        except Exception as exc:
            failure = _failure(method.__name__, exc, context)
            if failure is not None:
                abort(context, failure)

    return wrapper


def creation_failure(error: CallboxError) -> ServiceError:
    if isinstance(error, SpecError):
        # The engine's host cannot run this spec (an unwritable rw mount, too many CPUs):
        # the request must change, so retrying it as it is cannot help.
        return ServiceError(Reason.ERROR_REASON_INVALID_ARGUMENT, f"{error.key}: {error.message}",
                            code=grpc.StatusCode.INVALID_ARGUMENT, retryable=False)
    if isinstance(error, ImageNotFound):
        return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message,
                            code=grpc.StatusCode.FAILED_PRECONDITION, retryable=False)
    if isinstance(error, EngineUnavailable):
        return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, error.message)
    return ServiceError(Reason.ERROR_REASON_SANDBOX_UNAVAILABLE, f"the sandbox could not start: {error.message}")

