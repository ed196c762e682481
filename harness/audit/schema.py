"""The audit database's tables: the schema version, its migrations, and the tables made on
first use.

``PRAGMA user_version`` holds the schema version; ``MIGRATIONS[n]`` upgrades a version n-1
database. Tables that are purely additive (checkpoints, egress records, superseded call
attempts) are made on first use (``CREATE TABLE IF NOT EXISTS`` in the transaction that
writes them) rather than by a version bump: a bumped ``user_version`` would make every
older callbox refuse the database as "newer". Columns that are purely additive are
migrations of the same kind (:data:`ADDED_COLUMNS`, applied by :func:`add_columns` when the
database is opened): nullable, so an older callbox writing the table leaves them empty and
the code reading them takes an empty one as "not recorded".
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from harness.audit.errors import AuditError
from harness.audit.records import ACTION_CALL_PREFIX, ACTION_TOOL_PREFIX
from harness.core.errors import ErrorCode

__all__ = ["ADDED_COLUMNS", "ATTEMPTS_TABLE", "CHECKPOINTS_TABLE", "COUNTED", "EGRESS_TABLE", "MIGRATIONS",
           "SCHEMA_VERSION", "add_columns", "ensure_call_counts", "migrate", "table_exists"]

log = logging.getLogger("callbox.audit")

SCHEMA_VERSION = 1
"""Stored in ``PRAGMA user_version``; ``MIGRATIONS[n]`` upgrades a database from n-1 to n."""

_SCHEMA_V1 = (
    """CREATE TABLE IF NOT EXISTS runs (
        id          TEXT PRIMARY KEY,
        created     REAL NOT NULL,
        ended       REAL,
        end_reason  TEXT,
        meta        TEXT NOT NULL DEFAULT '{}'
    )""",
    """CREATE TABLE IF NOT EXISTS calls (
        id                  INTEGER PRIMARY KEY,
        run_id              TEXT NOT NULL REFERENCES runs(id),
        call_id             TEXT NOT NULL,
        tool                TEXT NOT NULL,
        args_digest         TEXT NOT NULL,
        arguments           TEXT NOT NULL,
        arguments_truncated INTEGER NOT NULL DEFAULT 0,
        bytes_in            INTEGER NOT NULL,
        state               TEXT NOT NULL DEFAULT 'claimed' CHECK (state IN ('claimed', 'running', 'done')),
        decision            TEXT CHECK (decision IN ('allow', 'ask', 'deny')),
        rule                TEXT,
        reason              TEXT,
        authorized          INTEGER NOT NULL DEFAULT 0,
        owner               TEXT NOT NULL,
        started             REAL NOT NULL,
        finished            REAL,
        duration_ms         REAL,
        exit_code           INTEGER,
        is_error            INTEGER,
        error_code          TEXT,
        bytes_out           INTEGER,
        truncated           INTEGER,
        result_text         TEXT,
        result_json         TEXT,
        UNIQUE (run_id, call_id)
    )""",
    """CREATE TABLE IF NOT EXISTS approvals (
        id                  TEXT PRIMARY KEY,
        run_id              TEXT NOT NULL REFERENCES runs(id),
        call_id             TEXT NOT NULL,
        tool                TEXT NOT NULL,
        args_digest         TEXT NOT NULL,
        arguments           TEXT NOT NULL,
        arguments_truncated INTEGER NOT NULL DEFAULT 0,
        rule                TEXT NOT NULL,
        reason              TEXT NOT NULL DEFAULT '',
        state               TEXT NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'approved', 'denied', 'consumed')),
        created             REAL NOT NULL,
        resolved            REAL,
        resolved_by         TEXT,
        resolution_reason   TEXT,
        consumed            REAL,
        UNIQUE (run_id, call_id)
    )""",
    "CREATE INDEX IF NOT EXISTS calls_authorized ON calls (run_id, authorized, error_code)",
    "CREATE INDEX IF NOT EXISTS approvals_by_state ON approvals (state, created)",
    "CREATE INDEX IF NOT EXISTS runs_by_created ON runs (created)",
)


def _migrate_to_1(conn: sqlite3.Connection) -> None:
    for statement in _SCHEMA_V1:
        conn.execute(statement)


MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {1: _migrate_to_1}
"""Version n -> the function that upgrades a version n-1 database, run inside the same
``BEGIN IMMEDIATE`` transaction that then sets ``PRAGMA user_version = n``. Statements only
(no ``executescript``, which would commit half-way)."""


CHECKPOINTS_TABLE = """CREATE TABLE IF NOT EXISTS checkpoints (
    run_id  TEXT PRIMARY KEY REFERENCES runs(id),
    saved   REAL NOT NULL,
    status  TEXT NOT NULL CHECK (status IN ('paused', 'resumed')),
    owner   TEXT NOT NULL,
    state   TEXT NOT NULL
)"""
EGRESS_TABLE = """CREATE TABLE IF NOT EXISTS egress (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs(id),
    call_id     TEXT,
    sandbox_id  TEXT NOT NULL,
    ts          REAL NOT NULL,
    decision    TEXT NOT NULL,
    method      TEXT,
    host        TEXT,
    port        INTEGER,
    address     TEXT,
    reason      TEXT,
    record      TEXT NOT NULL
)"""
"""One row per connection the egress proxy of an ``allowlist`` sandbox allowed or refused;
``call_id`` is the call during which it was seen (NULL: between calls or at the end)."""
ATTEMPTS_TABLE = """CREATE TABLE IF NOT EXISTS call_attempts (
    id          INTEGER PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs(id),
    call_id     TEXT NOT NULL,
    attempt     INTEGER NOT NULL,
    owner       TEXT NOT NULL,
    started     REAL NOT NULL,
    finished    REAL,
    duration_ms REAL,
    decision    TEXT,
    rule        TEXT,
    reason      TEXT,
    exit_code   INTEGER,
    error_code  TEXT,
    bytes_out   INTEGER,
    result_text TEXT,
    result_json TEXT,
    UNIQUE (run_id, call_id, attempt)
)"""
"""One row per superseded attempt of a call (a retry-safe failure that a retry replaced);
the call's row in ``calls`` always holds its latest attempt."""


def _counted(row: str) -> str:
    """Whether the calls row ``row`` (``NEW``, ``OLD`` or ``calls``) counts toward the run's
    ``max_tool_calls`` budget, as 0 or 1: authorized, not refused for the budget itself, and
    not a sandbox action."""
    return (f"coalesce(({row}.authorized = 1 AND ({row}.error_code IS NULL OR {row}.error_code != 'budget_exceeded') "
            f"AND NOT ({row}.tool GLOB '{ACTION_TOOL_PREFIX}*' AND {row}.call_id GLOB '{ACTION_CALL_PREFIX}*')), 0)")


_ADD_COUNT = ("INSERT INTO call_counts (run_id, counted) VALUES ({run}, {delta}) "
              "ON CONFLICT (run_id) DO UPDATE SET counted = counted + excluded.counted")
CALL_COUNTS = (
    "CREATE TABLE IF NOT EXISTS call_counts (run_id TEXT PRIMARY KEY, counted INTEGER NOT NULL) WITHOUT ROWID",
    f"CREATE TRIGGER IF NOT EXISTS call_counts_insert AFTER INSERT ON calls WHEN {_counted('NEW')} = 1 "
    f"BEGIN {_ADD_COUNT.format(run='NEW.run_id', delta=1)}; END",
    # A call's run and its tool and call_id never change; what it counts by can.
    f"CREATE TRIGGER IF NOT EXISTS call_counts_update AFTER UPDATE OF authorized, error_code ON calls "
    f"WHEN {_counted('NEW')} != {_counted('OLD')} "
    f"BEGIN {_ADD_COUNT.format(run='NEW.run_id', delta=_counted('NEW') + ' - ' + _counted('OLD'))}; END",
    f"CREATE TRIGGER IF NOT EXISTS call_counts_delete AFTER DELETE ON calls WHEN {_counted('OLD')} = 1 "
    f"BEGIN {_ADD_COUNT.format(run='OLD.run_id', delta=-1)}; END",
    f"INSERT INTO call_counts (run_id, counted) SELECT run_id, sum({_counted('calls')}) FROM calls GROUP BY run_id",  # noqa: S608
)
"""The ``call_counts`` table: per run, how many of its calls count toward ``max_tool_calls``,
kept by triggers on ``calls`` (so every writer keeps it right, older callbox versions too),
filled from the calls already stored when it is made. The budget check reads one row
instead of counting the run's calls, which took longer with every call of a long run."""

COUNTED = "SELECT coalesce((SELECT counted FROM call_counts WHERE run_id = ?), 0)"
"""A run's calls that count toward ``max_tool_calls`` (``call_counts``)."""


def ensure_call_counts(conn: sqlite3.Connection) -> None:
    """Make ``call_counts`` and its triggers if the database has none yet (one ``BEGIN
    IMMEDIATE`` transaction: another process may be making them at the same time). Not a
    schema version: a bumped ``user_version`` would make older callbox versions refuse the
    database, and they keep the table right through the triggers all the same."""
    if table_exists(conn, "call_counts"):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not table_exists(conn, "call_counts"):  # another process may have won
            for statement in CALL_COUNTS:
                conn.execute(statement)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


ADDED_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("calls", "owner_pid", "INTEGER"),
    ("calls", "owner_boot_id", "TEXT"),
    ("calls", "owner_started", "REAL"),
    ("calls", "owner_pid_ns", "TEXT"),
    ("approvals", "scope", "TEXT"),
)
"""(table, column, type) added to version 1 databases, in order: who holds a call's claim,
so a later process can tell when it is provably gone (:mod:`harness.audit.owners`)."""


def _missing_columns(conn: sqlite3.Connection) -> list[tuple[str, str, str]]:
    present: dict[str, set[str]] = {}
    for table in {table for table, _, _ in ADDED_COLUMNS}:
        present[table] = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
    return [added for added in ADDED_COLUMNS if added[1] not in present[added[0]]]


def add_columns(conn: sqlite3.Connection, path: Path) -> None:
    """Add the :data:`ADDED_COLUMNS` a database lacks, in one ``BEGIN IMMEDIATE``
    transaction (another process may be adding them at the same time)."""
    if not _missing_columns(conn):
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        for table, column, kind in _missing_columns(conn):  # another process may have added some
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
            log.info("audit database %s: added column %s.%s", path, table, column)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def table_exists(conn: sqlite3.Connection, name: str) -> bool:
    """Whether a table made on first use exists yet."""
    sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(sql, (name,)).fetchone() is not None


def migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Bring the database behind ``conn`` (the file at ``path``) to ``SCHEMA_VERSION``, in one
    ``BEGIN IMMEDIATE`` transaction (another process may be migrating it at the same time);
    a newer schema is an AuditError."""
    target = SCHEMA_VERSION
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version == target:
        return
    if version > target:
        raise AuditError(
            f"the audit database {path} has schema version {version}, newer than this callbox "
            f"understands ({target}); upgrade callbox or use another database",
            code=ErrorCode.INTERNAL,
        )
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
        for step in range(version + 1, target + 1):
            MIGRATIONS[step](conn)
            log.info("audit database %s: migrated to schema version %d", path, step)
        if version < target:
            conn.execute(f"PRAGMA user_version = {int(target)}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
