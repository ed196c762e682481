"""Snapshot, ListSnapshots, DeleteSnapshot and Fork of the Sandboxes service.

A client's snapshots are its own (:mod:`harness.doors.grpc.sandboxes_snapshots`). A fork is
a new sandbox of the same client, made while a place is reserved under the client's limits
(RESOURCE_EXHAUSTED beyond them), registered as a session like one CreateSandbox made:

* of a live sandbox (``sandbox_id``): the engine's fork (a temporary snapshot restored into a
  sandbox of the same spec), with the source's policy, tools and overrides; the action is
  authorized and recorded in the source's run;
* of a snapshot: a sandbox of the client's policy (its profile's, else the server's)
  tightened by what the snapshot recorded (checked again now), its files restored from the
  snapshot; the action is authorized and recorded in the fork's own run, so an approval
  asked for names the sandbox id the fork then gets, and the repeat with that approval_id
  reuses it.

The fork's run records where it came from (``forked_from`` or ``forked_from_snapshot`` in
its meta).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import grpc

from harness.audit.store import AuditError
from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy
from harness.core.session import Session
from harness.doors.grpc.errors import ServiceError, creation_failure, handle_errors_any, invalid
from harness.doors.grpc.overrides import SandboxOverrides, sandbox_policy
from harness.doors.grpc.sandboxes_base import SandboxesBase
from harness.doors.grpc.sandboxes_snapshots import (
    ClientSnapshots,
    overrides_from_spec,
    owner,
    read_sidecar,
    write_sidecar,
)
from harness.doors.grpc.sessions import ClientSession
from harness.engine.base import SnapshotKeeper, keeps_snapshots, run_owner
from harness.engine.docker.snapshots import SnapshotExists, SnapshotInfo
from harness.v1 import executor_pb2, sandboxes_pb2

__all__ = ["SnapshotsAndForks"]


class SnapshotsAndForks(SandboxesBase):
    """The snapshot and fork RPCs (the rest of the servicer is :class:`SandboxesService`)."""

    def _engine(self) -> SnapshotKeeper:
        engine = self.executor.engine_factory()
        if not keeps_snapshots(engine):
            raise ServiceError(ErrorCode.NOT_SUPPORTED, "this server's engine keeps no snapshots")
        return engine

    @handle_errors_any
    def Snapshot(self, request: sandboxes_pb2.SnapshotRequest, context: grpc.ServicerContext) -> Any:
        owned = self._running(request.sandbox_id, context)
        engine = self._engine()
        snapshots = ClientSnapshots(engine, owned.client)
        stored = snapshots.stored_name(request.name)
        gate, ticket = self._gate(owned, "snapshot", {"name": request.name, "replace": request.replace},
                                  request.approval_id)
        with self._acting(gate, ticket, context, owned):
            taken = next((info for info in engine.snapshots() if info.name == stored), None)
            if taken is not None and not (request.replace and snapshots.mine(taken)):
                raise ServiceError(ErrorCode.ALREADY_EXISTS,
                                   f"a snapshot named {request.name} already exists; set replace to replace it, or "
                                   "pick another name")
            try:
                info = engine.snapshot(owned.box, stored, replace=request.replace, owner=owner(owned.client))
            except SnapshotExists:  # another request of this client took the name meanwhile
                raise ServiceError(ErrorCode.ALREADY_EXISTS,
                                   f"a snapshot named {request.name} already exists") from None
            write_sidecar(engine, info, owned.sandbox_id, owned.session.overrides)
            ticket.outcome.update(bytes=info.bytes, places=info.captured)
        return snapshots.message(info)

    @handle_errors_any
    def ListSnapshots(self, request: sandboxes_pb2.ListSnapshotsRequest, context: grpc.ServicerContext) -> Any:
        snapshots = ClientSnapshots(self._engine(), self.executor.client_of(context))
        return sandboxes_pb2.ListSnapshotsResponse(snapshots=[snapshots.message(i) for i in snapshots.list()])

    @handle_errors_any
    def DeleteSnapshot(self, request: sandboxes_pb2.DeleteSnapshotRequest, context: grpc.ServicerContext) -> Any:
        snapshots = ClientSnapshots(self._engine(), self.executor.client_of(context))
        info = snapshots.get(request.name)
        snapshots.engine.remove_snapshot(info.name)
        return sandboxes_pb2.DeleteSnapshotResponse()

    @handle_errors_any
    def Fork(self, request: sandboxes_pb2.ForkRequest, context: grpc.ServicerContext) -> Any:
        source = request.WhichOneof("source")
        if source == "sandbox_id":
            return self._fork_live(request, context)
        if source == "snapshot":
            return self._fork_snapshot(request, context)
        raise invalid("Fork needs a source: sandbox_id (a live sandbox) or snapshot (a snapshot name)")

    def _fork_live(self, request: sandboxes_pb2.ForkRequest, context: grpc.ServicerContext) -> executor_pb2.Sandbox:
        owned = self._running(request.sandbox_id, context)
        engine = self._engine()
        source = owned.session
        with self.executor.reserved(owned.client, owned.box.spec) as reservation:
            gate, ticket = self._gate(owned, "fork", {"from_snapshot": False}, request.approval_id)
            with self._acting(gate, ticket, context, owned):
                run_id = self.executor.new_run(owned.client)
                ticket.outcome["fork"] = run_id
                harness = Session(self.executor.registry, source.policy, self.audit, run_id=run_id,
                                  engine_factory=self.executor.engine_factory)
                try:
                    forked = engine.fork(owned.box, owner=run_owner(run_id))  # its run, as a created one
                except BaseException:
                    self._end_run(run_id, "sandbox_start_failed")
                    raise
                harness.attach(forked)  # a new session: it has no sandbox yet, so this cannot fail
                session = ClientSession(owned.client, harness, source.policy, source.tools, source.ttl_seconds,
                                        source.overrides)
                session.expires = forked.expires or session.expires
                self._note_origin(run_id, {"forked_from": owned.sandbox_id})
                self.executor.register(session, context.is_active, reservation)
        return session.message()

    def _fork_snapshot(self, request: sandboxes_pb2.ForkRequest,
                       context: grpc.ServicerContext) -> executor_pb2.Sandbox:
        client = self.executor.client_of(context)
        engine = self._engine()
        snapshots = ClientSnapshots(engine, client)
        info = snapshots.get(request.snapshot)
        _, recorded = read_sidecar(engine, info)
        server = self.executor.profiles.of(client)
        overrides = recorded if recorded is not None else overrides_from_spec(
            engine.snapshot_spec(info.name), server.sandbox_spec())
        policy = sandbox_policy(server, overrides, self.executor.profiles.exposed(client))
        with self.executor.reserved(client, policy.sandbox_spec()) as reservation:
            run_id, reused = self._fork_run(client, request.approval_id)
            try:
                gate, ticket = self._authorize(policy, run_id, client, "fork",
                                               {"snapshot": request.snapshot, "from_snapshot": True},
                                               request.approval_id)
            except ServiceError as refusal:
                if not reused and refusal.error is not ErrorCode.APPROVAL_PENDING:
                    self._end_run(run_id, "fork_refused")  # a run of this request only: it has nothing else
                raise
            with self._acting(gate, ticket, context):
                session = self._restored(engine, client, run_id, policy, overrides, info)
                self._note_origin(run_id, {"forked_from_snapshot": request.snapshot})
                self.executor.register(session, context.is_active, reservation)
        return session.message()

    def _fork_run(self, client: str, approval_id: str) -> tuple[str, bool]:
        """The run of a fork of a snapshot, and whether it is the asked one's: that one when
        its approval comes back (the approval names the sandbox id the fork gets) and the run
        never had a sandbox and has not ended, else a new one (the gate then refuses the
        approval as not of it)."""
        if approval_id:
            try:
                run = self.audit.get_run(self.audit.get_approval(approval_id).run_id)
            except AuditError:
                return self.executor.new_run(client), False
            if self.executor.owns_run(run.id, client) and run.ended is None and "container" not in run.meta:
                return run.id, True
        return self.executor.new_run(client), False

    def _restored(self, engine: SnapshotKeeper, client: str, run_id: str, policy: Policy,
                  overrides: SandboxOverrides, info: SnapshotInfo) -> ClientSession:
        """A session whose new sandbox (of ``policy``) holds the files of snapshot ``info``."""
        harness = Session(self.executor.registry, policy, self.audit, run_id=run_id,
                          engine_factory=self.executor.engine_factory)
        session = ClientSession(client, harness, policy, self.executor.registry.exposed_names(policy),
                                policy.sandbox.ttl_seconds, overrides)
        try:
            box = harness.sandbox()
        except CallboxError as error:
            self._end_run(run_id, "sandbox_start_failed")
            raise creation_failure(error) from None
        try:
            engine.restore_snapshot_files(box, info.name)
        except BaseException:
            session.close(self.audit, "sandbox_start_failed")
            raise
        return session

    def _end_run(self, run_id: str, reason: str) -> None:
        with contextlib.suppress(AuditError):
            self.audit.end_run(run_id, reason)

    def _note_origin(self, run_id: str, meta: Mapping[str, Any]) -> None:
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(run_id, meta)
