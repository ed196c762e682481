"""``GET /audit/export?client=NAME&since=T``: the audit chain as JSON lines over the HTTP
endpoint (:mod:`harness.audit.chain_export`, the same lines as ``callbox audit export``).

Who gets what:

* an **operator** gets every client's entries, or one client's with ``client=NAME``;
* a **client** gets its own runs' entries only. Without ``client``, or with its own name,
  that is what it gets; naming another client is refused (403), so that a client never
  takes another's empty answer for "nothing happened there".

``since`` is epoch seconds or ISO 8601 (UTC without a zone). The caller authenticates as for
the console (a bearer token, or the console's login cookie).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse

from harness.audit.chain_export import export_lines, parse_since
from harness.core.errors import CallboxError, ErrorCode
from harness.doors.http.auth import Sessions, caller_of

__all__ = ["MEDIA_TYPE", "export_endpoint"]

log = logging.getLogger("callbox.http")

MEDIA_TYPE = "application/x-ndjson"


def export_endpoint(sessions: Sessions, audit_path: Path, *, www_authenticate: str
                    ) -> Callable[[Request], Awaitable[Response]]:
    """The endpoint of ``GET /audit/export`` over the audit database at ``audit_path``."""

    async def endpoint(request: Request) -> Response:
        caller = caller_of(request, sessions)
        if caller is None:
            return PlainTextResponse("this request carries no valid token: send 'Authorization: Bearer TOKEN' (a "
                                     "token of the server's token file) or log in at /login", status_code=401,
                                     headers={"www-authenticate": www_authenticate})
        asked = request.query_params.get("client") or None
        if caller.operator:
            client = asked
        elif asked is not None and asked != caller.client:
            log.warning("audit export: client %s asked for client %s's records and was refused", caller.client,
                        asked)
            return PlainTextResponse(f"{caller.client!r} is a client token: it exports its own records only, not "
                                     f"{asked!r}'s; leave client out, or ask an operator", status_code=403)
        else:
            client = caller.client
        since_text = request.query_params.get("since")
        try:
            since = parse_since(since_text) if since_text else None
            lines = await run_in_threadpool(export_lines, audit_path, client=client, since=since)
        except CallboxError as error:
            status = 400 if error.code is ErrorCode.INVALID_REQUEST else 503
            return PlainTextResponse(error.message, status_code=status)
        log.info("audit export: %s exported %s%s", caller.client,
                 "every client's records" if client is None else f"client {client}'s records",
                 f" since {since_text}" if since_text else "")
        name = f"callbox-audit-{client or 'all'}.jsonl"
        return StreamingResponse(lines, media_type=MEDIA_TYPE,
                                 headers={"content-disposition": f'attachment; filename="{name}"'})

    return endpoint
