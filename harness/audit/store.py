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

A claim records its owner: the process's label, pid, start time, pid namespace and the
machine's boot id (:mod:`harness.audit.owners`). A claimant that finds the call unfinished
and its owner provably gone (killed, crashed, the machine rebooted) records it as
interrupted in the same transaction (:mod:`harness.audit.orphans`) and gets that result, never
a second run; one that was still ``claimed`` had not reached its handler, so its result is
retry-safe and the same claim takes the call again. ``wait_for_result`` stops waiting as
soon as the owner is provably gone, and ``interrupt_orphan`` then records it the same way.

The store is made of parts, one job each: the connection and its transactions
(:mod:`harness.audit.database`), the tables and migrations (:mod:`~harness.audit.schema`),
runs and calls (here), calls whose process is gone (:mod:`~harness.audit.orphans`),
approvals of calls that wait for a person (:mod:`~harness.audit.approvals`), checkpoints of paused runs
(:mod:`~harness.audit.checkpoints`) and egress proxy records (:mod:`~harness.audit.egress`).
The records it returns are :mod:`harness.audit.records`.

Timestamps are Unix epoch seconds (floats).
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Mapping
from typing import Any

from harness.audit.approvals import SELECT_APPROVALS, Approvals
from harness.audit.browse import Browse
from harness.audit.checkpoints import Checkpoints
from harness.audit.database import ENSURE_RUN, default_audit_path
from harness.audit.egress import Egress
from harness.audit.errors import AuditError, unknown_call, unknown_run
from harness.audit.interruptions import PROCESS_STOPPED
from harness.audit.orphans import OWNER_COLUMNS, owner_of, settle
from harness.audit.owners import ClaimOwner, owner_gone, this_process
from harness.audit.pictures import Pictures, store_images
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
    _Args,
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
from harness.audit.schema import ATTEMPTS_TABLE, COUNTED, table_exists
from harness.core.calls import Action, Decision, ErrorCode, ToolResult

__all__ = [
    "ARGUMENTS_CAP",
    "Approval",
    "Attempt",
    "AuditError",
    "AuditStore",
    "CallRecord",
    "CallStart",
    "CheckpointRecord",
    "Claim",
    "RunRecord",
    "arguments_digest",
    "canonical_json",
    "default_audit_path",
    "result_from_json",
    "result_to_json",
]

RUN_ID_MAX = 128
CALL_STATES = ("claimed", "running", "done")
_OWNER_CHECK_EVERY_S = 1.0


_CALL_COLUMNS = (
    "run_id, call_id, tool, args_digest, arguments, arguments_truncated, bytes_in, state, decision, rule, "
    "reason, authorized, owner, started, finished, duration_ms, exit_code, is_error, error_code, bytes_out, "
    "truncated, result_text, result_json"
)
_RUN_SELECT = (
    "SELECT r.id, r.created, r.ended, r.end_reason, r.meta, "
    "(SELECT COUNT(*) FROM calls c WHERE c.run_id = r.id) FROM runs r"
)
_INSERT_CALL = (
    "INSERT INTO calls (run_id, call_id, tool, args_digest, arguments, arguments_truncated, bytes_in, started, "  # noqa: S608
    f"{OWNER_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, call_id) DO NOTHING"
)
_SELECT_CALL = f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? AND call_id = ?"  # noqa: S608
_SELECT_RUN_CALLS = f"SELECT {_CALL_COLUMNS} FROM calls WHERE run_id = ? ORDER BY id"  # noqa: S608
_SELECT_RECENT_CALLS = f"SELECT {_CALL_COLUMNS} FROM calls ORDER BY id DESC LIMIT ?"  # noqa: S608
_FINISH_CALL = (
    "UPDATE calls SET state = 'done', finished = ?, duration_ms = ?, exit_code = ?, is_error = ?, error_code = ?, "
    "bytes_out = ?, truncated = ?, result_text = ?, result_json = ?, "
    "decision = coalesce(?, decision), rule = coalesce(?, rule), reason = coalesce(?, reason), "
    "authorized = max(authorized, ?) "
    "WHERE run_id = ? AND call_id = ? AND state != 'done'"
)
_START_CALL = (
    "UPDATE calls SET decision = ?, rule = ?, reason = ?, authorized = 1, state = 'running' "
    "WHERE run_id = ? AND call_id = ? AND state = 'claimed'"
)
_ARCHIVE_ATTEMPT = (
    "INSERT INTO call_attempts (run_id, call_id, attempt, owner, started, finished, duration_ms, decision, rule, "
    "reason, exit_code, error_code, bytes_out, result_text, result_json) "
    "SELECT run_id, call_id, ?, owner, started, finished, duration_ms, decision, rule, reason, exit_code, "
    "error_code, bytes_out, result_text, result_json FROM calls WHERE run_id = ? AND call_id = ? AND state = 'done'"
)
_RUN_CALL = (
    f"UPDATE calls SET state = 'running', authorized = 1, ({OWNER_COLUMNS}) = (?, ?, ?, ?, ?) "  # noqa: S608
    "WHERE run_id = ? AND call_id = ?"
)
_RECLAIM_CALL = (
    "UPDATE calls SET state = 'claimed', owner = ?, owner_pid = ?, owner_boot_id = ?, owner_started = ?, "
    "owner_pid_ns = ?, started = ?, finished = NULL, duration_ms = NULL, "
    "exit_code = NULL, is_error = NULL, error_code = NULL, bytes_out = NULL, truncated = NULL, "
    "result_text = NULL, result_json = NULL, decision = NULL, rule = NULL, reason = NULL, authorized = 0 "
    "WHERE run_id = ? AND call_id = ? AND state = 'done'"
)


def _earlier_attempts(
    c: sqlite3.Connection, run_id: str, call_id: str | None = None
) -> dict[str, tuple[Attempt, ...]]:
    """The superseded attempts of one call (or of every call of the run), by call_id."""
    if not table_exists(c, "call_attempts"):
        return {}
    sql = f"SELECT call_id, {ATTEMPT_COLUMNS} FROM call_attempts WHERE run_id = ?"  # noqa: S608
    params: tuple[str, ...] = (run_id,)
    if call_id is not None:
        sql, params = f"{sql} AND call_id = ?", (run_id, call_id)
    found: dict[str, list[Attempt]] = {}
    for row in c.execute(f"{sql} ORDER BY call_id, attempt", params).fetchall():
        found.setdefault(row[0], []).append(_attempt_from_row(row[1:]))
    return {key: tuple(value) for key, value in found.items()}


@dataclasses.dataclass(frozen=True)
class CallStart:
    """The answer to ``claim_and_start``: the claim, and for a fresh one the decision
    recorded and whether the call is now running (an allow within the budget)."""

    claim: Claim
    decision: Decision | None = None
    running: bool = False


def _existing(c: sqlite3.Connection, run_id: str, call_id: str) -> CallRecord:
    row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
    return _call_from_row(row, _earlier_attempts(c, run_id, call_id).get(call_id, ()))


def _claim(c: sqlite3.Connection, run_id: str, call_id: str, tool: str, args: _Args, owner: ClaimOwner,
           now: float) -> Claim:
    """``claim_call`` inside the caller's transaction. A call found unfinished whose owner is
    provably gone is first recorded as interrupted (:func:`harness.audit.orphans.settle`)."""
    params = (run_id, call_id, tool, args.digest, args.text, int(args.truncated), args.size, now, *owner.columns())
    c.execute(ENSURE_RUN, (run_id, now))
    if c.execute(_INSERT_CALL, params).rowcount == 1:
        record = CallRecord(
            run_id=run_id, call_id=call_id, tool=tool, args_digest=args.digest, arguments=args.text,
            arguments_truncated=args.truncated, bytes_in=args.size, state="claimed", decision=None,
            authorized=False, owner=owner.label, started=now,
        )  # fmt: skip
        return Claim(fresh=True, record=record)
    existing = _existing(c, run_id, call_id)
    conflict = existing.tool != tool or existing.args_digest != args.digest
    if not conflict and existing.state != "done" and settle(c, run_id, call_id, here=owner):
        existing = _existing(c, run_id, call_id)
    if conflict or existing.state != "done" or not retry_safe(existing.result):
        return Claim(fresh=False, record=existing, conflict=conflict)
    c.execute(ATTEMPTS_TABLE)
    c.execute(_ARCHIVE_ATTEMPT, (existing.attempts, run_id, call_id))
    c.execute(_RECLAIM_CALL, (*owner.columns(), now, run_id, call_id))
    row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
    return Claim(fresh=True, record=_call_from_row(row, _earlier_attempts(c, run_id, call_id)[call_id]))


def _record_decision(c: sqlite3.Connection, run_id: str, call_id: str, decision: Decision) -> None:
    """``record_decision`` inside the caller's transaction."""
    allow = int(decision.action is Action.ALLOW)
    cur = c.execute(
        "UPDATE calls SET decision = ?, rule = ?, reason = ?, authorized = max(authorized, ?) "
        "WHERE run_id = ? AND call_id = ?",
        (decision.action.value, decision.rule, decision.reason, allow, run_id, call_id),
    )
    if cur.rowcount == 0:
        raise unknown_call(run_id, call_id)


def _mark_running(c: sqlite3.Connection, run_id: str, call_id: str, max_calls: int | None,
                  owner: ClaimOwner) -> bool:
    """``mark_running`` inside the caller's transaction; ``owner`` (the process about to run
    it: after an approval, not always the one that claimed it) becomes the claim's owner."""
    row = c.execute(
        "SELECT state, authorized, error_code FROM calls WHERE run_id = ? AND call_id = ?", (run_id, call_id)
    ).fetchone()
    if row is None:
        raise unknown_call(run_id, call_id)
    state, authorized, error_code = row
    if state != "claimed":
        raise AuditError(f"call {call_id} of run {run_id} is already {state}; a call_id runs at most once",
                         code=ErrorCode.CONFLICT)
    if max_calls is not None:
        counted = c.execute(COUNTED, (run_id,)).fetchone()[0]
        others = counted - int(bool(authorized) and error_code != ErrorCode.BUDGET_EXCEEDED.value)
        if others >= max_calls:
            c.execute("UPDATE calls SET authorized = 0 WHERE run_id = ? AND call_id = ?", (run_id, call_id))
            return False
    c.execute(_RUN_CALL, (*owner.columns(), run_id, call_id))
    return True


def _new_run_id() -> str:
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    return f"{stamp}-{secrets.token_hex(4)}"


class AuditStore(Approvals, Browse, Checkpoints, Egress, Pictures):
    """The audit database. Thread-safe (one connection behind a lock); process-safe (SQLite
    locking); fork-aware (a forked child opens its own connection). Use as a context manager
    or call ``close()``."""

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
                raise unknown_run(run_id)

        self._write(body)

    def update_run_meta(self, run_id: str, meta: Mapping[str, Any]) -> None:
        """Merge ``meta`` into the run's meta (keys given replace stored ones)."""

        def body(c: sqlite3.Connection) -> None:
            row = c.execute("SELECT meta FROM runs WHERE id = ?", (run_id,)).fetchone()
            if row is None:
                raise unknown_run(run_id)
            merged = {**json.loads(row[0]), **meta}
            text = json.dumps(merged, ensure_ascii=False, default=_json_default, sort_keys=True)
            c.execute("UPDATE runs SET meta = ? WHERE id = ?", (_storable(text), run_id))

        self._write(body)


    def get_run(self, run_id: str) -> RunRecord:
        row = self._read(lambda c: c.execute(f"{_RUN_SELECT} WHERE r.id = ?", (run_id,)).fetchone())
        if row is None:
            raise unknown_run(run_id)
        return _run_from_row(row)

    def list_runs(self, limit: int = 50, *, client: str | None = None) -> list[RunRecord]:
        """Newest first; with ``client``, only the runs whose ``meta.client`` it is."""
        where, params = ("WHERE json_extract(r.meta, '$.client') = ? ", (client,)) if client is not None else ("", ())
        rows = self._read(
            lambda c: c.execute(f"{_RUN_SELECT} {where}ORDER BY r.created DESC, r.rowid DESC LIMIT ?",
                                (*params, limit)).fetchall()
        )
        return [_run_from_row(r) for r in rows]

    def open_runs(self) -> list[RunRecord]:
        """The runs not ended yet, oldest first (a restarted server looks for its sandboxes among them)."""
        rows = self._read(
            lambda c: c.execute(f"{_RUN_SELECT} WHERE r.ended IS NULL ORDER BY r.created, r.rowid").fetchall()
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
        owner, now = this_process(), time.time()
        return self._write(lambda c: _claim(c, run_id, call_id, tool, args, owner, now))

    def claim_and_start(
        self, run_id: str, call_id: str, tool: str, arguments_json: str | Mapping[str, Any],
        decide: Callable[[int], Decision], *, max_calls: int | None = None,
    ) -> CallStart:
        """``claim_call``, ``record_decision`` and, for an allow, ``mark_running``, in one
        transaction: the path of a call that passed validation.

        When the claim is fresh, ``decide`` gets the run's authorized calls so far (what
        ``count_calls`` returns) and gives the policy's decision, which is recorded; an
        ``allow`` then marks the call running (``max_calls`` as in ``mark_running``). What is
        stored, and in which states a concurrent claimant can find the call, is what the three
        calls made one after the other store, so every record is committed before the command
        runs, as with them. ``decide`` runs inside the transaction, so it must be quick and
        must not use the store; if it raises, nothing is recorded. Not fresh: ``decide`` is
        not called and the answer holds the stored record (``claim``)."""
        args = _prepare_arguments(arguments_json)
        owner, now = this_process(), time.time()

        def body(c: sqlite3.Connection) -> CallStart:
            claim = _claim(c, run_id, call_id, tool, args, owner, now)
            if not claim.fresh:
                return CallStart(claim)
            counted = int(c.execute(COUNTED, (run_id,)).fetchone()[0])  # a fresh claim is not authorized yet
            decision = decide(counted)
            allow = decision.action is Action.ALLOW
            if allow and (max_calls is None or counted < max_calls):  # record_decision and mark_running at once
                c.execute(_START_CALL, (decision.action.value, decision.rule, decision.reason, run_id, call_id))
                return CallStart(claim, decision, running=True)
            _record_decision(c, run_id, call_id, decision)
            if allow:  # over the budget: refused as mark_running refuses it
                c.execute("UPDATE calls SET authorized = 0 WHERE run_id = ? AND call_id = ?", (run_id, call_id))
            return CallStart(claim, decision)

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
        self._write(lambda c: _record_decision(c, run_id, call_id, decision))

    def mark_running(self, run_id: str, call_id: str, *, max_calls: int | None = None) -> bool:
        """claimed -> running, right before executing. With ``max_calls``, atomically refuse
        (return False, nothing changed but the call no longer counts as authorized) when the
        run already has ``max_calls`` other authorized calls, so concurrent processes cannot
        overrun the budget together."""
        owner = this_process()
        return self._write(lambda c: _mark_running(c, run_id, call_id, max_calls, owner))

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
            store_images(c, result.images)  # rolled back with the rest if the call was finished already
            try:
                cur = c.execute(_FINISH_CALL, params(text, payload))
            except UnicodeEncodeError:  # lone surrogates: store escaped, still exact on replay
                ascii_payload = json.dumps(json.loads(payload), ensure_ascii=True, separators=(",", ":"))
                cur = c.execute(_FINISH_CALL, params(_storable(text), ascii_payload))
            if cur.rowcount == 1:
                return
            row = c.execute("SELECT state FROM calls WHERE run_id = ? AND call_id = ?", (run_id, call_id)).fetchone()
            if row is None:
                raise unknown_call(run_id, call_id)
            raise AuditError(f"call {call_id} of run {run_id} is already finished; a call_id runs at most once",
                             code=ErrorCode.CONFLICT)

        self._write(body)

    def wait_for_result(self, run_id: str, call_id: str, timeout_s: float) -> ToolResult | None:
        """For a claimant that found the call claimed or running elsewhere: poll until it is
        done (5 ms backoff doubling to 100 ms) and return the stored result. None after
        ``timeout_s``, or as soon as the owning process is provably gone
        (:func:`harness.audit.owners.owner_gone`; ``interrupt_orphan`` then records it)."""
        deadline = time.monotonic() + timeout_s
        delay = 0.005
        next_owner_check = time.monotonic() + _OWNER_CHECK_EVERY_S
        query = f"SELECT state, result_json, {OWNER_COLUMNS} FROM calls WHERE run_id = ? AND call_id = ?"  # noqa: S608
        while True:
            row = self._read(lambda c: c.execute(query, (run_id, call_id)).fetchone())
            if row is None:
                raise unknown_call(run_id, call_id)
            state, payload = row[:2]
            if state == "done":
                return result_from_json(payload)
            now = time.monotonic()
            if now >= next_owner_check:
                next_owner_check = now + _OWNER_CHECK_EVERY_S
                owner = owner_of(row[2:])
                if owner is not None and owner_gone(owner):
                    return None
            remaining = deadline - now
            if remaining <= 0:
                return None
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.1)

    def interrupt_orphan(self, run_id: str, call_id: str, *, cause: str = PROCESS_STOPPED) -> CallRecord | None:
        """Record call ``call_id`` of ``run_id`` as interrupted by ``cause`` if it is unfinished
        and its owner is provably gone (:mod:`harness.audit.orphans`); the call's record once
        finished (by this or by anyone), None while it is still unfinished."""

        def body(c: sqlite3.Connection) -> CallRecord | None:
            settle(c, run_id, call_id, cause=cause)
            row = c.execute(_SELECT_CALL, (run_id, call_id)).fetchone()
            if row is None:
                raise unknown_call(run_id, call_id)
            record = _call_from_row(row, _earlier_attempts(c, run_id, call_id).get(call_id, ()))
            return record if record.state == "done" else None

        return self._write(body)

    def count_calls(self, run_id: str) -> int:
        """Calls of the run authorized to run (for the max_tool_calls budget): an ``allow``
        decision recorded, an approval consumed, or ``mark_running``; calls refused for the
        budget itself and sandbox actions (``ACTION_TOOL_PREFIX``) are not counted. The current
        call counts once its allow is recorded."""
        row = self._read(lambda c: c.execute(COUNTED, (run_id,)).fetchone())
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
            return calls, c.execute(f"{SELECT_APPROVALS} WHERE run_id = ?", (run_id,)).fetchall()

        found = self._read(body)
        if found is None:
            raise unknown_run(run_id)
        calls, approval_rows = found
        approvals = {a.call_id: a for a in map(_approval_from_row, approval_rows)}
        return [call_view(record, approvals.get(record.call_id)) for record in calls]

    def recent_calls(self, limit: int = 50) -> list[dict[str, Any]]:
        """The last ``limit`` calls across runs, newest first."""

        def body(c: sqlite3.Connection) -> list[CallRecord]:
            rows = c.execute(_SELECT_RECENT_CALLS, (limit,)).fetchall()
            return [_call_from_row(r, _earlier_attempts(c, r[0], r[1]).get(r[1], ())) for r in rows]

        return [record.to_dict() for record in self._read(body)]
