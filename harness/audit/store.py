"""The audit store: runs, tool calls (each executed at most once) and approvals, in SQLite.

One file, shared by every harness process on the host (``callbox call``, ``callbox run``,
``callbox serve``, ``callbox approvals ...``). Standard-library ``sqlite3`` in WAL mode with
``synchronous=NORMAL`` (a commit is a WAL append, no fsync), a 10 s busy timeout and foreign
keys on. Every write is one ``BEGIN IMMEDIATE`` transaction, so concurrent writers from
several processes queue on SQLite's write lock instead of failing or losing records.

The call lifecycle the harness drives::

    claim = store.claim_call(run_id, call_id, tool, arguments)   # atomic across processes
    if not claim.fresh:                  # a replay, or a concurrent duplicate
        claim.result or store.wait_for_result(run_id, call_id, timeout_s)
    store.record_decision(run_id, call_id, decision)             # allow | ask | deny, and the rule
    if store.mark_running(run_id, call_id, max_calls=budget):    # atomic budget check
        ...execute...
    store.finish_call(run_id, call_id, result, decision=..., exit_code=..., ...)

A call whose recorded result is a retryable failure from a command that did not start
(``audit_records.retry_safe``: no engine answered, no sandbox could be had) does not keep
its call_id from running: ``claim_call`` with the same tool and arguments claims it again
(``fresh=True``, ``claim.attempt`` > 1) in the same transaction that moves the failed
attempt into the ``call_attempts`` table, so the failure stays in the audit record
(``CallRecord.earlier_attempts``) and two concurrent retries still get one fresh claim.
The ``call_attempts`` table is created on first use, like ``checkpoints``.

A call that must wait for a human gets ``create_approval``; ``resolve_approval`` (CLI, API,
any process) approves or denies it, and ``consume_approval`` flips approved -> consumed
atomically so an approved call runs exactly once even if two harness processes resume it.

A paused agent run is checkpointed with ``save_checkpoint``: its state
(JSON, see ``harness.loop.checkpoint``) goes into the ``checkpoints`` table and the run is marked
``end_reason = "approval_pending"``; ``claim_checkpoint`` (the resuming process) atomically
takes it back, re-opening the run, so two processes cannot resume the same pause. The
``checkpoints`` table is created on first use (``CREATE TABLE IF NOT EXISTS`` in the same
transaction) rather than by a schema-version bump: it is purely additive, and a bumped
``user_version`` would make every older callbox refuse the database as "newer".

Timestamps are Unix epoch seconds (floats).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import secrets
import socket
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from harness.audit.records import (
    ARGUMENTS_CAP,
    ATTEMPT_COLUMNS,
    Approval,
    Attempt,
    CallRecord,
    CheckpointRecord,
    Claim,
    RunRecord,
    _approval_from_row,
    _attempt_from_row,
    _call_from_row,
    _json_default,
    _prepare_arguments,
    _run_from_row,
    _storable,
    arguments_digest,
    call_view,
    canonical_json,
    result_from_json,
    result_to_json,
    retry_safe,
)
from harness.core.calls import Action, Decision, ErrorCode, ToolResult
from harness.core.errors import CallboxError
from harness.engine.docker.labels import Owner, owner_alive

__all__ = [
    "ARGUMENTS_CAP",
    "Approval",
    "Attempt",
    "AuditError",
    "AuditStore",
    "CallRecord",
    "CheckpointRecord",
    "Claim",
    "RunRecord",
    "arguments_digest",
    "canonical_json",
    "default_audit_path",
    "result_from_json",
    "result_to_json",
]

log = logging.getLogger("callbox.audit")

SCHEMA_VERSION = 1
"""Stored in ``PRAGMA user_version``; ``MIGRATIONS[n]`` upgrades a database from n-1 to n."""

BUSY_TIMEOUT_S = 10.0
"""How long a connection waits for another process's write lock before giving up."""

RUN_ID_MAX = 128
APPROVAL_STATES = ("pending", "approved", "denied", "consumed")
CALL_STATES = ("claimed", "running", "done")

_APPROVAL_ID_ALPHABET = "abcdefghjkmnpqrstuvwxyz23456789"  # url-safe, no look-alikes, never starts with "-"
_APPROVAL_ID_LEN = 10
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
_OWNER_CHECK_EVERY_S = 1.0

T = TypeVar("T")


class AuditError(CallboxError):
    """An unknown run/call/approval id, a call or approval in the wrong state, or a database
    that cannot be used; the message says what to do."""

    exit_code = 2

    def __init__(self, message: str, *, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


def default_audit_path() -> Path:
    """``$CALLBOX_AUDIT_DB``, else ``$XDG_STATE_HOME/callbox/audit.sqlite3``, else
    ``~/.local/state/callbox/audit.sqlite3`` (a relative XDG_STATE_HOME is ignored, as the
    XDG spec requires)."""
    override = os.environ.get("CALLBOX_AUDIT_DB")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_STATE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "callbox" / "audit.sqlite3"



# --------------------------------------------------------------------------- schema

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


_CHECKPOINTS_TABLE = """CREATE TABLE IF NOT EXISTS checkpoints (
    run_id  TEXT PRIMARY KEY REFERENCES runs(id),
    saved   REAL NOT NULL,
    status  TEXT NOT NULL CHECK (status IN ('paused', 'resumed')),
    owner   TEXT NOT NULL,
    state   TEXT NOT NULL
)"""
_EGRESS_TABLE = """CREATE TABLE IF NOT EXISTS egress (
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
_ATTEMPTS_TABLE = """CREATE TABLE IF NOT EXISTS call_attempts (
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
PAUSED_REASON = "approval_pending"
"""The ``end_reason`` a run has while it is paused with a checkpoint."""


# --------------------------------------------------------------------------- SQL

_CALL_COLUMNS = (
    "run_id, call_id, tool, args_digest, arguments, arguments_truncated, bytes_in, state, decision, rule, "
    "reason, authorized, owner, started, finished, duration_ms, exit_code, is_error, error_code, bytes_out, "
    "truncated, result_text, result_json"
)
_APPROVAL_COLUMNS = (
    "id, run_id, call_id, tool, args_digest, arguments, arguments_truncated, rule, reason, state, created, "
    "resolved, resolved_by, resolution_reason, consumed"
)
_RUN_SELECT = (
    "SELECT r.id, r.created, r.ended, r.end_reason, r.meta, "
    "(SELECT COUNT(*) FROM calls c WHERE c.run_id = r.id) FROM runs r"
)
_ENSURE_RUN = "INSERT INTO runs (id, created) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"
_INSERT_CALL = (
    "INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, arguments_truncated, bytes_in, owner, started) "
    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, call_id) DO NOTHING"
)
_SELECT_CALL = f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? AND call_id = ?"  # noqa: S608
_SELECT_RUN_CALLS = f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? ORDER BY id"  # noqa: S608
_SELECT_RECENT_CALLS = f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY id DESC LIMIT ?"  # noqa: S608
_SELECT_APPROVALS = f"SELECT {_APPROVAL_COLUMNS} FROM approvals"  # noqa: S608
_SELECT_APPROVAL = f"{_SELECT_APPROVALS} WHERE id = ?"
_SELECT_APPROVAL_OF_CALL = f"{_SELECT_APPROVALS} WHERE run_id = ? AND call_id = ?"
_FINISH_CALL = (
    "UPDATE calls SET state = 'done', finished = ?, duration_ms = ?, exit_code = ?, is_error = ?, error_code = ?, "
    "bytes_out = ?, truncated = ?, result_text = ?, result_json = ?, "
    "decision = coalesce(?, decision), rule = coalesce(?, rule), reason = coalesce(?, reason), "
    "authorized = max(authorized, ?) "
    "WHERE run_id = ? AND call_id = ? AND state != 'done'"
)
_HAS_ATTEMPTS = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'call_attempts'"
_ARCHIVE_ATTEMPT = (
    "INSERT INTO call_attempts (run_id, call_id, attempt, owner, started, finished, duration_ms, decision, rule, "
    "reason, exit_code, error_code, bytes_out, result_text, result_json) "
    "SELECT run_id, call_id, ?, owner, started, finished, duration_ms, decision, rule, reason, exit_code, "
    "error_code, bytes_out, result_text, result_json FROM calls WHERE run_id = ? AND call_id = ? AND state = 'done'"
)
_RECLAIM_CALL = (
    "UPDATE calls SET state = 'claimed', owner = ?, started = ?, finished = NULL, duration_ms = NULL, "
    "exit_code = NULL, is_error = NULL, error_code = NULL, bytes_out = NULL, truncated = NULL, "
    "result_text = NULL, result_json = NULL, decision = NULL, rule = NULL, reason = NULL, authorized = 0 "
    "WHERE run_id = ? AND call_id = ? AND state = 'done'"
)
_COUNT_AUTHORIZED = (
    "SELECT COUNT(*) FROM calls WHERE run_id = ? AND authorized = 1 "
    "AND (error_code IS NULL OR error_code != 'budget_exceeded')"
)



def _earlier_attempts(
    c: sqlite3.Connection, run_id: str, call_id: str | None = None
) -> dict[str, tuple[Attempt, ...]]:
    """The superseded attempts of one call (or of every call of the run), by call_id."""
    if c.execute(_HAS_ATTEMPTS).fetchone() is None:
        return {}
    sql = f"SELECT call_id, {ATTEMPT_COLUMNS} FROM call_attempts WHERE run_id = ?"  # noqa: S608
    params: tuple[str, ...] = (run_id,)
    if call_id is not None:
        sql, params = f"{sql} AND call_id = ?", (run_id, call_id)
    found: dict[str, list[Attempt]] = {}
    for row in c.execute(f"{sql} ORDER BY call_id, attempt", params).fetchall():
        found.setdefault(row[0], []).append(_attempt_from_row(row[1:]))
    return {key: tuple(value) for key, value in found.items()}


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


def _new_run_id() -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{stamp}-{secrets.token_hex(4)}"


def _new_approval_id() -> str:
    return "".join(secrets.choice(_APPROVAL_ID_ALPHABET) for _ in range(_APPROVAL_ID_LEN))


def _unknown_approval(approval_id: str) -> AuditError:
    return AuditError(f"no approval with id {approval_id}; list them with `callbox approvals list`")


def _unknown_run(run_id: str) -> AuditError:
    return AuditError(f"no run with id {run_id}; list them with `callbox audit`")


def _unknown_call(run_id: str, call_id: str) -> AuditError:
    return AuditError(f"no call {call_id} in run {run_id}; a call is recorded by claim_call first")


_inherited_connections: list[sqlite3.Connection] = []
"""Connections a forked child inherited: never used nor closed there (SQLite forbids both)."""

_open_stores: weakref.WeakSet[AuditStore] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._lock = threading.Lock()  # another thread may have held it at fork time


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------- the store


class AuditStore:
    """The audit database. Thread-safe (one connection behind a lock); process-safe (SQLite
    locking); fork-aware (a forked child opens its own connection). Use as a context manager
    or call ``close()``."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = Path(path) if path is not None else default_audit_path()
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._closed = False
        self._owner: tuple[int, str] | None = None
        with self._lock:
            self._connection()
        _open_stores.add(self)

    # -- lifecycle

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conn, self._conn = self._conn, None
            if conn is not None and self._pid == os.getpid():
                conn.close()

    def __enter__(self) -> AuditStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _connection(self) -> sqlite3.Connection:
        """The open connection (caller holds ``_lock``); opens or re-opens after a fork."""
        if self._closed:
            raise AuditError(f"the audit store {self.path} is closed")
        conn = self._conn
        if conn is not None and self._pid == os.getpid():
            return conn
        if conn is not None:  # forked: the parent's connection must not be touched here
            _inherited_connections.append(conn)
            self._conn = None
        conn = self._retrying(self._open)
        self._conn, self._pid = conn, os.getpid()
        return conn

    def _open(self) -> sqlite3.Connection:
        try:
            self._make_parent()
            if not self.path.exists():
                os.close(os.open(self.path, os.O_CREAT | os.O_RDWR, 0o600))
            conn = sqlite3.connect(
                self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False, cached_statements=256
            )
        except (OSError, sqlite3.Error) as exc:
            raise AuditError(
                f"cannot open the audit database {self.path}: {exc} (pass another path or set CALLBOX_AUDIT_DB)",
                exit_code=125,
            ) from exc
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                log.warning(
                    "audit database %s: journal_mode is %s, not wal (filesystem without WAL support?)", self.path, mode
                )
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute("PRAGMA foreign_keys = ON")
            self._migrate(conn)
        except BaseException:
            conn.close()
            raise
        return conn

    def _make_parent(self) -> None:
        missing: list[Path] = []
        parent = self.path.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile
                directory.mkdir(mode=0o700)

    def _migrate(self, conn: sqlite3.Connection) -> None:
        target = SCHEMA_VERSION
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version == target:
            return
        if version > target:
            raise AuditError(
                f"the audit database {self.path} has schema version {version}, newer than this callbox "
                f"understands ({target}); upgrade callbox or use another database",
                exit_code=125,
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process may have won
            for step in range(version + 1, target + 1):
                MIGRATIONS[step](conn)
                log.info("audit database %s: migrated to schema version %d", self.path, step)
            if version < target:
                conn.execute(f"PRAGMA user_version = {int(target)}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    # -- transaction helpers

    def _retrying(self, operation: Callable[[], T]) -> T:
        """Run ``operation``; if SQLite still reports busy/locked after its own busy timeout
        (or at once, in the few cases SQLite does not wait), retry until BUSY_TIMEOUT_S more."""
        deadline: float | None = None
        delay = 0.002
        while True:
            try:
                return operation()
            except sqlite3.OperationalError as exc:
                if not _is_busy(exc):
                    raise AuditError(f"audit database {self.path}: {exc}", exit_code=125) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + BUSY_TIMEOUT_S
                if now >= deadline:
                    raise AuditError(
                        f"the audit database {self.path} stayed locked by another process for over "
                        f"{BUSY_TIMEOUT_S:.0f} s; try again",
                        exit_code=125,
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except sqlite3.Error as exc:
                raise AuditError(f"audit database {self.path}: {exc}", exit_code=125) from exc

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body`` inside one BEGIN IMMEDIATE transaction (rolled back if it raises)."""

        def attempt() -> T:
            conn = self._connection()
            conn.execute("BEGIN IMMEDIATE")
            try:
                out = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return out

        with self._lock:
            return self._retrying(attempt)

    def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            return self._retrying(lambda: body(self._connection()))

    def _owner_label(self) -> str:
        pid = os.getpid()
        if self._owner is None or self._owner[0] != pid:
            self._owner = (pid, Owner.current().label())
        return self._owner[1]

    # -- runs

    def start_run(self, run_id: str | None = None, meta: Mapping[str, Any] | None = None) -> str:
        """Record a run and return its id (a new one when ``run_id`` is None). Starting an
        existing run again is a no-op (its meta is kept)."""
        if run_id is None:
            run_id = _new_run_id()
        elif not run_id or len(run_id) > RUN_ID_MAX or not run_id.isprintable():
            raise AuditError(f"bad run id {run_id!r}: use 1 to {RUN_ID_MAX} printable characters")
        meta_json = json.dumps(dict(meta or {}), ensure_ascii=False, default=_json_default, sort_keys=True)
        rid = run_id
        self._write(
            lambda c: c.execute(
                "INSERT INTO runs (id, created, meta) VALUES (?, ?, ?) ON CONFLICT (id) DO NOTHING",
                (rid, time.time(), _storable(meta_json)),
            )
        )
        return run_id

    def end_run(self, run_id: str, reason: str) -> None:
        """Mark a run ended with the loop's termination reason; ending it again keeps the first."""

        def body(c: sqlite3.Connection) -> None:
            cur = c.execute(
                "UPDATE runs SET ended = ?, end_reason = ? WHERE id = ? AND ended IS NULL",
                (time.time(), reason, run_id),
            )
            if cur.rowcount == 0 and c.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise _unknown_run(run_id)

        self._write(body)

    def update_run_meta(self, run_id: str, meta: Mapping[str, Any]) -> None:
        """Merge ``meta`` into the run's meta (keys given replace stored ones)."""

        def body(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT meta FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise _unknown_run(run_id)
            merged = {**json.loads(row[0]), **meta}
            text = json.dumps(merged, ensure_ascii=False, default=_json_default, sort_keys=True)
            c.execute("UPDATE runs SET meta = ? WHERE id = ?", (_storable(text), run_id))

        self._write(body)

    # -- checkpoints (paused runs)

    def save_checkpoint(self, run_id: str, state_json: str) -> None:
        """Store the paused state of ``run_id`` (replacing an earlier one) and mark the run
        ``approval_pending``: paused, not finally ended (``claim_checkpoint`` re-opens it)."""
        now = time.time()
        owner = self._owner_label()
        state = _storable(state_json)

        def body(c: sqlite3.Connection) -> None:
            c.execute(_CHECKPOINTS_TABLE)
            if c.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise _unknown_run(run_id)
            c.execute(
                "INSERT INTO checkpoints (run_id, saved, status, owner, state) VALUES (?, ?, 'paused', ?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET saved = excluded.saved, status = 'paused', "
                "owner = excluded.owner, state = excluded.state",
                (run_id, now, owner, state),
            )
            cur = c.execute(
                "UPDATE runs SET ended = ?, end_reason = ? WHERE id = ? AND (ended IS NULL OR end_reason = ?)",
                (now, PAUSED_REASON, run_id, PAUSED_REASON),
            )
            if cur.rowcount == 0:
                reason = c.execute("SELECT end_reason FROM runs WHERE id = ?", (run_id,)).fetchone()[0]
                raise AuditError(f"run {run_id} already ended ({reason}); it cannot be paused")

        self._write(body)

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
            c.execute(_EGRESS_TABLE)
            c.executemany(
                "INSERT INTO egress (run_id, call_id, sandbox_id, ts, decision, method, host, port, address, "
                "reason, record) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows,
            )

        self._write(body)
        return len(rows)

    def egress(self, run_id: str) -> list[dict[str, Any]]:
        """The egress decisions recorded for ``run_id``, oldest first."""

        def body(c: sqlite3.Connection) -> Any:
            exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'egress'"
            if c.execute(exists).fetchone() is None:
                return []
            return c.execute(
                "SELECT call_id, sandbox_id, ts, decision, method, host, port, address, reason FROM egress "
                "WHERE run_id = ? ORDER BY ts, id", (run_id,),
            ).fetchall()

        names = ("call_id", "sandbox_id", "ts", "decision", "method", "host", "port", "address", "reason")
        return [dict(zip(names, row, strict=True)) for row in self._read(body)]

    def load_checkpoint(self, run_id: str) -> CheckpointRecord | None:
        """The saved checkpoint of ``run_id`` (paused or already claimed), or None."""

        def body(c: sqlite3.Connection) -> Any:
            exists = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'checkpoints'"
            if c.execute(exists).fetchone() is None:
                return None
            return c.execute(
                "SELECT run_id, saved, status, owner, state FROM checkpoints WHERE run_id = ?", (run_id,)
            ).fetchone()

        row = self._read(body)
        return None if row is None else CheckpointRecord(*row)

    def claim_checkpoint(self, run_id: str) -> CheckpointRecord:
        """Take the checkpoint of a paused run to resume it, atomically across processes:
        paused -> resumed (owner: this process) and the run re-opened (no end reason). A
        checkpoint claimed by a process that has died may be claimed again. AuditError, saying
        why, when there is nothing to resume or another live process resumed it."""
        owner = self._owner_label()
        this_host = socket.gethostname()

        def body(c: sqlite3.Connection) -> CheckpointRecord:
            c.execute(_CHECKPOINTS_TABLE)
            run = c.execute("SELECT ended, end_reason FROM runs WHERE id = ?", (run_id,)).fetchone()
            if run is None:
                raise _unknown_run(run_id)
            row = c.execute(
                "SELECT run_id, saved, status, owner, state FROM checkpoints WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise AuditError(f"run {run_id} has no checkpoint: only a run paused for approval can be resumed")
            record = CheckpointRecord(*row)
            ended, end_reason = run
            if ended is not None and end_reason != PAUSED_REASON:
                raise AuditError(f"run {run_id} already ended ({end_reason}); there is nothing to resume")
            if record.status == "resumed":
                holder = Owner.parse(record.owner)
                if holder is None or owner_alive(holder, this_host) is not False:
                    raise AuditError(f"run {run_id} is already being resumed by process {record.owner}")
            c.execute("UPDATE checkpoints SET status = 'resumed', owner = ? WHERE run_id = ?", (owner, run_id))
            c.execute("UPDATE runs SET ended = NULL, end_reason = NULL WHERE id = ?", (run_id,))
            return dataclasses.replace(record, status="resumed", owner=owner)

        return self._write(body)

    def get_run(self, run_id: str) -> RunRecord:
        row = self._read(lambda c: c.execute(f"{_RUN_SELECT} WHERE r.id = ?", (run_id,)).fetchone())
        if row is None:
            raise _unknown_run(run_id)
        return _run_from_row(row)

    def list_runs(self, limit: int = 50) -> list[RunRecord]:
        """Newest first."""
        rows = self._read(
            lambda c: c.execute(f"{_RUN_SELECT} ORDER BY r.created DESC, r.rowid DESC LIMIT ?", (limit,)).fetchall()
        )
        return [_run_from_row(r) for r in rows]

    # -- calls

    def claim_call(self, run_id: str, call_id: str, tool: str, arguments_json: str | Mapping[str, Any]) -> Claim:
        """Claim ``call_id`` in ``run_id`` for execution, atomically across threads and processes.

        Exactly one claimant of a (run, call_id) gets ``fresh=True``; every other one gets the
        stored record. A run that was never started is created. ``arguments_json`` is the JSON
        text the model sent (or the parsed object); invalid JSON is recorded as is.

        A call recorded as done with a retry-safe failure (``retry_safe``: retryable, and the
        command did not start) is claimed again, fresh, by the first claimant with the same
        tool and arguments: the failed attempt moves to ``record.earlier_attempts`` and the
        call is ``claimed`` anew, atomically, so only one retry of it runs.
        """
        args = _prepare_arguments(arguments_json)
        owner = self._owner_label()
        now = time.time()
        params = (run_id, call_id, tool, args.digest, args.text, int(args.truncated), args.size, owner, now)

        def body(c: sqlite3.Connection) -> Claim:
            c.execute(_ENSURE_RUN, (run_id, now))
            if c.execute(_INSERT_CALL, params).rowcount == 1:
                record = CallRecord(
                    run_id=run_id, call_id=call_id, tool=tool, args_digest=args.digest, arguments=args.text,
                    arguments_truncated=args.truncated, bytes_in=args.size, state="claimed", decision=None,
                    authorized=False, owner=owner, started=now,
                )  # fmt: skip
                return Claim(fresh=True, record=record)
            row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
            existing = _call_from_row(row, _earlier_attempts(c, run_id, call_id).get(call_id, ()))
            conflict = existing.tool != tool or existing.args_digest != args.digest
            if conflict or existing.state != "done" or not retry_safe(existing.result):
                return Claim(fresh=False, record=existing, conflict=conflict)
            c.execute(_ATTEMPTS_TABLE)
            c.execute(_ARCHIVE_ATTEMPT, (existing.attempts, run_id, call_id))
            c.execute(_RECLAIM_CALL, (owner, now, run_id, call_id))
            row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
            return Claim(fresh=True, record=_call_from_row(row, _earlier_attempts(c, run_id, call_id)[call_id]))

        return self._write(body)

    def get_call(self, run_id: str, call_id: str) -> CallRecord | None:
        def body(c: sqlite3.Connection) -> CallRecord | None:
            row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
            if row is None:
                return None
            return _call_from_row(row, _earlier_attempts(c, run_id, call_id).get(call_id, ()))

        return self._read(body)

    def record_decision(self, run_id: str, call_id: str, decision: Decision) -> None:
        """Store the policy's decision and rule before anything runs (an ``allow`` marks the
        call authorized, which ``count_calls`` counts)."""
        allow = int(decision.action is Action.ALLOW)

        def body(c: sqlite3.Connection) -> None:
            cur = c.execute(
                "UPDATE calls SET decision = ?, rule = ?, reason = ?, authorized = max(authorized, ?) "
                "WHERE run_id = ? AND call_id = ?",
                (decision.action.value, decision.rule, decision.reason, allow, run_id, call_id),
            )
            if cur.rowcount == 0:
                raise _unknown_call(run_id, call_id)

        self._write(body)

    def mark_running(self, run_id: str, call_id: str, *, max_calls: int | None = None) -> bool:
        """claimed -> running, right before executing. With ``max_calls``, atomically refuse
        (return False, nothing changed but the call no longer counts as authorized) when the
        run already has ``max_calls`` other authorized calls, so concurrent processes cannot
        overrun the budget together."""

        def body(c: sqlite3.Connection) -> bool:
            row = c.execute(
                "SELECT state, authorized, error_code FROM calls WHERE run_id = ? AND call_id = ?", (run_id, call_id)
            ).fetchone()
            if row is None:
                raise _unknown_call(run_id, call_id)
            state, authorized, error_code = row
            if state != "claimed":
                raise AuditError(f"call {call_id} of run {run_id} is already {state}; a call_id runs at most once")
            if max_calls is not None:
                counted = c.execute(_COUNT_AUTHORIZED, (run_id,)).fetchone()[0]
                others = counted - int(bool(authorized) and error_code != ErrorCode.BUDGET_EXCEEDED.value)
                if others >= max_calls:
                    c.execute("UPDATE calls SET authorized = 0 WHERE run_id = ? AND call_id = ?", (run_id, call_id))
                    return False
            c.execute(
                "UPDATE calls SET state = 'running', authorized = 1 WHERE run_id = ? AND call_id = ?", (run_id, call_id)
            )
            return True

        return self._write(body)

    def finish_call(
        self,
        run_id: str,
        call_id: str,
        result: ToolResult,
        *,
        decision: Decision | None,
        exit_code: int | None,
        duration_ms: float,
        bytes_out: int,
        truncated: bool,
    ) -> None:
        """Store the outcome (state -> done). ``decision`` None keeps the one recorded earlier.
        Finishing a call twice is an AuditError: the first result is the one replays return."""
        payload = result_to_json(result)
        text = result.text
        if decision is None:
            action = rule = reason = None
            allow = 0
        else:
            action, rule, reason = decision.action.value, decision.rule, decision.reason
            allow = int(decision.action is Action.ALLOW)
        error_code = None if result.error is None else result.error.value

        def params(text: str, payload: str) -> tuple[Any, ...]:
            return (
                time.time(), duration_ms, exit_code, int(result.is_error), error_code, bytes_out, int(truncated),
                text, payload, action, rule, reason, allow, run_id, call_id,
            )  # fmt: skip

        def body(c: sqlite3.Connection) -> None:
            try:
                cur = c.execute(_FINISH_CALL, params(text, payload))
            except UnicodeEncodeError:  # lone surrogates: store escaped, still exact on replay
                ascii_payload = json.dumps(json.loads(payload), ensure_ascii=True, separators=(",", ":"))
                cur = c.execute(_FINISH_CALL, params(_storable(text), ascii_payload))
            if cur.rowcount == 1:
                return
            row = c.execute("SELECT state FROM calls WHERE run_id = ? AND call_id = ?", (run_id, call_id)).fetchone()
            if row is None:
                raise _unknown_call(run_id, call_id)
            raise AuditError(f"call {call_id} of run {run_id} is already finished; a call_id runs at most once")

        self._write(body)

    def wait_for_result(self, run_id: str, call_id: str, timeout_s: float) -> ToolResult | None:
        """For a claimant that found the call claimed or running elsewhere: poll until it is
        done (5 ms backoff doubling to 100 ms) and return the stored result. None after
        ``timeout_s``, or as soon as the owning process on this host is seen dead."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        next_owner_check = time.monotonic() + _OWNER_CHECK_EVERY_S
        query = "SELECT state, result_json, owner FROM calls WHERE run_id = ? AND call_id = ?"
        this_host = socket.gethostname()
        while True:
            row = self._read(lambda c: c.execute(query, (run_id, call_id)).fetchone())
            if row is None:
                raise _unknown_call(run_id, call_id)
            state, payload, owner_label = row
            if state == "done":
                return result_from_json(payload)
            now = time.monotonic()
            if now >= next_owner_check:
                next_owner_check = now + _OWNER_CHECK_EVERY_S
                owner = Owner.parse(owner_label)
                if owner is not None and owner_alive(owner, this_host) is False:
                    return None
            remaining = deadline - now
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.1)

    def count_calls(self, run_id: str) -> int:
        """Calls of the run authorized to run (for the max_tool_calls budget): an ``allow``
        decision recorded, an approval consumed, or ``mark_running``; calls refused for the
        budget itself are not counted. The current call counts once its allow is recorded."""
        row = self._read(lambda c: c.execute(_COUNT_AUTHORIZED, (run_id,)).fetchone())
        return int(row[0])

    def first_call_time(self, run_id: str) -> float | None:
        row = self._read(lambda c: c.execute("SELECT MIN(started) FROM calls WHERE run_id = ?", (run_id,)).fetchone())
        return None if row[0] is None else float(row[0])

    def calls_for_run(self, run_id: str) -> list[dict[str, Any]]:
        """Every call of the run in the order they were claimed (AuditError if no such run),
        each with the decision that stands and its approval (``audit_records.call_view``)."""

        def body(c: sqlite3.Connection) -> tuple[list[CallRecord], list[Any]] | None:
            if c.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                return None
            earlier = _earlier_attempts(c, run_id)
            calls = [_call_from_row(r, earlier.get(r[1], ())) for r in c.execute(_SELECT_RUN_CALLS, (run_id,))]
            return calls, c.execute(f"{_SELECT_APPROVALS} WHERE run_id = ?", (run_id,)).fetchall()

        found = self._read(body)
        if found is None:
            raise _unknown_run(run_id)
        calls, approval_rows = found
        approvals = {a.call_id: a for a in map(_approval_from_row, approval_rows)}
        return [call_view(record, approvals.get(record.call_id)) for record in calls]

    def recent_calls(self, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` calls across runs, newest first."""

        def body(c: sqlite3.Connection) -> list[CallRecord]:
            rows = c.execute(_SELECT_RECENT_CALLS, (limit,)).fetchall()
            return [_call_from_row(r, _earlier_attempts(c, r[0], r[1]).get(r[1], ())) for r in rows]

        return [record.to_dict() for record in self._read(body)]

    # -- approvals

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
            c.execute(_ENSURE_RUN, (run_id, now))
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
            raise _unknown_approval(approval_id)
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
        sql = f"{_SELECT_APPROVALS}{where} ORDER BY created, rowid"
        rows = self._read(lambda c: c.execute(sql, params).fetchall())
        return [_approval_from_row(r) for r in rows]

    def resolve_approval(self, approval_id: str, approve: bool, *, by: str, reason: str | None) -> Approval:
        """pending -> approved | denied. Anything else is an AuditError naming the state."""

        def body(c: sqlite3.Connection) -> Approval:
            row = c.execute(_SELECT_APPROVAL, (approval_id,)).fetchone()
            if row is None:
                raise _unknown_approval(approval_id)
            current = _approval_from_row(row)
            if current.state != "pending":
                state = "approved (and its call has run)" if current.state == "consumed" else current.state
                raise AuditError(f"approval {approval_id} is already {state}")
            new_state, now = ("approved" if approve else "denied"), time.time()
            c.execute(
                "UPDATE approvals SET state = ?, resolved = ?, resolved_by = ?, resolution_reason = ? WHERE id = ?",
                (new_state, now, by, reason, approval_id),
            )
            return dataclasses.replace(current, state=new_state, resolved=now, resolved_by=by, resolution_reason=reason)

        return self._write(body)

    def consume_approval(self, approval_id: str) -> bool:
        """approved -> consumed, atomically: True for exactly one caller, who then runs the
        call (now counted as authorized); False if it was already consumed. A pending or
        denied approval is an AuditError."""

        def body(c: sqlite3.Connection) -> bool:
            row = c.execute("SELECT state, run_id, call_id FROM approvals WHERE id = ?", (approval_id,)).fetchone()
            if row is None:
                raise _unknown_approval(approval_id)
            state, run_id, call_id = row
            if state == "consumed":
                return False
            if state == "pending":
                raise AuditError(
                    f"approval {approval_id} is still pending; "
                    f"approve it with `callbox approvals approve {approval_id}`"
                )
            if state == "denied":
                raise AuditError(f"approval {approval_id} was denied; its call must not run")
            c.execute("UPDATE approvals SET state = 'consumed', consumed = ? WHERE id = ?", (time.time(), approval_id))
            c.execute("UPDATE calls SET authorized = 1 WHERE run_id = ? AND call_id = ?", (run_id, call_id))
            return True

        return self._write(body)
