"""The E2B template API: what the e2b SDK's ``Template.build`` / ``AsyncTemplate.build`` call, served offline.

=================================================  ================================================
``POST /v3/templates``                             request a build of template ``name`` (202:
                                                   ``templateID``, ``buildID``); the client's own
                                                   template of that name, made if new
``GET /templates/{id}/files/{hash}``               201 ``present`` (the files of a COPY step are
                                                   kept) or where to upload them (``url``, a
                                                   one-time URL of this server, 10 minutes)
``PUT /template-uploads/{token}``                  the upload itself (the URL carries its
                                                   permission: the SDK sends no API key there)
``POST /v2/templates/{id}/builds/{build}``         start the build with its recipe (202)
``GET /templates/{id}/builds/{build}/status``      ``status`` (waiting, building, ready, error),
                                                   ``logEntries`` from ``logsOffset``, ``reason``
``GET /templates/{id}/builds/{build}/logs``        the log entries from ``cursor``
``GET /templates/{id}/tags``                       the current build under the tags its build was
                                                   requested with (``Template.get_tags``)
``GET /templates/aliases/{name}``                  200 if the client sees a template of that name
                                                   (``Template.exists``), else 404
``GET /templates``, ``GET /templates/{id}``        the templates the client sees
``DELETE /templates/{id}``                         204: the client's own template is removed
=================================================  ================================================

Templates belong to the client that built them, or to the operator
(:mod:`harness.engine.templates.store`): a client sees and uses its own and the operator's,
and removes only its own (the operator's is ``permission_denied``). Anyone else's is 404, as
one that never existed. Tags (``name:tag``) name the template's one current build: there is
no history of builds to tag, so ``get_tags`` lists the current build under the tags it was
built with, and assigning or removing tags answers 501 naming the call.

A sandbox is created from a template by its id or name (``Sandbox.create("my-template")``,
:mod:`harness.doors.e2b.template_boxes`).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from harness.core.errors import CallboxError, ErrorCode
from harness.doors.e2b.boxes import DEFAULT_TEMPLATE, E2bSandboxes
from harness.doors.e2b.errors import E2bError, from_callbox, invalid, not_found
from harness.doors.e2b.rest_models import ENVD_VERSION, unsupported
from harness.doors.e2b.rpc import HttpRequest, HttpResponse, RestRoute, json_response
from harness.doors.e2b.template_boxes import BuiltTemplates
from harness.doors.e2b.templates_build import Builds
from harness.engine.templates.build import TemplateBuilder
from harness.engine.templates.steps import parse_recipe
from harness.engine.templates.store import OPERATOR, Template, TemplateStore

__all__ = ["MAX_UPLOAD_BYTES", "UPLOAD_PREFIX", "UPLOAD_TTL_S", "TemplateApi", "template_routes"]

log = logging.getLogger("callbox.e2b")

UPLOAD_PREFIX = "/template-uploads/"
"""Routes under it carry their permission in the path (a one-time token), not an API key."""
UPLOAD_TTL_S = 600.0
MAX_UPLOAD_BYTES = 1 << 30
"""The largest archive of one COPY step's files."""

Handler = Callable[[HttpRequest, str], HttpResponse]


def _iso(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).isoformat().replace("+00:00", "Z")


def _answering(handler: Handler) -> Handler:
    def answer(request: HttpRequest, client: str) -> HttpResponse:
        try:
            return handler(request, client)
        except CallboxError as error:
            failure = from_callbox(error)
            return json_response(failure.status, failure.rest_body())
        except E2bError as error:
            return json_response(error.status, error.rest_body(), error.headers())

    return answer


def _not_served(what: str) -> Handler:
    def refuse(request: HttpRequest, client: str) -> HttpResponse:
        error = unsupported(f"{what} is not supported by this server (callbox's E2B door): a template has one "
                            "current build, named by the template's name")
        return json_response(error.status, error.rest_body())

    return refuse


class TemplateApi:
    """The template routes' handlers over a store and a builder; see the module docstring."""

    def __init__(self, sandboxes: E2bSandboxes, store: TemplateStore, builder: TemplateBuilder) -> None:
        self.sandboxes = sandboxes
        self.store = store
        self.builds = Builds(builder)
        self.scheme = "http"
        """How clients reach this server (``https`` behind TLS): the scheme of upload URLs."""
        self._uploads: dict[str, tuple[str, str, float]] = {}
        """token -> (owner, files hash, expiry)."""
        self._lock = threading.Lock()
        sandboxes.built = BuiltTemplates(store)

    def _template(self, request: HttpRequest, client: str) -> Template:
        ident = request.path_params.get("templateID", "")
        template = self.store.find(client, ident)
        if template is None:
            raise not_found("template", ident)
        return template

    def _own(self, request: HttpRequest, client: str) -> Template:
        template = self._template(request, client)
        if template.owner != client:
            raise E2bError(ErrorCode.PERMISSION_DENIED, f"template {template.name!r} is the operator's; only the "
                                                        "operator changes it (`callbox template`)")
        return template

    # ---- build -------------------------------------------------------------------------------

    def request_build(self, request: HttpRequest, client: str) -> HttpResponse:
        body = request.json()
        if not isinstance(body, dict):
            raise invalid("the body must be a JSON object with the template's name")
        raw = body.get("name") or body.get("alias")
        if not isinstance(raw, str) or not raw:
            raise invalid('the body needs "name": the template\'s name (name or name:tag)')
        name, _, tag = raw.partition(":")
        if name == DEFAULT_TEMPLATE or name in self.sandboxes.templates:
            raise E2bError(ErrorCode.ALREADY_EXISTS, f"template name {name!r} is one of this server's own "
                                                     "templates; build under another name")
        cpu_count, memory_mb = _size(body, "cpuCount"), _size(body, "memoryMB")
        template = self.store.claim(client, name)
        template.cpu_count, template.memory_mb = cpu_count, memory_mb
        self.store.save(template)
        tags = [t for t in (body.get("tags") or []) if isinstance(t, str)] or [tag or "default"]
        build = self.builds.new(template, memory_mb, tags)
        for note in self._sized(client, cpu_count, memory_mb):
            build.add("info", note)
        log.info("e2b client %s requested build %s of template %s (%s)", client, build.build_id, name,
                 template.template_id)
        return json_response(202, {"templateID": template.template_id, "buildID": build.build_id, "public": False,
                                   "names": [name], "tags": tags, "aliases": [name]})

    def _sized(self, client: str, cpu_count: int | None, memory_mb: int | None) -> list[str]:
        """What the template's sandboxes will get of the CPUs and memory asked, said in its build log."""
        policy = self.sandboxes.check_template(DEFAULT_TEMPLATE, client).sandbox
        notes = []
        if cpu_count is not None:
            got = min(float(cpu_count), policy.cpus)
            notes.append(f"cpu_count {cpu_count}: this template's sandboxes get {got:g} CPU"
                         + ("" if got == cpu_count else f" (the policy's sandbox.cpus is {policy.cpus:g})"))
        if memory_mb is not None:
            got_mb = min(memory_mb, int(policy.memory) >> 20)
            notes.append(f"memory_mb {memory_mb}: this template's sandboxes get {got_mb} MiB"
                         + ("" if got_mb == memory_mb else f" (the policy's sandbox.memory is {got_mb} MiB)"))
        return notes

    def start_build(self, request: HttpRequest, client: str) -> HttpResponse:
        template = self._own(request, client)
        build = self.builds.get(client, template.template_id, request.path_params.get("buildID", ""))
        if build is None:
            raise not_found("build", request.path_params.get("buildID", ""))
        recipe = parse_recipe(request.json())
        for index, step in enumerate(recipe.steps):
            if step.files_hash is not None and not self.store.has_files(client, step.files_hash):
                raise invalid(f"steps[{index}]: the files of COPY {step.args[0]!r} were not uploaded (hash "
                              f"{step.files_hash}); ask GET /templates/{{id}}/files/{{hash}} where to upload them")
        self.builds.start(build, template, recipe)
        return json_response(202, None)

    def status(self, request: HttpRequest, client: str) -> HttpResponse:
        build = self._build(request, client)
        offset = request.first("logsOffset")
        try:
            start = int(offset) if offset else 0
        except ValueError:
            raise invalid(f"logsOffset: {offset!r} is not a whole number") from None
        return json_response(200, build.status_body(max(0, start)))

    def logs(self, request: HttpRequest, client: str) -> HttpResponse:
        build = self._build(request, client)
        cursor = request.first("cursor")
        start = int(cursor) if cursor and cursor.isdigit() else 0
        return json_response(200, {"logs": build.status_body(start)["logEntries"]})

    def _build(self, request: HttpRequest, client: str) -> Any:
        template = self._template(request, client)
        build_id = request.path_params.get("buildID", "")
        build = self.builds.get(template.owner, template.template_id, build_id)
        if build is None:
            raise not_found("build", build_id)
        return build

    # ---- files -------------------------------------------------------------------------------

    def files(self, request: HttpRequest, client: str) -> HttpResponse:
        self._own(request, client)
        files_hash = request.path_params.get("hash", "")
        if self.store.has_files(client, files_hash):
            return json_response(201, {"present": True})
        token = secrets.token_urlsafe(24)
        now = time.monotonic()
        with self._lock:
            for old in [t for t, (_, _, until) in self._uploads.items() if until < now]:
                del self._uploads[old]
            self._uploads[token] = (client, files_hash, now + UPLOAD_TTL_S)
        host = request.headers.get("host") or "localhost"
        return json_response(201, {"present": False, "url": f"{self.scheme}://{host}{UPLOAD_PREFIX}{token}"})

    def upload(self, request: HttpRequest, client: str) -> HttpResponse:
        token = request.path_params.get("token", "")
        with self._lock:
            found = self._uploads.pop(token, None)
        if found is None or found[2] < time.monotonic():
            raise E2bError(ErrorCode.UNAUTHENTICATED, "this upload URL is not one this server gave, was used "
                                                      "already, or expired; ask for the files' URL again")
        owner, files_hash, _ = found
        size = self.store.put_files(owner, files_hash, request.body, max_bytes=MAX_UPLOAD_BYTES)
        log.info("e2b client %s uploaded the files of %s (%d bytes)", owner, files_hash[:12], size)
        return json_response(200, None)

    # ---- aliases, list, get, delete -----------------------------------------------------------

    def alias(self, request: HttpRequest, client: str) -> HttpResponse:
        name = request.path_params.get("alias", "")
        template = self.store.find(client, name)
        if template is None or template.name != name.partition(":")[0]:
            raise not_found("template", name)
        return json_response(200, {"templateID": template.template_id, "public": template.owner == OPERATOR})

    def _body(self, template: Template) -> dict[str, Any]:
        policy = self.sandboxes.template(DEFAULT_TEMPLATE, None) or self.sandboxes.templates[DEFAULT_TEMPLATE]
        spec = policy.sandbox
        return {"templateID": template.template_id, "buildID": template.build_id or "",
                "cpuCount": max(1, int(spec.cpus)), "memoryMB": int(spec.memory) >> 20,
                "diskSizeMB": 0, "public": template.owner == OPERATOR, "aliases": [template.name],
                "names": [template.name], "createdAt": _iso(template.created_at),
                "updatedAt": _iso(template.updated_at), "createdBy": None, "lastSpawnedAt": None,
                "spawnCount": template.spawn_count, "buildCount": template.build_count,
                "envdVersion": ENVD_VERSION, "buildStatus": "ready" if template.key else "error"}

    def list(self, request: HttpRequest, client: str) -> HttpResponse:
        return json_response(200, [self._body(t) for t in self.store.visible(client) if t.key])

    def get(self, request: HttpRequest, client: str) -> HttpResponse:
        template = self._template(request, client)
        return json_response(200, {**self._body(template), "builds": []})

    def tags(self, request: HttpRequest, client: str) -> HttpResponse:
        """The current build under each tag it was requested with (none before a build succeeds here)."""
        template = self._template(request, client)
        if not template.key or not template.build_id:
            return json_response(200, [])
        return json_response(200, [{"tag": tag, "buildID": template.build_id, "createdAt": _iso(template.updated_at)}
                                   for tag in template.tags or ["default"]])

    def delete(self, request: HttpRequest, client: str) -> HttpResponse:
        template = self._own(request, client)
        self.store.remove(template)
        log.info("e2b client %s removed template %s (%s)", client, template.name, template.template_id)
        return json_response(204, None)


def template_routes(sandboxes: E2bSandboxes, store: TemplateStore | None = None,
                    builder: TemplateBuilder | None = None) -> tuple[TemplateApi, list[RestRoute]]:
    """The template API over ``store`` (default: the default template directory) and
    ``builder`` (default: building on the server's sandbox image, without network unless the
    server's policy gives sandboxes an open one)."""
    store = store if store is not None else TemplateStore()
    if builder is None:
        base = sandboxes.templates[DEFAULT_TEMPLATE].sandbox
        network = "bridge" if base.network == "open" else "none"
        builder = TemplateBuilder(store, default_image=base.image, network=network)
    api = TemplateApi(sandboxes, store, builder)
    served: list[tuple[str, str, Handler]] = [
        ("POST", "/v3/templates", api.request_build),
        ("GET", "/templates", api.list),
        ("GET", "/templates/aliases/{alias}", api.alias),
        ("GET", "/templates/{templateID}", api.get),
        ("DELETE", "/templates/{templateID}", api.delete),
        ("GET", "/templates/{templateID}/files/{hash}", api.files),
        ("PUT", UPLOAD_PREFIX + "{token}", api.upload),
        ("POST", "/v2/templates/{templateID}/builds/{buildID}", api.start_build),
        ("GET", "/templates/{templateID}/builds/{buildID}/status", api.status),
        ("GET", "/templates/{templateID}/builds/{buildID}/logs", api.logs),
        ("POST", "/templates/tags", _not_served("assigning tags to a template (Template.assign_tags)")),
        ("DELETE", "/templates/tags", _not_served("removing tags of a template (Template.remove_tags)")),
        ("GET", "/templates/{templateID}/tags", api.tags),
    ]
    return api, [(method, path, _answering(handler)) for method, path, handler in served]


def _size(body: dict[str, Any], key: str) -> int | None:
    """A positive whole number the build request gives for ``key`` (``cpuCount``, ``memoryMB``), or None."""
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise invalid(f"{key} must be a positive whole number, not {value!r}")
    return value
