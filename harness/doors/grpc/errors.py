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
from harness.core.errors import ERRORS, AgentCallError, CallboxError, EngineUnavailable, ErrorCode, ImageNotFound
from harness.doors.quota_ledger import QuotaExceeded
from harness.engine.agent_errors import sandbox_gone
from harness.engine.docker.lifetime import SandboxPaused
from harness.engine.docker.snapshots import SnapshotNotFound
from harness.engine.spec import SpecError
from harness.v1 import executor_pb2
from harness.wire import DETAIL_METADATA_KEY

__all__ = ["Reason", "ServiceError", "abort", "action_refused", "creation_failure", "denied", "handle_errors",
           "handle_errors_any", "handle_stream_errors", "invalid", "not_found", "paused", "quota_refused",
           "sandbox_failure"]

log = logging.getLogger("callbox.executor")

Reason = executor_pb2.ErrorReason
RETRY_PUSHBACK_KEY = "grpc-retry-pushback-ms"


class ServiceError(Exception):
    """A request the service refuses: an :class:`ErrorCode` and one sentence. The status
    code, the ``ErrorDetail`` reason and whether a retry is safe come from the error table."""

    def __init__(
        self,
        error: ErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        approval_id: str = "",
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(message)
        kind = ERRORS[error]
        if not kind.grpc_status:
            raise ValueError(f"{error} is never a refusal of the gRPC door (it only appears in results)")
        self.error = error
        self.message = message
        self.code: grpc.StatusCode = grpc.StatusCode[kind.grpc_status]
        self.reason: executor_pb2.ErrorReason.ValueType = Reason.Value(
            f"ERROR_REASON_{kind.grpc_reason}" if kind.grpc_reason else "ERROR_REASON_UNSPECIFIED")
        self.retryable = kind.retry if retryable is None else retryable
        self.approval_id = approval_id
        self.retry_after_s = retry_after_s
        """When a retry may succeed (a quota's refusal): sent as ``grpc-retry-pushback-ms``."""

    def detail(self) -> executor_pb2.ErrorDetail:
        return executor_pb2.ErrorDetail(reason=self.reason, message=self.message, retryable=self.retryable,
                                        approval_id=self.approval_id, code=self.error.value)


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    """End the RPC with the error's status code and its ErrorDetail in the trailing metadata."""
    trailers: list[tuple[str, str | bytes]] = [(DETAIL_METADATA_KEY, error.detail().SerializeToString())]
    if error.retry_after_s is not None:
        trailers.append((RETRY_PUSHBACK_KEY, str(max(0, math.ceil(error.retry_after_s * 1000)))))
    context.set_trailing_metadata(tuple(trailers))
    context.abort(error.code, error.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def not_found(kind: str, ident: str) -> ServiceError:
    return ServiceError(ErrorCode.NOT_FOUND, f"no {kind} with id {ident!r} for this client")


def denied(message: str) -> ServiceError:
    return ServiceError(ErrorCode.PERMISSION_DENIED, message)


def invalid(message: str) -> ServiceError:
    return ServiceError(ErrorCode.INVALID_REQUEST, message)


def quota_refused(error: QuotaExceeded) -> ServiceError:
    """A client's quota refused the request: RESOURCE_EXHAUSTED, the retry time in the trailer."""
    return ServiceError(ErrorCode.LIMIT_REACHED, error.message, retryable=error.retryable,
                        retry_after_s=error.retry_after_s if error.retryable else None)


def paused(sandbox_id: str) -> ServiceError:
    return ServiceError(ErrorCode.PAUSED, f"sandbox {sandbox_id} is paused; resume it first (Sandboxes.Resume)")


def action_refused(error: ActionDenied | ApprovalPending) -> ServiceError:
    """The policy's refusal of a sandbox action: PERMISSION_DENIED naming the key, or an
    approval to resolve (FAILED_PRECONDITION, APPROVAL_PENDING, ``approval_id``)."""
    if isinstance(error, ApprovalPending):
        return ServiceError(
            ErrorCode.APPROVAL_PENDING,
            f"{error.rule}: this {error.action} needs a person's approval; it is pending as approval "
            f"{error.approval_id}: resolve it with Executor.ResolveApproval, then send the same request again "
            "with approval_id set",
            approval_id=error.approval_id,
        )
    return denied(error.message)


def sandbox_failure(error: CallboxError, sandbox_id: str = "") -> ServiceError:
    """How an error of a sandbox operation (the engine's, the agent's, the policy's) reads: its
    own code, as the error table says; a sandbox that stopped answering mid-operation is gone."""
    if isinstance(error, ActionDenied | ApprovalPending):
        return action_refused(error)
    if isinstance(error, QuotaExceeded):
        return quota_refused(error)
    if isinstance(error, SandboxPaused):
        return paused(sandbox_id or error.name_or_id)
    if isinstance(error, SnapshotNotFound):
        return not_found("snapshot", error.name)
    if isinstance(error, AgentCallError):
        if sandbox_gone(error):
            return ServiceError(ErrorCode.SANDBOX_GONE, error.message)
        return ServiceError(error.code, error.message, retryable=error.retryable)
    if error.code is ErrorCode.INTERNAL:  # an engine failure without a code of its own
        return ServiceError(ErrorCode.SANDBOX_UNAVAILABLE, error.message, retryable=False)
    return ServiceError(error.code, error.message)



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
            failure = ServiceError(ErrorCode.INTERNAL, f"{method.__name__} failed inside the server (a bug); "
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
    return ServiceError(ErrorCode.INTERNAL, f"{name} failed inside the server (a bug); "
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
    """Why a sandbox could not be created: a spec this engine's host cannot run (an unwritable
    rw mount, too many CPUs) names its key; a missing image or engine says so; any other
    failure is a sandbox that could not start."""
    if isinstance(error, SpecError):
        return ServiceError(ErrorCode.INVALID_REQUEST, f"{error.key}: {error.message}")
    if isinstance(error, ImageNotFound | EngineUnavailable | QuotaExceeded) or error.code is not ErrorCode.INTERNAL:
        return ServiceError(error.code, error.message)
    return ServiceError(ErrorCode.SANDBOX_UNAVAILABLE, f"the sandbox could not start: {error.message}")

