"""Approvals: a call the policy says ``ask`` about waits for a person.

``create_approval`` persists it (pending); ``resolve_approval`` (CLI, API, any process)
approves or denies it; ``consume_approval`` flips approved -> consumed atomically, so an
approved call runs exactly once even if two harness processes resume it.
"""

from __future__ import annotations

import dataclasses
import secrets
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from harness.audit.database import ENSURE_RUN, Database
from harness.audit.errors import AuditError, unknown_approval
from harness.audit.records import (
    APPROVAL_COLUMNS,
    EGRESS_SCOPES,
    EGRESS_TOOL,
    Approval,
    _approval_from_row,
    _prepare_arguments,
)
from harness.core.errors import ErrorCode

__all__ = ["APPROVAL_STATES", "SELECT_APPROVALS", "Approvals"]

APPROVAL_STATES = ("pending", "approved", "denied", "consumed")

_APPROVAL_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # url-safe, no look-alikes, never starts with "-"
_APPROVAL_ID_LEN = 10

SELECT_APPROVALS = f"SELECT {APPROVAL_COLUMNS} FROM approvals"  # noqa: S608
_SELECT_APPROVAL = f"{SELECT_APPROVALS} WHERE id = ?"
_SELECT_APPROVAL_OF_CALL = f"{SELECT_APPROVALS} WHERE run_id = ? AND call_id = ?"


def _new_approval_id() -> str:
    return "".join(secrets.choice(_APPROVAL_ID_ALPHABET) for _ in range(_APPROVAL_ID_LEN))


class Approvals(Database):
    """The approvals part of the audit store."""

    def create_approval(
        self, run_id: str, call_id: str, tool: str, arguments_json: str | Mapping[str, Any], rule: str, reason: str
    ) -> Approval:
        """Persist a pending approval for the call; if one exists for (run, call_id), return it."""
        args = _prepare_arguments(arguments_json)
        now = time.time()

        def body(c: sqlite3.Connection) -> Approval:
            row = c.execute(_SELECT_APPROVAL_OF_CALL, (run_id, call_id)).fetchone()
            if row is not None:
                return _approval_from_row(row)
            c.execute(ENSURE_RUN, (run_id, now))
            while True:
                approval_id = _new_approval_id()
                cur = c.execute(
                    "INSERT INTO approvals (id, run_id, call_id, tool, args_digest, arguments, arguments_truncated, "
                    "rule, reason, created) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
                    (approval_id, run_id, call_id, tool, args.digest, args.text, int(args.truncated), rule, reason,
                     now),
                )  # fmt: skip
                if cur.rowcount == 1:
                    break
            return Approval(
                id=approval_id, run_id=run_id, call_id=call_id, tool=tool, args_digest=args.digest,
                arguments=args.text, arguments_truncated=args.truncated, rule=rule, reason=reason, state="pending",
                created=now, resolved=None, resolved_by=None, resolution_reason=None, consumed=None,
            )  # fmt: skip

        return self._write(body)

    def get_approval(self, approval_id: str) -> Approval:
        row = self._read(lambda c: c.execute(_SELECT_APPROVAL, (approval_id,)).fetchone())
        if row is None:
            raise unknown_approval(approval_id)
        return _approval_from_row(row)

    def find_approval(self, run_id: str, call_id: str) -> Approval | None:
        row = self._read(lambda c: c.execute(_SELECT_APPROVAL_OF_CALL, (run_id, call_id)).fetchone())
        return None if row is None else _approval_from_row(row)

    def list_approvals(self, state: str | None = "pending", *, run_id: str | None = None) -> list[Approval]:
        """Oldest first; ``state=None`` lists every state."""
        if state is not None and state not in APPROVAL_STATES:
            raise AuditError(f"unknown approval state {state!r}; use one of {', '.join(APPROVAL_STATES)}")
        clauses, params = [], []
        if state is not None:
            clauses.append("state = ?")
            params.append(state)
        if run_id is not None:
            clauses.append("run_id = ?")
            params.append(run_id)
        where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
        sql = f"{SELECT_APPROVALS}{where} ORDER BY created, rowid"
        rows = self._read(lambda c: c.execute(sql, params).fetchall())
        return [_approval_from_row(r) for r in rows]

    def resolve_approval(self, approval_id: str, approve: bool, *, by: str, reason: str | None,
                         scope: str | None = None) -> Approval:
        """pending -> approved | denied. Anything else is an AuditError naming the state.
        ``scope`` is for an egress approval (``once``, the default, or ``sandbox``) only."""

        def body(c: sqlite3.Connection) -> Approval:
            row = c.execute(_SELECT_APPROVAL, (approval_id,)).fetchone()
            if row is None:
                raise unknown_approval(approval_id)
            current = _approval_from_row(row)
            kept_scope = _scope(current, approve, scope)
            if current.state != "pending":
                state = "approved (and its call has run)" if current.state == "consumed" else current.state
                raise AuditError(f"approval {approval_id} is already {state}", code=ErrorCode.ALREADY_RESOLVED)
            new_state, now = ("approved" if approve else "denied"), time.time()
            c.execute(
                "UPDATE approvals SET state = ?, resolved = ?, resolved_by = ?, resolution_reason = ?, scope = ? "
                "WHERE id = ?", (new_state, now, by, reason, kept_scope, approval_id),
            )
            return dataclasses.replace(current, state=new_state, resolved=now, resolved_by=by, resolution_reason=reason,
                                       scope=kept_scope)

        return self._write(body)

    def take_egress_answer(self, approval_id: str) -> Approval:
        """An egress approval as it stands, an approved one flipped to consumed (the harness
        handed its answer to the proxy), so an answer is delivered once."""

        def body(c: sqlite3.Connection) -> Approval:
            row = c.execute(_SELECT_APPROVAL, (approval_id,)).fetchone()
            if row is None:
                raise unknown_approval(approval_id)
            current = _approval_from_row(row)
            if current.state != "approved":
                return current
            now = time.time()
            c.execute("UPDATE approvals SET state = 'consumed', consumed = ? WHERE id = ?", (now, approval_id))
            return dataclasses.replace(current, state="consumed", consumed=now)

        return self._write(body)

    def consume_approval(self, approval_id: str) -> bool:
        """approved -> consumed, atomically: True for exactly one caller, who then runs the
        call (now counted as authorized); False if it was already consumed. A pending or
        denied approval is an AuditError."""

        def body(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT state, run_id, call_id FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            if row is None:
                raise unknown_approval(approval_id)
            state, run_id, call_id = row
            if state == "consumed":
                return False
            if state == "pending":
                raise AuditError(
                    f"approval {approval_id} is still pending; "
                    f"approve it with `callbox approvals approve {approval_id}`",
                    code=ErrorCode.APPROVAL_PENDING,
                )
            if state == "denied":
                raise AuditError(f"approval {approval_id} was denied; its call must not run",
                                 code=ErrorCode.ALREADY_RESOLVED)
            c.execute("UPDATE approvals SET state = 'consumed', consumed = ? WHERE id = ?", (time.time(), approval_id))
            c.execute("UPDATE calls SET authorized = 1 WHERE run_id = ? AND call_id = ?", (run_id, call_id))
            return True

        return self._write(body)


def _scope(approval: Approval, approve: bool, scope: str | None) -> str | None:
    """The scope an answer gives ``approval``: ``once`` unless it says ``sandbox``, for an
    approved egress approval; None otherwise (a scope given to anything else is an error)."""
    if approval.tool != EGRESS_TOOL:
        if scope is not None:
            raise AuditError(f"approval {approval.id} is for a {approval.tool} call; only an egress approval "
                             f"takes a scope ({', '.join(EGRESS_SCOPES)})", code=ErrorCode.INVALID_REQUEST)
        return None
    if scope is not None and scope not in EGRESS_SCOPES:
        raise AuditError(f"unknown scope {scope!r} for approval {approval.id}; use one of {', '.join(EGRESS_SCOPES)}",
                         code=ErrorCode.INVALID_REQUEST)
    return (scope or "once") if approve else None
