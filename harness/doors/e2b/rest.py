"""The E2B control plane: the REST API the e2b SDK calls with ``E2B_API_URL`` pointing here.

Every route answers the calling client (named by its ``X-API-KEY``) about its own
sandboxes only; anyone else's is 404 with the words of one that never existed.

=========================================  =======================================================
``POST /v2/sandboxes`` (and v1's           create (201 ``Sandbox``; see :mod:`rest_models` for
``POST /sandboxes``)                       each field); an ``Idempotency-Key`` repeat returns the
                                           same sandbox
``GET /v2/sandboxes``                      list: ``metadata`` (``k=v&...``, url-encoded as the SDK
                                           sends it), ``state`` (running, paused, comma separated),
                                           ``template``, ``startedAfter``, ``order`` (asc: in the
                                           order the door began serving them, or desc), ``limit``
                                           (1 to 100, default 100), paged by ``nextToken`` / the
                                           ``x-next-token`` header: each sandbox once
``GET /sandboxes``                         v1's list: the running ones, unpaged
``GET /sandboxes/{id}``                    ``SandboxDetail``
``DELETE /sandboxes/{id}``                 204 (the SDK reads 404 as ``False``)
``POST /sandboxes/{id}/timeout``           204: its end is now + ``timeout``, shorter or longer
``POST /sandboxes/{id}/pause``             204, 409 if paused already (the SDK: ``False``)
``POST /v2/sandboxes/{id}/connect``        201 and a resumed sandbox if it was paused, else 200;
(and v1's ``/sandboxes/{id}/connect``)     its timeout is extended to ``timeout`` (default
                                           300 s) from now, never shortened
``POST /sandboxes/{id}/resume``            v1's resume: as connect, 409 if it is running
``GET /sandboxes/{id}/metrics``            one reading now (``start``/``end``: empty if now is
                                           outside them)
``PUT /sandboxes/{id}/network``            204: its network rules replaced (``allowOut``,
                                           ``denyOut``, ``allow_internet_access``), within its
                                           policy's network (:mod:`harness.core.network_request`);
                                           the policy's ``network`` action, recorded in its run
=========================================  =======================================================

Snapshots and forks (``/sandboxes/{id}/snapshots``, ``/sandboxes/{id}/fork``, ``/snapshots``,
``DELETE /templates/{id}`` of a snapshot, and a create whose ``templateID`` is a snapshot) are
:mod:`harness.doors.e2b.snapshots`'. What the SDK can ask on these paths that this server
does not do (logs, refreshes, the metrics of many sandboxes) is 501 with a
sentence naming it. Errors are ``{"code": STATUS, "message": ...}``; a 429
says ``Should-Retry: false`` (a limit of sandboxes per client is not passed by waiting a
few seconds, which is what the SDK's retries would do).

A pause or resume is the policy's ``pause`` action (``op``), recorded in the sandbox's run;
create and delete are its run's start and end (through the executor).
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import logging
import time
import urllib.parse
from collections.abc import Callable, Collection, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from harness.core.errors import ErrorCode
from harness.core.network_request import update_network
from harness.doors.e2b.boxes import DEFAULT_TIMEOUT_S, E2bSandbox, E2bSandboxes, e2b_errors
from harness.doors.e2b.domains import sandbox_domain
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.lifecycle import Lifecycle
from harness.doors.e2b.rest_models import (
    ENVD_VERSION,
    created_body,
    detail_body,
    listed_body,
    metric_body,
    network_request,
    parse_create,
    unsupported,
)
from harness.doors.e2b.rpc import HttpRequest, HttpResponse, RestRoute, json_response
from harness.doors.e2b.snapshots import E2bSnapshots, snapshot_template

__all__ = ["ENVD_VERSION", "MAX_LIST_LIMIT", "ControlPlane", "routes"]

log = logging.getLogger("callbox.e2b")

MAX_LIST_LIMIT = 100
"""The most sandboxes one list page holds (E2B's maximum, and its default)."""
STATES = ("running", "paused")

Handler = Callable[[HttpRequest, str], HttpResponse]


def _answering(handler: Handler) -> Handler:
    """E2bError as the control plane's error response."""

    @functools.wraps(handler)
    def answer(request: HttpRequest, client: str) -> HttpResponse:
        try:
            return handler(request, client)
        except E2bError as error:
            headers = [("should-retry", "false")] if error.status == 429 else []
            return json_response(error.status, error.rest_body(), [*headers, *error.headers()])

    return answer


def _not_served(what: str) -> Handler:
    def refuse(request: HttpRequest, client: str) -> HttpResponse:
        error = unsupported(f"{what} is not supported by this server (callbox's E2B door)")
        return json_response(error.status, error.rest_body())

    return refuse


def _object(request: HttpRequest) -> dict[str, Any]:
    body = request.json()
    if not isinstance(body, dict):
        raise invalid(f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def _int_param(request: HttpRequest, name: str) -> int | None:
    text = request.first(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise invalid(f"{name}: {text!r} is not a whole number") from None


def parse_metadata_query(text: str) -> dict[str, str]:
    """The ``metadata`` query parameter as the SDK builds it: ``urlencode`` of pairs whose
    keys and values were already ``quote``d (so each is decoded twice)."""
    pairs = urllib.parse.parse_qsl(text, keep_blank_values=True)
    if not pairs and text.strip():
        raise invalid(f"metadata: {text!r} is not key=value pairs joined by &")
    return {urllib.parse.unquote(key): urllib.parse.unquote(value) for key, value in pairs}


def _states(request: HttpRequest) -> list[str]:
    states = [part.strip() for value in request.query.get("state", []) for part in value.split(",") if part.strip()]
    for state in states:
        if state not in STATES:
            raise invalid(f"state: {state!r} is not a sandbox state; use running or paused")
    return states


def _started_after(request: HttpRequest) -> float | None:
    text = request.first("startedAfter")
    if not text:
        return None
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(f"startedAfter: {text!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def _cursor(sandbox: E2bSandbox) -> str:
    """The next page's token: the place of the page's last sandbox in the door's order (a
    sandbox that starts meanwhile comes later in it, one that ends leaves no gap)."""
    raw = json.dumps([sandbox.seq]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _after_cursor(token: str) -> int:
    try:
        (seq,) = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise TypeError(seq)
        return seq
    except (ValueError, TypeError, binascii.Error):
        raise invalid(f"nextToken: {token!r} is not a token this server gave (x-next-token of a list)") from None


class ControlPlane:
    """The REST handlers over one server's :class:`E2bSandboxes`."""

    def __init__(self, sandboxes: E2bSandboxes, domain: str | None = None) -> None:
        self.sandboxes = sandboxes
        self.snapshots = E2bSnapshots(sandboxes)
        self.domain = domain
        """The configured sandbox domain (:func:`~harness.doors.e2b.domains.sandbox_domain`)."""

    def _domain(self, request: HttpRequest) -> str:
        return sandbox_domain(request.headers, self.domain)

    def _sandbox(self, request: HttpRequest, client: str) -> E2bSandbox:
        return self.sandboxes.get(client, request.path_params.get("sandboxID", ""))

    # ---- create, list, get, delete -----------------------------------------------------------------

    def create(self, request: HttpRequest, client: str) -> HttpResponse:
        body = request.json()
        snapshot = self.snapshots.find(client, body.get("templateID")) if isinstance(body, dict) else None
        if snapshot is not None:  # a templateID naming one of the client's snapshots
            template = snapshot_template(self.sandboxes, client, snapshot)
            wanted = parse_create({**body, "templateID": template}, self.sandboxes, client)
            name = str(body["templateID"])
            sandbox = self.snapshots.create_from(client, snapshot, wanted, template_id=template,
                                                 details={"snapshot": name, "from_snapshot": True},
                                                 origin={"forked_from_snapshot": name},
                                                 idempotency_key=request.headers.get("idempotency-key") or None)
            log.info("e2b client %s created sandbox %s from snapshot %s", client, sandbox.sandbox_id, name)
            return json_response(201, created_body(sandbox, self._domain(request)))
        wanted = parse_create(body, self.sandboxes, client)
        sandbox = self.sandboxes.create(client, template_id=wanted.template_id, overrides=wanted.overrides,
                                        metadata=wanted.metadata,
                                        idempotency_key=request.headers.get("idempotency-key") or None,
                                        fingerprint=wanted.fingerprint, lifecycle=wanted.lifecycle,
                                        public_ports=wanted.public_ports)
        sandbox.network_note = wanted.network_note
        # Less network than asked is a warning: the client may not look at the sandbox's info.
        log.log(logging.WARNING if wanted.network_note else logging.INFO,
                "e2b client %s created sandbox %s (template %s, timeout %d s, on timeout %s, network %s)%s",
                client, sandbox.sandbox_id, sandbox.template_id, wanted.timeout, sandbox.lifecycle.on_timeout,
                sandbox.box.spec.network_summary(), f": {wanted.network_note}" if wanted.network_note else "")
        return json_response(201, created_body(sandbox, self._domain(request)))

    def list_v2(self, request: HttpRequest, client: str) -> HttpResponse:
        text = request.first("metadata")
        metadata = parse_metadata_query(text) if text else None
        limit = _int_param(request, "limit")
        if limit is None:
            limit = MAX_LIST_LIMIT
        if not 1 <= limit <= MAX_LIST_LIMIT:
            raise invalid(f"limit: {limit} is out of range; ask for 1 to {MAX_LIST_LIMIT} per page")
        order = request.first("order") or "asc"
        if order not in ("asc", "desc"):
            raise invalid(f"order: {order!r} is not asc or desc")
        template = request.first("template")
        after = _started_after(request)
        found = [s for s in self.sandboxes.list(client, metadata=metadata, states=_states(request))
                 if (not template or s.template_id == template) and (after is None or s.started_at >= after)]
        found.sort(key=lambda s: s.seq, reverse=order == "desc")
        token = request.first("nextToken")
        if token:
            mark = _after_cursor(token)
            found = [s for s in found if (s.seq < mark if order == "desc" else s.seq > mark)]
        page = found[:limit]
        headers = [("x-next-token", _cursor(page[-1]))] if len(found) > limit else []
        return json_response(200, self._listed(page), headers)

    def list_v1(self, request: HttpRequest, client: str) -> HttpResponse:
        text = request.first("metadata")
        metadata = parse_metadata_query(text) if text else None
        return json_response(200, self._listed(self.sandboxes.list(client, metadata=metadata, states=["running"])))

    def _listed(self, sandboxes: Collection[E2bSandbox]) -> list[dict[str, Any]]:
        now = time.time()
        bodies = []
        for sandbox in sandboxes:
            try:
                bodies.append(listed_body(sandbox, now))
            except E2bError:
                if not sandbox.closed:  # one that ended while listed is simply not in the list
                    raise
        return bodies

    def get(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        return json_response(200, detail_body(sandbox, time.time(), self._domain(request)))

    def kill(self, request: HttpRequest, client: str) -> HttpResponse:
        self.sandboxes.kill(client, request.path_params.get("sandboxID", ""))
        return json_response(204, None)

    # ---- lifetime ----------------------------------------------------------------------------------

    def timeout(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        body = _object(request)
        if "timeout" not in body:
            raise invalid('the body needs "timeout": the seconds from now the sandbox should end')
        self.sandboxes.set_timeout(sandbox, body["timeout"])
        return json_response(204, None)

    def pause(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        body = _object(request)
        if body.get("memory") is False:
            raise unsupported("a filesystem-only pause (mode 'filesystem') is not supported: this server freezes "
                              "the sandbox's processes with their memory; pause it without a mode")
        # requireHealthyGuest: a freeze needs nothing of the agent, so it changes nothing here.
        self.sandboxes.pause(sandbox)
        return json_response(204, None)

    def connect(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        return self._connect(sandbox, _object(request), must_be_paused=False, domain=self._domain(request))

    def resume(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        body = _object(request)
        if body.get("autoPause") is True and not sandbox.lifecycle.pauses:  # v1: pause it at its next timeout
            self.sandboxes.set_lifecycle(sandbox, Lifecycle("pause", sandbox.lifecycle.auto_resume))
        return self._connect(sandbox, body, must_be_paused=True, domain=self._domain(request))

    def _connect(self, sandbox: E2bSandbox, body: Mapping[str, Any], *, must_be_paused: bool,
                 domain: str) -> HttpResponse:
        timeout = body.get("timeout")
        if timeout is None:
            timeout = min(DEFAULT_TIMEOUT_S, self.sandboxes.timeout_limit(sandbox.template_id, sandbox.client))
        paused = sandbox.state == "paused"
        if must_be_paused and not paused:
            raise E2bError(ErrorCode.ALREADY_EXISTS, f"sandbox {sandbox.sandbox_id} is already running")
        if paused and body.get("memory") is False:
            raise unsupported("resuming with a reboot (on_resume 'reboot') is not supported: this server resumes "
                              "the sandbox's frozen processes; connect without on_resume")
        resumed = self.sandboxes.connect(sandbox, timeout)
        return json_response(201 if resumed else 200, created_body(sandbox, domain))

    def update_network(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        asked = network_request(_object(request), update=True)
        details = {"internet": asked.internet, "allow": list(asked.allow), "deny": list(asked.deny)}
        with self.sandboxes.acting(sandbox, "network", details) as ticket, e2b_errors(sandbox):
            spec = update_network(sandbox.box, sandbox.box.spec, asked,
                                  sandbox.session.policy.sandbox.on_internet_request)
            ticket.outcome["network"] = spec.network_summary()
        log.info("e2b client %s changed the network of sandbox %s: %s", client, sandbox.sandbox_id,
                 spec.network_summary())
        return json_response(204, None)

    def snapshot(self, request: HttpRequest, client: str) -> HttpResponse:
        return self.snapshots.snapshot(self._sandbox(request, client), _object(request))

    def fork(self, request: HttpRequest, client: str) -> HttpResponse:
        return self.snapshots.fork(self._sandbox(request, client), _object(request), self._domain(request))

    def metrics(self, request: HttpRequest, client: str) -> HttpResponse:
        sandbox = self._sandbox(request, client)
        start, end = _int_param(request, "start"), _int_param(request, "end")
        metric = self.sandboxes.metrics(sandbox)
        if (start is not None and metric.timestamp < start) or (end is not None and metric.timestamp > end + 1):
            return json_response(200, [])
        return json_response(200, [metric_body(metric)])


def routes(sandboxes: E2bSandboxes, domain: str | None = None,
           templates: Iterable[RestRoute] = ()) -> list[RestRoute]:
    """The control plane's routes, in the order to match them (literal segments before
    ``{sandboxID}``: ``/sandboxes/metrics`` is not a sandbox); ``domain``: the configured
    sandbox domain; ``templates``: the template API's routes, matched before these."""
    api = ControlPlane(sandboxes, domain)
    served: list[tuple[str, str, Handler]] = [
        ("POST", "/v2/sandboxes", api.create),
        ("GET", "/v2/sandboxes", api.list_v2),
        ("POST", "/sandboxes", api.create),
        ("GET", "/sandboxes", api.list_v1),
        ("GET", "/sandboxes/metrics", _not_served("the metrics of many sandboxes at once (GET /sandboxes/metrics)")),
        ("GET", "/sandboxes/{sandboxID}", api.get),
        ("DELETE", "/sandboxes/{sandboxID}", api.kill),
        ("POST", "/sandboxes/{sandboxID}/timeout", api.timeout),
        ("POST", "/sandboxes/{sandboxID}/pause", api.pause),
        ("POST", "/v2/sandboxes/{sandboxID}/connect", api.connect),
        ("POST", "/sandboxes/{sandboxID}/connect", api.connect),
        ("POST", "/sandboxes/{sandboxID}/resume", api.resume),
        ("GET", "/sandboxes/{sandboxID}/metrics", api.metrics),
        ("PUT", "/sandboxes/{sandboxID}/network", api.update_network),
        ("POST", "/sandboxes/{sandboxID}/fork", api.fork),
        ("POST", "/sandboxes/{sandboxID}/snapshots", api.snapshot),
        ("GET", "/snapshots", api.snapshots.list),
        ("GET", "/sandboxes/{sandboxID}/logs", _not_served("a sandbox's logs")),
        ("GET", "/v2/sandboxes/{sandboxID}/logs", _not_served("a sandbox's logs")),
        ("POST", "/sandboxes/{sandboxID}/refreshes", _not_served("refreshing a sandbox (use set_timeout)")),
    ]
    own = [(method, path, _answering(handler)) for method, path, handler in served]
    # DELETE /templates/{id} is the SDK's delete_snapshot and Template.delete both: a
    # snapshot of the client's first, else the template route (if the template API is served).
    others = list(templates)
    template_delete = next((h for m, p, h in others if (m, p) == ("DELETE", "/templates/{templateID}")), None)
    delete = _answering(functools.partial(api.snapshots.delete, otherwise=template_delete))
    return [("DELETE", "/templates/{templateID}", delete), *others, *own]
