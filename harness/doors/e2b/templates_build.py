"""Template builds of the E2B door: queued, run one at a time in the background, their status and logs kept.

A build is requested (``POST /v3/templates``: status ``waiting``), started with its recipe
(``POST /v2/templates/{id}/builds/{build}``: ``building``), and ends ``ready`` or ``error``
with the reason and the failing step. The SDK polls its status with ``logsOffset`` and
shows each log entry; entries are kept in memory (at most :data:`MAX_LOG_ENTRIES` a build,
the oldest dropped with a line saying so), the last :data:`KEPT_BUILDS` builds. Builds run
on one worker thread (a build is heavy: Docker's builder, the host's CPUs), so a second
build waits, ``waiting``, with a log line saying it is queued.

A build is the ``template_build`` of its owner in the log (the server's log: who built
what, the cache key, cached or built and how long it took).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from harness.core.errors import CallboxError, ErrorCode
from harness.engine.templates.build import BuildFailed, TemplateBuilder
from harness.engine.templates.steps import Recipe
from harness.engine.templates.store import Template

__all__ = ["KEPT_BUILDS", "MAX_LOG_ENTRIES", "Build", "Builds"]

log = logging.getLogger("callbox.e2b")

MAX_LOG_ENTRIES = 5000
KEPT_BUILDS = 200
PAGE = 100
"""Log entries one status response carries at most (E2B's page)."""


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@dataclass
class Build:
    """One build: its state and log."""

    build_id: str
    template_id: str
    owner: str
    status: str = "waiting"
    entries: list[dict[str, Any]] = field(default_factory=list)
    dropped: int = 0
    reason: str | None = None
    step: str | None = None
    memory_mb: int | None = None
    tags: list[str] = field(default_factory=list)
    """The tags it was requested under: the template's tags once it is ready."""
    started: bool = False
    created_at: str = field(default_factory=_now)
    finished_at: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, level: str, message: str, step: str | None = None) -> None:
        entry: dict[str, Any] = {"timestamp": _now(), "level": level, "message": message}
        if step is not None:
            entry["step"] = step
        with self.lock:
            self.entries.append(entry)
            if len(self.entries) > MAX_LOG_ENTRIES:
                del self.entries[0]
                self.dropped += 1

    def status_body(self, offset: int) -> dict[str, Any]:
        with self.lock:
            start = max(0, offset - self.dropped)
            page = self.entries[start:start + PAGE]
            body: dict[str, Any] = {"templateID": self.template_id, "buildID": self.build_id,
                                    "status": self.status, "logs": [], "logEntries": page}
            if self.reason is not None:
                reason: dict[str, Any] = {"message": self.reason}
                if self.step is not None:
                    reason["step"] = self.step
                body["reason"] = reason
            return body


class Builds:
    """The door's builds, run on one worker; see the module docstring."""

    def __init__(self, builder: TemplateBuilder) -> None:
        self.builder = builder
        self._builds: OrderedDict[str, Build] = OrderedDict()
        self._lock = threading.Lock()
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="callbox-template-build")

    def new(self, template: Template, memory_mb: int | None, tags: list[str]) -> Build:
        build = Build(build_id=str(uuid.uuid4()), template_id=template.template_id, owner=template.owner,
                      memory_mb=memory_mb, tags=tags)
        with self._lock:
            self._builds[build.build_id] = build
            while len(self._builds) > KEPT_BUILDS:
                self._builds.popitem(last=False)
        return build

    def get(self, owner: str, template_id: str, build_id: str) -> Build | None:
        with self._lock:
            build = self._builds.get(build_id)
        if build is None or build.owner != owner or build.template_id != template_id:
            return None
        return build

    def start(self, build: Build, template: Template, recipe: Recipe) -> None:
        """Queue ``build`` of ``recipe``; ``already_exists`` if it was started before."""
        with build.lock:
            if build.started:
                raise CallboxError(f"build {build.build_id} was started already; request a new build",
                                   code=ErrorCode.ALREADY_EXISTS)
            build.started = True
        if not recipe.forced and self._cached(recipe, template.owner):
            self._run(build, template, recipe)  # no Docker build: done before the SDK's first poll
            return
        build.add("info", "queued: builds on this server run one at a time")
        try:
            self._worker.submit(self._run, build, template, recipe)
        except RuntimeError:
            raise CallboxError("the server is shutting down", code=ErrorCode.SHUTTING_DOWN) from None

    def _cached(self, recipe: Recipe, owner: str) -> bool:
        try:
            return self.builder.cached(recipe, owner) is not None
        except CallboxError:
            return False  # the build itself reports why (a base that is not there)

    def _run(self, build: Build, template: Template, recipe: Recipe) -> None:
        build.status = "building"
        try:
            built = self.builder.build(template, recipe, memory_mb=build.memory_mb, on_log=build.add)
        except BuildFailed as failed:
            self._failed(build, failed.message, failed.step)
        except CallboxError as error:
            self._failed(build, error.message, None)
        except Exception as exc:  # a build never takes the server down; it fails, saying why
            log.exception("template build %s failed", build.build_id)
            self._failed(build, f"the build failed unexpectedly: {type(exc).__name__}: {exc}", None)
        else:
            log.info("template %s (%s) of %s built: %s (%s)", template.name, template.template_id,
                     template.owner or "the operator", built.image, f"{built.build_s:.1f} s")
            # The template's current build is this one, under the tags it was requested with
            # (``Template.get_tags`` lists them; ``name:tag`` and ``name:BUILD_ID`` name it).
            template.build_id, template.tags = build.build_id, list(build.tags)
            self.builder.store.save(template)
            build.finished_at = _now()
            build.status = "ready"

    def _failed(self, build: Build, message: str, step: str | None) -> None:
        log.info("template build %s of %s failed at step %s: %s", build.build_id, build.template_id, step, message)
        build.add("error", message, step)
        build.reason, build.step = message, step
        build.finished_at = _now()
        build.status = "error"

    def shutdown(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)
