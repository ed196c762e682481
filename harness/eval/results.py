"""The eval's out directory, and what makes ``--resume`` run nothing twice.

::

    OUT/eval.json        what the eval runs: the task file and the model (or transcripts)
    OUT/results.jsonl    one TrialResult per finished trial, appended (and flushed to disk) as
                         each one finishes
    OUT/audit.db         the audit store of its runs (unless --audit-db names another)
    OUT/report.json      the results and totals, OUT/report.html the report (rewritten at the end)

A trial is done once its line is in ``results.jsonl``; a trial stopped by Ctrl-C has no line
(its run ends ``error:interrupted`` in the audit store) and runs again on ``--resume``, in a
new run. A last line cut short (the process killed while writing it) is removed on resume and
its trial runs again; a broken line before the last is an error naming it. ``--resume`` refuses
an out directory whose eval used another model or transcripts, and an eval without
``--resume`` refuses one that already holds results, so results of two models never mix.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.core.errors import UsageError
from harness.eval.scoring import TrialResult

__all__ = ["ResultsLog"]

META = "eval.json"
RESULTS = "results.jsonl"


class ResultsLog:
    """The out directory of one eval: its identity, and its finished trials."""

    def __init__(self, out: Path, identity: dict[str, Any], *, resume: bool) -> None:
        """Open ``out`` for the eval ``identity`` (the model or transcripts it uses, its task
        file): a new out directory, or with ``resume`` one of the same eval."""
        self.out = out
        self.path = out / RESULTS
        self._lock = threading.Lock()
        meta = out / META
        if resume:
            if not meta.is_file():
                raise UsageError(f"--resume: {out} holds no eval to continue (no {META}); run the eval without "
                                 "--resume first")
            earlier = self._read_meta(meta)
            for key in ("model", "transcripts"):
                if earlier.get(key) != identity.get(key):
                    raise UsageError(f"--resume: the eval in {out} used {key} {earlier.get(key)!r}, not "
                                     f"{identity.get(key)!r}; resume with the same one, or give another --out")
        elif self.path.is_file() and self.path.stat().st_size > 0:
            raise UsageError(f"{out} already holds the results of an eval: continue it with --resume, or give "
                             "another --out")
        try:
            out.mkdir(parents=True, exist_ok=True)
            meta.write_text(json.dumps(identity, indent=2, default=str) + "\n")
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
        self.results: list[TrialResult] = self._read() if resume else []
        """The finished trials (those read back on resume first, then each as it is added)."""

    @staticmethod
    def _read_meta(meta: Path) -> dict[str, Any]:
        try:
            data = json.loads(meta.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"--resume: cannot read {meta}: {exc}") from None
        if not isinstance(data, dict):
            raise UsageError(f"--resume: {meta} is not an eval's {META}")
        return data

    def _read(self) -> list[TrialResult]:
        if not self.path.is_file():
            return []
        lines = self.path.read_text(encoding="utf-8", errors="replace").splitlines()
        found: list[TrialResult] = []
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                found.append(TrialResult.model_validate_json(line))
            except ValidationError:
                if number == len(lines):  # cut short by a kill while it was written: that trial runs again
                    self.path.write_text("".join(r.model_dump_json() + "\n" for r in found), encoding="utf-8")
                    break
                raise UsageError(f"--resume: {self.path} line {number} is not a trial's result; remove the line "
                                 "(its trial then runs again) or give another --out") from None
        return found

    def done(self) -> set[tuple[str, int]]:
        """The (task, trial) pairs finished: they never run again."""
        with self._lock:
            return {(r.task, r.trial) for r in self.results}

    def add(self, result: TrialResult) -> None:
        """Keep ``result``: appended as one line and flushed to disk before this returns."""
        line = result.model_dump_json() + "\n"
        with self._lock:
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
            self.results.append(result)
