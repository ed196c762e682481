"""Egress records: what the egress proxy of an ``allowlist`` sandbox allowed or refused, per
run (and the call during which it was seen). The ``egress`` table is made on first use.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from harness.audit.database import Database
from harness.audit.schema import EGRESS_TABLE, table_exists

__all__ = ["Egress"]


class Egress(Database):
    """The egress part of the audit store."""

    def record_egress(self, run_id: str, call_id: str | None, sandbox_id: str,
                      records: Iterable[Mapping[str, Any]]) -> int:
        """Store egress proxy decisions (its JSON records: ts, decision, method, host, port,
        address, reason) for ``run_id``; returns how many were stored."""
        rows = [
            (run_id, call_id, sandbox_id, float(r.get("ts") or 0.0), str(r.get("decision") or "?"),
             r.get("method"), r.get("host"), r.get("port"), r.get("address"), r.get("reason"),
             json.dumps(dict(r), sort_keys=True))
            for r in records
        ]
        if not rows:
            return 0

        def body(c: sqlite3.Connection) -> None:
            c.execute(EGRESS_TABLE)
            c.executemany(
                "INSERT INTO egress (run_id, call_id, sandbox_id, ts, decision, method, host, port, address, "
                "reason, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows,
            )

        self._write(body)
        return len(rows)

    def egress(self, run_id: str) -> list[dict[str, Any]]:
        """The egress decisions recorded for ``run_id``, oldest first."""

        def body(c: sqlite3.Connection) -> Any:
            if not table_exists(c, "egress"):
                return []
            return c.execute(
                "SELECT call_id, sandbox_id, ts, decision, method, host, port, address, reason FROM egress "
                "WHERE run_id = ? ORDER BY ts, id", (run_id,),
            ).fetchall()

        names = ("call_id", "sandbox_id", "ts", "decision", "method", "host", "port", "address", "reason")
        return [dict(zip(names, row, strict=True)) for row in self._read(body)]

    def recent_egress(self, limit: int = 100) -> list[dict[str, Any]]:
        """The last ``limit`` egress decisions across runs, newest first (each with its ``run_id``)."""

        def body(c: sqlite3.Connection) -> Any:
            if not table_exists(c, "egress"):
                return []
            return c.execute(
                "SELECT run_id, call_id, sandbox_id, ts, decision, method, host, port, address, reason FROM egress "
                "ORDER BY id DESC LIMIT ?", (limit,),
            ).fetchall()

        names = ("run_id", "call_id", "sandbox_id", "ts", "decision", "method", "host", "port", "address", "reason")
        return [dict(zip(names, row, strict=True)) for row in self._read(body)]
