"""The E2B door's ASGI app: the control plane's REST API and every sandbox's envd on one port.

How a request is routed (the e2b SDK sends both kinds to the same URL when
``E2B_API_URL`` and ``E2B_SANDBOX_URL`` name this server):

* **Control plane**: a request without an ``E2b-Sandbox-Id`` header. It matches a REST route
  (HTTP method and path template, ``/sandboxes/{sandboxID}``) and must carry ``X-API-KEY``, a
  token of the server's :class:`~harness.doors.grpc.tokens.TokenSet`; the token's client name
  is who acts. A missing or unknown key is 401 ``{"code": 401, "message": ...}``.
* **envd**: a request with ``E2b-Sandbox-Id``. Its ``X-Access-Token`` must be that sandbox's
  (:meth:`~harness.doors.e2b.boxes.E2bSandboxes.for_envd`); only ``GET /health`` answers
  without one. A sandbox that does not exist (killed, expired) is answered as E2B's proxy
  answers it, 502 with a message saying it "was not found", so the SDK raises
  ``SandboxNotRunningException`` and ``is_running()`` is False. ``Authorization: Basic base64(USER:)`` names the
  user to act as (:attr:`~harness.doors.e2b.rpc.EnvdCall.user`). Then ``POST
  /SERVICE/METHOD`` of a served service is a Connect call (:mod:`harness.doors.e2b.connect`);
  anything else must match an envd HTTP route (``/files``, ``/health``).
  A request to a paused sandbox (but ``/health``) resumes it first if its lifecycle says
  ``auto_resume``, else is refused as E2B's proxy refuses it (:mod:`harness.doors.e2b.lifecycle`).
* **A sandbox port**: a request naming a port other than envd's, by ``E2b-Sandbox-Port`` or by
  a host name ``PORT-SANDBOXID.DOMAIN`` (``get_host(port)``), and every WebSocket upgrade, go
  to that port in the sandbox (:mod:`harness.doors.e2b.ports`). A host name
  ``49983-SANDBOXID.DOMAIN`` is envd's, as if it carried ``E2b-Sandbox-Id``.
* Anything else is 404, with a JSON body naming the method and path.

Each client is sure of ``share`` long requests in flight at once (sandbox creates, envd
streams and file transfers; a quarter of the workers by default); past it, it is served while a
share of the workers stays free for the others, so one client's streams cannot hold every
worker; one more is 429 with ``Retry-After`` (:mod:`harness.doors.quota_ledger`). Creates
beyond what the host starts at once wait in line (:mod:`harness.doors.start_queue`). Quick requests are always served.

Handlers run on a pool of worker threads (:mod:`harness.doors.e2b.bridge` carries bodies and
streams between them and the event loop with bounded queues). A request body reaches a plain
HTTP handler in chunks as they arrive; a response body may be an iterator, streamed as it
yields. When the client goes away, or the server shuts down, the call's
:class:`~harness.engine.cancel.CallScope` is cancelled and the handler's iterator is no
longer read (its thread closes it). A streamed response body whose iterator fails after the
head was sent is cut off (the connection is closed without the body's end), so the client
sees a failed transfer, never a short one.

Requests are logged at debug level (method, path, status, time), never their headers:
they carry API keys and access tokens.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import unquote

from harness.core.errors import ErrorCode
from harness.doors.e2b.boxes import DOOR, E2bSandbox, E2bSandboxes
from harness.doors.e2b.bridge import STOPPED, ClientGone, Done, Exchange, OutputChannel, Receive, Scope, Send
from harness.doors.e2b.connect import as_error, connect_error_response, read_head, serve_call
from harness.doors.e2b.errors import E2bError, from_quota
from harness.doors.e2b.interpreter import install as install_interpreter
from harness.doors.e2b.port_targets import port_target
from harness.doors.e2b.ports import PortProxy
from harness.doors.e2b.responses import CutOff, http_refusal, rest_error
from harness.doors.e2b.rpc import EnvdCall, EnvdRoute, HttpRequest, HttpResponse, Method, RestRoute, Service
from harness.doors.e2b.signing import check_signed, signed_sandbox
from harness.doors.e2b.templates import UPLOAD_PREFIX
from harness.doors.grpc.tokens import TokenSet
from harness.doors.quota_ledger import QuotaExceeded
from harness.engine.cancel import current_scope
from harness.telemetry import tracing

__all__ = ["ENVD_PORT", "E2bApp", "envd_user"]

log = logging.getLogger("callbox.e2b")

ENVD_PORT = "49983"
"""The port envd listens on in an E2B sandbox (the SDK's ``E2b-Sandbox-Port``)."""
HEALTH_PATH = "/health"
FILES_PATH = "/files"
_CREATES = frozenset({"/sandboxes", "/v2/sandboxes"})
"""The control plane's routes (POST) that start a sandbox: long requests, counted in a share."""

H = TypeVar("H")


@dataclass(frozen=True)
class _Route(Generic[H]):
    method: str
    template: str
    parts: tuple[str, ...]
    handler: H

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.parts):
            return None
        params: dict[str, str] = {}
        for part, segment in zip(self.parts, segments, strict=True):
            if part.startswith("{") and part.endswith("}"):
                if not segment:
                    return None
                params[part[1:-1]] = segment
            elif part != segment:
                return None
        return params


class _Router(Generic[H]):
    """Routes by HTTP method and path template; ``find`` returns the route and its parameters,
    or the methods the path allows (empty: no route has that path)."""

    def __init__(self, routes: Iterable[tuple[str, str, H]]) -> None:
        self.routes = [_Route(method.upper(), template, tuple(template.strip("/").split("/")), handler)
                       for method, template, handler in routes]

    def find(self, method: str, segments: list[str]) -> tuple[_Route[H], dict[str, str]] | list[str]:
        allowed: list[str] = []
        for route in self.routes:
            params = route.match(segments)
            if params is None:
                continue
            if route.method == method:
                return route, params
            allowed.append(route.method)
        return allowed


def _segments(raw_path: bytes) -> list[str]:
    """The path's segments, each percent-decoded (an encoded ``/`` stays inside its segment)."""
    return [unquote(part) for part in raw_path.decode("latin-1").split("?")[0].strip("/").split("/")]


def _query_only(exchange: Exchange) -> HttpRequest:
    """The request line and headers of ``exchange`` (its body left unread)."""
    return HttpRequest(method=exchange.method, path=exchange.path, query=exchange.query, headers=exchange.headers,
                       body=iter(()))


def envd_user(headers: Mapping[str, str]) -> str | None:
    """The user of ``Authorization: Basic base64(USER:)``, or None (no header, or no user)."""
    value = headers.get("authorization")
    if value is None:
        return None
    scheme, _, credentials = value.strip().partition(" ")
    if scheme.lower() != "basic":
        raise E2bError(ErrorCode.INVALID_REQUEST,
            "envd's Authorization header is Basic base64(USER:), naming the user to "
                                           f"act as; this one is {scheme or 'empty'!r}")
    try:
        decoded = base64.b64decode(credentials.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise E2bError(ErrorCode.INVALID_REQUEST,
                       "envd's Authorization header is Basic base64(USER:); this one is not valid base64 of UTF-8 text"
                       ) from None
    user = decoded.partition(":")[0]
    return user or None


class E2bApp:
    """The ASGI app; see the module docstring. ``shutdown`` ends every request in flight."""

    def __init__(self, *, tokens: TokenSet, sandboxes: E2bSandboxes, services: Iterable[Service],
                 rest_routes: Iterable[RestRoute], envd_routes: Iterable[EnvdRoute], pool: Any,
                 share: int | None = None, capacity: int | None = None,
                 ports: PortProxy | None = None) -> None:
        self.tokens = tokens
        self.share = share
        """How many requests one client is sure to have in flight at once (None: no bound)."""
        self.capacity = capacity
        """The door's workers: past its share, a client is served while a share of them stays free."""
        self.sandboxes = sandboxes
        self.services: dict[str, Service] = {service.name: service for service in services}
        self.rest = _Router(rest_routes)
        self.envd = _Router(envd_routes)
        self.pool = pool
        self.ports = ports if ports is not None else PortProxy(sandboxes, tokens)
        if ports is None and isinstance(sandboxes, E2bSandboxes):  # e2b_code_interpreter's template and port 49999
            install_interpreter(sandboxes, self.ports.filters)
        """Requests to a sandbox port other than envd's (:mod:`harness.doors.e2b.ports`)."""
        self._lock = threading.Lock()
        self._active: set[Exchange] = set()
        self._closing = False

    # ---- lifetime ------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """From any thread: refuse new requests and end those in flight (their scopes
        cancelled, their streams ended with ``unavailable``)."""
        with self._lock:
            self._closing = True
            active = list(self._active)
        for exchange in active:
            exchange.abort()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # ---- ASGI ----------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            if not self._closing:
                await self.ports.serve_websocket(scope, receive, send, self.pool)
            return
        if scope["type"] != "http":
            return
        exchange = Exchange(scope, receive, send, self.pool)
        began = time.monotonic()
        with self._lock:
            closing = self._closing
            if not closing:
                self._active.add(exchange)
        try:
            if closing:
                await exchange.respond(*rest_error(E2bError(ErrorCode.SHUTTING_DOWN, "the server is shutting down")))
            else:
                # A span per request while tracing is on; a caller's traceparent header continues its trace.
                with tracing.request_span("callbox.e2b", exchange.headers, _span_attributes(exchange)):
                    await self._route(exchange)
        except ClientGone:
            pass
        finally:
            with self._lock:
                self._active.discard(exchange)
            await exchange.close()
            if log.isEnabledFor(logging.DEBUG):
                log.debug("%s %s -> %s in %.1f ms%s", exchange.method, exchange.path, exchange.status or "-",
                          (time.monotonic() - began) * 1000, f" ({exchange.ended})" if exchange.ended else "")

    async def _route(self, exchange: Exchange) -> None:
        headers = exchange.headers
        segments = _segments(exchange.raw_path)
        signed = exchange.path == FILES_PATH and not headers.get("x-access-token")
        try:
            target = port_target(headers)
        except E2bError as error:
            await http_refusal(exchange, error)
            return
        signed_id = None
        if target is None and signed and exchange.query.get("signature"):
            try:  # a signed file URL from a plain HTTP client: the signature names its sandbox
                signed_id = signed_sandbox(_query_only(exchange), "read" if exchange.method == "GET" else "write",
                                           self.sandboxes.every()).sandbox_id
            except E2bError as error:
                await http_refusal(exchange, error)
                return
        if target is None and signed_id is None:
            await self._serve_rest(exchange, segments)
            return
        if target is not None and str(target.port) != ENVD_PORT:
            owner = self.sandboxes.find(target.sandbox_id) or self.sandboxes.find_folded(target.sandbox_id)
            with self._fair(owner.client if owner is not None else "", counted=owner is not None) as refusal:
                if refusal is not None:
                    await http_refusal(exchange, refusal)
                else:
                    await self.ports.serve_http(exchange, target)
            return
        sandbox_id = target.sandbox_id if target is not None else signed_id
        assert sandbox_id is not None
        if target is not None and target.by_host and self.sandboxes.find(sandbox_id) is None:
            # https://49983-ID.DOMAIN: the client lower-cased the id with the host name
            folded = self.sandboxes.find_folded(sandbox_id)
            sandbox_id = folded.sandbox_id if folded is not None else sandbox_id
        method = self._connect_method(exchange.method, segments)
        connect_like = method is not None or (len(segments) == 2 and "." in segments[0] and exchange.method == "POST")
        respond_error = _connect_refusal if connect_like else http_refusal
        found = None if connect_like else self.envd.find(exchange.method, segments)
        if connect_like and method is None:
            await respond_error(exchange, E2bError(ErrorCode.NOT_SUPPORTED, f"envd has no method {exchange.path}; this "
                                                   f"server serves {', '.join(sorted(self.services))}", status=404))
            return
        if isinstance(found, list):
            await respond_error(exchange, _no_route(exchange, found, "envd serves /files, /health and the Connect "
                                                    "services " + ", ".join(sorted(self.services))))
            return
        health = exchange.path == HEALTH_PATH
        try:
            sandbox = self._envd_sandbox(sandbox_id, headers, health=health, signed=signed)
            if signed:  # no access token: the URL's signature must be the sandbox's, before any handler runs
                check_signed(_query_only(exchange), "read" if exchange.method == "GET" else "write", sandbox)
            user = envd_user(headers)
            if not health:  # a paused sandbox: resumed if it auto-resumes (on a worker: it waits for the engine)
                await exchange.run(lambda: self.sandboxes.awake(sandbox))
        except E2bError as error:
            await respond_error(exchange, error)
            return
        if method is not None:
            try:
                head = read_head(method, exchange.method, headers)
            except E2bError as error:
                await respond_error(exchange, error)
                return
            call = EnvdCall(sandbox=sandbox, headers=headers, deadline=head.deadline, user=user)
            with self._fair(sandbox.client, counted=method.kind != "unary") as refusal:
                if refusal is not None:
                    await respond_error(exchange, refusal)
                else:
                    await serve_call(exchange, method, exchange.path, head, call)
            return
        assert found is not None
        route, params = found
        call = EnvdCall(sandbox=sandbox, headers=headers, user=user, signed=signed)
        handler = route.handler
        with self._fair(sandbox.client) as refusal:
            if refusal is not None:
                await respond_error(exchange, refusal)
            else:
                await self._serve_http(exchange, params, lambda request: handler(request, call), call)

    def _connect_method(self, http_method: str, segments: list[str]) -> Method | None:
        if len(segments) != 2:
            return None
        service = self.services.get(segments[0])
        return service.methods.get(segments[1]) if service is not None else None

    def _envd_sandbox(self, sandbox_id: str, headers: Mapping[str, str], *, health: bool,
                      signed: bool = False) -> E2bSandbox:
        token = headers.get("x-access-token")
        try:
            if (health or signed) and not token:  # signed: the caller checks the URL's signature
                sandbox = self._untokened(sandbox_id)
            else:
                sandbox = self.sandboxes.for_envd(sandbox_id, token)
        except E2bError as error:
            if error.error is not ErrorCode.NOT_FOUND:
                raise
            raise E2bError(ErrorCode.SANDBOX_UNAVAILABLE,
                f"sandbox {sandbox_id!r} was not found: it was killed, or its timeout "
                                          "passed", status=502) from None
        return sandbox

    def _untokened(self, sandbox_id: str) -> E2bSandbox:
        """The sandbox ``/health`` names when it carries no access token (health says only
        whether the sandbox runs)."""
        sandbox = self.sandboxes.find(sandbox_id)
        if sandbox is None:
            raise E2bError(ErrorCode.NOT_FOUND, f"sandbox {sandbox_id!r} not found")
        return sandbox

    async def _serve_rest(self, exchange: Exchange, segments: list[str]) -> None:
        found = self.rest.find(exchange.method, segments)
        if isinstance(found, list):
            await http_refusal(exchange, _no_route(exchange, found, "the control plane serves /sandboxes and "
                                                    "/v2/sandboxes; envd requests carry E2b-Sandbox-Id"))
            return
        route, params = found
        key = exchange.headers.get("x-api-key")
        # A template upload URL carries its own one-time permission (the SDK sends no key there).
        client = "" if route.template.startswith(UPLOAD_PREFIX) else self.tokens.lookup(key)
        if client is None:
            message = ("this request carries no X-API-KEY header; set E2B_API_KEY to a key of this server "
                       "(a token of its token file)" if not key else "the X-API-KEY is not a key of this server")
            await http_refusal(exchange, E2bError(ErrorCode.UNAUTHENTICATED, message))
            return
        handler = route.handler
        with self._fair(client, counted=route.method == "POST" and route.template in _CREATES) as refusal:
            if refusal is not None:
                await http_refusal(exchange, refusal)
            else:
                await self._serve_http(exchange, params, lambda request: handler(request, client), None)

    @contextlib.contextmanager
    def _fair(self, client: str, *, counted: bool = True) -> Iterator[E2bError | None]:
        """One of ``client``'s requests in flight, within its share of the door's workers
        (:mod:`harness.doors.quota_ledger`); yields the refusal (429) when it is over it.
        Quick requests (not ``counted``) are always served, so a client at its share can
        still kill a sandbox or a process."""
        if self.share is None or not counted:
            yield None
            return
        quotas = self.sandboxes.executor.quotas
        try:
            quotas.enter(client, door=DOOR, share=self.share, capacity=self.capacity)
        except QuotaExceeded as refusal:
            yield from_quota(refusal)
            return
        try:
            yield None
        finally:
            quotas.leave(client, door=DOOR)

    # ---- plain HTTP ----------------------------------------------------------------------------

    async def _serve_http(self, exchange: Exchange, params: dict[str, str],
                          handler: Callable[[HttpRequest], HttpResponse], call: EnvdCall | None) -> None:
        channel = exchange.stream_body()
        request = HttpRequest(method=exchange.method, path=exchange.path, query=exchange.query,
                              headers=exchange.headers, body=channel.chunks(), path_params=params)
        scope = call.scope if call is not None else None
        if scope is not None:
            exchange.on_end(scope.cancel)
        where = f"{exchange.method} {exchange.path}"

        def work() -> HttpResponse:
            with current_scope(scope) if scope is not None else contextlib.nullcontext():
                response = handler(request)
            if not isinstance(response, HttpResponse):
                raise TypeError(f"{where} returned {type(response).__name__}, not an HttpResponse")
            return response

        try:
            response = await exchange.run(work)
        except Exception as exc:
            await http_refusal(exchange, as_error(exc, where))
            return
        if exchange.ended is not None:
            _close(response.body)
            return
        if isinstance(response.body, bytes):
            head = [(k, v) for k, v in response.headers if k.lower() != "content-length"]
            await exchange.respond(response.status, head, response.body)
            return
        await self._stream_body(exchange, response, where, scope)

    async def _stream_body(self, exchange: Exchange, response: HttpResponse, where: str, scope: Any) -> None:
        out = OutputChannel(exchange.loop)
        exchange.on_end(out.stop)
        body = response.body

        def produce() -> None:
            error: BaseException | None = None
            try:
                with current_scope(scope) if scope is not None else contextlib.nullcontext():
                    try:
                        for chunk in body:
                            if not out.put(bytes(chunk)):
                                break
                    finally:
                        _close(body)
            except Exception as exc:
                error = exc
            out.done(error)

        exchange.run(produce)
        while True:
            item = await out.get()
            if item is STOPPED:
                if exchange.ended == "shutdown" and not exchange.started:
                    await http_refusal(exchange, E2bError(ErrorCode.SHUTTING_DOWN, "the server is shutting down"))
                elif exchange.started:
                    raise CutOff(f"{where}: the response body was cut off ({exchange.ended})")
                return
            if isinstance(item, Done):
                if item.error is None:
                    if not exchange.started:
                        await exchange.start(response.status, response.headers)
                    await exchange.finish()
                    return
                error = as_error(item.error, where)
                if not exchange.started:
                    await http_refusal(exchange, error)
                    return
                log.warning("%s: the response body failed after %s was sent, closing the connection: %s",
                            where, response.status, error.message)
                raise CutOff(f"{where}: the response body failed: {error.message}")
            assert isinstance(item, bytes)
            if not exchange.started:
                await exchange.start(response.status, response.headers)
            await exchange.write(item)


def _close(body: object) -> None:
    close = getattr(body, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def _span_attributes(exchange: Exchange) -> dict[str, str]:
    """The request's span attributes (a sandbox's id is its run's)."""
    attributes = {"http.request.method": exchange.method, "url.path": exchange.path}
    sandbox_id = exchange.headers.get("e2b-sandbox-id")
    if sandbox_id is not None:
        attributes["callbox.run_id"] = sandbox_id
    return attributes


def _no_route(exchange: Exchange, allowed: list[str], what: str) -> E2bError:
    if allowed:
        return E2bError(ErrorCode.NOT_SUPPORTED, f"{exchange.path} does not take {exchange.method}; it takes "
                                         f"{', '.join(sorted(set(allowed)))}", status=405)
    return E2bError(ErrorCode.NOT_FOUND, f"no route {exchange.method} {exchange.path}: {what}")


async def _connect_refusal(exchange: Exchange, error: E2bError) -> None:
    if exchange.ended is None and not exchange.started:
        await exchange.respond(*connect_error_response(error))

