"""Signed file URLs: ``sandbox.upload_url(path)`` / ``download_url(path)`` used without the access token.

The SDK signs a file URL with the sandbox's envd access token, and envd checks it the same
way; this module is that check. The ``/files`` query carries ``path``, ``username`` (absent:
the default user), ``signature`` and, optionally, ``signature_expiration`` (Unix seconds).
The signature is ``v1_`` and the unpadded standard base64 of the SHA-256 of
``PATH:OPERATION:USERNAME:TOKEN`` (with ``:EXPIRATION`` appended when the URL expires), where
``OPERATION`` is ``read`` (``GET /files``) or ``write`` (``POST /files``) and the path and
user are the query's values exactly as sent, before any resolution.

A request that carries ``X-Access-Token`` needs no signature (the token is checked as for
every envd request). Without the token, a missing, wrong (tampered path, user, operation or
expiry; another sandbox's) or expired signature is refused with envd's status, 401, and
envd's words first. The comparison takes the same time wherever the signatures differ.

The signature also names its sandbox: a plain HTTP client given such a URL may not send the
``E2b-Sandbox-Id`` header the SDK adds (the URL is the server's own when ``E2B_SANDBOX_URL``
names it), so :func:`signed_sandbox` finds the one sandbox whose token signs the request.
Only the current access token signs: a URL signed before a server restart (whose tokens
survive only as digests) must be made again after ``connect``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time
from collections.abc import Callable, Iterable
from typing import Literal

from harness.core.errors import ErrorCode
from harness.doors.e2b.boxes import E2bSandbox
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.rpc import HttpRequest

__all__ = ["Operation", "check_signed", "is_signed", "signature", "signed_sandbox"]

Operation = Literal["read", "write"]
_PREFIX = "v1_"


def signature(path: str, operation: Operation, username: str, token: str, expiration: int | None) -> str:
    """The signature of a file URL, as the SDK computes it and envd checks it."""
    fields = [path, operation, username, token] + ([str(expiration)] if expiration is not None else [])
    digest = hashlib.sha256(":".join(fields).encode()).digest()
    return _PREFIX + base64.b64encode(digest).rstrip(b"=").decode("ascii")


def is_signed(request: HttpRequest) -> bool:
    """Whether the request carries a ``signature`` query parameter."""
    return request.first("signature") is not None


def _expiration(request: HttpRequest) -> int | None:
    text = request.first("signature_expiration")
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise invalid(f"signature_expiration {text!r} is not a Unix time in whole seconds") from None


def _refused(words: str, advice: str) -> E2bError:
    return E2bError(ErrorCode.UNAUTHENTICATED, f"{words}: {advice}", status=401)


def _matches(request: HttpRequest, operation: Operation, token: str) -> bool:
    given = request.first("signature") or ""
    expected = signature(request.first("path") or "", operation, request.first("username") or "", token,
                         _expiration(request))
    return hmac.compare_digest(expected.encode(), given.encode())


def check_signed(request: HttpRequest, operation: Operation, sandbox: E2bSandbox,
                 now: Callable[[], float] = time.time) -> None:
    """Refuse (401) a ``/files`` request without the access token whose URL is not signed for
    ``operation`` on ``sandbox`` by its access token, or whose signature has expired."""
    if not is_signed(request):
        raise _refused("missing signature query parameter",
                       "send the X-Access-Token header, or use a URL from sandbox.download_url()/upload_url()")
    if not _matches(request, operation, sandbox.access_token):
        maker = "download_url" if operation == "read" else "upload_url"
        raise _refused("invalid signature",
                       f"this URL is not signed for {operation} of its path and user in sandbox "
                       f"{sandbox.sandbox_id}; use the URL from sandbox.{maker}() unchanged (after a server "
                       "restart, connect and make it again)")
    expiration = _expiration(request)
    if expiration is not None and expiration < int(now()):
        raise _refused("signature is already expired",
                       f"this URL expired at Unix time {expiration}; make a new one (use_signature_expiration)")


def signed_sandbox(request: HttpRequest, operation: Operation, sandboxes: Iterable[E2bSandbox]) -> E2bSandbox:
    """The sandbox whose access token signs ``request`` (a signed URL sent without the
    ``E2b-Sandbox-Id`` header); 401 when none does."""
    if is_signed(request):
        for sandbox in sandboxes:
            if _matches(request, operation, sandbox.access_token):
                return sandbox
    raise _refused("invalid signature",
                   "this URL is signed by no running sandbox of this server (it was changed, its sandbox "
                   "is gone, or it was made before a server restart); send the E2b-Sandbox-Id and X-Access-Token "
                   "headers, or use a fresh URL from sandbox.download_url()/upload_url()")
