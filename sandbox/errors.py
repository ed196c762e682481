"""Structured RPC errors: a gRPC status code plus an ErrorDetail in trailing metadata."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NoReturn, Protocol, TypeVar

import grpc

from sandbox.v1 import errors_pb2

DETAIL_METADATA_KEY = "callbox-error-bin"

#: The error reasons of ``proto/sandbox/v1/errors.proto``, without the ``ERROR_REASON_`` prefix; the one
#: place the agent's modules take them from.
UNSPECIFIED = errors_pb2.ERROR_REASON_UNSPECIFIED
INVALID_ARGUMENT = errors_pb2.ERROR_REASON_INVALID_ARGUMENT
NOT_FOUND = errors_pb2.ERROR_REASON_NOT_FOUND
WRONG_TYPE = errors_pb2.ERROR_REASON_WRONG_TYPE
PATH_ESCAPE = errors_pb2.ERROR_REASON_PATH_ESCAPE
PERMISSION_DENIED = errors_pb2.ERROR_REASON_PERMISSION_DENIED
ALREADY_EXISTS = errors_pb2.ERROR_REASON_ALREADY_EXISTS
TOO_LARGE = errors_pb2.ERROR_REASON_TOO_LARGE
SPAWN_FAILED = errors_pb2.ERROR_REASON_SPAWN_FAILED
NO_SUCH_PROCESS = errors_pb2.ERROR_REASON_NO_SUCH_PROCESS
BUSY = errors_pb2.ERROR_REASON_BUSY
INTERNAL = errors_pb2.ERROR_REASON_INTERNAL
SESSION_BROKEN = errors_pb2.ERROR_REASON_SESSION_BROKEN
CONNECTION_REFUSED = errors_pb2.ERROR_REASON_CONNECTION_REFUSED

_CODES: dict[int, grpc.StatusCode] = {
    INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    WRONG_TYPE: grpc.StatusCode.FAILED_PRECONDITION,
    PATH_ESCAPE: grpc.StatusCode.PERMISSION_DENIED,
    PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
    ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    TOO_LARGE: grpc.StatusCode.OUT_OF_RANGE,
    SPAWN_FAILED: grpc.StatusCode.FAILED_PRECONDITION,
    NO_SUCH_PROCESS: grpc.StatusCode.NOT_FOUND,
    BUSY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    INTERNAL: grpc.StatusCode.INTERNAL,
    SESSION_BROKEN: grpc.StatusCode.FAILED_PRECONDITION,
    CONNECTION_REFUSED: grpc.StatusCode.FAILED_PRECONDITION,
}

_RETRYABLE = frozenset({BUSY})
_R = TypeVar("_R")
_E = TypeVar("_E")

COMMAND_NOT_FOUND = "command not found"
"""How a SPAWN_FAILED message ends when no PATH directory holds the program (``ls: command
not found``, as a shell says it)."""
NO_SUCH_FILE = "no such file or directory"
"""How a SPAWN_FAILED message ends when the program's path leads to nothing (``./run:
no such file or directory``, as a shell says it)."""


def program_missing(message: str) -> bool:
    """Whether a SPAWN_FAILED message says the program does not exist (a shell's exit
    status 127) rather than that it cannot run (126); the harness tells the two apart by it."""
    return message.endswith((COMMAND_NOT_FOUND, NO_SUCH_FILE))


class AgentError(Exception):
    """An error a request caused; the server turns it into a status with details."""

    def __init__(self, reason: errors_pb2.ErrorReason.ValueType, message: str,
                 code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self._code = code

    @property
    def code(self) -> grpc.StatusCode:
        """The status code: the one given, else the reason's."""
        return self._code or _CODES.get(self.reason, grpc.StatusCode.UNKNOWN)

    def detail(self) -> errors_pb2.ErrorDetail:
        return errors_pb2.ErrorDetail(
            reason=self.reason, message=self.message, retryable=self.reason in _RETRYABLE
        )


def abort(context: grpc.ServicerContext, error: AgentError) -> NoReturn:
    """End the RPC with the error's status code and its ErrorDetail attached."""
    context.set_trailing_metadata(((DETAIL_METADATA_KEY, error.detail().SerializeToString()),))
    context.abort(error.code, error.message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class Cancellable(Protocol):
    def cancel(self) -> None: ...


def answer(context: grpc.ServicerContext, call: Callable[[], _R]) -> _R:
    """The result of ``call``; an AgentError it raises ends the RPC with its status instead."""
    try:
        return call()
    except AgentError as error:
        abort(context, error)


def stream(
    context: grpc.ServicerContext, start: Callable[[Callable[[Cancellable], None]], Iterator[_E]]
) -> Iterator[_E]:
    """What ``start(on_start)`` yields, with the handle it passes to ``on_start`` cancelled when
    the RPC ends for any reason (a no-op after a normal end); an AgentError ends the RPC with
    its status."""

    def on_start(handle: Cancellable) -> None:
        context.add_callback(handle.cancel)

    try:
        yield from start(on_start)
    except AgentError as error:
        abort(context, error)
