"""Errors a user or the environment can cause, each with a readable message.

The CLI prints ``callbox: <message>`` and exits with ``exit_code``; no traceback.
"""

from __future__ import annotations


class CallboxError(Exception):
    """Base class: a failure callbox explains instead of crashing."""

    exit_code = 125

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(CallboxError):
    """Bad flags or arguments."""

    exit_code = 2


class EngineUnavailable(CallboxError):
    """No container engine answers: fail closed, never run anything on the host."""


class ImageNotFound(CallboxError):
    """The sandbox image is not present locally."""

    @classmethod
    def named(cls, image: str) -> ImageNotFound:
        return cls(f"image {image} not found locally; build it with `callbox image build` "
                   "(there is no registry to pull from)")


class SandboxStartError(CallboxError):
    """The container started but its agent never became ready."""


class SessionClosed(CallboxError):
    """The session has ended: its sandbox is gone and no new one starts for it."""


class AgentCallError(CallboxError):
    """The agent refused or failed an RPC; carries its structured reason."""

    def __init__(self, message: str, *, reason: str, code: str, retryable: bool) -> None:
        super().__init__(message)
        self.reason = reason
        self.code = code
        self.retryable = retryable


def short_reason(exc: BaseException) -> str:
    """The first line of an exception's text (at most 300 characters), for one-line messages."""
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
