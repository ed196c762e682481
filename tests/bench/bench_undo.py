"""``make bench`` section ``undo``: per-call change records (``[checkpoints] mode = "changes"``) on a
project of 10,000 files and 200 MB (100 directories of 100 files of 20,000 bytes) in a read-write mount.

Rows:

27a.-27c. what recording a call adds (``ChangeRecorder.after``: the agent's scan of the writable places,
     the content of the changed files into the run's store, the record appended) when the call changed
     0, 10 and 1,000 files, vs the call itself without records (an exec of the shell command that
     changes them, in the same sandbox); target p50 ≤ 30 ms at 10 files;
27d. the baseline, once per run (every file of the places read and stored), with its bytes in the note;
27e. storage added per call, 10 files changed (bytes; a changed file is stored whole, once per content);
27f. ``revert`` of the mount, through its host directory, to before the run's last call, which changed
     10 files (every file of the mount compared by hash, the 10 written back).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.audit.change_store import RunChanges
from harness.core import undo
from harness.core.change_recorder import ChangeRecorder, CheckpointSettings
from harness.engine.exec_result import collect
from harness.engine.spec import Mount, SandboxSpec
from tests.bench.bench_e2b import ms_since
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_results import p50

TARGET_RECORD_P50_MS = 30.0
DIRS, FILES, FILE_BYTES = 100, 100, 20_000
PROJECT = "/project"


def _project(root: Path) -> None:
    block = os.urandom(FILE_BYTES // 2).hex().encode()
    for d in range(DIRS):
        (root / f"d{d}").mkdir(parents=True)
        for f in range(FILES):
            (root / f"d{d}" / f"f{f}.txt").write_bytes(block[:FILE_BYTES - 8] + f"{d:04d}{f:04d}".encode())
    if os.geteuid() == 0:
        for top, dirs, files in os.walk(root):
            for name in [top, *(os.path.join(top, n) for n in dirs + files)]:
                os.chown(name, 1000, 1000)


def _command(changed: int, sample: int) -> list[str]:
    """A shell command appending to ``changed`` files spread over the directories."""
    paths = [f"d{i % DIRS}/f{(i // DIRS + sample) % FILES}.txt" for i in range(changed)]
    script = f"cd {PROJECT} && for f in {' '.join(paths)}; do printf x >> $f; done" if paths else "true"
    return ["sh", "-c", script]


def bench_undo(res: Resources, spec: SandboxSpec, samples: int, warmup: int, kit: Toolkit) -> dict[str, list[float]]:
    """Rows 27a-27f; the sandbox started here is gone when it returns."""
    kit.progress("undo: a project of 10,000 files, 200 MB, in a read-write mount")
    source = res.mount_root / "undo-project"
    _project(source)
    store_root = Path(tempfile.mkdtemp(prefix="callbox-bench-undo-"))
    box = res.create_sandbox(spec.model_copy(update={"mounts": (Mount(source=source, target=PROJECT,
                                                                     read_only=False),)}))
    out: dict[str, list[float]] = {}
    try:
        changes = RunChanges(store_root, "bench-undo")
        recorder = ChangeRecorder(CheckpointSettings(mode="changes", max_bytes=8 << 30), changes, box.spec)
        t0 = time.perf_counter_ns()
        if recorder.before(box) is not None:
            raise RuntimeError("the baseline failed")
        out["undo_baseline"] = [ms_since(t0)]
        out["undo_baseline_bytes"] = [float(changes.stored_bytes())]

        def one(changed: int, sample: int, call_id: str) -> tuple[float, float]:
            t0 = time.perf_counter_ns()
            result = collect(box.agent.exec(_command(changed, sample)))
            exec_ms = ms_since(t0)
            if result.exit_code != 0:
                raise RuntimeError(f"the command changing {changed} files exited {result.exit_code}")
            t0 = time.perf_counter_ns()
            counts = recorder.after(box, call_id, "shell")
            record_ms = ms_since(t0)
            if counts.get("changed") != changed:
                raise RuntimeError(f"{changed} files changed, the record says {counts}")
            return exec_ms, record_ms

        for changed, n in ((0, samples), (10, samples), (1000, max(3, samples // 10))):
            kit.progress(f"undo: records of calls changing {changed} files ({n} samples)")
            for i in range(warmup):
                one(changed, i, f"warm-{changed}-{i}")
            execs, records = [], []
            for i in range(n):
                exec_ms, record_ms = one(changed, warmup + i, f"c{changed}-{i}")
                execs.append(exec_ms)
                records.append(record_ms)
            out[f"undo_exec_{changed}"] = execs
            out[f"undo_record_{changed}"] = records
        tens = [r for r in changes.records() if r.call_id and r.call_id.startswith("c10-")]
        out["undo_bytes_10"] = [float(r.bytes) for r in tens]
        kit.progress("undo: revert of the mount to before a call that changed 10 files")
        one(10, warmup + samples + 1, "revert-me")  # the last call: a revert to before it undoes its 10 files
        t0 = time.perf_counter_ns()
        report = undo.revert(changes, "revert-me")
        out["undo_revert_10"] = [ms_since(t0)]
        if len(report.written) != 10 or report.not_restored:
            raise RuntimeError(f"the revert put back {len(report.written)} files, not 10: {report.not_restored}")
    finally:
        res.destroy_sandbox(box)
        shutil.rmtree(store_root, ignore_errors=True)
        shutil.rmtree(source, ignore_errors=True)
    return out


def add_undo_rows(data: dict[str, list[float]], add: Callable[..., Any]) -> None:
    """Rows 27a-27f of the report (``add`` takes ``Row``'s arguments)."""
    if "undo_record_10" not in data:
        return
    for letter, changed in (("a", 0), ("b", 10), ("c", 1000)):
        target, check = "— (info)", None
        if changed == 10:
            target = f"p50 ≤ {TARGET_RECORD_P50_MS:g} ms"
            check = lambda r: r.cb(p50) <= TARGET_RECORD_P50_MS  # noqa: E731
        add(f"27{letter}. undo: a call's change record, {changed:,} of 10,000 files (200 MB) changed", "time",
            data[f"undo_record_{changed}"], "the call itself (exec of the command), no record",
            data[f"undo_exec_{changed}"], target, check)
    baseline_mb = data["undo_baseline_bytes"][0] / 1e6
    add("27d. undo: the run's baseline, once (every file of the writable places stored)", "time",
        data["undo_baseline"], "—", None, f"— (info; {baseline_mb:.0f} MB stored)")
    add("27e. undo: storage added per call, 10 files changed", "mem", data["undo_bytes_10"], "—", None,
        "— (info; proportional to the changed files' sizes)")
    add("27f. undo: revert of the mount to before a call that changed 10 files", "time", data["undo_revert_10"],
        "—", None, "— (info)")
