"""The gRPC door's errors: one table from ErrorDetail reason to status code and retryability.

A refused request ends with a status code and an ``ErrorDetail`` (reason, one sentence,
``retryable``) in the trailing metadata under ``DETAIL_METADATA_KEY``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NoReturn

import grpc

from harness.core.errors import CallboxError, EngineUnavailable, ImageNotFound
from harness.engine.spec import SpecError
from harness.v1 import executor_pb2
from harness.wire import DETAIL_METADATA_KEY

__all__ = ["Reason", "ServiceError", "abort", "creation_failure", "denied", "handle_errors",
           "invalid", "not_found"]

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
}
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
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code: grpc.StatusCode = code or _CODES.get(reason, grpc.StatusCode.UNKNOWN)
        self.retryable = reason in _RETRYABLE if retryable is None else retryable

    def detail(self) -> executor_pb2.ErrorDetail:
        return executor_pb2.ErrorDetail(reason=self.reason, message=self.message, retryable=self.retryable)


def abort(context: grpc.ServicerContext, error: ServiceError) -> NoReturn:
    """End the RPC with the error's status code and its ErrorDetail in the trailing metadata."""
    context.set_trailing_metadata(((DETAIL_METADATA_KEY, error.detail().SerializeToString()),))
    context.abort(error.code, error.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def not_found(kind: str, ident: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_NOT_FOUND, f"no {kind} with id {ident!r} for this client")


def denied(message: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_PERMISSION_DENIED, message)


def invalid(message: str) -> ServiceError:
    return ServiceError(Reason.ERROR_REASON_INVALID_ARGUMENT, message)



def handle_errors(method: Callable[..., Any]) -> Callable[..., Any]:
    """Unary handlers: ServiceError -> status + detail; anything else -> INTERNAL, logged."""

    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except ServiceError as error:
            failure = error
        except Exception:
            log.exception("%s failed", method.__name__)
            failure = ServiceError(Reason.ERROR_REASON_INTERNAL, f"{method.__name__} failed inside the server (a bug); "
                                   "the error is in the server log")
        abort(context, failure)

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
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

