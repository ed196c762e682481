"""Where a run's change records live: what each tool call changed in the sandbox's writable places.

One directory per run, beside the audit database (``<audit dir>/changes/<run id>/``), so the
records outlive the process that wrote them (a server restart) and go with the run's other
data::

    records.jsonl      one record a line, in the order they were taken
    blobs/ab/abcd...   file contents by SHA-256, each stored once

A record is a :class:`ChangeRecord`: the ``baseline`` (every entry of the places, taken once
before the run's first call that may change files), then one ``call`` record per such call
(the entries it changed, with what they were before), a ``stopped`` record when the run's
size cap was reached, and ``revert`` records for what a revert of the living sandbox changed.
An entry is a :class:`Entry`: a file with its mode and content hash, a directory, a symlink
with its target, or the removal of a path. The state of the places at any
point is the baseline with every later record applied in order (:meth:`RunChanges.state_before`).

Storage grows with what changed: a blob is written once, whatever number of records name it.
The baseline is the exception: it holds every file of the places once, since the content a
shell command changes in place cannot be recovered afterwards. Lines are appended and a blob is
written under a temporary name and renamed, so a process killed half-way leaves at most a
partial last line, which reading skips.

They go with the run: :func:`sweep` removes the records of runs that ended longer ago than
the policy keeps them; records of a run the audit store does not know, or of one still open,
are left alone.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

RECORDS = "records.jsonl"
BLOBS = "blobs"

EntryType = Literal["file", "dir", "symlink", "other"]
RecordKind = Literal["baseline", "call", "stopped", "revert"]


@dataclass(frozen=True)
class Entry:
    """One path of a writable place as a scan found it (or its removal)."""

    path: str
    type: EntryType | None = None
    """None: the path was removed."""
    mode: int = 0
    size: int = 0
    sha256: str | None = None
    """A file's content (None: removed, not a file, or not readable by the tool user)."""
    target: str | None = None
    """A symlink's target, as stored."""

    @property
    def removed(self) -> bool:
        return self.type is None

    def same(self, other: Entry | None) -> bool:
        """Whether ``other`` is the same thing at the same path (type, bits, content, target)."""
        return other is not None and (self.type, self.mode, self.sha256, self.target) == (
            other.type, other.mode, other.sha256, other.target)

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if (v is not None and v != 0) or k == "path"}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Entry:
        return cls(path=str(data["path"]), type=data.get("type"), mode=int(data.get("mode", 0)),
                   size=int(data.get("size", 0)), sha256=data.get("sha256"), target=data.get("target"))


@dataclass(frozen=True)
class ChangeRecord:
    """What one scan found changed, in order."""

    seq: int
    kind: RecordKind
    at: float
    call_id: str | None = None
    tool: str | None = None
    entries: tuple[Entry, ...] = ()
    before: dict[str, Entry | None] = field(default_factory=dict)
    """For a call: each changed path as it was before the call (None: it did not exist)."""
    places: tuple[str, ...] = ()
    """For the baseline: the writable places, in the sandbox."""
    mounts: dict[str, str] = field(default_factory=dict)
    """For the baseline: each read-write mount's place in the sandbox -> its host directory."""
    seconds: float = 0.0
    bytes: int = 0
    """Bytes of content this record added to the store."""
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"seq": self.seq, "kind": self.kind, "at": self.at, "call_id": self.call_id,
                                "tool": self.tool, "entries": [e.to_json() for e in self.entries],
                                "seconds": round(self.seconds, 6), "bytes": self.bytes}
        if self.before:
            data["before"] = {p: None if e is None else e.to_json() for p, e in self.before.items()}
        if self.places:
            data["places"] = list(self.places)
            data["mounts"] = self.mounts
        if self.note:
            data["note"] = self.note
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChangeRecord:
        before = {p: None if e is None else Entry.from_json(e) for p, e in (data.get("before") or {}).items()}
        return cls(seq=int(data["seq"]), kind=data["kind"], at=float(data["at"]), call_id=data.get("call_id"),
                   tool=data.get("tool"), entries=tuple(Entry.from_json(e) for e in data.get("entries", ())),
                   before=before, places=tuple(data.get("places", ())), mounts=dict(data.get("mounts", {})),
                   seconds=float(data.get("seconds", 0.0)), bytes=int(data.get("bytes", 0)),
                   note=str(data.get("note", "")))


def sweep(root: Path, ended_at: Callable[[str], float | None], keep_s: float, now: float) -> list[str]:
    """Remove the records of every run that ended more than ``keep_s`` before ``now``
    (``ended_at(run_id)``: when the run ended, None when it is open or unknown); the run ids removed."""
    removed: list[str] = []
    try:
        names = sorted(os.listdir(root))
    except FileNotFoundError:
        return removed
    for name in names:
        if name.startswith(".") or not (root / name / RECORDS).exists():
            continue
        ended = ended_at(name)
        if ended is not None and ended + keep_s < now:
            RunChanges(root, name).remove()
            removed.append(name)
    return removed


def changes_root(audit_path: Path) -> Path:
    """The directory holding every run's change records, beside the audit database at ``audit_path``."""
    return audit_path.parent / "changes"


class RunChanges:
    """The change records and content store of one run."""

    def __init__(self, root: Path, run_id: str) -> None:
        if not run_id or "/" in run_id or run_id.startswith("."):
            raise ValueError(f"not a run id: {run_id!r}")
        self.run_id = run_id
        self.directory = root / run_id
        self._blobs = self.directory / BLOBS

    @property
    def exists(self) -> bool:
        return (self.directory / RECORDS).exists()

    # --- content --------------------------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return self._blobs / digest[:2] / digest

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).exists()

    def blob_writer(self) -> BlobWriter:
        """A writer of one content; :meth:`BlobWriter.finish` files it under its hash."""
        self._blobs.mkdir(parents=True, exist_ok=True)
        return BlobWriter(self)

    def put_blob(self, chunks: Iterable[bytes]) -> tuple[str, int, bool]:
        """Store content given in pieces: (its SHA-256, its size, whether it was new here)."""
        writer = self.blob_writer()
        for chunk in chunks:
            writer.write(chunk)
        return writer.finish()

    def read_blob(self, digest: str) -> bytes:
        return self.blob_path(digest).read_bytes()

    def stored_bytes(self) -> int:
        """Bytes of content held for this run."""
        if not self._blobs.exists():
            return 0
        return sum(p.stat().st_size for p in self._blobs.glob("*/*"))

    # --- records --------------------------------------------------------------------------------

    def append(self, record: ChangeRecord) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        with (self.directory / RECORDS).open("a", encoding="utf-8") as out:
            out.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")

    def records_size(self) -> int:
        """Bytes of the records file (0: none yet): tells a reader whether another process appended."""
        try:
            return (self.directory / RECORDS).stat().st_size
        except FileNotFoundError:
            return 0

    def records(self) -> list[ChangeRecord]:
        """Every complete record, in order (a partial last line, from a killed writer, is skipped)."""
        path = self.directory / RECORDS
        if not path.exists():
            return []
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(ChangeRecord.from_json(json.loads(line)))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def baseline(self) -> ChangeRecord | None:
        return next((r for r in self.records() if r.kind == "baseline"), None)

    def call_record(self, call_id: str) -> ChangeRecord | None:
        return next((r for r in self.records() if r.kind == "call" and r.call_id == call_id), None)

    def state_before(self, call_id: str | None = None) -> dict[str, Entry]:
        """The places as recorded just before the call ``call_id`` ran (None: as recorded last)."""
        state: dict[str, Entry] = {}
        for record in self.records():
            if call_id is not None and record.kind == "call" and record.call_id == call_id:
                return state
            apply(state, record.entries)
        if call_id is not None:
            raise KeyError(call_id)
        return state

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


class BlobWriter:
    """One content being written to a run's store, hashed as it goes."""

    def __init__(self, store: RunChanges) -> None:
        self._store = store
        self._staging = store.directory / BLOBS / f".tmp-{uuid.uuid4().hex}"
        self._out = self._staging.open("wb")
        self._digest = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self._digest.update(data)
        self.size += len(data)
        self._out.write(data)

    def finish(self) -> tuple[str, int, bool]:
        """(the content's SHA-256, its size, whether it was new in the store)."""
        self._out.close()
        digest = self._digest.hexdigest()
        final = self._store.blob_path(digest)
        try:
            if final.exists():
                return digest, self.size, False
            final.parent.mkdir(exist_ok=True)
            os.replace(self._staging, final)
            return digest, self.size, True
        finally:
            self._staging.unlink(missing_ok=True)

    def abandon(self) -> None:
        self._out.close()
        self._staging.unlink(missing_ok=True)


def apply(state: dict[str, Entry], entries: Iterable[Entry]) -> None:
    """Apply a record's entries to ``state`` (path -> entry), in place."""
    for entry in entries:
        if entry.removed:
            state.pop(entry.path, None)
        else:
            state[entry.path] = entry


def now() -> float:
    return time.time()


def chunked(data: bytes, size: int = 1 << 20) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start:start + size]
