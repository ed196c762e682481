"""``make bench`` section ``archive``: a snapshot that travels, as ``callbox sandbox
export-snapshot`` and ``import-snapshot`` move it, on a snapshot of a sandbox whose workspace
holds 100 MiB (100 files of random bytes), taken once.

Rows:

28a. export: the stored snapshot → one archive file with its SHA-256 manifest, fsynced and
     renamed into place, vs ``tar -cf`` of the same snapshot directory then ``sync`` of the file;
28b. import: the archive → a stored snapshot, every member hashed and checked, each file
     fsynced, then renamed into place, vs ``tar -xf`` of the same archive (it is a plain tar)
     then ``sync`` of its files (no checks). The imported copy is removed untimed between samples.

Throughput in MB/s of the snapshot's bytes (its files as stored).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.engine.docker.snapshot_archive import export_to_file, import_from_file
from harness.engine.docker.snapshots import SnapshotStore
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_e2b import ms_since
from tests.bench.bench_living import Resources, Toolkit, heavy_samples

WORKSPACE_MIB = 100
FILL = (f"mkdir -p /workspace/d && for i in $(seq {WORKSPACE_MIB}); do "
        "head -c 1048576 /dev/urandom > /workspace/d/f$i; done")
SNAPSHOT = "bench-archive"


def _tree_bytes(directory: Path) -> int:
    return sum(path.stat().st_size for path in directory.rglob("*") if path.is_file())


def bench_snapshot_archive(res: Resources, spec: SandboxSpec, samples: int, kit: Toolkit) -> dict[str, list[float]]:
    """Rows 28a-28b; the sandbox and every file made here are gone when it returns."""
    work = Path(tempfile.mkdtemp(prefix="cbx-barchive-"))
    try:
        return _measure(res, spec, samples, kit, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _measure(res: Resources, spec: SandboxSpec, samples: int, kit: Toolkit, work: Path) -> dict[str, list[float]]:
    box = res.create_sandbox(spec.model_copy(update={"memory": 1 << 30, "workspace_size": 256 << 20}))
    try:
        kit.progress(f"archive: a {WORKSPACE_MIB} MiB workspace, snapshotted once")
        filled = collect(box.agent.exec(["sh", "-c", FILL], timeout_ms=120_000))
        if filled.exit_code != 0:
            raise RuntimeError(f"filling the workspace: {filled.to_json()}")
        info = SnapshotStore(work / "from").write(SNAPSHOT, spec=box.spec, download=box.transfer.download,
                                                  source_sandbox_id=box.id)
    finally:
        res.destroy_sandbox(box)
    target = SnapshotStore(work / "to")
    archive, tar_archive, extracted = work / "snap.tar", work / "plain.tar", work / "extracted"
    size = _tree_bytes(info.directory)
    def export() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        export_to_file(info, archive)
        return {"archive_export": ms_since(t0)}

    def tar_create() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        subprocess.run(["tar", "-cf", str(tar_archive), "-C", str(info.directory), "."], check=True)
        subprocess.run(["sync", str(tar_archive)], check=True)
        return {"archive_export_tar": ms_since(t0)}

    def import_() -> dict[str, float]:
        t0 = time.perf_counter_ns()
        import_from_file(target, archive, name="imported", replace=True)
        elapsed = ms_since(t0)
        target.remove("imported")
        return {"archive_import": elapsed}

    def tar_extract() -> dict[str, float]:
        extracted.mkdir()
        t0 = time.perf_counter_ns()
        subprocess.run(["tar", "-xf", str(archive), "-C", str(extracted)], check=True)
        files = [str(p) for p in extracted.rglob("*") if p.is_file()]
        subprocess.run(["sync", *files], check=True)
        elapsed = ms_since(t0)
        shutil.rmtree(extracted)
        return {"archive_import_tar": elapsed}

    count = heavy_samples(samples)
    data = kit.interleaved("archive export", [export, tar_create], count, 1, every=count)
    data.update(kit.interleaved("archive import", [import_, tar_extract], count, 1, every=count))
    data["archive_bytes"] = [float(size)]
    return data


def add_snapshot_archive_rows(data: dict[str, list[float]], add: Callable[..., Any]) -> None:
    """Rows 28a-28b of the report (``add`` takes ``Row``'s arguments)."""
    if "archive_export" not in data:
        return
    size = int(data["archive_bytes"][0])
    what = f"a snapshot of a {WORKSPACE_MIB} MiB workspace ({size / 2**20:.0f} MiB stored)"
    add(f"28a. snapshot export: {what} → one archive with SHA-256 of every member, fsynced", "rate",
        data["archive_export"], "`tar -cf` of the same snapshot directory + `sync` of the file",
        data["archive_export_tar"], "— (info)", rate_bytes=size)
    add("28b. snapshot import: the archive → a stored snapshot, every hash checked, fsynced", "rate",
        data["archive_import"], "`tar -xf` of the same archive + `sync` of its files (no checks)",
        data["archive_import_tar"], "— (info)", rate_bytes=size)
