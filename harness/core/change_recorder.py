"""Records what each tool call changes in the sandbox's writable places (the policy's ``[checkpoints]``).

With ``mode = "changes"``, the call path asks this recorder, around every call of a tool that
is not annotated read-only, for two things: :meth:`ChangeRecorder.before` (the first time in
a run, the baseline: every entry of the places, with its content) and
:meth:`ChangeRecorder.after` (what the call changed: the agent's ``Changes.Scan`` since the
previous scan, each entry compared with the recorded state so that a file rewritten with the
same bytes is no change). The records go to the run's :class:`~harness.audit.change_store.RunChanges`.

The writable places are the scratch places (``/workspace``, ``/tmp``, the home directory, a
separate workdir) and every read-write mount; the agent's own runtime files in ``/tmp`` are
left out. Changes made between two recorded calls (by a read-only call, or a background job)
are counted in the next recorded call's.

A record never fails its call: a scan that fails is logged and said in the result's meta
(``changes.error``), and the run's next recorded call scans again. When the content stored for
the run would pass ``max_bytes``, recording stops for the run: a ``stopped`` record says so,
and so does the meta of the call that reached it.

Records go with their run: :func:`sweep_ended_runs`, called when a recording session opens
(at most every ``SWEEP_EVERY_S`` per store), removes those of runs ended more than the
policy's ``keep_days`` ago.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.audit.change_store import BlobWriter, ChangeRecord, Entry, EntryType, RunChanges, apply, sweep
from harness.audit.errors import AuditError
from harness.audit.store import AuditStore
from harness.core.errors import AgentCallError, CallboxError
from harness.core.units import ByteSize
from harness.engine.base import Sandbox
from harness.engine.spec import TMP, SandboxSpec
from sandbox.v1 import changes_pb2, filesystem_pb2

log = logging.getLogger("callbox.changes")

AGENT_RUNTIME = "callbox-shell-"
"""The agent's shell sessions keep private runtime directories ``/tmp/callbox-shell-*``: left out."""

_TYPES: dict[int, EntryType] = {
    filesystem_pb2.FILE_TYPE_FILE: "file",
    filesystem_pb2.FILE_TYPE_DIRECTORY: "dir",
    filesystem_pb2.FILE_TYPE_SYMLINK: "symlink",
}


class CheckpointSettings(BaseModel):
    """``[checkpoints]``: a record of what each tool call changes in the sandbox's writable
    places, for ``callbox diff`` and ``callbox revert`` (see the undo page of the docs).

    Off by default: the first recorded call of a run copies every file of the writable places
    (a read-write mount holding a project included) into the run's store, and each recorded
    call pays a scan (a few milliseconds, measured in the bench); a run should not pay for that,
    in time and disk, unless its policy asks for undo."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["off", "changes"] = "off"
    """``"changes"``: record the changes of every call of a tool not annotated read-only
    (the first such call of a run also takes the baseline); ``"off"``: none."""
    max_bytes: ByteSize = Field(default=1 << 30, ge=0)
    """The most file content a run's records may hold, the baseline included (``"1g"`` or
    bytes); reaching it stops recording for the run, said in the result of the call that did."""
    keep_days: float = Field(default=7, ge=0)
    """How long a run's records are kept after the run ended, in days (0: until removed by
    hand). A session that records sweeps the records of runs ended longer ago than that."""


SWEEP_EVERY_S = 600.0
"""How often one process looks for records of runs ended longer ago than ``keep_days``."""
_last_sweep: dict[str, float] = {}
_sweep_lock = threading.Lock()


def sweep_ended_runs(audit: AuditStore, root: Path, settings: CheckpointSettings,
                     *, now: float | None = None, force: bool = False) -> list[str]:
    """Remove the change records under ``root`` of runs ended more than ``keep_days`` ago
    (at most every ``SWEEP_EVERY_S`` per ``root`` unless ``force``); the run ids removed."""
    if settings.keep_days <= 0:
        return []
    now = time.time() if now is None else now
    with _sweep_lock:
        if not force and now - _last_sweep.get(str(root), float("-inf")) < SWEEP_EVERY_S:
            return []
        _last_sweep[str(root)] = now

    def ended_at(run_id: str) -> float | None:
        try:
            return audit.get_run(run_id).ended
        except AuditError:
            return None  # a run this store does not know: not ours to judge

    removed = sweep(root, ended_at, settings.keep_days * 86400, now)
    if removed:
        log.info("removed the change records of %d runs ended more than %g days ago: %s",
                 len(removed), settings.keep_days, ", ".join(removed))
    return removed


class ChangeRecorder:
    """The change records of one run's sandbox (one recorder per session)."""

    def __init__(self, settings: CheckpointSettings, store: RunChanges, spec: SandboxSpec) -> None:
        self.settings = settings
        self.store = store
        mounts = {m.target: str(m.source) for m in spec.mounts if not m.read_only}
        self.places = tuple(sorted({*spec.scratch_tmpfs(), *mounts}))
        self.mounts = mounts
        self._state: dict[str, Entry] | None = None
        self._size = 0
        self._seq = 0
        self._used = 0
        self._baseline = False
        self._lock = threading.Lock()
        self.stopped = False

    def _load(self) -> dict[str, Entry]:
        """The recorded state: read back from the store the first time (after a restart) and
        whenever another process appended to it (a revert from the command line)."""
        if self._state is None or self.store.records_size() != self._size:
            records = self.store.records()
            self._state = {}
            for record in records:
                apply(self._state, record.entries)
            self._seq = records[-1].seq if records else 0
            self._used = self.store.stored_bytes()
            self.stopped = any(r.kind == "stopped" for r in records)
            self._baseline = any(r.kind == "baseline" for r in records)
            self._size = self.store.records_size()
        return self._state

    def before(self, sandbox: Sandbox) -> dict[str, Any] | None:
        """Take the baseline if the run has none yet; the result meta's ``changes`` on failure."""
        with self._lock:
            return self._before(sandbox)

    def after(self, sandbox: Sandbox, call_id: str, tool: str) -> dict[str, Any]:
        """Record what the call changed; the result meta's ``changes`` (counts, or what failed).
        Calls of one run running at once are recorded one after the other, each with what its
        scan found (a change the other call made may be counted in either)."""
        with self._lock:
            return self._after(sandbox, call_id, tool)

    def reverting(self, sandbox: Sandbox, to_call: str,
                  put_back: Callable[[dict[str, Entry], dict[str, Entry]], None]) -> dict[str, Any]:
        """Record what changed since the last record, call ``put_back(target, current)`` (the
        recorded state just before ``to_call``, and now), then record what it changed as a
        ``revert`` record; its counts."""
        with self._lock:
            state = self._load()
            if not self._baseline:
                raise CallboxError(f"run {self.store.run_id} has no baseline: no recorded call to revert to")
            target = self.store.state_before(to_call)
            entries, added = self._scan(sandbox, reset=False)
            if entries:
                self._append(ChangeRecord(seq=0, kind="revert", at=time.time(), entries=tuple(entries),
                                          before={e.path: state.get(e.path) for e in entries}, bytes=added,
                                          note="changes since the last record, found before a revert"))
            put_back(target, dict(state))
            entries, added = self._scan(sandbox, reset=False)
            before = {e.path: state.get(e.path) for e in entries}
            self._append(ChangeRecord(seq=0, kind="revert", at=time.time(), call_id=to_call, entries=tuple(entries),
                                      before=before, bytes=added, note=f"revert to just before call {to_call}"))
            return _counts(entries, before)

    def _before(self, sandbox: Sandbox) -> dict[str, Any] | None:
        self._load()
        if self._baseline or self.stopped:
            return None
        started = time.perf_counter()
        try:
            entries, added = self._scan(sandbox, reset=True)
        except _Stop as stop:
            return self._stop(None, None, stop.reason)
        except CallboxError as error:
            log.warning("run %s: the baseline of its writable places failed: %s", self.store.run_id, error.message)
            return {"error": f"the baseline of the writable places failed: {error.message}"}
        self._append(ChangeRecord(seq=0, kind="baseline", at=time.time(), entries=tuple(entries),
                                  places=self.places, mounts=self.mounts,
                                  seconds=time.perf_counter() - started, bytes=added))
        self._baseline = True
        return None

    def _after(self, sandbox: Sandbox, call_id: str, tool: str) -> dict[str, Any]:
        state = self._load()
        if self.stopped:
            return {"stopped": True}
        if not self._baseline:
            return {"error": "no baseline: the call's changes are counted in the next recorded call's"}
        started = time.perf_counter()
        try:
            entries, added = self._scan(sandbox, reset=False)
        except _Stop as stop:
            return self._stop(call_id, tool, stop.reason)
        except CallboxError as error:
            log.warning("run %s call %s: its changes were not recorded: %s", self.store.run_id, call_id,
                        error.message)
            return {"error": f"the call's changes were not recorded: {error.message}"}
        before = {e.path: state.get(e.path) for e in entries}
        self._append(ChangeRecord(seq=0, kind="call", at=time.time(), call_id=call_id, tool=tool,
                                  entries=tuple(entries), before=before,
                                  seconds=time.perf_counter() - started, bytes=added))
        return _counts(entries, before)

    def _append(self, record: ChangeRecord) -> None:
        state = self._load()
        self._seq += 1
        record = ChangeRecord(**{**record.__dict__, "seq": self._seq})
        self.store.append(record)
        self._size = self.store.records_size()
        apply(state, record.entries)

    def _stop(self, call_id: str | None, tool: str | None, reason: str) -> dict[str, Any]:
        self.stopped = True
        log.warning("run %s: change records stopped: %s", self.store.run_id, reason)
        self._append(ChangeRecord(seq=0, kind="stopped", at=time.time(), call_id=call_id, tool=tool, note=reason))
        return {"stopped": True, "error": f"change records stopped for this run: {reason}"}

    def _scan(self, sandbox: Sandbox, *, reset: bool) -> tuple[list[Entry], int]:
        """The entries the agent reports changed that differ from the recorded state, and the
        bytes of content they added to the store."""
        state = self._load()
        left = self.settings.max_bytes - self._used
        if left <= 0:
            raise _Stop(f"the run's records hold max_bytes ({self.settings.max_bytes} bytes) of content")
        request = changes_pb2.ScanRequest(places=list(self.places), reset=reset, max_bytes=left,
                                          skip_prefixes=[f"{TMP}/{AGENT_RUNTIME}"])
        entries: list[Entry] = []
        added = 0
        pending: tuple[changes_pb2.ScanEntry, BlobWriter] | None = None

        def settle() -> None:
            nonlocal pending, added
            if pending is None:
                return
            scanned, writer = pending
            pending = None
            digest, _, new = writer.finish()
            if new:
                added += writer.size
            self._keep(entries, state, _entry(scanned, digest))

        try:
            for chunk in sandbox.agent.scan_changes(request):
                if chunk.HasField("entry"):
                    settle()
                    scanned = chunk.entry
                    if scanned.type == filesystem_pb2.FILE_TYPE_FILE and not scanned.unreadable:
                        pending = (scanned, self.store.blob_writer())
                    else:
                        self._keep(entries, state, _entry(scanned, None))
                if chunk.data and pending is not None:
                    pending[1].write(chunk.data)
            settle()
        except AgentCallError as error:
            if pending is not None:
                pending[1].abandon()
            if error.reason == "TOO_LARGE":
                raise _Stop(f"the changed content passes max_bytes ({self.settings.max_bytes} bytes)") from None
            raise
        self._used += added
        return entries, added

    @staticmethod
    def _keep(entries: list[Entry], state: dict[str, Entry], entry: Entry) -> None:
        if entry.removed and entry.path not in state:
            return
        if not entry.removed and entry.same(state.get(entry.path)):
            return
        entries.append(entry)


class _Stop(Exception):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _entry(scanned: changes_pb2.ScanEntry, digest: str | None) -> Entry:
    if scanned.removed:
        return Entry(path=scanned.path)
    kind = _TYPES.get(scanned.type, "other")
    return Entry(path=scanned.path, type=kind, mode=scanned.mode, size=scanned.size, sha256=digest,
                 target=scanned.link_target if kind == "symlink" else None)


def _counts(entries: list[Entry], before: dict[str, Entry | None]) -> dict[str, Any]:
    created = sum(1 for e in entries if not e.removed and before.get(e.path) is None)
    removed = sum(1 for e in entries if e.removed)
    return {"created": created, "changed": len(entries) - created - removed, "removed": removed}
