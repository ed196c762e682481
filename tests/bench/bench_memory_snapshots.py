"""``make bench`` section ``memsnap``: memory snapshots under gVisor (as root, with ``make runsc``),
or alone with ``python -m tests.bench.bench_memory_snapshots [--samples N]``.

Rows, for an idle sandbox of 512 MiB and one of 2 GiB (``runtime = "runsc"``, network none,
one python3 REPL job holding a variable):

26a. memory snapshot, the whole ``snapshot(memory=True)`` (the files' archives, the agent closing
     and reopening its socket, ``runsc checkpoint --leave-running``); target ≤ 1 s at 512 MiB;
26b. of which the sandbox stood still (``runsc checkpoint``);
26c. restore: a fork of the snapshot, create → agent ready, its processes resumed; target ≤ 500 ms
     at 512 MiB; against a cold start of the same spec;
26d. the memory image's size on disk;
26e. fork from the memory snapshot to the fork's first command answered (``true``);
26f. pause to disk (``pause(to_disk=True)``: the agent closing its socket, ``runsc checkpoint``,
     the container stopped);
26g. resume from disk (the same container started with ``runsc restore`` → agent ready), and
     26h. to its first command answered.

Skipped, with the reason, when the engine has no runsc runtime or this is not root. Everything
started is removed in ``finally``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_results import p50
from tests.conftest import IMAGE

TARGET_SNAPSHOT_MS = 1000.0
TARGET_RESTORE_MS = 500.0
SIZES = (("512 MiB", 512 << 20, "512m"), ("2 GiB", 2 << 30, "2g"))
DRAIN_S = 60.0
SKIPPED: dict[str, str] = {}


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _answers(box: Sandbox) -> None:
    """Run ``true`` in ``box`` (it must answer)."""
    result = collect(box.agent.exec(["true"], timeout_ms=30_000))
    assert result.exit_code == 0, result.stderr.data()


def skip_reason(engine: DockerEngine) -> str | None:
    if "runsc" not in (engine.client.info().get("Runtimes") or {}):
        return "the Docker engine has no runsc runtime (run `make runsc`)"
    if os.geteuid() != 0:
        return "memory snapshots run `runsc checkpoint`, which needs root"
    return None


def measure(engine: DockerEngine, samples: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    """Every figure, raw: ``memsnap_<figure>_<size>`` in ms (bytes for the image)."""
    SKIPPED.clear()
    if (why := skip_reason(engine)) is not None:
        SKIPPED["memsnap"] = why
        progress(f"memsnap: skipped: {why}")
        return {}
    root = Path(tempfile.mkdtemp(prefix="cbx-bench-memsnap-", dir="/tmp"))
    store = Path(tempfile.mkdtemp(prefix="cbx-bench-memsnap-store-"))
    eng = DockerEngine(engine.client, run_root=root, reap_on_start=False, snapshot_dir=store)
    data: dict[str, list[float]] = {}
    try:
        for label, memory, key in SIZES:
            n = samples if key == "512m" else max(3, samples // 2)
            progress(f"memsnap: {label}: {n} memory snapshots and restores")
            spec = SandboxSpec(image=IMAGE, runtime="runsc", memory=memory)
            box = eng.create(spec)
            try:
                repl = box.agent.jobs.start(["python3", "-u", "-i", "-q"], tag="repl", stdin=True).pid
                box.agent.jobs.write(repl, b"kept = list(range(1000))\n")
                for i in range(n):
                    start = time.perf_counter()
                    info = eng.snapshot(box, f"bench-{key}-{i}", memory=True)
                    data.setdefault(f"memsnap_snapshot_{key}", []).append(_ms(start))
                    assert info.memory is not None
                    data.setdefault(f"memsnap_frozen_{key}", []).append(info.memory.frozen_seconds * 1000)
                    data.setdefault(f"memsnap_image_{key}", []).append(float(info.memory.bytes))
                    start = time.perf_counter()
                    fork = eng.fork(info.name, from_snapshot=True)
                    data.setdefault(f"memsnap_restore_{key}", []).append(_ms(start))
                    _answers(fork)
                    data.setdefault(f"memsnap_fork_answers_{key}", []).append(_ms(start))
                    fork.destroy()
                    start = time.perf_counter()
                    box.pause(to_disk=True)
                    data.setdefault(f"memsnap_pause_disk_{key}", []).append(_ms(start))
                    start = time.perf_counter()
                    box.resume()
                    data.setdefault(f"memsnap_resume_disk_{key}", []).append(_ms(start))
                    _answers(box)
                    data.setdefault(f"memsnap_resume_answers_{key}", []).append(_ms(start))
                    start = time.perf_counter()
                    cold = eng.create(spec)
                    data.setdefault(f"memsnap_cold_{key}", []).append(_ms(start))
                    cold.destroy()
                    eng.remove_snapshot(info.name)
                    eng.drain(DRAIN_S)  # untimed: no removal runs while the next sample is timed
            finally:
                box.destroy()
                eng.drain(DRAIN_S)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return data


def add_memsnap_rows(data: dict[str, list[float]], add: Callable[..., Any]) -> None:
    """Rows 26a-26h (``add`` takes ``Row``'s arguments)."""
    for label, _, key in SIZES:
        if f"memsnap_snapshot_{key}" not in data:
            continue
        first = key == "512m"
        add(f"26a. memory snapshot of an idle {label} gVisor sandbox (files + memory image)", "time",
            data[f"memsnap_snapshot_{key}"], "—", None,
            f"≤ {TARGET_SNAPSHOT_MS:g} ms" if first else "— (info)",
            (lambda r: r.cb(p50) <= TARGET_SNAPSHOT_MS) if first else None)
        add(f"26b. of which the sandbox stood still (runsc checkpoint), {label}", "time",
            data[f"memsnap_frozen_{key}"], "—", None, "— (info)")
        add(f"26c. restore from it (fork: create → agent ready, processes resumed), {label}", "time",
            data[f"memsnap_restore_{key}"], "cold start, same spec", data[f"memsnap_cold_{key}"],
            f"≤ {TARGET_RESTORE_MS:g} ms" if first else "— (info)",
            (lambda r: r.cb(p50) <= TARGET_RESTORE_MS) if first else None)
        add(f"26d. memory image on disk, {label}", "mem", data[f"memsnap_image_{key}"], "—", None, "— (info)")
        add(f"26e. fork from a memory snapshot to its first command answered, {label}", "time",
            data[f"memsnap_fork_answers_{key}"], "cold start, same spec", data[f"memsnap_cold_{key}"], "— (info)")
        add(f"26f. pause to disk (runsc checkpoint, container stopped), {label}", "time",
            data[f"memsnap_pause_disk_{key}"], "—", None, "— (info)")
        add(f"26g. resume from disk (runsc restore → agent ready), {label}", "time",
            data[f"memsnap_resume_disk_{key}"], "—", None, "— (info)")
        add(f"26h. resume from disk to its first command answered, {label}", "time",
            data[f"memsnap_resume_answers_{key}"], "—", None, "— (info)")


def bench_memsnap(engine: DockerEngine, samples: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    return measure(engine, max(3, samples // 3), progress)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=5)
    args = parser.parse_args(argv)
    engine = DockerEngine.connect(reap_on_start=False)
    data = measure(engine, args.samples, lambda text: print(text, file=sys.stderr))
    summary = {key: {"n": len(values), "p50": round(p50(values), 1)} for key, values in data.items()}
    print(json.dumps({"figures": summary, "left_out": SKIPPED}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
