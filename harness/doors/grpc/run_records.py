"""The executor service's runs and approvals: ``ResolveApproval``, ``GetRun`` and ``ListRuns``,
and who may see which run (a mixin of :class:`~harness.doors.grpc.service.ExecutorService`).

A client sees the runs of this door it made; an operator (:mod:`~harness.doors.grpc.tokens`)
reads any run of this door, and is the only one who resolves approvals, of any door's run:
a client never resolves one, not even of its own calls, so an approval means a person.
``ListRuns`` lists the caller's own runs, whatever its role.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import grpc

from harness.audit.store import AuditError, AuditStore, RunRecord
from harness.core.errors import ErrorCode
from harness.doors.grpc.errors import ServiceError, denied, handle_errors, not_found
from harness.doors.grpc.messages import approval_message, call_message
from harness.doors.grpc.tokens import TokenSet
from harness.v1 import executor_pb2

__all__ = ["DOOR", "MAX_LIST_RUNS", "RunRecordRpcs"]

DOOR = "grpc"
"""The door's name in run metadata (``meta.door``) and in who resolved an approval (``grpc:NAME``)."""
MAX_LIST_RUNS = 1000


class RunRecordRpcs:
    """The run and approval RPCs over the executor's audit store, tokens and live sessions."""

    audit: AuditStore
    tokens: TokenSet
    _lock: threading.Condition
    _sessions: Mapping[str, Any]

    def _client(self, context: grpc.ServicerContext) -> str:
        raise NotImplementedError

    def owns_run(self, run_id: str, client: str) -> bool:
        """Whether ``run_id`` is a run of ``client`` (live or not)."""
        try:
            self._owned_run(run_id, client)
        except ServiceError:
            return False
        return True

    def _owned_run(self, run_id: str, client: str) -> RunRecord:
        try:
            run = self.audit.get_run(run_id)
        except AuditError:
            raise not_found("run", run_id) from None
        if not self._sees_run(run, client):
            raise not_found("run", run_id)
        return run

    @staticmethod
    def _owns(run: RunRecord, client: str) -> bool:
        return run.meta.get("door") == DOOR and run.meta.get("client") == client

    def _sees_run(self, run: RunRecord, client: str) -> bool:
        return self._owns(run, client) or (run.meta.get("door") == DOOR and self.tokens.is_operator(client))

    # ---- approvals and the audit store -------------------------------------------------------

    @handle_errors
    def ResolveApproval(self, request: executor_pb2.ResolveApprovalRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        if not self.tokens.is_operator(client):
            raise denied(
                f"approvals are resolved by an operator, and {client!r} is a client token: a person resolves it "
                f"with an operator's token (a token-file line ending in ' operator'), in the console, or with "
                f"`callbox approvals approve {request.approval_id}` on the server"
            )
        try:
            approval = self.audit.get_approval(request.approval_id)
        except AuditError:
            raise not_found("approval", request.approval_id) from None
        try:  # a call's approval, or a held egress connection's (``scope``: once or sandbox)
            resolved = self.audit.resolve_approval(approval.id, request.approve, by=f"{DOOR}:{client}",
                                                   reason=request.reason or None, scope=request.scope or None)
        except AuditError as error:
            code = ErrorCode.INVALID_REQUEST if error.code is ErrorCode.INVALID_REQUEST else ErrorCode.ALREADY_RESOLVED
            raise ServiceError(code, error.message) from None
        return approval_message(resolved)

    @handle_errors
    def GetRun(self, request: executor_pb2.GetRunRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        run = self._owned_run(request.run_id, client)
        message = self._run_message(run)
        for call in self.audit.calls_for_run(run.id):
            message.calls.append(call_message(call))
        for approval in self.audit.list_approvals(None, run_id=run.id):
            message.approvals.append(approval_message(approval))
        return message

    @handle_errors
    def ListRuns(self, request: executor_pb2.ListRunsRequest, context: grpc.ServicerContext) -> Any:
        client = self._client(context)
        limit = min(request.limit or 50, MAX_LIST_RUNS)
        fetch = max(4 * limit, 200)
        while True:
            runs = self.audit.list_runs(fetch)
            mine = [r for r in runs if self._owns(r, client)]
            if len(mine) >= limit or len(runs) < fetch or fetch >= 64 * MAX_LIST_RUNS:
                break
            fetch *= 4
        return executor_pb2.ListRunsResponse(runs=[self._run_message(r) for r in mine[:limit]])

    def _run_message(self, run: RunRecord) -> executor_pb2.Run:
        with self._lock:
            live = run.id in self._sessions
        return executor_pb2.Run(
            run_id=run.id, created_unix=run.created, ended_unix=run.ended or 0.0, end_reason=run.end_reason or "",
            live=live, call_count=run.calls,
        )

