"""The audit chain as JSON lines, for ``callbox audit export`` and ``GET /audit/export``.

One line per chain entry (:mod:`harness.audit.chain`), oldest first::

    {"seq": 41, "ts": 1796564310.95, "table": "calls", "key": "[17]", "op": "update",
     "run_id": "...", "actor": "host/pid/start", "digest": "...", "note": null,
     "prev": "...", "hash": "...", "record": {...}}

``record`` is the row as it is now (its non-NULL columns, exactly what ``digest`` is the
sha256 of, in canonical form) on the row's latest entry; earlier entries of the row carry
its digest only (the store keeps a row's latest state). A reader checks a line by
recomputing ``hash`` (:func:`harness.audit.chain.entry_hash`) and, where there is a record,
its digest; a whole export also by following ``prev``.

With ``client``, only the entries of that client's runs (``runs.meta.client``) are written:
no entry of another client's run, and no note about the chain itself. With ``since``, only
entries written at or after that time.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.audit.chain import CHAIN_TABLE, TableShape, content_json, is_chained_table
from harness.audit.chain_verify import open_snapshot
from harness.audit.errors import AuditError

__all__ = ["export_lines", "parse_since"]

_COLUMNS = ("seq", "ts", "table", "key", "op", "run_id", "actor", "digest", "note", "prev", "hash")


def parse_since(text: str) -> float:
    """A ``--since`` time: epoch seconds, or ISO 8601 (``2026-12-06``, ``2026-12-06T14:00:00Z``;
    without a zone, UTC)."""
    value = text.strip()
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise AuditError(f"bad time {text!r}: give epoch seconds (1796564310) or ISO 8601 "
                         "(2026-12-06 or 2026-12-06T14:00:00Z; without a zone, UTC)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def export_lines(path: Path, *, client: str | None = None, since: float | None = None) -> Iterator[str]:
    """The export of the audit database at ``path`` (see the module docstring), one JSON line
    (with its newline) at a time, from one consistent snapshot. The database is opened
    before this returns (an AuditError then), and closed when the lines are all read or the
    iterator is closed."""
    conn = open_snapshot(path)

    def lines() -> Iterator[str]:
        try:
            yield from _lines(conn, client, since)
        except sqlite3.Error as exc:
            raise AuditError(f"cannot read the audit chain of {path}: {exc}") from exc
        finally:
            conn.close()

    return lines()


def _lines(conn: sqlite3.Connection, client: str | None, since: float | None) -> Iterator[str]:
    runs: set[str] | None = None
    if client is not None:
        runs = {str(r[0]) for r in conn.execute("SELECT id FROM runs WHERE json_extract(meta, '$.client') = ?",
                                                (client,))}
    clauses, params = [], []
    if since is not None:
        clauses.append("ts >= ?")
        params.append(since)
    if runs is not None:
        clauses.append("run_id IS NOT NULL")
    where = f" WHERE {' AND '.join(clauses)}" if clauses else ""
    latest = {(str(t), str(k)): int(s) for t, k, s in conn.execute(
        f"SELECT tbl, key, max(seq) FROM {CHAIN_TABLE} WHERE tbl != '' GROUP BY tbl, key")}  # noqa: S608
    shapes: dict[str, TableShape | None] = {}
    cursor = conn.execute(f"SELECT {', '.join(c if c != 'table' else 'tbl' for c in _COLUMNS)} "  # noqa: S608
                          f"FROM {CHAIN_TABLE}{where} ORDER BY seq", params)
    for values in cursor:
        entry: dict[str, Any] = dict(zip(_COLUMNS, values, strict=True))
        if runs is not None and entry["run_id"] not in runs:
            continue
        table, key = entry["table"], entry["key"]
        if table and entry["op"] != "delete" and latest.get((table, key)) == entry["seq"]:
            record = _record(conn, shapes, table, key)
            if record is not None:
                entry["record"] = record
        yield json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"


def _record(conn: sqlite3.Connection, shapes: dict[str, TableShape | None], table: str,
            key: str) -> dict[str, Any] | None:
    """The row ``key`` of ``table`` now, as its digest covers it; None when it is gone."""
    if table not in shapes:
        exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
        shapes[table] = TableShape.of(conn, table) if exists and is_chained_table(table) else None
    shape = shapes[table]
    if shape is None:
        return None
    values = shape.read(conn, None, key)
    if values is None:
        return None
    record: dict[str, Any] = json.loads(content_json(shape.row(values)))
    return record
