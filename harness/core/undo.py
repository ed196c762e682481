"""Undo of tool calls from their change records: :func:`diff` and :func:`revert`.

:func:`diff` renders what recorded calls changed (:mod:`harness.core.change_recorder`): a unified
diff for text, one summary line for other content (its size and hash), and lines for modes,
symlinks, directories and removals. It needs only the run's records.

:func:`revert` puts the writable places back as they were just before a call: the state the
records give for that moment (:meth:`~harness.audit.change_store.RunChanges.state_before`) is
compared with what is there now, entry by entry (content by hash), and every difference is
undone: what the state does not hold is removed, files are written back byte for byte, deleted
files, directories and symlinks recreated, and permission bits set. Since what is there is read
afresh, a change no record saw is undone too.

Two ways to put places back. :func:`revert_live` works on the run's living sandbox, through its
agent (every writable place, as the tool user, what it changed recorded as a ``revert`` record):
for a process that holds the run's session (a server, its doors). :func:`revert` works on a
read-write mount through its host directory, which outlives the sandbox: a run's sandbox is gone
once the run ended, and with it its scratch places (``/workspace``, ``/tmp``, the home
directory), which no revert can bring back; a revert whose calls changed such a place says so
and is refused unless the caller accepts restoring the mounts only. Its walk never follows a
symlink: a path whose parent is not a real directory after the earlier steps is refused, not
written through.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import shutil
import stat
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from harness.audit.change_store import ChangeRecord, Entry, RunChanges, apply
from harness.core.change_recorder import ChangeRecorder
from harness.core.errors import AgentCallError, CallboxError, ErrorCode
from harness.engine.base import Sandbox
from sandbox.v1 import changes_pb2

MAX_DIFF_BYTES = 1 << 20
"""Text files larger than this get the summary line instead of a diff."""
APPLY_BATCH_BYTES = 4 << 20
"""Content per ``Changes.Apply`` request (a larger file goes in several appends)."""


class UndoError(CallboxError):
    """A diff or revert that cannot be done; the message says why and what can be done."""

    code = ErrorCode.INVALID_REQUEST


class RevertRefused(UndoError):
    """A revert refused for the run's state (a call of it running, the run still open);
    the message says what to wait for."""

    code = ErrorCode.CONFLICT


# --- diff ------------------------------------------------------------------------------------------


def diff(changes: RunChanges, call_id: str | None = None) -> str:
    """What the recorded calls of the run changed (only ``call_id``'s when given), as text."""
    records = call_records(changes, call_id)
    if call_id is not None and not records:
        raise UndoError(f"call {call_id!r} has no change record in run {changes.run_id}; "
                        f"{_recorded(changes)}")
    out: list[str] = []
    for record in records:
        out.append(f"# call {record.call_id} ({record.tool}): {_summary(record)}")
        for entry in record.entries:
            out.extend(_entry_diff(changes, record.before.get(entry.path), entry))
    return "\n".join(out) + ("\n" if out else "")


def _recorded(changes: RunChanges) -> str:
    calls = [r.call_id for r in changes.records() if r.kind == "call"]
    return f"the recorded calls are: {', '.join(str(c) for c in calls)}" if calls else "it has no recorded call"


def counts(record: ChangeRecord) -> tuple[int, int, int]:
    """How many entries the record's call created, changed and removed."""
    created = sum(1 for e in record.entries if not e.removed and record.before.get(e.path) is None)
    removed = sum(1 for e in record.entries if e.removed)
    return created, len(record.entries) - created - removed, removed


def call_records(changes: RunChanges, call_id: str | None = None) -> list[ChangeRecord]:
    """The run's call records (only ``call_id``'s when given), in order."""
    return [r for r in changes.records() if r.kind == "call" and (call_id is None or r.call_id == call_id)]


def _summary(record: ChangeRecord) -> str:
    if not record.entries:
        return "no changes"
    created, changed, removed = counts(record)
    return f"{created} created, {changed} changed, {removed} removed"


def _entry_diff(changes: RunChanges, before: Entry | None, after: Entry) -> list[str]:
    path = after.path
    if after.removed:
        if before is not None and before.type == "file":
            return _content_diff(changes, path, before.sha256, None, label=f"removed {path}")
        return [f"removed {before.type if before else 'entry'} {path}"]
    if after.type == "dir":
        return [f"created directory {path} (mode {after.mode:o})" if before is None or before.type != "dir"
                else f"mode {path}: {before.mode:o} -> {after.mode:o}"]
    if after.type == "symlink":
        was = f" (was {before.target})" if before is not None and before.type == "symlink" else ""
        return [f"symlink {path} -> {after.target}{was}"]
    if after.type != "file":
        return [f"{after.type} {path}"]
    lines = []
    if before is not None and before.type == "file" and before.mode != after.mode:
        lines.append(f"mode {path}: {before.mode:o} -> {after.mode:o}")
    old = before.sha256 if before is not None and before.type == "file" else None
    if before is None or before.type != "file" or old != after.sha256:
        label = f"created {path} (mode {after.mode:o})" if before is None else f"changed {path}"
        lines.extend(_content_diff(changes, path, old, after.sha256, label=label))
    return lines


def _content_diff(changes: RunChanges, path: str, old: str | None, new: str | None, *, label: str) -> list[str]:
    old_bytes = changes.read_blob(old) if old and changes.has_blob(old) else b""
    new_bytes = changes.read_blob(new) if new and changes.has_blob(new) else b""
    old_text, new_text = _text(old_bytes), _text(new_bytes)
    if old_text is None or new_text is None:
        return [f"{label}: binary, {_describe(old, old_bytes)} -> {_describe(new, new_bytes)}"]
    lines = difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                 fromfile=f"a{path}" if old else "/dev/null", tofile=f"b{path}" if new else "/dev/null")
    return [f"{label}:", *(line.rstrip("\n") for line in lines)]


def _text(data: bytes) -> str | None:
    if len(data) > MAX_DIFF_BYTES or b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _describe(digest: str | None, data: bytes) -> str:
    return "nothing" if digest is None else f"{len(data)} bytes sha256 {digest[:12]}"


# --- revert ----------------------------------------------------------------------------------------


@dataclass
class RevertReport:
    """What a revert did, per path in the sandbox."""

    removed: list[str] = field(default_factory=list)
    written: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    modes: list[str] = field(default_factory=list)
    not_restored: list[str] = field(default_factory=list)
    """Paths or places that could not be put back, each with why."""

    @property
    def count(self) -> int:
        return len(self.removed) + len(self.written) + len(self.created) + len(self.modes)

    def lines(self) -> Iterator[str]:
        for verb, paths in (("removed", self.removed), ("restored", self.written), ("recreated", self.created),
                            ("mode set", self.modes)):
            for path in paths:
                yield f"{verb} {path}"
        for why in self.not_restored:
            yield f"not restored: {why}"

    def as_dict(self) -> dict[str, list[str]]:
        """The report as JSON: what each list holds, by what was done."""
        return {"removed": self.removed, "restored": self.written, "recreated": self.created, "modes": self.modes,
                "not_restored": self.not_restored}


def scratch_changes(changes: RunChanges, to_call: str) -> list[str]:
    """The scratch places (not a mount) that the calls from ``to_call`` on changed."""
    baseline = changes.baseline()
    if baseline is None:
        return []
    mounts = tuple(baseline.mounts)
    touched: set[str] = set()
    seen = False
    for record in changes.records():
        seen = seen or (record.kind == "call" and record.call_id == to_call)
        if seen:
            for entry in record.entries:
                if not _under_any(entry.path, mounts):
                    touched.add(next((p for p in baseline.places if _under(entry.path, p)), entry.path))
    return sorted(touched)


def revert(changes: RunChanges, to_call: str) -> RevertReport:
    """Put every read-write mount of the run back as it was just before ``to_call`` ran,
    through its host directory (the run's sandbox is gone)."""
    baseline = changes.baseline()
    if baseline is None:
        raise UndoError(f"run {changes.run_id} has no change records (its policy's [checkpoints] mode was off)")
    try:
        target = changes.state_before(to_call)
    except KeyError:
        raise UndoError(f"call {to_call!r} has no change record in run {changes.run_id}; "
                        f"{_recorded(changes)}") from None
    report = RevertReport()
    for place, source in sorted(baseline.mounts.items()):
        wanted = {path: entry for path, entry in target.items() if _under(path, place) and path != place}
        _Restore(changes, place, Path(source), report).run(wanted)
    _record_mount_revert(changes, to_call, target, tuple(baseline.mounts))
    return report


def _record_mount_revert(changes: RunChanges, to_call: str, target: dict[str, Entry], mounts: tuple[str, ...]) -> None:
    """Append what the revert of the mounts changed, so the recorded state is what is there (a
    paused run resumed later compares its next call with it)."""
    records = changes.records()
    current: dict[str, Entry] = {}
    for record in records:
        apply(current, record.entries)
    entries: list[Entry] = []
    for path in sorted(set(current) | set(target)):
        if not _under_any(path, mounts) or path in mounts:
            continue
        wanted = target.get(path)
        if wanted is None:
            entries.append(Entry(path=path))
        elif not wanted.same(current.get(path)):
            entries.append(wanted)
    if entries:
        changes.append(ChangeRecord(seq=(records[-1].seq if records else 0) + 1, kind="revert", at=time.time(),
                                    call_id=to_call, entries=tuple(entries),
                                    before={e.path: current.get(e.path) for e in entries},
                                    note=f"revert of the read-write mounts to just before call {to_call}"))


def revert_live(recorder: ChangeRecorder, sandbox: Sandbox, to_call: str) -> RevertReport:
    """Put every writable place of the run's living ``sandbox`` back as it was just before
    ``to_call`` ran, through its agent (``Changes.Apply``, as the tool user), and record what
    that changed. The caller makes sure no call of the run is running."""
    if recorder.store.call_record(to_call) is None:
        raise UndoError(f"call {to_call!r} has no change record in run {recorder.store.run_id}; "
                        f"{_recorded(recorder.store)}")
    report = RevertReport()

    def put_back(target: dict[str, Entry], current: dict[str, Entry]) -> None:
        ops = _plan(recorder.store, target, current, report)
        batch: list[changes_pb2.ApplyOp] = []
        size = 0
        for op in ops:
            if batch and size + len(op.data) > APPLY_BATCH_BYTES:
                sandbox.agent.apply_changes(batch)
                batch, size = [], 0
            batch.append(op)
            size += len(op.data)
        if batch:
            sandbox.agent.apply_changes(batch)

    try:
        recorder.reverting(sandbox, to_call, put_back)
    except AgentCallError as error:
        raise UndoError(f"the revert of run {recorder.store.run_id} failed part way: {error.message}; "
                        "what it changed is recorded, and a revert can be tried again") from None
    return report


def _plan(changes: RunChanges, target: dict[str, Entry], current: dict[str, Entry],
          report: RevertReport) -> list[changes_pb2.ApplyOp]:
    """The operations that turn ``current`` into ``target`` (both: sandbox path -> entry)."""
    op = changes_pb2.ApplyOp
    ops: list[changes_pb2.ApplyOp] = []
    removed: list[str] = []
    for path in sorted(current):
        entry = target.get(path)
        if (entry is None or entry.type != current[path].type) and not _under_any(path, tuple(removed)):
            ops.append(op(kind=op.REMOVE, path=path))
            removed.append(path)
            report.removed.append(path)
    for path in sorted(target):
        entry, now = target[path], current.get(path)
        gone = now is None or path in removed or _under_any(path, tuple(removed))
        if entry.type == "dir" and gone:
            ops.append(op(kind=op.MAKE_DIR, path=path))
            report.created.append(path)
        elif entry.type == "symlink" and (gone or (now is not None and now.target != entry.target)):
            if not gone:
                ops.append(op(kind=op.REMOVE, path=path))
            ops.append(op(kind=op.SYMLINK, path=path, link_target=entry.target or ""))
            report.created.append(path)
        elif entry.type == "file" and (gone or (now is not None and now.sha256 != entry.sha256)):
            if entry.sha256 is None or not changes.has_blob(entry.sha256):
                report.not_restored.append(f"{path}: its content was not recorded (the tool user could not read it)")
                continue
            data = changes.read_blob(entry.sha256)
            for start in range(0, max(len(data), 1), APPLY_BATCH_BYTES):
                ops.append(op(kind=op.WRITE, path=path, data=data[start:start + APPLY_BATCH_BYTES],
                              mode=entry.mode, append=start > 0))
            (report.created if gone else report.written).append(path)
    for path in sorted(target, reverse=True):  # a directory's bits last: they may forbid writing in it
        entry, now = target[path], current.get(path)
        if entry.type in ("file", "dir") and (now is None or now.mode != entry.mode or path in report.created
                                               or path in report.written or _under_any(path, tuple(removed))):
            ops.append(op(kind=op.CHMOD, path=path, mode=entry.mode))
            if now is not None and now.mode != entry.mode and path not in report.created:
                report.modes.append(path)
    return ops


class _Restore:
    """Puts one mount's host directory back to a recorded state."""

    def __init__(self, changes: RunChanges, place: str, source: Path, report: RevertReport) -> None:
        self.changes = changes
        self.place = place
        self.source = source
        self.report = report

    def host(self, path: str) -> Path:
        return self.source / path[len(self.place):].lstrip("/")

    def run(self, wanted: dict[str, Entry]) -> None:
        if not self.source.is_dir() or self.source.is_symlink():
            self.report.not_restored.append(f"{self.place}: its host directory {self.source} is gone")
            return
        present = self._present()
        for path in sorted(present, reverse=True):  # children before their directory
            entry = wanted.get(path)
            if entry is None or entry.type != present[path]:
                self._remove(path, present[path])
        for path in sorted(wanted):
            self._put(wanted[path])
        for path in sorted(wanted, reverse=True):  # a directory's bits last: they may forbid writing in it
            self._mode(wanted[path])

    def _present(self) -> dict[str, str]:
        """Every entry now below the mount (sandbox path -> type), found without following symlinks."""
        found: dict[str, str] = {}
        for top, dirs, files in os.walk(self.source):
            rel = Path(top).relative_to(self.source)
            base = self.place if str(rel) == "." else f"{self.place}/{rel}"
            for name in dirs + files:
                st = os.lstat(os.path.join(top, name))
                found[f"{base}/{name}"] = _kind(st.st_mode)
        return found

    def _remove(self, path: str, kind: str) -> None:
        host = self.host(path)
        if not os.path.lexists(host):
            return  # went with its directory
        if kind == "dir":
            shutil.rmtree(host)
        else:
            host.unlink()
        self.report.removed.append(path)

    def _put(self, entry: Entry) -> None:
        host = self.host(entry.path)
        if not self._parent_is_real(host):
            self.report.not_restored.append(f"{entry.path}: its parent is not a directory")
            return
        st = os.lstat(host) if os.path.lexists(host) else None
        if entry.type == "dir":
            if st is None:
                host.mkdir(mode=0o700)
                self.report.created.append(entry.path)
        elif entry.type == "symlink":
            if st is None or os.readlink(host) != entry.target:
                if st is not None:
                    host.unlink()
                os.symlink(entry.target or "", host)
                self.report.created.append(entry.path)
        elif entry.type == "file":
            if entry.sha256 is None or not self.changes.has_blob(entry.sha256):
                self.report.not_restored.append(f"{entry.path}: its content was not recorded "
                                                "(the tool user could not read it)")
                return
            if st is None or _sha256(host) != entry.sha256:
                self._write(host, self.changes.blob_path(entry.sha256))
                (self.report.written if st is not None else self.report.created).append(entry.path)
        else:
            self.report.not_restored.append(f"{entry.path}: a {entry.type} is not recreated")

    def _write(self, host: Path, blob: Path) -> None:
        staging = host.parent / f".callbox-revert-{uuid.uuid4().hex}"
        try:
            with blob.open("rb") as src, open(staging, "xb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(staging, host)
        finally:
            staging.unlink(missing_ok=True)

    def _mode(self, entry: Entry) -> None:
        host = self.host(entry.path)
        if entry.type not in ("file", "dir") or not os.path.lexists(host) or host.is_symlink():
            return
        if stat.S_IMODE(os.lstat(host).st_mode) != entry.mode:
            os.chmod(host, entry.mode)
            if entry.path not in self.report.created and entry.path not in self.report.written:
                self.report.modes.append(entry.path)

    def _parent_is_real(self, host: Path) -> bool:
        if not host.is_relative_to(self.source) or host == self.source:
            return False
        parent = host.parent
        while parent != self.source:
            if parent.is_symlink() or not parent.is_dir():
                return False
            parent = parent.parent
        return True


def _kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _under(path: str, place: str) -> bool:
    return path == place or path.startswith(place.rstrip("/") + "/")


def _under_any(path: str, places: tuple[str, ...]) -> bool:
    return any(_under(path, p) for p in places)


# --- per call, for a page --------------------------------------------------------------------------


@dataclass(frozen=True)
class CallChanges:
    """What one recorded call changed, as :func:`diff` shows it: its summary and its lines."""

    call_id: str
    tool: str | None
    summary: str
    """``1 created, 2 changed, 0 removed`` (or ``no changes``)."""
    entries: int
    """How many paths it changed."""
    lines: tuple[str, ...] | None
    """The unified diff of its text files and the summary lines of everything else (None:
    not worked out, the call being older than the ones asked for)."""


def call_changes(changes: RunChanges, *, diffs: int | None = None) -> list[CallChanges]:
    """Each recorded call's changes, in the order the calls ran (what :func:`diff` prints, one
    item per call, for a caller that lays them out itself); with ``diffs``, only the latest
    ``diffs`` calls get their lines (a diff reads every changed file's content)."""
    records = [record for record in changes.records() if record.kind == "call"]
    first_diffed = 0 if diffs is None else max(0, len(records) - diffs)
    return [CallChanges(call_id=str(record.call_id), tool=record.tool, summary=_summary(record),
                        entries=len(record.entries),
                        lines=None if n < first_diffed else tuple(
                            line for entry in record.entries
                            for line in _entry_diff(changes, record.before.get(entry.path), entry)))
            for n, record in enumerate(records)]
