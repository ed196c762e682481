"""Reverting a run wherever it is: what ``callbox revert``, the gRPC door's ``Undo.RevertRun``
and the ``undo`` tool share.

* A run whose session this process holds (its sandbox living): :class:`LiveUndo` puts every
  writable place back through the sandbox's agent (:func:`harness.core.undo.revert_live`),
  with every other call of the run held off meanwhile (``Session.calls_held``): refused with
  the running call's id while one runs, and a call that arrives during the revert is refused.
* A run that ended: :func:`revert_ended` puts its read-write mounts back through their host
  directories (:func:`harness.core.undo.revert`); refused while a call of the run is running or
  the run is open, and when the undone calls also changed a scratch place (gone with the
  sandbox) unless ``mounts_only``.

:func:`revert_run` picks one of the two for a run id and the session a door holds for it (or None).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from harness.audit.change_store import RunChanges, changes_root
from harness.audit.records import ACTION_CALL_PREFIX
from harness.audit.store import AuditStore
from harness.core import undo
from harness.core.change_recorder import ChangeRecorder
from harness.core.undo import RevertRefused, RevertReport, UndoError
from harness.engine.base import Sandbox
from harness.engine.cancel import CallScope, active_scope

if TYPE_CHECKING:
    from harness.core.session import Session

__all__ = ["LiveUndo", "RevertHow", "live_undo", "revert_ended", "revert_run", "run_changes", "running_calls"]

RevertHow = Literal["live", "mounts"]
"""How a run was reverted: its living sandbox's every place, or an ended run's read-write mounts."""


def running_calls(audit: AuditStore, run_id: str, *, but: str | None = None) -> list[str]:
    """The tool calls of ``run_id`` the audit store has as running (``but`` excepted; sandbox
    actions, such as the revert itself, are not calls)."""
    return [c["call_id"] for c in audit.calls_for_run(run_id) if c.get("state") == "running"
            and c["call_id"] != but and not str(c["call_id"]).startswith(ACTION_CALL_PREFIX)]


def run_changes(audit: AuditStore, run_id: str) -> RunChanges:
    """The change records of ``run_id``; UndoError when it has none."""
    changes = RunChanges(changes_root(audit.path), run_id)
    if not changes.exists:
        raise UndoError(f"run {run_id} has no change records: its policy's [checkpoints] mode was off "
                        'or none of its calls could change files (set mode = "changes" to record them)')
    return changes


@dataclass(frozen=True)
class LiveUndo:
    """Reverting one living session's sandbox: its recorder, its sandbox (None: none started),
    and its ``calls_held``."""

    recorder: ChangeRecorder
    sandbox: Callable[[], Sandbox | None]
    hold: Callable[[CallScope | None, str | None], contextlib.AbstractContextManager[None]]

    @property
    def changes(self) -> RunChanges:
        return self.recorder.store

    def revert(self, to_call: str, *, own_call: str | None = None) -> RevertReport:
        """Every writable place back as it was just before ``to_call``; ``own_call``: the call
        that asks (the ``undo`` tool's), which is running and does not count as another."""
        with self.hold(active_scope() if own_call is not None else None, own_call):
            box = self.sandbox()
            if box is None:
                raise UndoError(f"run {self.changes.run_id} has no sandbox: no call of it was recorded")
            return undo.revert_live(self.recorder, box, to_call)


def live_undo(session: Session) -> LiveUndo | None:
    """The session's :class:`LiveUndo` (None: its policy records no changes)."""
    if session.changes is None:
        return None
    return LiveUndo(session.changes, lambda: session.active_sandbox, session.calls_held)


def revert_ended(audit: AuditStore, run_id: str, to_call: str, *, mounts_only: bool,
                 flag: str = "--mounts-only") -> RevertReport:
    """An ended run's read-write mounts back as they were just before ``to_call``; the scratch
    places the undone calls changed are listed in ``not_restored`` (``mounts_only``; ``flag``:
    how the caller's user says it, named in the refusal without it)."""
    record = audit.get_run(run_id)
    changes = run_changes(audit, run_id)
    running = running_calls(audit, run_id)
    if running:
        raise RevertRefused(f"call {running[0]} of run {run_id} is running; revert once it has finished")
    if record.ended is None:
        raise RevertRefused(f"run {run_id} is still open: its sandbox may still change its mounts; revert "
                            "once the run has ended (`callbox audit` shows its END), or now through the server "
                            "that holds it (its console's run page, or its gRPC door's Undo.RevertRun)")
    lost = undo.scratch_changes(changes, to_call)
    if lost and not mounts_only:
        raise UndoError(f"the calls from {to_call} on also changed {', '.join(lost)}, which only the "
                        "run's sandbox holds (gone once the run ended, or kept for a paused run) and a revert "
                        f"from here cannot restore; add {flag} to restore the read-write mounts alone")
    report = undo.revert(changes, to_call)
    report.not_restored.extend(f"{place}: only the run's sandbox holds it" for place in lost)
    return report


def revert_run(audit: AuditStore, run_id: str, to_call: str, *, session: Session | None,
               mounts_only: bool = False, flag: str = "--mounts-only") -> tuple[RevertHow, RevertReport]:
    """Revert ``run_id`` to just before ``to_call``: its living sandbox when ``session`` (the
    run's live session in this process) has one, else its mounts (the run must have ended)."""
    live = live_undo(session) if session is not None and not session.closed else None
    if live is not None and live.sandbox() is not None:
        run_changes(audit, run_id)
        return "live", live.revert(to_call)
    return "mounts", revert_ended(audit, run_id, to_call, mounts_only=mounts_only, flag=flag)
