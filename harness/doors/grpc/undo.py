"""The ``harness.v1.Undo`` service: ``DiffRun`` and ``RevertRun`` over a run's change records.

A client reaches its own runs of this door (an operator every run of it), as ``GetRun``
does; anyone else's is NOT_FOUND. ``RevertRun`` is the sandbox action ``revert``: authorized
by the policy of the run's session (its client's profile's policy for an ended run), recorded
in the run with the actor ``grpc:CLIENT``. A run whose session is live here is reverted in its
sandbox, every writable place, while no other call of it runs; an ended one through its
read-write mounts' host directories (:mod:`harness.core.run_revert`). A paused sandbox is
PAUSED; a call of the run running is FAILED_PRECONDITION (``conflict``) naming it.
"""

from __future__ import annotations

from typing import Any

import grpc

from harness.core import undo
from harness.core.errors import CallboxError
from harness.core.run_revert import revert_run, run_changes
from harness.doors.grpc.errors import ServiceError, handle_errors_any, invalid, not_found, paused, sandbox_failure
from harness.doors.grpc.sandboxes_base import SandboxesBase
from harness.doors.grpc.sessions import ClientSession
from harness.v1 import undo_pb2, undo_pb2_grpc

__all__ = ["MAX_DIFF_CHARS", "UndoService"]

MAX_DIFF_CHARS = 8 << 20
"""Characters of a diff one DiffRun answers (cut at a line; in UTF-8 at most half the door's message size)."""


class UndoService(SandboxesBase, undo_pb2_grpc.UndoServicer):
    """Diff and revert of the runs of an :class:`~harness.doors.grpc.service.ExecutorService`'s clients."""

    def _run(self, run_id: str, context: grpc.ServicerContext) -> str:
        """The caller's name, once ``run_id`` is a run it may see (NOT_FOUND otherwise)."""
        if not run_id:
            raise invalid("run_id is required (a sandbox's id is its run's id)")
        client = self.executor.client_of(context)
        if not self.executor.owns_run(run_id, client):
            raise not_found("run", run_id)
        return client

    @handle_errors_any
    def DiffRun(self, request: undo_pb2.DiffRunRequest, context: grpc.ServicerContext) -> Any:
        self._run(request.run_id, context)
        changes = run_changes(self.audit, request.run_id)
        text = undo.diff(changes, request.call_id or None)
        truncated = len(text) > MAX_DIFF_CHARS
        if truncated:
            text = text[:text.rfind("\n", 0, MAX_DIFF_CHARS) + 1]
        calls = [undo_pb2.CallChanges(call_id=r.call_id or "", tool=r.tool or "", created=c, changed=m, removed=d)
                 for r in undo.call_records(changes, request.call_id or None) for c, m, d in [undo.counts(r)]]
        return undo_pb2.DiffRunResponse(diff=text, calls=calls, truncated=truncated)

    @handle_errors_any
    def RevertRun(self, request: undo_pb2.RevertRunRequest, context: grpc.ServicerContext) -> Any:
        client = self._run(request.run_id, context)
        if not request.to_call:
            raise invalid("to_call is required: the call before which to restore (DiffRun lists the recorded calls)")
        session = self._live_session(request.run_id, client)
        if session is not None and session.paused:
            raise paused(request.run_id)
        owner = str(self.audit.get_run(request.run_id).meta.get("client") or client)
        policy = session.policy if session is not None else self.executor.profiles.of(owner)
        details = {"sandbox": request.run_id, "to_call": request.to_call, "mounts_only": request.mounts_only}
        gate, ticket = self._authorize(policy, request.run_id, client, "revert", details, request.approval_id)
        with self._acting(gate, ticket, context):
            try:
                how, report = revert_run(self.audit, request.run_id, request.to_call,
                                         session=session.harness if session is not None else None,
                                         mounts_only=request.mounts_only, flag="mounts_only = true")
            except CallboxError as error:
                raise sandbox_failure(error, request.run_id) from None
            ticket.outcome.update({"how": how, "count": report.count, "not_restored": len(report.not_restored)})
        return undo_pb2.RevertRunResponse(how=how, **report.as_dict())

    def _live_session(self, run_id: str, client: str) -> ClientSession | None:
        try:
            return self.executor.session_of(run_id, client)
        except ServiceError:
            return None
