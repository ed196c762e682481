"""Snapshots and forks through the E2B API, on the engine's snapshot store.

One implementation with the gRPC door's (:mod:`harness.doors.grpc.sandboxes_snapshots`): a
client's snapshot ``NAME`` is :class:`~harness.doors.grpc.sandboxes_snapshots.ClientSnapshots`'
(its own, whichever door took it; anyone else's is "not found"), the same door note is
written with it, and the same policy actions are asked and recorded: ``snapshot`` in the
source sandbox's run, ``fork`` in the source's run (a fork) or in the new sandbox's run (a
create from a snapshot).

=========================================  =======================================================
``POST /sandboxes/{id}/snapshots``          201 ``{snapshotID, names}``: its files (the snapshot
(``create_snapshot``)                       store's places: ``/home/user``, ``/tmp``,
                                            ``/workspace``); ``name`` (else ``snapshot-HEX``)
                                            replaces the client's snapshot of that name. The
                                            SDK's default mode is served as ``filesystem``: the
                                            processes and memory are not kept; an explicit
                                            ``mode="full"`` is 501
``POST /v2/sandboxes`` with ``templateID``  a sandbox of the server's ``base`` template and the
a snapshot id                               request's options, holding the snapshot's files
``GET /snapshots`` (``list_snapshots``)     the client's, oldest first (``sandboxID`` filters by
                                            source); one page
``DELETE /templates/{id}``                  ``delete_snapshot``: 204, or 404 for none of the
                                            client's
``POST /sandboxes/{id}/fork``               ``fork(count)`` (1 to 20, default 1): the files
                                            captured once, then each fork a new sandbox of the
                                            source's template, options and lifecycle; each
                                            entry a sandbox or an error
=========================================  =======================================================
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import secrets
import time
from collections.abc import Callable, Iterator
from typing import Any

from harness.core.errors import CallboxError, ErrorCode
from harness.doors.e2b.boxes import DEFAULT_TEMPLATE, E2bSandbox, E2bSandboxes, e2b_errors
from harness.doors.e2b.errors import E2bError, from_service_error, invalid, not_found
from harness.doors.e2b.rest_models import CreateRequest, created_body, unsupported
from harness.doors.e2b.rpc import HttpRequest, HttpResponse, json_response
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.sandboxes_snapshots import ClientSnapshots, owner, read_sidecar, write_sidecar
from harness.engine.base import SnapshotKeeper, keeps_snapshots
from harness.engine.docker.snapshots import SnapshotInfo

__all__ = ["MAX_FORKS", "E2bSnapshots"]

log = logging.getLogger("callbox.e2b")

MAX_FORKS = 20
"""The most forks one request makes (the SDK's bound too)."""


class E2bSnapshots:
    """The snapshot and fork requests of the E2B door (see the module docstring)."""

    def __init__(self, sandboxes: E2bSandboxes) -> None:
        self.sandboxes = sandboxes

    def _engine(self) -> SnapshotKeeper:
        engine = self.sandboxes.executor.engine_factory()
        if not keeps_snapshots(engine):
            raise E2bError(ErrorCode.NOT_SUPPORTED, "this server's engine keeps no snapshots")
        return engine

    def _mine(self, client: str) -> ClientSnapshots:
        return ClientSnapshots(self._engine(), client)

    def find(self, client: str, snapshot_id: Any) -> SnapshotInfo | None:
        """``client``'s snapshot ``snapshot_id`` (a create's templateID), if it is one."""
        if not isinstance(snapshot_id, str) or not snapshot_id or self.sandboxes.template(snapshot_id, client):
            return None
        try:
            return self._mine(client).get(snapshot_id)
        except (ServiceError, E2bError):
            return None

    # ---- create_snapshot, list, delete ------------------------------------------------------------

    def snapshot(self, sandbox: E2bSandbox, body: dict[str, Any]) -> HttpResponse:
        if body.get("memory") is True:
            raise unsupported("a snapshot with memory (mode 'full') is not supported: this server's snapshots keep "
                              "a sandbox's files, not its processes; use mode 'filesystem'")
        name = body.get("name") or f"snapshot-{secrets.token_hex(6)}"
        if not isinstance(name, str):
            raise invalid(f"name must be a string, not {name!r}")
        snapshots = self._mine(sandbox.client)
        try:
            stored = snapshots.stored_name(name)
        except ServiceError as error:
            raise from_service_error(error) from None
        taken = next((info for info in snapshots.engine.snapshots() if info.name == stored), None)
        if taken is not None and not snapshots.mine(taken):
            raise E2bError(ErrorCode.ALREADY_EXISTS, f"a snapshot named {name} already exists; pick another name")
        with self.sandboxes.acting(sandbox, "snapshot", {"name": name, "replace": taken is not None}) as ticket, \
                e2b_errors(sandbox):
            info = snapshots.engine.snapshot(sandbox.running(), stored, replace=taken is not None,
                                             owner=owner(sandbox.client))
            write_sidecar(snapshots.engine, info, sandbox.sandbox_id, sandbox.session.overrides)
            ticket.outcome.update(bytes=info.bytes, places=info.captured)
        return json_response(201, {"snapshotID": name, "names": [name]})

    def list(self, request: HttpRequest, client: str) -> HttpResponse:
        snapshots = self._mine(client)
        source = request.first("sandboxID")
        wanted = request.first("name")
        found = []
        for info in snapshots.list():
            shown = snapshots.shown_name(info)
            if source and read_sidecar(snapshots.engine, info)[0] != source:
                continue
            if wanted and shown != wanted:
                continue
            found.append({"snapshotID": shown, "names": [shown]})
        return json_response(200, found)

    def delete(self, request: HttpRequest, client: str, *,
               otherwise: Callable[[HttpRequest, str], HttpResponse] | None = None) -> HttpResponse:
        """Delete the client's snapshot the path names; one that is none: ``otherwise``
        (the template API's delete), else ``not_found``."""
        name = request.path_params.get("templateID", "")
        info = self.find(client, name)
        if info is None:
            if otherwise is not None:
                return otherwise(request, client)
            raise not_found("snapshot", name)
        self._mine(client).engine.remove_snapshot(info.name)
        return json_response(204, None)

    # ---- a sandbox from a snapshot, forks -----------------------------------------------------------

    def create_from(self, client: str, info: SnapshotInfo, wanted: CreateRequest, *, template_id: str,
                    details: dict[str, Any] | None, origin: dict[str, Any],
                    idempotency_key: str | None = None) -> E2bSandbox:
        """A new sandbox of ``template_id`` and ``wanted``'s options holding the files of
        snapshot ``info``; with ``details``, the ``fork`` action asked and recorded in its own run."""
        sandbox = self.sandboxes.create(client, template_id=template_id, overrides=wanted.overrides,
                                        metadata=wanted.metadata, lifecycle=wanted.lifecycle,
                                        idempotency_key=idempotency_key, fingerprint=wanted.fingerprint)
        try:
            with (self.sandboxes.acting(sandbox, "fork", details) if details is not None
                  else contextlib.nullcontext()), e2b_errors(sandbox):
                self._engine().restore_snapshot_files(sandbox.running(), info.name)
        except BaseException:
            with contextlib.suppress(E2bError, CallboxError, ServiceError):
                self.sandboxes.kill(client, sandbox.sandbox_id)
            raise
        with contextlib.suppress(Exception):
            self.sandboxes.audit.update_run_meta(sandbox.sandbox_id, origin)
        return sandbox

    def fork(self, source: E2bSandbox, body: dict[str, Any], domain: str) -> HttpResponse:
        count = body.get("count", 1)
        if count is None:
            count = 1
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_FORKS:
            raise invalid(f"count must be a whole number from 1 to {MAX_FORKS}, not {count!r}")
        timeout = body.get("timeout")
        limit = self.sandboxes.timeout_limit(source.template_id, source.client)
        seconds = self.sandboxes.check_timeout(source.template_id, timeout if timeout is not None
                                               else min(source.session.ttl_seconds, limit), client=source.client)
        overrides = source.session.overrides
        wanted = CreateRequest(template_id=source.template_id, timeout=seconds,
                               overrides=dataclasses.replace(overrides, ttl_seconds=seconds),
                               metadata=dict(source.metadata), lifecycle=source.lifecycle, fingerprint="")
        results: list[dict[str, Any]] = []
        with self._captured(source, count) as info:
            for _ in range(count):
                try:
                    fork = self.create_from(source.client, info, wanted, template_id=source.template_id,
                                            details=None, origin={"forked_from": source.sandbox_id})
                    results.append({"sandbox": created_body(fork, domain)})
                except E2bError as error:
                    results.append({"error": {"code": error.status, "message": error.message}})
        return json_response(201, results)

    @contextlib.contextmanager
    def _captured(self, source: E2bSandbox, count: int) -> Iterator[SnapshotInfo]:
        """The source's files, captured once for its forks (a snapshot removed afterwards);
        the ``fork`` action asked and recorded in the source's run."""
        snapshots = self._mine(source.client)
        stored = snapshots.stored_name(f"fork-{int(time.time())}-{secrets.token_hex(4)}")
        with self.sandboxes.acting(source, "fork", {"from_snapshot": False, "count": count}), e2b_errors(source):
            info = snapshots.engine.snapshot(source.running(), stored, owner=owner(source.client))
        try:
            yield info
        finally:
            with contextlib.suppress(Exception):
                snapshots.engine.remove_snapshot(info.name)


def snapshot_template(sandboxes: E2bSandboxes, client: str, info: SnapshotInfo) -> str:
    """The template a sandbox from snapshot ``info`` gets: its source sandbox's, if this
    server still has it, else ``base``."""
    engine = sandboxes.executor.engine_factory()
    source = read_sidecar(engine, info)[0] if keeps_snapshots(engine) else ""
    template = DEFAULT_TEMPLATE
    if source:
        with contextlib.suppress(Exception):
            recorded = sandboxes.audit.get_run(source).meta.get("template")
            if isinstance(recorded, str) and sandboxes.template(recorded, client) is not None:
                template = recorded
    return template
