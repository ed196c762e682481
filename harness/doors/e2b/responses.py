"""The E2B door's plain-HTTP error answers, shared by its router and its port proxy."""

from __future__ import annotations

import json

from harness.doors.e2b.bridge import Exchange
from harness.doors.e2b.errors import E2bError

__all__ = ["CutOff", "http_refusal", "rest_error"]


def rest_error(error: E2bError) -> tuple[int, list[tuple[str, str]], bytes]:
    """The status, headers and JSON body (``{"code": ..., "message": ...}``) of ``error``."""
    body = json.dumps(error.rest_body(), separators=(",", ":")).encode()
    return error.status, [("content-type", "application/json"), *error.headers()], body


class CutOff(Exception):
    """A streamed response body failed after its head was sent: the connection must close
    without the body's end (raised out of the app, uvicorn closes it)."""


async def http_refusal(exchange: Exchange, error: E2bError) -> None:
    """Answer ``exchange`` with ``error`` unless its answer has begun (or it has ended)."""
    if exchange.ended is None and not exchange.started:
        await exchange.respond(*rest_error(error))
