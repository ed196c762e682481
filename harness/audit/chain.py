"""The audit chain: every change the store makes to a record is an entry of an append-only,
hash-linked log, so a record changed, removed or inserted behind the store's back shows.

**What is chained.** Every row of every table of the audit database (runs, calls, earlier
attempts, approvals, checkpoints, egress records, and any table added later), except
``call_counts`` (a per-run count its triggers derive from ``calls``) and the chain's own
tables. Each committed change of a row is one entry of ``audit_chain``::

    seq      1, 2, 3, ... with no gap
    ts       when it was written (epoch seconds)
    tbl      the table ("calls"), or "" for a note about the chain itself
    key      the row's primary key as a JSON array ('["20261206T1330-ab12cd34"]', '[17]')
    op       insert | update | delete | existing (a row there before the chain began or before
             its table joined it) | migrate (a row re-recorded after a schema change) | note
    run_id   the run the row belongs to (NULL for notes), which an export by client uses
    actor    the process that wrote it (host/pid/start)
    digest   sha256 of the row's canonical content (NULL for a delete and a note)
    note     words, for a note (how the chain began, a table that joined it)
    prev     the previous entry's hash (64 zeros for the first)
    hash     sha256 of the canonical JSON of [seq, ts, tbl, key, op, run_id, actor, digest, note, prev]

A row's canonical content is the JSON object of its columns that are not NULL, with sorted
keys, no whitespace and ASCII escapes (:func:`content_json`): a nullable column added later
changes no digest. An UPDATE is an entry with the row's content after it; several changes of
one row in one transaction are one entry with the content committed. The chain keeps the
digest of every state a row went through, and the row itself its latest: ``verify`` checks
each row against its latest entry, and every entry against the one before it.

**How.** Each connection of the store has TEMP triggers on the chained tables (they exist in
that connection only) that note the key of every row inserted, updated or deleted in a
temporary table; :meth:`Chain.seal` runs in the same ``BEGIN IMMEDIATE`` transaction just
before its COMMIT, reads those rows and appends their entries after the head. Writers queue
on SQLite's write lock, so the chain stays one line whatever the threads and processes.
A change made by any other connection (the ``sqlite3`` shell, an older callbox) fires no
trigger and enters no entry, so ``verify`` names it.

**Older stores.** The first connection that finds no chain (a store from a callbox without
one, or a new store) starts it in one transaction: a note entry saying how many records
were there, then one ``existing`` entry per row, and marks the store (``PRAGMA
application_id``): a marked store found without its chain had it removed, and the chain
started again says so (``verify`` reports it). A table that appears later (made on first
use, or by a newer callbox) joins the same way, with a note. A table whose columns change
(a migration adds one with a default) has its rows whose content changed re-recorded
(``migrate``), after a note naming the columns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CHAINED_MARK",
    "CHAIN_TABLE",
    "GENESIS",
    "LOG_EVERY",
    "RESTARTED",
    "Chain",
    "ChainHead",
    "TableShape",
    "content_digest",
    "content_json",
    "entry_hash",
    "is_chained_table",
    "read_head",
]

log = logging.getLogger("callbox.audit.chain")

CHAIN_TABLE = "audit_chain"
TABLES_TABLE = "audit_chain_tables"
GENESIS = "0" * 64
"""The ``prev`` of the first entry."""
LOG_EVERY = 1000
"""The head is logged each time the chain passes a multiple of this many entries."""

CHAINED_MARK = 0x63627831
"""``PRAGMA application_id`` of a store whose chain was started ("cbx1"): a store that has
it and no chain had its chain removed, which the chain's new first entry says."""
NEW_STORE = "chain started on a new store"
"""The note of a chain started on a new store (logged at debug level only)."""
RESTARTED = "chain restarted"
"""How the note of a chain started again on such a store begins (``verify`` reports it)."""

_UNCHAINED = frozenset({CHAIN_TABLE, TABLES_TABLE, "call_counts"})

_CREATE = (
    f"""CREATE TABLE IF NOT EXISTS {CHAIN_TABLE} (
        seq     INTEGER PRIMARY KEY,
        ts      REAL NOT NULL,
        tbl     TEXT NOT NULL,
        key     TEXT NOT NULL,
        op      TEXT NOT NULL,
        run_id  TEXT,
        actor   TEXT,
        digest  TEXT,
        note    TEXT,
        prev    TEXT NOT NULL,
        hash    TEXT NOT NULL
    )""",
    f"CREATE TABLE IF NOT EXISTS {TABLES_TABLE} (name TEXT PRIMARY KEY, columns TEXT NOT NULL)",
)
_PENDING = ("CREATE TEMP TABLE IF NOT EXISTS audit_chain_pending (tbl TEXT NOT NULL, rid INTEGER, key TEXT NOT NULL, "
            "op TEXT NOT NULL, run_id TEXT)")
_INSERT_ENTRY = (f"INSERT INTO {CHAIN_TABLE} (seq, ts, tbl, key, op, run_id, actor, digest, note, prev, hash) "  # noqa: S608
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_HEAD = f"SELECT seq, hash FROM {CHAIN_TABLE} ORDER BY seq DESC LIMIT 1"  # noqa: S608


_canonical = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode
_compact = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode


def is_chained_table(name: str) -> bool:
    """Whether rows of table ``name`` are chained."""
    return not name.startswith("sqlite_") and name not in _UNCHAINED


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def content_json(row: dict[str, Any]) -> str:
    """A row's canonical content: its non-NULL columns as JSON, keys sorted, no whitespace,
    ASCII escapes; a BLOB as ``{"$hex": ...}``."""
    kept = {k: ({"$hex": v.hex()} if isinstance(v, bytes) else v) for k, v in row.items() if v is not None}
    return _canonical(kept)


def content_digest(row: dict[str, Any]) -> str:
    return hashlib.sha256(content_json(row).encode("ascii")).hexdigest()


def entry_hash(seq: int, ts: float, tbl: str, key: str, op: str, run_id: str | None, actor: str | None,
               digest: str | None, note: str | None, prev: str) -> str:
    """An entry's hash (see the module docstring)."""
    body = _compact([seq, ts, tbl, key, op, run_id, actor, digest, note, prev])
    return hashlib.sha256(body.encode("ascii")).hexdigest()


@dataclass(frozen=True)
class ChainHead:
    """The chain's last entry: anchor it elsewhere (``SEQ:HASH``), then ``callbox audit verify
    --anchor SEQ:HASH`` proves the chain still holds it."""

    seq: int
    hash: str

    def __str__(self) -> str:
        return f"{self.seq}:{self.hash}"


def read_head(conn: sqlite3.Connection) -> ChainHead:
    """The head of the chain behind ``conn`` (seq 0 and the genesis hash when it has none)."""
    try:
        row = conn.execute(_HEAD).fetchone()
    except sqlite3.OperationalError:  # no chain yet
        row = None
    return ChainHead(0, GENESIS) if row is None else ChainHead(int(row[0]), str(row[1]))


@dataclass(frozen=True)
class TableShape:
    """How to find a chained table's rows: its columns, its key columns (the primary key, else
    the rowid) and the column naming its run."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    run: str | None
    rowid: bool
    """Whether the table has a rowid (not ``WITHOUT ROWID``): a changed row is read back by it."""

    @classmethod
    def of(cls, conn: sqlite3.Connection, name: str) -> TableShape:
        info = conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
        columns = tuple(str(r[1]) for r in info)
        key = tuple(str(r[1]) for r in sorted((r for r in info if r[5]), key=lambda r: r[5])) or ("rowid",)
        run = "run_id" if "run_id" in columns else ("id" if name == "runs" else None)
        try:
            conn.execute(f"SELECT rowid FROM {_quote(name)} LIMIT 0")  # noqa: S608
            rowid = True
        except sqlite3.OperationalError:
            rowid = False
        return cls(name, columns, key, run, rowid)

    def key_sql(self, row: str = "") -> str:
        """The SQL of a row's key as the chain writes it: a JSON array of its key columns
        (``row``: ``NEW``, ``OLD``, or nothing for the table's own rows)."""
        prefix = f"{row}." if row else ""
        return f"json_array({', '.join(prefix + _quote(k) for k in self.key)})"

    @property
    def select_all(self) -> str:
        """Every row, as (key, its columns...), in key order."""
        keys = ", ".join(_quote(k) for k in self.key)
        return f"SELECT {self.key_sql()}, * FROM {_quote(self.name)} ORDER BY {keys}"  # noqa: S608

    def read(self, conn: sqlite3.Connection, rid: int | None, key: str) -> tuple[Any, ...] | None:
        """The row of rowid ``rid`` (or, without one, of key ``key``), None when it is gone."""
        if self.rowid and rid is not None:
            found = conn.execute(f"SELECT * FROM {_quote(self.name)} WHERE rowid = ?", (rid,)).fetchone()  # noqa: S608
        else:
            where = " AND ".join(f"{_quote(k)} = ?" for k in self.key)
            found = conn.execute(f"SELECT * FROM {_quote(self.name)} WHERE {where}", json.loads(key)).fetchone()  # noqa: S608
        return None if found is None else tuple(found)

    def row(self, values: Sequence[Any]) -> dict[str, Any]:
        return dict(zip(self.columns, values, strict=True))

    def run_of(self, row: dict[str, Any]) -> str | None:
        value = row.get(self.run) if self.run is not None else None
        return None if value is None else str(value)


def _triggers(shape: TableShape) -> list[str]:
    """The TEMP triggers that note each change of ``shape``'s rows in the pending table."""
    out = []
    for op, row in (("insert", "NEW"), ("update", "NEW"), ("delete", "OLD")):
        run = f"{row}.{_quote(shape.run)}" if shape.run is not None else "NULL"
        rid = f"{row}.rowid" if shape.rowid else "NULL"
        literal = "'" + shape.name.replace("'", "''") + "'"
        values = f"VALUES ({literal}, {rid}, {shape.key_sql(row)}, '{op}', {run})"
        out.append(f"CREATE TEMP TRIGGER IF NOT EXISTS {_quote('audit_chain_' + op + '_' + shape.name)} "
                   f"AFTER {op.upper()} ON main.{_quote(shape.name)} BEGIN "
                   f"INSERT INTO audit_chain_pending (tbl, rid, key, op, run_id) {values}; END")
    return out


def _chained_tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM main.sqlite_master WHERE type = 'table' ORDER BY name").fetchall()
    return [str(r[0]) for r in rows if is_chained_table(str(r[0]))]


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM main.sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


def _differs_from(latest: dict[str, str | None]) -> Callable[[str, str], bool]:
    """Whether a row (key, digest) is not as ``latest`` (key -> digest) has it."""
    return lambda key, digest: latest.get(key) != digest


def _made_name(statement: str) -> str:
    """The table a ``CREATE TABLE IF NOT EXISTS name (...)`` statement makes."""
    return statement.split("EXISTS", 1)[1].split("(", 1)[0].strip()


class Chain:
    """The chain of one connection of the store: its triggers, and :meth:`seal`, which each
    write transaction runs before it commits. ``actor`` names the writing process."""

    def __init__(self, conn: sqlite3.Connection, actor: Callable[[], str], tables: Sequence[str] = ()) -> None:
        """Start the chain behind ``conn`` if it has none, and install its triggers there.
        ``tables``: ``CREATE TABLE IF NOT EXISTS`` statements of tables otherwise made on
        first use, made now so that their first rows are chained as inserts."""
        self._actor = actor
        self._tables = tuple(tables)
        self._shapes: dict[str, TableShape] = {}
        self._schema = -1
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(_PENDING)
        if not self._needs_sync(conn):
            self._install(conn)
            return
        try:  # a new store, an older one, or a table that joins
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            if "readonly" not in str(exc):
                raise
            log.warning("audit chain: the store is read-only here, so its chain is not started or brought up to "
                        "date; verify it where it is written")
            return
        try:
            self._sync(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- tables

    def _known(self, conn: sqlite3.Connection) -> dict[str, str] | None:
        try:
            return {str(n): str(c) for n, c in conn.execute(f"SELECT name, columns FROM {TABLES_TABLE}")}  # noqa: S608
        except sqlite3.OperationalError:
            return None

    def _needs_sync(self, conn: sqlite3.Connection) -> bool:
        known = self._known(conn)
        if known is None or not _has_table(conn, CHAIN_TABLE):
            return True
        names = _chained_tables(conn)
        if any(_made_name(statement) not in names for statement in self._tables):
            return True
        return any(known.get(name) != json.dumps(TableShape.of(conn, name).columns) for name in names)

    def _install(self, conn: sqlite3.Connection) -> None:
        """TEMP triggers on every chained table that has none on this connection yet."""
        for name in _chained_tables(conn):
            if name not in self._shapes:
                shape = self._shapes[name] = TableShape.of(conn, name)
                for statement in _triggers(shape):
                    conn.execute(statement)
        self._schema = int(conn.execute("PRAGMA schema_version").fetchone()[0])

    def _sync(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction: start the chain if there is none, let tables that are
        not in it yet join it, re-record the rows of tables whose columns changed, and
        install the triggers."""
        started = self._known(conn) is not None and _has_table(conn, CHAIN_TABLE)
        if not started:  # a new chain: every table joins it
            conn.execute(f"DROP TABLE IF EXISTS {TABLES_TABLE}")
        for statement in (*_CREATE, *self._tables):
            conn.execute(statement)
        known = self._known(conn) or {}
        names = _chained_tables(conn)
        self._shapes = {}  # a table's columns may have changed: new triggers for the new shape
        for row in conn.execute("SELECT name FROM temp.sqlite_master WHERE type = 'trigger' "
                                "AND name GLOB 'audit_chain_*'").fetchall():
            conn.execute(f"DROP TRIGGER IF EXISTS temp.{_quote(str(row[0]))}")
        self._install(conn)
        joining = [n for n in names if n not in known]
        changed = [n for n in names if n in known and known[n] != json.dumps(self._shapes[n].columns)]
        if not started:
            counts = {n: int(conn.execute(f"SELECT count(*) FROM {_quote(n)}").fetchone()[0]) for n in joining}  # noqa: S608
            total = sum(counts.values())
            what = ", ".join(f"{n} {c}" for n, c in counts.items() if c) or "none"
            note = (f"chain started on a store written before it: {total} existing records chained once ({what})"
                    if total else NEW_STORE)
            if int(conn.execute("PRAGMA application_id").fetchone()[0]) == CHAINED_MARK:
                note = (f"{RESTARTED}: this store had a chain and it was removed outside callbox; {total} records "
                        f"chained again, unproven before this entry ({what})")
                log.warning("audit chain: %s", note)
            self._note(conn, note)
            conn.execute(f"PRAGMA application_id = {CHAINED_MARK}")
        elif joining:
            self._note(conn, f"tables joined the chain with their existing rows: {', '.join(joining)}")
        for name in joining:
            self._append_rows(conn, self._shapes[name], "existing", lambda _key, _digest: True)
        for name in changed:
            old = json.loads(known[name])
            added = [c for c in self._shapes[name].columns if c not in old]
            removed = [c for c in old if c not in self._shapes[name].columns]
            self._note(conn, f"columns of {name} changed (added: {', '.join(added) or 'none'}; removed: "
                             f"{', '.join(removed) or 'none'}); rows whose content changed are re-recorded")
            latest: dict[str, str | None] = {str(k): d for k, d in conn.execute(
                f"SELECT key, digest FROM {CHAIN_TABLE} WHERE seq IN "  # noqa: S608
                f"(SELECT max(seq) FROM {CHAIN_TABLE} WHERE tbl = ? GROUP BY key)", (name,))}
            self._append_rows(conn, self._shapes[name], "migrate", _differs_from(latest))
        for name in names:
            conn.execute(f"INSERT INTO {TABLES_TABLE} (name, columns) VALUES (?, ?) "  # noqa: S608
                         "ON CONFLICT (name) DO UPDATE SET columns = excluded.columns",
                         (name, json.dumps(self._shapes[name].columns)))
        for name in joining:  # their rows, as this transaction leaves them, are chained above
            conn.execute("DELETE FROM temp.audit_chain_pending WHERE tbl = ?", (name,))

    def _append_rows(self, conn: sqlite3.Connection, shape: TableShape, op: str,
                     wanted: Callable[[str, str], bool]) -> None:
        head = read_head(conn)
        now, actor = time.time(), self._actor()
        entries = []
        for values in conn.execute(shape.select_all):
            row, key = shape.row(values[1:]), str(values[0])
            digest = content_digest(row)
            if wanted(key, digest):
                entries.append((shape.name, key, op, shape.run_of(row), digest, None))
        self._append(conn, head, now, actor, entries)

    def _note(self, conn: sqlite3.Connection, note: str) -> None:
        self._append(conn, read_head(conn), time.time(), self._actor(), [("", "[]", "note", None, None, note)])
        log.log(logging.DEBUG if note == NEW_STORE else logging.INFO, "audit chain: %s", note)

    def _append(self, conn: sqlite3.Connection, head: ChainHead, now: float, actor: str,
                entries: Iterable[tuple[str, str, str, str | None, str | None, str | None]]) -> ChainHead:
        seq, prev = head.seq, head.hash
        rows = []
        for tbl, key, op, run_id, digest, note in entries:
            seq += 1
            prev_hash, prev = prev, entry_hash(seq, now, tbl, key, op, run_id, actor, digest, note, prev)
            rows.append((seq, now, tbl, key, op, run_id, actor, digest, note, prev_hash, prev))
        if rows:
            conn.executemany(_INSERT_ENTRY, rows)
            if seq // LOG_EVERY > head.seq // LOG_EVERY:
                log.info("audit chain head: %d:%s", seq, prev)
        return ChainHead(seq, prev)

    def forget(self) -> None:
        """After a rollback: what a sync in the rolled-back transaction installed is undone
        too, so the next seal syncs again."""
        self._schema = -1

    # -- each write

    def seal(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction, just before its COMMIT: chain what it changed."""
        if int(conn.execute("PRAGMA schema_version").fetchone()[0]) != self._schema:
            self._sync(conn)  # a table made, or columns added, by this transaction or another process
        pending = conn.execute(
            "DELETE FROM temp.audit_chain_pending RETURNING rowid, tbl, rid, key, op, run_id").fetchall()
        if not pending:
            return
        pending.sort()  # RETURNING gives no order; the changes' order is the rowids'
        changes: dict[tuple[str, str], tuple[str, int | None, str | None]] = {}  # (tbl, key) -> (first op, rid, run)
        for _, tbl, rid, key, op, run_id in pending:
            first = changes.get((tbl, key))
            changes[(tbl, key)] = (op if first is None else first[0], rid, run_id)
        entries: list[tuple[str, str, str, str | None, str | None, str | None]] = []
        for (tbl, key), (first_op, rid, run_id) in changes.items():
            shape = self._shapes[tbl]
            values = shape.read(conn, rid, key)
            if values is None:
                if first_op != "insert":  # a row made and removed in one transaction was never there
                    entries.append((tbl, key, "delete", run_id, None, None))
                continue
            row = shape.row(values)
            entries.append((tbl, key, "insert" if first_op == "insert" else "update", shape.run_of(row),
                            content_digest(row), None))
        self._append(conn, read_head(conn), time.time(), self._actor(), entries)
