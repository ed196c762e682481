"""Calls left ``claimed`` or ``running`` by a harness process that is gone.

:func:`settle` runs inside the transaction of whoever finds such a call (a process sending
the same call_id, a restarted server adopting its runs): when the claim's owner is provably
gone (:func:`harness.audit.owners.owner_gone`), the call is finished with an interrupted
result (:mod:`harness.audit.interruptions`) naming the owner and the process that noticed.

Whether the command had started is read from the call's state: ``running`` (the store marks
a call running just before its handler is given it) may have started; a call still
``claimed`` never reached its handler, so it had not (its result is then retry-safe: the
same call sent again runs). A call ``claimed`` with an ``ask`` decision is waiting for a
person, not for its process, and is never touched.
"""

from __future__ import annotations

import sqlite3
import time

from harness.audit.interruptions import PROCESS_STOPPED, interrupted_result
from harness.audit.owners import ClaimOwner, owner_gone, this_process
from harness.audit.records import result_to_json

__all__ = ["OWNER_COLUMNS", "owner_of", "settle"]

OWNER_COLUMNS = "owner, owner_pid, owner_boot_id, owner_started, owner_pid_ns"
"""The claim owner's columns, in the order :meth:`ClaimOwner.from_columns` takes them."""

_SELECT = f"SELECT state, decision, started, {OWNER_COLUMNS} FROM calls WHERE run_id = ? AND call_id = ?"  # noqa: S608
_FINISH = (
    "UPDATE calls SET state = 'done', finished = ?, duration_ms = ?, exit_code = NULL, is_error = 1, "
    "error_code = ?, bytes_out = 0, truncated = 0, result_text = ?, result_json = ? "
    "WHERE run_id = ? AND call_id = ? AND state = ? AND owner = ?"
)


def owner_of(row: tuple[object, ...]) -> ClaimOwner | None:
    """The owner in a row of :data:`OWNER_COLUMNS`."""
    label, pid, boot, started, pid_ns = row
    return ClaimOwner.from_columns(
        str(label or ""), pid if isinstance(pid, int) else None, boot if isinstance(boot, str) else None,
        float(started) if isinstance(started, int | float) else None, pid_ns if isinstance(pid_ns, str) else None,
    )


def settle(c: sqlite3.Connection, run_id: str, call_id: str, *, cause: str = PROCESS_STOPPED,
           here: ClaimOwner | None = None) -> bool:
    """Inside the caller's transaction: finish call ``call_id`` of ``run_id`` as interrupted
    by ``cause`` if it is unfinished and its owner is provably gone; whether it was."""
    row = c.execute(_SELECT, (run_id, call_id)).fetchone()
    if row is None:
        return False
    state, decision, started = row[:3]
    if state == "done" or (state == "claimed" and decision == "ask"):
        return False
    owner = owner_of(row[3:])
    here = here if here is not None else this_process()
    if owner is None or not owner_gone(owner, here):
        return False
    result = interrupted_result(call_id, cause=cause, command_started=None if state == "running" else False,
                                owner=owner.label, noticed_by=here.label)
    now = time.time()
    duration_ms = max(0.0, now - float(started or now)) * 1000.0
    error = result.error.value if result.error is not None else None
    cur = c.execute(_FINISH, (now, duration_ms, error, result.text, result_to_json(result), run_id, call_id, state,
                              owner.label))
    return cur.rowcount == 1
