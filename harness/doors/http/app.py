"""The HTTP endpoint's routes: ``/metrics``, ``/healthz``, the login, and the console's pages
and actions (see :mod:`harness.doors.http` for what each does and who may use it).

Pages and actions are server-rendered with no script. A page asked for without a valid token
is 401 with the login form; an action (``POST``) is refused 403 when another site started it,
401 without a valid token, 403 without the session's CSRF token (see
:mod:`harness.doors.http.auth`). Every response carries headers that keep the pages from
being framed, sniffed, cached or given any resource but their own stylesheet.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from importlib import resources
from string import Template
from typing import Any
from urllib.parse import parse_qs, quote

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from harness.core.errors import CallboxError, ErrorCode
from harness.doors.http import browse_pages, pages, sandbox_pages, undo_pages
from harness.doors.http.audit_export import export_endpoint
from harness.doors.http.auth import (
    Caller,
    Sessions,
    caller_of,
    clear_cookie,
    cross_site_refusal,
    csrf_valid,
    set_cookie,
)
from harness.doors.http.console import PAGE_SIZE, Console, ConsoleError
from harness.doors.http.console_undo import ConsoleUndo
from harness.doors.http.live_view import ControlDesk, relay_vnc
from harness.doors.http.novnc_files import NovncError, NovncFiles
from harness.doors.http.overview import REFRESH_S, overview_page
from harness.doors.mcp.http import _is_loopback
from harness.telemetry.metrics import exposition
from harness.telemetry.samples import GaugeSample

__all__ = ["FORM_MAX_BYTES", "console_app"]

log = logging.getLogger("callbox.http")

FORM_MAX_BYTES = 64 * 1024
"""The largest form body accepted (a denial's reason is the longest field)."""
LIVE_VIEW_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                 "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
"""The live view's page runs noVNC (served here) and opens a WebSocket back to this console."""
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    # "no-referrer" would make Chromium send "Origin: null" with the console's own forms.
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}
WWW_AUTHENTICATE = 'Bearer realm="callbox console"'


class _Refused(Exception):
    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _Frame:
    """An ASGI wrapper: the security headers on every response and, for a console on a
    loopback address, 421 for a request whose ``Host`` is not a loopback name (a page of
    another site reaching it by DNS rebinding)."""

    def __init__(self, app: ASGIApp, *, loopback: bool) -> None:
        self.app = app
        self.loopback = loopback

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            if self.loopback and not _loopback_host(_header(scope, b"host")):
                await send({"type": "websocket.close", "code": 1008})  # before accepting: HTTP 403
                return
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.loopback and not _loopback_host(_header(scope, b"host")):
            response = PlainTextResponse("this console answers only to a loopback host name (127.0.0.1, "
                                         "localhost, [::1])", status_code=421)
            await response(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers") or ():
        if key == name:
            return bytes(value).decode("latin-1")
    return ""


def _loopback_host(host: str) -> bool:
    text = host.strip().lower()
    if text.startswith("["):
        name = text[1:text.find("]")] if "]" in text else text
    else:
        name = text.rpartition(":")[0] if ":" in text else text
    return _is_loopback(name)


def _safe_next(path: str | None) -> str:
    """Where the login goes on to: a path of this console, else ``/``."""
    if not path or not path.startswith("/") or path.startswith("//") or "\\" in path or len(path) > 2048:
        return "/"
    return path


async def _form(request: Request) -> dict[str, str]:
    """The request's url-encoded form (first value of each field); _Refused for anything else."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > FORM_MAX_BYTES:
            raise _Refused(413, f"the form is larger than {FORM_MAX_BYTES} bytes")
    if not body:
        return {}
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "application/x-www-form-urlencoded":
        raise _Refused(415, "send the form as application/x-www-form-urlencoded")
    try:
        parsed = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True, max_num_fields=20)
    except ValueError:
        raise _Refused(400, "the form has too many fields") from None
    return {key: values[0] for key, values in parsed.items()}


def console_app(console: Console, sessions: Sessions, *, engine_ping: Callable[[], None], tls: bool,
                loopback: bool, samples: Callable[[], list[GaugeSample]] = list,
                novnc: NovncFiles | None = None) -> ASGIApp:
    """The ASGI app of the HTTP endpoint (see the module docstring); ``samples`` gives the
    sampled gauges the overview charts (none: an empty chart); ``novnc``, noVNC's files for
    the live view (default: read from each sandbox's image through the Docker engine)."""
    css = resources.files("harness").joinpath("data/console.css").read_bytes()
    live_js = resources.files("harness").joinpath("data/liveview.js").read_bytes()
    desk = ControlDesk(console.audit)
    undoing = ConsoleUndo(console.audit, console.executor)
    novnc_files = novnc if novnc is not None else NovncFiles()

    # ---- no token ------------------------------------------------------------------------------------

    async def metrics(_request: Request) -> Response:
        data, content_type = await run_in_threadpool(exposition)
        return Response(data, headers={"content-type": content_type})

    async def healthz(_request: Request) -> Response:
        try:
            await run_in_threadpool(engine_ping)
        except CallboxError as error:
            return _json({"status": "unavailable", "engine": error.message}, 503)
        except Exception as error:  # a ping that fails in a way of its own is still an unhealthy engine
            return _json({"status": "unavailable", "engine": f"{type(error).__name__}: {error}"}, 503)
        return _json({"status": "ok", "engine": "reachable"}, 200)

    async def stylesheet(_request: Request) -> Response:
        return Response(css, media_type="text/css", headers={"cache-control": "max-age=300"})

    async def live_script(_request: Request) -> Response:
        return Response(live_js, media_type="text/javascript", headers={"cache-control": "max-age=300"})

    # ---- logging in and out ----------------------------------------------------------------------------

    async def login_form(request: Request) -> Response:
        next_path = _safe_next(request.query_params.get("next"))
        if caller_of(request, sessions) is not None:
            return RedirectResponse(next_path, status_code=303)
        return HTMLResponse(pages.login_page(next_path=next_path))

    async def login(request: Request) -> Response:
        try:
            _refuse_cross_site(request)
            form = await _form(request)
        except _Refused as refused:
            return PlainTextResponse(refused.text, status_code=refused.status)
        next_path = _safe_next(form.get("next"))
        session = sessions.login(form.get("token", ""))
        if session is None:
            return HTMLResponse(pages.login_page(error="That token is not one of this server's tokens.",
                                                 next_path=next_path), status_code=401,
                                headers={"www-authenticate": WWW_AUTHENTICATE})
        log.info("console: client %s logged in", session.client)
        response = RedirectResponse(next_path, status_code=303)
        set_cookie(response, session, secure=tls, ttl_s=sessions.ttl_s)
        return response

    async def logout(request: Request) -> Response:
        try:
            caller = await _authorized_post(request)
        except _Refused as refused:
            return PlainTextResponse(refused.text, status_code=refused.status)
        if caller[0].session is not None:
            sessions.logout(caller[0].session.id)
        response = RedirectResponse("/login", status_code=303)
        clear_cookie(response, secure=tls)
        return response

    # ---- pages -----------------------------------------------------------------------------------------

    def page(key: str, title: str, render: Callable[[Request, Caller], pages.Html], *, refresh_s: int | None = None,
             csp: str | None = None) -> Callable[[Request], Awaitable[Response]]:
        def rendered(request: Request, caller: Caller) -> tuple[pages.Html, int, int | None]:
            try:
                body, status = render(request, caller), 200
            except ConsoleError as error:
                body, status = pages.not_found_page(error.message), error.status
            except CallboxError as error:
                body, status = pages.not_found_page(f"the console could not read this: {error.message}"), 503
            try:
                pending: int | None = console.pending_count(viewer=caller.viewer)
            except CallboxError:
                pending = None
            return body, status, pending

        async def endpoint(request: Request) -> Response:
            caller = caller_of(request, sessions)
            if caller is None:
                return _login_needed(request)
            body, status, pending = await run_in_threadpool(rendered, request, caller)
            notes = caller.session.take_notes() if caller.session is not None else []
            csrf = caller.session.csrf if caller.session is not None else None
            html = pages.page(title if status == 200 else "Not available", body, active=key, client=caller.client,
                              csrf=csrf, notes=notes, operator=caller.operator, pending=pending,
                              refresh_s=refresh_s if status == 200 else None)
            return HTMLResponse(html, status_code=status,
                                headers={"content-security-policy": csp} if csp is not None and status == 200 else None)

        return endpoint

    def approvals(_request: Request, caller: Caller) -> pages.Html:
        items, total = console.pending(viewer=caller.viewer)
        return pages.approvals_page(items, total, csrf=_csrf(caller), actions=caller.operator)

    def sandboxes(_request: Request, caller: Caller) -> pages.Html:
        return sandbox_pages.sandboxes_page(
            console.sandboxes(viewer=caller.viewer), pool=console.pool() if caller.operator else None,
            quotas=console.quotas(viewer=caller.viewer), actions=caller.operator)

    def kill_confirm(request: Request, caller: Caller) -> pages.Html:
        if not caller.operator:
            raise ConsoleError(_client_refusal(caller), ErrorCode.PERMISSION_DENIED)
        box = console.sandbox(request.path_params["sandbox_id"])
        return sandbox_pages.kill_confirm_page(box, csrf=_csrf(caller))

    def runs(request: Request, caller: Caller) -> pages.Html:
        filters, number = browse_pages.filters_of(request.query_params, states=browse_pages.RUN_STATES)
        found, total = console.runs(filters, number, viewer=caller.viewer)
        listing = browse_pages.Listing(total, number, PAGE_SIZE, filters)
        return browse_pages.runs_page(found, listing, console.live(), operator_view=caller.viewer is None)

    def history(request: Request, caller: Caller) -> pages.Html:
        filters, number = browse_pages.filters_of(request.query_params, states=browse_pages.DECISIONS)
        found, total = console.history(filters, number, viewer=caller.viewer)
        listing = browse_pages.Listing(total, number, PAGE_SIZE, filters)
        return browse_pages.history_page(found, listing, operator_view=caller.viewer is None)

    def overview(_request: Request, caller: Caller) -> pages.Html:
        since = time.time() - 3600
        calls, egress_points = console.activity(since, viewer=caller.viewer)
        boxes = console.live_count(viewer=caller.viewer)
        pool = console.pool() if caller.operator else None
        return overview_page(pending=console.pending_count(viewer=caller.viewer), live=boxes,
                             pooled=pool.ready if pool is not None else None, calls=calls, egress=egress_points,
                             samples=samples(), viewer=caller.viewer)

    def run(request: Request, caller: Caller) -> pages.Html:
        run_id = request.path_params["run_id"]
        record, calls, approvals_of_run = console.run(run_id, viewer=caller.viewer)
        title = pages.fill(Template('<p class="run-id"><code>$id</code></p>\n'), id=record.id)
        changes = undo_pages.changes_part(record.id, undoing.view(record), operator=caller.operator, csrf=_csrf(caller))
        return pages.join([title, pages.run_page(record, calls, approvals_of_run, live=record.id in console.live()),
                           changes])

    async def picture(request: Request) -> Response:
        """A picture a call of the run returned, for the ``<img>`` of the run's page (the
        caller must be allowed to see the run)."""
        caller = caller_of(request, sessions)
        if caller is None:
            return PlainTextResponse("log in at /login to see this picture", status_code=401,
                                     headers={"www-authenticate": WWW_AUTHENTICATE})
        try:
            media_type, data = await run_in_threadpool(
                console.run_image, request.path_params["run_id"], request.path_params["digest"],
                viewer=caller.viewer)
        except ConsoleError as error:
            return PlainTextResponse(error.message, status_code=error.status)
        return Response(data, media_type=media_type, headers={
            "cache-control": "private, max-age=3600", "x-content-type-options": "nosniff",
            "content-security-policy": "default-src 'none'"})

    # ---- the live view (see harness.doors.http.live_view) -------------------------------------------------

    def live_view(request: Request, caller: Caller) -> pages.Html:
        sandbox_id = request.path_params["sandbox_id"]
        box = console.sandbox(sandbox_id, viewer=caller.viewer)
        console.desktop_tunnel(sandbox_id, viewer=caller.viewer).close()  # no VNC server: say why, here
        desk.forget(set(console.executor.live_sandboxes()) if console.executor is not None else set())
        holder = desk.holder(sandbox_id)
        return sandbox_pages.live_view_page(
            box, holder=holder.client if holder is not None else None, operator=caller.operator, csrf=_csrf(caller),
            in_control=caller.operator and desk.in_control(sandbox_id, _holder_key(caller)))

    async def novnc_file(request: Request) -> Response:
        """One of noVNC's files, from the image of a sandbox the caller may see."""
        caller = caller_of(request, sessions)
        if caller is None:
            return PlainTextResponse("log in at /login to see this", status_code=401,
                                     headers={"www-authenticate": WWW_AUTHENTICATE})
        path = request.path_params["path"]
        try:
            image = await run_in_threadpool(console.sandbox_image, request.path_params["sandbox_id"],
                                            viewer=caller.viewer)
            found = await run_in_threadpool(novnc_files.file, image, path)
        except ConsoleError as error:
            return PlainTextResponse(error.message, status_code=error.status)
        except NovncError as error:
            return PlainTextResponse(str(error), status_code=503)
        if found is None:
            return PlainTextResponse(f"noVNC has no file {path} that the live view serves", status_code=404)
        data, media_type = found
        return Response(data, media_type=media_type, headers={"cache-control": "private, max-age=3600"})

    async def vnc(websocket: WebSocket) -> None:
        """The live view's WebSocket: refused (HTTP 403) from another site, without a token, or
        for a sandbox the caller may not see or that has no VNC server; else relayed."""
        caller = caller_of(websocket, sessions)
        refusal = cross_site_refusal(websocket)
        sandbox_id = websocket.path_params["sandbox_id"]
        if refusal is not None or caller is None:
            log.warning("console: live view of %s refused: %s", sandbox_id, refusal or "no valid token")
            await websocket.close(code=1008)
            return
        try:
            tunnel = await run_in_threadpool(console.desktop_tunnel, sandbox_id, viewer=caller.viewer)
        except CallboxError as error:
            log.info("console: live view of %s for %s refused: %s", sandbox_id, caller.client, error.message)
            await websocket.close(code=1008)
            return
        key = _holder_key(caller)

        def may_send_input() -> bool:
            """Asked at each input message: this login holds control, and is still an operator's."""
            if not desk.in_control(sandbox_id, key):
                return False
            if caller.session is not None and sessions.get(caller.session.id) is None:
                return False  # logged out, expired, or its token removed
            return sessions.tokens.is_operator(caller.client)

        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol="binary" if "binary" in offered else None)
        await relay_vnc(websocket, tunnel, may_send_input)

    def egress(request: Request, caller: Caller) -> pages.Html:
        filters, number = browse_pages.filters_of(request.query_params)
        found, total = console.egress(filters, number, viewer=caller.viewer)
        listing = browse_pages.Listing(total, number, PAGE_SIZE, filters)
        return browse_pages.egress_page(found, listing, operator_view=caller.viewer is None)

    # ---- actions ---------------------------------------------------------------------------------------

    async def _authorized_post(request: Request) -> tuple[Caller, dict[str, str]]:
        _refuse_cross_site(request)
        caller = caller_of(request, sessions)
        if caller is None:
            raise _Refused(401, "this request carries no valid token: send 'Authorization: Bearer TOKEN' "
                                "(a token of the server's token file) or log in at /login")
        form = await _form(request)
        if not csrf_valid(caller, form.get("csrf")):
            raise _Refused(403, "this form has no valid CSRF token; reload the page and submit it again")
        return caller, form

    def action(back: str | Callable[[Request], str], do: Callable[[Request, Caller, dict[str, str]], str]
               ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            back_to = back(request) if callable(back) else back
            try:
                caller, form = await _authorized_post(request)
            except _Refused as refused:
                headers = {"www-authenticate": WWW_AUTHENTICATE} if refused.status == 401 else None
                return PlainTextResponse(refused.text, status_code=refused.status, headers=headers)
            try:
                if not caller.operator:
                    log.warning("console: client %s was refused an operator's action (%s %s)", caller.client,
                                request.method, request.url.path)
                    raise _Refused(403, _client_refusal(caller))
                done = await run_in_threadpool(do, request, caller, form)
            except (ConsoleError, _Refused) as error:
                status = error.status
                text = error.message if isinstance(error, ConsoleError) else error.text
                if caller.session is None:
                    return PlainTextResponse(text, status_code=status)
                caller.session.note("error", text)
                return RedirectResponse(back_to, status_code=303)
            log.info("console: %s: %s", caller.client, done)
            if caller.session is None:
                return PlainTextResponse(done)
            caller.session.note("ok", done)
            return RedirectResponse(back_to, status_code=303)

        return endpoint

    def resolve(request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        decision = form.get("decision")
        if decision not in ("approve", "approve-sandbox", "deny"):
            raise _Refused(400, "the form's decision must be approve, approve-sandbox (egress) or deny")
        _, done = console.resolve(request.path_params["approval_id"], decision != "deny", client=caller.client,
                                  reason=form.get("reason"), scope="sandbox" if decision == "approve-sandbox" else None)
        return done

    def kill(request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        sandbox_id = request.path_params["sandbox_id"]
        if form.get("confirm") != sandbox_id:
            raise _Refused(400, f"a kill is confirmed: send confirm={sandbox_id} with it (the console's "
                                f"confirmation page at /sandboxes/{sandbox_id}/kill does)")
        return console.kill(sandbox_id, client=caller.client)

    def control(request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        sandbox_id = request.path_params["sandbox_id"]
        console.sandbox(sandbox_id)
        key = _holder_key(caller)
        if form.get("control") == "take":
            return desk.take(sandbox_id, key=key, client=caller.client)
        if form.get("control") == "give":
            return desk.give_back(sandbox_id, key=key, client=caller.client)
        raise _Refused(400, "the form's control must be take (take over the mouse and keyboard) or give (give "
                            "them back)")

    def revert(request: Request, caller: Caller, form: Mapping[str, str]) -> str:
        return undoing.revert(request.path_params["run_id"], form.get("to", ""), client=caller.client,
                              mounts_only=form.get("mounts_only") == "yes")

    def changes_of(request: Request) -> str:
        return f"/runs/{quote(request.path_params['run_id'], safe='')}#changes"

    def view_of(request: Request) -> str:
        return f"/sandboxes/{quote(request.path_params['sandbox_id'], safe='')}/view"

    routes = [
        Route("/metrics", metrics, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/static/console.css", stylesheet, methods=["GET"]),
        Route("/static/liveview.js", live_script, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/logout", logout, methods=["POST"]),
        Route("/", page("approvals", "Pending approvals", approvals), methods=["GET"]),
        Route("/overview", page("overview", "Overview", overview, refresh_s=REFRESH_S), methods=["GET"]),
        Route("/history", page("history", "Resolved approvals", history), methods=["GET"]),
        Route("/sandboxes", page("sandboxes", "Sandboxes", sandboxes), methods=["GET"]),
        Route("/sandboxes/{sandbox_id:path}/kill", page("sandboxes", "Kill a sandbox?", kill_confirm),
              methods=["GET"]),
        Route("/sandboxes/{sandbox_id}/view", page("sandboxes", "Live view", live_view, csp=LIVE_VIEW_CSP),
              methods=["GET"]),
        Route("/sandboxes/{sandbox_id}/novnc/{path:path}", novnc_file, methods=["GET"]),
        Route("/sandboxes/{sandbox_id}/control", action(view_of, control), methods=["POST"]),
        WebSocketRoute("/sandboxes/{sandbox_id}/vnc", vnc),
        Route("/runs", page("runs", "Runs", runs), methods=["GET"]),
        Route("/runs/{run_id}/images/{digest}", picture, methods=["GET"]),
        Route("/runs/{run_id}/revert", action(changes_of, revert), methods=["POST"]),
        Route("/runs/{run_id:path}", page("runs", "Run", run), methods=["GET"]),
        Route("/egress", page("egress", "Egress log", egress), methods=["GET"]),
        Route("/approvals/{approval_id}/resolve", action("/", resolve), methods=["POST"]),
        Route("/sandboxes/{sandbox_id:path}/kill", action("/sandboxes", kill), methods=["POST"]),
        # the audit chain as JSON lines: an operator's of any client, a client's of its own
        Route("/audit/export", export_endpoint(sessions, console.audit.path, www_authenticate=WWW_AUTHENTICATE),
              methods=["GET"]),
    ]
    return _Frame(Starlette(routes=routes), loopback=loopback)


def _refuse_cross_site(request: Request) -> None:
    reason = cross_site_refusal(request)
    if reason is not None:
        raise _Refused(403, reason)


def _client_refusal(caller: Caller) -> str:
    return (f"this action is an operator's, and {caller.client!r} is a client token: a client sees its own work "
            "here read-only and resolves no approval, not even of its own calls; a person logs in with a "
            "token-file line ending in ' operator'")


def _holder_key(caller: Caller) -> str:
    """Who holds a take-over: the login session (another tab of it too), or a bearer token's client."""
    return caller.session.id if caller.session is not None else f"bearer:{caller.client}"


def _csrf(caller: Caller) -> str | None:
    return caller.session.csrf if caller.session is not None else None


def _login_needed(request: Request) -> Response:
    """401 with the login form, which comes back to this page."""
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return HTMLResponse(pages.login_page(next_path=_safe_next(target)), status_code=401,
                        headers={"www-authenticate": WWW_AUTHENTICATE})


def _json(value: Any, status: int) -> Response:
    return Response(json.dumps(value) + "\n", status_code=status, media_type="application/json")
