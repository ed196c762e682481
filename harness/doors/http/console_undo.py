"""Undo in the console: what each call of a run changed, and an operator's revert.

A run's page shows, per call with a change record (``[checkpoints] mode = "changes"``), what
:func:`harness.core.undo.call_changes` gives: its counts and its diff. An operator reverts to
just before a call the way the other ways of reverting do:

* the run's session lives in this server (a live sandbox of the doors' executor): every
  writable place is put back through the sandbox's agent, refused while a call of the run is
  running or while the sandbox is paused;
* otherwise what ``callbox revert`` does: the read-write mounts through their host
  directories, refused while a call runs, while the run is open (in another process), and,
  unless the operator confirms "mounts only", when the calls it undoes also changed scratch
  places, which went with the run's sandbox.

Both are :func:`harness.core.run_revert.revert_run`, shared with the CLI, the gRPC door and
the ``undo`` tool.

A revert is audited like the console's other actions: the change records get its ``revert``
record, the run's meta gets who reverted to which call, when, and what was and was not put
back (``console_reverts``, the latest :data:`REVERTS_KEPT`), and the server's log a line.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from harness.audit.change_store import RunChanges, changes_root
from harness.audit.records import RunRecord
from harness.audit.store import AuditError, AuditStore
from harness.core import undo
from harness.core.errors import CallboxError, ErrorCode
from harness.core.run_revert import revert_run
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.service import ExecutorService
from harness.doors.http.console import ACTOR_PREFIX, ConsoleError

__all__ = ["REVERTS_META", "ConsoleUndo", "RunChangesView"]

log = logging.getLogger("callbox.http")

REVERTS_META = "console_reverts"
"""The run meta key listing the console's reverts of the run (oldest first)."""
REVERTS_KEPT = 20
"""Reverts kept in a run's meta (the latest ones)."""
LINES_KEPT = 200
"""Paths of one revert kept in the run's meta (the count says how many there were)."""
CALLS_DIFFED = 50
"""The latest calls whose diffs the run's page shows (older ones: their counts, and the
``callbox diff`` command that prints theirs), so a long run's page stays quick to draw."""


@dataclass(frozen=True)
class RunChangesView:
    """What the run's page shows of its change records."""

    recorded: bool
    """Whether the run has change records (False: checkpoints were off for it)."""
    calls: list[undo.CallChanges]
    reverts: list[dict[str, Any]]
    """The console's reverts of the run, as its meta holds them (oldest first)."""
    live: bool
    """Whether the run's session lives in this server (a revert puts back every writable place)."""


class ConsoleUndo:
    """Change records and reverts of the runs of one audit store and, when the server runs one,
    of the doors' executor's live sandboxes."""

    def __init__(self, audit: AuditStore, executor: ExecutorService | None) -> None:
        self.audit = audit
        self.executor = executor

    def view(self, run: RunRecord) -> RunChangesView:
        """``run``'s change records, per call (the caller checked that the viewer may see it)."""
        changes = RunChanges(changes_root(self.audit.path), run.id)
        reverts = run.meta.get(REVERTS_META)
        calls = undo.call_changes(changes, diffs=CALLS_DIFFED) if changes.exists else []
        return RunChangesView(recorded=changes.exists, calls=calls,
                              reverts=[r for r in reverts if isinstance(r, dict)] if isinstance(reverts, list)
                              else [], live=self._live_session(run.id) is not None)

    def revert(self, run_id: str, to_call: str, *, client: str, mounts_only: bool) -> str:
        """Put the run back as it was just before ``to_call`` (see the module docstring), as
        ``console:CLIENT``; a sentence saying what was done. ConsoleError, with the reason, for
        a refusal or a failure."""
        if not to_call:
            raise ConsoleError("the form names no call to revert to (to=CALL)", ErrorCode.INVALID_REQUEST)
        try:
            self.audit.get_run(run_id)
            session = self._live_session(run_id)
            if session is not None and session.paused:
                raise ConsoleError(f"sandbox {run_id} is paused: resume it, then revert", ErrorCode.PAUSED)
            how, report = revert_run(self.audit, run_id, to_call,
                                     session=session.harness if session is not None else None,
                                     mounts_only=mounts_only, flag='a tick in "mounts only"')
            where = "sandbox" if how == "live" else "mounts"
        except ConsoleError:
            raise
        except CallboxError as error:
            raise ConsoleError(error.message, error.code) from None
        except OSError as error:
            raise ConsoleError(f"the revert of run {run_id} stopped part way: {error}; what is there now is "
                               "compared again by a new revert, which can be tried once the cause is fixed",
                               ErrorCode.INTERNAL) from None
        not_restored = report.not_restored
        by = f"{ACTOR_PREFIX}:{client}"
        self._record(run_id, {"by": by, "at": time.time(), "to_call": to_call, "where": where,
                              "put_back": report.count, "lines": list(report.lines())[:min(report.count, LINES_KEPT)],
                              "not_restored": not_restored})
        place = "its sandbox's writable places" if where == "sandbox" else "its read-write mounts"
        done = f"run {run_id} reverted to just before call {to_call} ({place}): {report.count} paths put back"
        if not_restored:
            done += f"; {len(not_restored)} not restored: {'; '.join(not_restored[:3])}"
        log.info("console: %s: %s", by, done)
        return done

    def _live_session(self, run_id: str) -> Any:
        """The executor's live session of ``run_id`` (a run's id is its sandbox's), or None."""
        if self.executor is None:
            return None
        owner = self.executor.live_sandboxes().get(run_id)
        if owner is None:
            return None
        try:
            return self.executor.session_of(run_id, owner)
        except ServiceError:
            return None

    def _record(self, run_id: str, entry: dict[str, Any]) -> None:
        try:
            kept = self.audit.get_run(run_id).meta.get(REVERTS_META)
            earlier = [r for r in kept if isinstance(r, dict)] if isinstance(kept, list) else []
            self.audit.update_run_meta(run_id, {REVERTS_META: [*earlier, entry][-REVERTS_KEPT:]})
        except AuditError as error:  # the files are back; say that the record of it is not
            log.warning("console: the revert of run %s is done but not recorded in its meta: %s", run_id,
                        error.message)
