"""The audit database's connection: opening it (WAL, busy timeout, foreign keys, the schema
migrated, its added columns and per-run call counts made), writes committed in groups,
retries while another process holds the write lock, and a fresh connection in a forked
child.

**Group commit.** The threads of one process that write at the same time share one
transaction. A writer queues its body; if no writer leads, it leads: it takes every body
queued, runs each in a SAVEPOINT of one ``BEGIN IMMEDIATE`` transaction, seals the audit
chain once and commits once. The others wait for that COMMIT; a body queued meanwhile waits
for the next group, led by the first of them. Each caller still returns only after the
COMMIT that holds its own record (what ``_write`` promised before: a record returned is a
record committed), and raises its own body's error: a body that raises is rolled back to its
savepoint alone, and the others' records commit. A failure of the group itself (the COMMIT,
the chain's seal, the write lock held by another process past the busy timeout) fails every
body of the group, each caller with an :class:`AuditError` that says so. One writer alone
runs as before: one transaction, no savepoint.

:class:`Database` is the base the store's parts (:mod:`harness.audit.store`,
:mod:`~harness.audit.approvals`, :mod:`~harness.audit.checkpoints`,
:mod:`~harness.audit.egress`) build on: each of them is SQL run through ``_read`` and
``_write``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar, cast

from harness.audit.chain import Chain, ChainHead, read_head
from harness.audit.errors import AuditError
from harness.audit.schema import (
    ATTEMPTS_TABLE,
    CHECKPOINTS_TABLE,
    EGRESS_TABLE,
    add_columns,
    ensure_call_counts,
    migrate,
)
from harness.core.errors import ErrorCode
from harness.core.state_dirs import state_dir
from harness.engine.docker.labels import Owner

__all__ = ["BUSY_TIMEOUT_S", "DEFAULT_WHERE", "ENSURE_RUN", "Database", "default_audit_path", "missing_database"]

log = logging.getLogger("callbox.audit")

BUSY_TIMEOUT_S = 10.0
"""How long a connection waits for another process's write lock before giving up."""

_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6

T = TypeVar("T")

ENSURE_RUN = "INSERT INTO runs (id, created) VALUES (?, ?) ON CONFLICT (id) DO NOTHING"
"""Record a run, unless it is recorded already (a call or approval of a run never started)."""


DEFAULT_WHERE = ("$CALLBOX_AUDIT_DB, else $XDG_STATE_HOME/callbox/audit.sqlite3, else "
                 "~/.local/state/callbox/audit.sqlite3")
"""Where the audit database is when no path is given, in words."""


def default_audit_path() -> Path:
    """``$CALLBOX_AUDIT_DB``, else ``$XDG_STATE_HOME/callbox/audit.sqlite3``, else
    ``~/.local/state/callbox/audit.sqlite3`` (a relative XDG_STATE_HOME is ignored, as the
    XDG spec requires)."""
    override = os.environ.get("CALLBOX_AUDIT_DB")
    if override:
        return Path(override).expanduser()
    return state_dir() / "audit.sqlite3"


def missing_database(path: Path, *, given: bool) -> AuditError:
    """The refusal to read audit database ``path``, which does not exist; ``given``: it was
    asked for by path (``--audit-db``), else it is the default. Reading never creates one:
    a mistyped path would otherwise read as an empty store."""
    default = default_audit_path()
    if given:
        return AuditError(
            f"the audit database {path} does not exist; check the path, or leave --audit-db out for the default, "
            f"{DEFAULT_WHERE} (here {default}); reading never creates one (call, run and serve do)",
            code=ErrorCode.NOT_FOUND)
    source = "$CALLBOX_AUDIT_DB" if os.environ.get("CALLBOX_AUDIT_DB") else f"the default: {DEFAULT_WHERE}"
    return AuditError(
        f"the audit database {path} ({source}) does not exist: nothing has been recorded there yet; call, run and "
        "serve create it as they record; pass --audit-db FILE to read another one", code=ErrorCode.NOT_FOUND)


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    text = str(exc)
    return "locked" in text or "busy" in text


_inherited_connections: list[sqlite3.Connection] = []
"""Connections a forked child inherited: never used nor closed there (SQLite forbids both)."""

_open_stores: weakref.WeakSet[Database] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_open_stores):
        store._lock = threading.Lock()  # another thread may have held it at fork time
        store._queue_lock = threading.Lock()
        store._queued = []  # the parent's writers are not in this process
        store._leading = False


@dataclass(eq=False)
class _Queued:
    """One writer's body waiting for a group commit, and its outcome once committed or failed."""

    body: Callable[[sqlite3.Connection], Any]
    """What to run inside the transaction."""
    done: threading.Event = field(default_factory=threading.Event)
    """Set when the outcome is known (``finished``), or when this writer is to lead the next group (``lead``)."""
    lead: bool = False
    """Handed the lead of the next group, which holds this body (set under the queue lock)."""
    finished: bool = False
    """The outcome is known: ``result`` or ``error``."""
    result: Any = None
    """What ``body`` returned, once its transaction committed."""
    error: BaseException | None = None
    """Why this body's record was not committed: its own error, or the group's."""


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _group_failed(exc: BaseException, size: int) -> AuditError:
    """The error of a writer whose record was in a group commit that failed as a whole."""
    error = AuditError(f"the audit record was not written: the group commit of {size} records it was part of "
                       f"failed: {exc}",
                       code=exc.code if isinstance(exc, AuditError) else ErrorCode.INTERNAL)
    error.__cause__ = exc
    return error


class Database:
    """The audit database's connection. Thread-safe (one connection behind a lock); process-safe (SQLite
    locking); fork-aware (a forked child opens its own connection). Use as a context manager
    or call ``close()``."""

    def __init__(self, path: Path | None = None, *, create: bool = True) -> None:
        """Open the database at ``path`` (None: :func:`default_audit_path`), creating it (and
        its directories) unless ``create`` is False: then one that does not exist is an
        AuditError naming the path and the default (:func:`missing_database`)."""
        self.path = Path(path) if path is not None else default_audit_path()
        if not create and not self.path.exists():
            raise missing_database(self.path, given=path is not None)
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        self._pid = -1
        self._closed = False
        self._owner: tuple[int, str] | None = None
        self._chain: Chain | None = None
        self._queue_lock = threading.Lock()
        self._queued: list[_Queued] = []
        """Bodies waiting for the next group commit (under ``_queue_lock``)."""
        self._leading = False
        """A writer is leading a group commit now (under ``_queue_lock``)."""
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

    def __enter__(self) -> Self:
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
                code=ErrorCode.INTERNAL,
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
            migrate(conn, self.path)
            add_columns(conn, self.path)
            ensure_call_counts(conn)
            self._chain = Chain(conn, self._owner_label, (CHECKPOINTS_TABLE, EGRESS_TABLE, ATTEMPTS_TABLE))
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
                    raise AuditError(f"audit database {self.path}: {exc}", code=ErrorCode.INTERNAL) from exc
                now = time.monotonic()
                if deadline is None:
                    deadline = now + BUSY_TIMEOUT_S
                if now >= deadline:
                    raise AuditError(
                        f"the audit database {self.path} stayed locked by another process for over "
                        f"{BUSY_TIMEOUT_S:.0f} s; try again",
                        code=ErrorCode.BUSY,
                    ) from exc
                time.sleep(delay)
                delay = min(delay * 2, 0.05)
            except sqlite3.Error as exc:
                raise self._sqlite_error(exc) from exc

    def _sqlite_error(self, exc: sqlite3.Error) -> AuditError:
        return AuditError(f"audit database {self.path}: {exc}", code=ErrorCode.INTERNAL)

    def _write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body`` inside a BEGIN IMMEDIATE transaction, committed before this returns,
        perhaps together with other threads' bodies (the module docstring's group commit);
        if ``body`` raises, what it did is rolled back and its error raised here."""
        queued = _Queued(body)
        with self._queue_lock:
            self._queued.append(queued)
            lead = not self._leading
            self._leading = True
        if not lead:
            try:
                queued.done.wait()
            except BaseException:  # Ctrl-C in the main thread, say
                self._withdraw(queued)
                raise
            lead = queued.lead
        if lead:
            self._lead()
        if queued.error is not None:
            raise queued.error
        return cast(T, queued.result)

    def _lead(self) -> None:
        """Commit every body queued as one group, tell their writers, and hand the lead to the
        first body queued meanwhile (or give it up)."""
        with self._queue_lock:
            group, self._queued = self._queued, []
        try:
            with self._lock:
                outcomes = self._retrying(lambda: self._commit(group))
            for queued, (result, error) in zip(group, outcomes, strict=True):
                queued.result, queued.error = result, error
        except BaseException as exc:
            for queued in group:
                queued.error = exc if queued is group[0] else _group_failed(exc, len(group))
        finally:
            with self._queue_lock:
                successor = self._queued[0] if self._queued else None
                self._leading = successor is not None
                if successor is not None:
                    successor.lead = True
            for queued in group:
                queued.finished = True
                queued.done.set()
            if successor is not None:
                successor.done.set()

    def _withdraw(self, queued: _Queued) -> None:
        """A writer stopped while it waited: its body leaves the queue unless a group took it
        already (then it commits or fails without its writer), and a lead it was handed
        passes on to the next writer queued, so that no writer waits for a leader that left."""
        with self._queue_lock:
            if queued not in self._queued:
                return
            self._queued.remove(queued)
            if not queued.lead:
                return
            successor = self._queued[0] if self._queued else None
            self._leading = successor is not None
            if successor is not None:
                successor.lead = True
        if successor is not None:
            successor.done.set()

    def _commit(self, group: list[_Queued]) -> list[tuple[Any, BaseException | None]]:
        """One transaction running ``group``'s bodies, each in a savepoint of its own when
        there are several; what each returned or raised."""
        conn = self._connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            outcomes: list[tuple[Any, BaseException | None]] = []
            if len(group) == 1:
                outcomes.append((group[0].body(conn), None))
            else:
                for queued in group:
                    outcomes.append(self._savepoint(conn, queued.body))
            if self._chain is not None:
                self._chain.seal(conn)  # what the bodies changed enters the chain in their transaction
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if self._chain is not None:
                self._chain.forget()
            raise
        return outcomes

    def _savepoint(self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], Any]
                   ) -> tuple[Any, BaseException | None]:
        """``body`` in a savepoint: kept if it returns, rolled back alone if it raises (a
        busy database is the group's problem: it is raised, and the whole group retried)."""
        conn.execute("SAVEPOINT audit_write")
        try:
            out = body(conn)
        except Exception as exc:
            if isinstance(exc, sqlite3.OperationalError) and _is_busy(exc):
                raise
            conn.execute("ROLLBACK TO audit_write")
            conn.execute("RELEASE audit_write")
            return None, self._sqlite_error(exc) if isinstance(exc, sqlite3.Error) else exc
        conn.execute("RELEASE audit_write")
        return out, None

    def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._lock:
            return self._retrying(lambda: body(self._connection()))

    def chain_head(self) -> ChainHead:
        """The audit chain's head (:mod:`harness.audit.chain`): the last entry's seq and hash."""
        return self._read(read_head)

    def _owner_label(self) -> str:
        pid = os.getpid()
        if self._owner is None or self._owner[0] != pid:
            self._owner = (pid, Owner.current().label())
        return self._owner[1]
