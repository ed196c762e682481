"""Checking the audit chain (:mod:`harness.audit.chain`) against itself and the records.

:func:`verify` reads the database in one read transaction (a consistent snapshot while
other processes write) through a connection of its own, and finds:

* an entry whose hash is not the hash of its content (an entry changed);
* a gap in the seq numbers (entries removed), or an entry whose ``prev`` is not the hash of
  the one before (an entry inserted, or the one before replaced);
* a row whose content is not the one its latest entry's digest names (a row **changed**);
* a row whose latest entry is not a delete, missing from its table (a row **removed**);
* a row no entry names, or whose latest entry is a delete (a row **inserted**);
* a chain started again on a store that had one (its tables were removed);
* an anchored head (``SEQ:HASH`` kept elsewhere) that the chain no longer holds: the whole
  chain was rewritten from that point.

Each finding names the table, the row's key, its run, and the seq of the entry it concerns;
:attr:`Verdict.first` is the one earliest in the chain (rows no entry names come last).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

from harness.audit.chain import (
    CHAIN_TABLE,
    GENESIS,
    RESTARTED,
    TABLES_TABLE,
    ChainHead,
    TableShape,
    content_digest,
    entry_hash,
    is_chained_table,
)
from harness.audit.errors import AuditError
from harness.core.errors import ErrorCode

__all__ = ["Problem", "Verdict", "open_snapshot", "parse_anchor", "verify"]

_SHOWN_KEY = 80


@dataclass(frozen=True)
class Problem:
    """One finding of :func:`verify`."""

    kind: str
    """changed | removed | inserted (a row); entry_changed | entry_removed | entry_link (the
    chain itself); restarted (the chain was removed and started again); anchor (an anchored
    head the chain no longer holds)."""
    seq: int | None
    """The chain entry it concerns; None for a row no entry names."""
    table: str
    key: str
    run_id: str | None
    text: str

    def to_dict(self) -> dict[str, object]:
        return {"kind": self.kind, "seq": self.seq, "table": self.table, "key": self.key, "run_id": self.run_id,
                "text": self.text}


@dataclass(frozen=True)
class Verdict:
    head: ChainHead
    entries: int
    rows: int
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def first(self) -> Problem | None:
        """The finding earliest in the chain."""
        if not self.problems:
            return None
        return min(self.problems, key=lambda p: (p.seq is None, p.seq or 0))


def parse_anchor(text: str) -> ChainHead:
    """``SEQ:HASH`` (as the logs and ``/metrics`` give the head) as a :class:`ChainHead`."""
    seq, _, digest = text.strip().partition(":")
    if not seq.isdigit() or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
        raise AuditError(f"bad anchor {text!r}: give the chain head as SEQ:HASH, e.g. 42:3fa9... (64 hex digits), "
                         "as `callbox audit verify` and the server's log print it")
    return ChainHead(int(seq), digest)


def open_snapshot(path: Path) -> sqlite3.Connection:
    """A read-only connection to the database at ``path``, inside a read transaction."""
    if not path.exists():
        raise AuditError(f"the audit database {path} does not exist", code=ErrorCode.NOT_FOUND)
    try:
        conn = sqlite3.connect(f"file:{quote(str(path.resolve()))}?mode=ro", uri=True, timeout=10.0,
                               isolation_level=None, check_same_thread=False)
        conn.execute("BEGIN")
        conn.execute(f"SELECT 1 FROM {CHAIN_TABLE} LIMIT 1").fetchall()  # noqa: S608  (starts the snapshot)
    except sqlite3.Error as exc:
        raise AuditError(f"cannot read the audit chain of {path}: {exc}", code=ErrorCode.INTERNAL) from exc
    return conn


def _short(key: str) -> str:
    return key if len(key) <= _SHOWN_KEY else key[:_SHOWN_KEY] + "..."


def _of_run(run_id: str | None) -> str:
    return f" (run {run_id})" if run_id else ""


def verify(path: Path, anchors: Sequence[ChainHead] = ()) -> Verdict:
    """Check the chain of the audit database at ``path`` (see the module docstring)."""
    conn = open_snapshot(path)
    try:
        return _verify(conn, anchors)
    except sqlite3.Error as exc:
        raise AuditError(f"cannot read the audit chain of {path}: {exc}", code=ErrorCode.INTERNAL) from exc
    finally:
        conn.close()


def _verify(conn: sqlite3.Connection, anchors: Sequence[ChainHead]) -> Verdict:
    problems: list[Problem] = []
    latest: dict[tuple[str, str], tuple[int, str, str | None, str | None]] = {}  # -> seq, op, digest, run
    hashes: dict[int, str] = {}
    wanted = {a.seq for a in anchors}
    last_seq, last_hash, entries = 0, GENESIS, 0
    for seq, ts, tbl, key, op, run_id, actor, digest, note, prev, stored in conn.execute(
            f"SELECT seq, ts, tbl, key, op, run_id, actor, digest, note, prev, hash FROM {CHAIN_TABLE} "  # noqa: S608
            "ORDER BY seq"):
        entries += 1
        what = f"{tbl} row {_short(key)}{_of_run(run_id)}, {op}" if tbl else f"note: {note}"
        if seq != last_seq + 1:
            span = f"seq {last_seq + 1}" if seq == last_seq + 2 else f"seq {last_seq + 1} to {seq - 1}"
            problems.append(Problem("entry_removed", last_seq + 1, tbl, key, run_id,
                                    f"chain entries {span} are missing: removed from the chain"))
        if entry_hash(seq, ts, tbl, key, op, run_id, actor, digest, note, prev) != stored:
            problems.append(Problem("entry_changed", seq, tbl, key, run_id,
                                    f"chain entry seq {seq} ({what}) was changed: its hash is not that of its "
                                    "content"))
        elif prev != last_hash and seq == last_seq + 1:
            problems.append(Problem("entry_link", seq, tbl, key, run_id,
                                    f"chain entry seq {seq} ({what}) does not follow seq {last_seq}: its prev hash "
                                    f"is not that entry's hash (an entry was inserted, changed or replaced there)"))
        if op == "note" and str(note or "").startswith(RESTARTED):
            problems.append(Problem("restarted", seq, "", key, None, f"chain entry seq {seq}: {note}"))
        if seq in wanted:
            hashes[seq] = stored
        if tbl:
            latest[(tbl, key)] = (seq, op, digest, run_id)
        last_seq, last_hash = seq, stored
    for anchor in anchors:
        found = hashes.get(anchor.seq)
        if found != anchor.hash:
            now = "has no such entry" if found is None else f"holds {found} there"
            problems.append(Problem("anchor", anchor.seq, "", "", None,
                                    f"the anchored head {anchor} is not in the chain (it {now}): the chain was "
                                    "rewritten at or before that entry"))
    rows = _check_rows(conn, latest, problems)
    return Verdict(ChainHead(last_seq, last_hash), entries, rows, problems)


def _check_rows(conn: sqlite3.Connection, latest: dict[tuple[str, str], tuple[int, str, str | None, str | None]],
                problems: list[Problem]) -> int:
    """Compare every row of the chained tables with its latest entry; how many rows there are."""
    tables = [str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
    known = {str(r[0]) for r in conn.execute(f"SELECT name FROM {TABLES_TABLE}")}  # noqa: S608
    scanned: set[str] = set()
    rows = 0
    for name in tables:
        if not is_chained_table(name):
            continue
        scanned.add(name)
        shape = TableShape.of(conn, name)
        for values in conn.execute(shape.select_all):
            rows += 1
            key, row = str(values[0]), shape.row(values[1:])
            entry = latest.pop((name, key), None)
            run_id = shape.run_of(row)
            if entry is None or entry[1] == "delete":
                why = "no chain entry has it" if entry is None else f"the chain has it deleted (seq {entry[0]})"
                joined = "" if name in known else f" (table {name} is not in the chain at all)"
                problems.append(Problem("inserted", None if entry is None else entry[0], name, key, run_id,
                                        f"{name} row {_short(key)}{_of_run(run_id)} was inserted outside the store: "
                                        f"{why}{joined}"))
            elif content_digest(row) != entry[2]:
                problems.append(Problem("changed", entry[0], name, key, run_id,
                                        f"{name} row {_short(key)}{_of_run(run_id)} was changed outside the store: "
                                        f"it is not as its last chain entry (seq {entry[0]}, {entry[1]}) "
                                        "recorded it"))
    for (name, key), (seq, op, _, run_id) in latest.items():
        if op != "delete":
            where = "its table is gone" if name not in scanned else "its table no longer has it"
            problems.append(Problem("removed", seq, name, key, run_id,
                                    f"{name} row {_short(key)}{_of_run(run_id)} was removed outside the store: the "
                                    f"chain has it (seq {seq}, {op}) but {where}"))
    return rows
