"""Reading the audit store a page at a time: runs, resolved approvals and egress decisions
filtered by client, tool, state or decision, with their total for paging, and the calls and
egress decisions since a moment (the console's overview charts).

A client is ``runs.meta.client``: every filter by client joins the run, so a client's view
(the console's ``viewer``) holds nothing of another client's. Filters are exact matches
except ``host``, a substring. Nothing here writes.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from harness.audit.database import Database
from harness.audit.records import APPROVAL_COLUMNS, Approval, RunRecord, _approval_from_row, _run_from_row
from harness.audit.schema import table_exists

__all__ = ["RUN_STATES", "Browse", "CallPoint", "EgressPoint", "Filters"]

RUN_STATES = ("open", "ended", "waiting")
"""A run's states to filter by: not ended yet, ended, waiting for a person (an approval pending)."""
_CLIENT = "json_extract(r.meta, '$.client')"
_APPROVAL_COLUMNS = ", ".join(f"a.{name}" for name in APPROVAL_COLUMNS.split(", "))
_RUNS = (
    "SELECT r.id, r.created, r.ended, r.end_reason, r.meta, "
    "(SELECT COUNT(*) FROM calls c WHERE c.run_id = r.id) FROM runs r"
)


@dataclass(frozen=True)
class Filters:
    """What a page is narrowed to (None or empty: anything)."""

    client: str | None = None
    tool: str | None = None
    state: str | None = None
    """Runs: one of :data:`RUN_STATES`; approvals: ``approved`` or ``denied``; egress: the decision."""
    host: str | None = None
    by: str | None = None
    """Approvals: who resolved them (``console:ops``, ``grpc:ops``, a CLI user's name)."""


@dataclass(frozen=True)
class CallPoint:
    """One call as the overview charts count it."""

    started: float
    duration_ms: float | None
    decision: str | None
    error_code: str | None


@dataclass(frozen=True)
class EgressPoint:
    ts: float
    decision: str


class _Where:
    """WHERE clauses and their parameters, added one at a time."""

    def __init__(self) -> None:
        self.clauses: list[str] = []
        self.params: list[Any] = []

    def add(self, clause: str, *params: Any) -> None:
        self.clauses.append(clause)
        self.params.extend(params)

    def sql(self) -> str:
        return f" WHERE {' AND '.join(self.clauses)}" if self.clauses else ""


class Browse(Database):
    """The filtered, paged reads of the audit store."""

    def find_runs(self, filters: Filters, *, offset: int = 0, limit: int = 100) -> tuple[list[RunRecord], int]:
        """Runs matching ``filters``, newest first, from ``offset``; and how many match in all.
        ``tool``: runs with at least one call of that tool."""
        where = _Where()
        if filters.client:
            where.add(f"{_CLIENT} = ?", filters.client)
        if filters.tool:
            where.add("EXISTS (SELECT 1 FROM calls c WHERE c.run_id = r.id AND c.tool = ?)", filters.tool)
        if filters.state == "open":
            where.add("r.ended IS NULL")
        elif filters.state == "ended":
            where.add("r.ended IS NOT NULL")
        elif filters.state == "waiting":
            where.add("EXISTS (SELECT 1 FROM approvals a WHERE a.run_id = r.id AND a.state = 'pending')")

        def body(c: sqlite3.Connection) -> tuple[list[Any], int]:
            rows = c.execute(f"{_RUNS}{where.sql()} ORDER BY r.created DESC, r.rowid DESC LIMIT ? OFFSET ?",
                             (*where.params, limit, offset)).fetchall()
            total = c.execute(f"SELECT COUNT(*) FROM runs r{where.sql()}", where.params).fetchone()[0]  # noqa: S608
            return rows, int(total)

        rows, total = self._read(body)
        return [_run_from_row(r) for r in rows], total

    def resolved_approvals(self, filters: Filters, *, offset: int = 0, limit: int = 100
                           ) -> tuple[list[tuple[Approval, str]], int]:
        """Approvals a person resolved (``approved``, ``denied``, and ``consumed``: approved and
        then run), the latest resolved first, each with its run's client; and how many match.
        ``state``: ``approved`` (approved or consumed) or ``denied``."""
        where = _Where()
        where.add("a.state != 'pending'")
        if filters.client:
            where.add(f"{_CLIENT} = ?", filters.client)
        if filters.tool:
            where.add("a.tool = ?", filters.tool)
        if filters.state == "approved":
            where.add("a.state IN ('approved', 'consumed')")
        elif filters.state == "denied":
            where.add("a.state = 'denied'")
        if filters.by:
            where.add("a.resolved_by = ?", filters.by)
        joined = " a LEFT JOIN runs r ON r.id = a.run_id"
        select = f"SELECT {_APPROVAL_COLUMNS}, {_CLIENT} FROM approvals{joined}"  # noqa: S608

        def body(c: sqlite3.Connection) -> tuple[list[Any], int]:
            rows = c.execute(f"{select}{where.sql()} ORDER BY a.resolved DESC, a.rowid DESC LIMIT ? OFFSET ?",
                             (*where.params, limit, offset)).fetchall()
            count = f"SELECT COUNT(*) FROM approvals{joined}{where.sql()}"  # noqa: S608
            total = c.execute(count, where.params).fetchone()[0]
            return rows, int(total)

        rows, total = self._read(body)
        return [(_approval_from_row(row[:-1]), str(row[-1] or "?")) for row in rows], total

    def count_pending(self, client: str | None = None) -> int:
        """Approvals waiting for a person (of ``client``'s runs only, when given)."""
        params: tuple[str, ...] = ()
        if client is None:
            sql = "SELECT COUNT(*) FROM approvals WHERE state = 'pending'"
        else:
            sql = (f"SELECT COUNT(*) FROM approvals a JOIN runs r ON r.id = a.run_id "  # noqa: S608
                   f"WHERE a.state = 'pending' AND {_CLIENT} = ?")
            params = (client,)
        return int(self._read(lambda c: c.execute(sql, params).fetchone()[0]))

    def find_egress(self, filters: Filters, *, offset: int = 0, limit: int = 100
                    ) -> tuple[list[dict[str, Any]], int]:
        """Egress decisions matching ``filters`` (``state``: the decision; ``host``: a part of
        the host), newest first, each with its run's client; and how many match."""
        where = _Where()
        if filters.client:
            where.add(f"{_CLIENT} = ?", filters.client)
        if filters.state:
            where.add("e.decision = ?", filters.state)
        if filters.host:
            where.add("instr(lower(e.host), lower(?)) > 0", filters.host)
        names = ("run_id", "call_id", "sandbox_id", "ts", "decision", "method", "host", "port", "address", "reason",
                 "client")
        joined = " e LEFT JOIN runs r ON r.id = e.run_id"

        def body(c: sqlite3.Connection) -> tuple[list[Any], int]:
            if not table_exists(c, "egress"):
                return [], 0
            select = ("SELECT e.run_id, e.call_id, e.sandbox_id, e.ts, e.decision, e.method, e.host, e.port, "  # noqa: S608
                      f"e.address, e.reason, {_CLIENT} FROM egress{joined}{where.sql()} "
                      "ORDER BY e.id DESC LIMIT ? OFFSET ?")
            rows = c.execute(select, (*where.params, limit, offset)).fetchall()
            count = f"SELECT COUNT(*) FROM egress{joined}{where.sql()}"  # noqa: S608
            total = c.execute(count, where.params).fetchone()[0]
            return rows, int(total)

        rows, total = self._read(body)
        return [dict(zip(names, row, strict=True)) for row in rows], total

    def calls_since(self, since: float, client: str | None = None) -> list[CallPoint]:
        """The calls started at or after ``since`` (of ``client``'s runs only, when given), oldest first."""
        where = _Where()
        where.add("c.started >= ?", since)
        if client is not None:
            where.add(f"{_CLIENT} = ?", client)
        sql = (f"SELECT c.started, c.duration_ms, c.decision, c.error_code FROM calls c "  # noqa: S608
               f"JOIN runs r ON r.id = c.run_id{where.sql()} ORDER BY c.started")
        rows = self._read(lambda c: c.execute(sql, where.params).fetchall())
        return [CallPoint(float(r[0]), r[1], r[2], r[3]) for r in rows]

    def egress_since(self, since: float, client: str | None = None) -> list[EgressPoint]:
        """The egress decisions at or after ``since`` (of ``client``'s runs only, when given), oldest first."""
        where = _Where()
        where.add("e.ts >= ?", since)
        if client is not None:
            where.add(f"{_CLIENT} = ?", client)

        def body(c: sqlite3.Connection) -> list[Any]:
            if not table_exists(c, "egress"):
                return []
            sql = f"SELECT e.ts, e.decision FROM egress e JOIN runs r ON r.id = e.run_id{where.sql()} ORDER BY e.ts"  # noqa: S608
            return c.execute(sql, where.params).fetchall()

        return [EgressPoint(float(ts), str(decision)) for ts, decision in self._read(body)]
