"""Checkpoints: a paused agent run's state, kept until a process resumes it.

``save_checkpoint`` stores the state (JSON, see ``harness.loop.checkpoint``) and marks the
run ``end_reason = "approval_pending"``; ``claim_checkpoint`` (the resuming process)
atomically takes it back, re-opening the run, so two processes cannot resume the same
pause. The ``checkpoints`` table is made on first use.
"""

from __future__ import annotations

import dataclasses
import socket
import sqlite3
import time
from typing import Any

from harness.audit.database import Database
from harness.audit.errors import AuditError, unknown_run
from harness.audit.records import CheckpointRecord, _storable
from harness.audit.schema import CHECKPOINTS_TABLE, table_exists
from harness.core.errors import ErrorCode
from harness.engine.docker.labels import Owner, owner_alive

__all__ = ["PAUSED_REASON", "Checkpoints"]

PAUSED_REASON = "approval_pending"
"""The ``end_reason`` a run has while it is paused with a checkpoint."""
_SELECT_CHECKPOINT = "SELECT run_id, saved, status, owner, state FROM checkpoints WHERE run_id = ?"


class Checkpoints(Database):
    """The checkpoints part of the audit store."""

    def save_checkpoint(self, run_id: str, state_json: str) -> None:
        """Store the paused state of ``run_id`` (replacing an earlier one) and mark the run
        ``approval_pending``: paused, not finally ended (``claim_checkpoint`` re-opens it)."""
        now = time.time()
        owner = self._owner_label()
        state = _storable(state_json)

        def body(c: sqlite3.Connection) -> None:
            c.execute(CHECKPOINTS_TABLE)
            if c.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
                raise unknown_run(run_id)
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
                raise AuditError(f"run {run_id} already ended ({reason}); it cannot be paused", code=ErrorCode.CONFLICT)

        self._write(body)


    def load_checkpoint(self, run_id: str) -> CheckpointRecord | None:
        """The saved checkpoint of ``run_id`` (paused or already claimed), or None."""

        def body(c: sqlite3.Connection) -> Any:
            if not table_exists(c, "checkpoints"):
                return None
            return c.execute(_SELECT_CHECKPOINT, (run_id,)).fetchone()

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
            c.execute(CHECKPOINTS_TABLE)
            run = c.execute("SELECT ended, end_reason FROM runs WHERE id = ?", (run_id,)).fetchone()
            if run is None:
                raise unknown_run(run_id)
            row = c.execute(_SELECT_CHECKPOINT, (run_id,)).fetchone()
            if row is None:
                raise AuditError(f"run {run_id} has no checkpoint: only a run paused for approval can be resumed",
                                 code=ErrorCode.CONFLICT)
            record = CheckpointRecord(*row)
            ended, end_reason = run
            if ended is not None and end_reason != PAUSED_REASON:
                raise AuditError(f"run {run_id} already ended ({end_reason}); there is nothing to resume",
                                 code=ErrorCode.CONFLICT)
            if record.status == "resumed":
                holder = Owner.parse(record.owner)
                if holder is None or owner_alive(holder, this_host) is not False:
                    raise AuditError(f"run {run_id} is already being resumed by process {record.owner}",
                                     code=ErrorCode.CONFLICT)
            c.execute("UPDATE checkpoints SET status = 'resumed', owner = ? WHERE run_id = ?", (owner, run_id))
            c.execute("UPDATE runs SET ended = NULL, end_reason = NULL WHERE id = ?", (run_id,))
            return dataclasses.replace(record, status="resumed", owner=owner)

        return self._write(body)
