"""What every Sandboxes RPC does first: find the caller's sandbox, ask the policy, record the action.

A request's sandbox is the calling client's live session (anyone else's is NOT_FOUND); the
action gate is of the sandbox's policy and run, with the actor ``grpc:CLIENT``; ``deny`` is
PERMISSION_DENIED, ``ask`` APPROVAL_PENDING with the approval's id; each action's outcome is
recorded when it ends (a stream the client cancelled is an ok end, ``ended: cancelled``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from harness.core.actions import ActionDenied, ActionGate, ActionTicket, ApprovalPending
from harness.core.errors import CallboxError, ErrorCode, short_reason
from harness.core.policy import Policy
from harness.doors.grpc.errors import ServiceError, action_refused, not_found
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import ClientSession
from harness.engine.base import LivingSandbox, is_living

__all__ = ["Owned", "SandboxesBase"]

log = logging.getLogger("callbox.executor")


@dataclass(frozen=True)
class Owned:
    """A request's sandbox: whose it is, its session and its engine sandbox."""

    client: str
    session: ClientSession
    box: LivingSandbox

    @property
    def sandbox_id(self) -> str:
        return self.session.sandbox_id


class SandboxesBase:
    """The Sandboxes servicer's shared steps, over the sessions of an :class:`ExecutorService`."""

    def __init__(self, executor: ExecutorService) -> None:
        self.executor = executor
        self.audit = executor.audit

    # ---- who is asking, what they own, what the policy says ------------------------------------

    def _owned(self, sandbox_id: str, context: grpc.ServicerContext) -> Owned:
        client = self.executor.client_of(context)
        session = self.executor.session_of(sandbox_id, client)
        box = session.harness.active_sandbox
        if not is_living(box):
            raise ServiceError(ErrorCode.NOT_SUPPORTED,
                               f"sandbox {sandbox_id} runs on an engine without living sandboxes")
        return Owned(client, session, box)

    def _running(self, sandbox_id: str, context: grpc.ServicerContext) -> Owned:
        """As ``_owned``, and PAUSED if it is paused (for what needs its agent)."""
        owned = self._owned(sandbox_id, context)
        owned.box.require_running()
        return owned

    def _authorize(self, policy: Policy, run_id: str, client: str, action: str, details: Mapping[str, Any],
                   approval_id: str) -> tuple[ActionGate, ActionTicket]:
        gate = ActionGate(policy, self.audit, run_id=run_id, actor=f"grpc:{client}")
        try:
            return gate, gate.authorize(action, details, approval_id=approval_id or None)
        except (ActionDenied, ApprovalPending) as refusal:
            raise action_refused(refusal) from None

    def _gate(self, owned: Owned, action: str, details: Mapping[str, Any],
              approval_id: str) -> tuple[ActionGate, ActionTicket]:
        return self._authorize(owned.session.policy, owned.sandbox_id, owned.client, action,
                               {"sandbox": owned.sandbox_id, **details}, approval_id)

    @contextlib.contextmanager
    def _acting(self, gate: ActionGate, ticket: ActionTicket, context: grpc.ServicerContext,
                owned: Owned | None = None) -> Iterator[ActionTicket]:
        """Record the action's outcome when the block ends: ok, cancelled (the client went
        away: an ok end), or failed with the error's first line."""
        try:
            with self._live(owned):
                yield ticket
        except BaseException as exc:
            if isinstance(exc, GeneratorExit) or not context.is_active():
                gate.finish_logged(ticket, ok=True, detail={**ticket.outcome, "ended": "cancelled"})
            else:
                gate.finish_logged(ticket, ok=False, detail={**ticket.outcome, "error": short_reason(exc)})
            raise
        gate.finish_logged(ticket, ok=True, detail=ticket.outcome)

    @contextlib.contextmanager
    def _live(self, owned: Owned | None) -> Iterator[None]:
        """An operation of a sandbox that is deleted meanwhile ends NOT_FOUND (its agent's
        channel closed under it)."""
        try:
            yield
        except (CallboxError, ServiceError):
            if owned is not None and owned.session.closed:
                raise not_found("sandbox", owned.sandbox_id) from None
            raise
