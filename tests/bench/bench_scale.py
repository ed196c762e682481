"""``make bench`` sections ``create`` and ``scale``: many cold creates at once, destroy latency,
and N live sandboxes on one machine.

Section ``create`` (rows 16 and 17), the modes of ComputeSDK's benchmarks, cold (there is no
warm pool in these rows): every figure is one sandbox's create → first ``true`` result
(ComputeSDK's "time to interactive"; ``engine.create`` returns once the agent answers, the
``true`` adds a few ms), and "sandboxes/s" is how many were ready per second of wall time:

16a. sequential, 1 creator: each sandbox is created, runs ``true`` and is destroyed before the
     next starts (ComputeSDK "sequential": cold start with no contention). Its destroys are
     timed: row 17;
16b/16c. 4 and 16 concurrent creators, closed loop: each creator starts its next create when
     its last one has answered, and the sandboxes stay live until the level ends, so the
     engine works on up to 4 (16) creates at once;
16d. staggered: one launch every 200 ms, each in its own thread, whether the ones before have
     answered or not (ComputeSDK "staggered": the load ramps up as slow creates pile up);
16e. burst: 50 creates released at the same instant (ComputeSDK "burst": a sudden spike),
     p50 and p95 over the 50;
17.  destroy latency to the caller: ``Sandbox.destroy()`` returning, for the sandboxes of
     16a (one at a time, nothing else running). The target (≤ 5 ms) is the issue's: removal
     in the background.

Section ``scale`` (row 19, ``--sandboxes N``, default 100; ``make bench-scale``): N idle
sandboxes of 128 MiB created by 8 creators and all kept live; then the host memory of each
(its memory cgroup's usage plus its containerd-shim's PSS, as row 4b measures it: docker-init
and the agent are inside the cgroup, the shim is not), then every one answers ``true`` while
all are live (16 at once), then all are destroyed (8 at once).

These rows have no baseline (no docker-py figure does the same job); they are information,
except the targets the issue sets (destroy ≤ 5 ms, 19b ≤ 20 MiB per sandbox, 19c every answer
within 1 s). Everything started here is destroyed before the function returns, or by the
run's cleanup (the sandboxes are in ``res.sandboxes`` from the moment ``create`` returns).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil
from docker.models.containers import Container

from harness.engine.docker.engine import Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_results import MIB, p50, p95

CREATOR_LEVELS = (4, 16)
STAGGER_S = 0.2
BURST = 50
SCALE_CREATORS = 8
SCALE_ANSWERERS = 16
SCALE_MEMORY = 128 * MIB
CLEANUP_THREADS = 8
TARGET_DESTROY_P50_MS = 5.0
TARGET_SCALE_MEMORY_MIB = 20.0
TARGET_SCALE_ANSWER_MS = 1000.0

MemoryReading = Callable[[Container, str], dict[str, float]]
"""(container, the main process's command-line hint) -> its readings (bench_exec.memory_reading)."""


def ms_since(start_ns: int) -> float:
    return (time.perf_counter_ns() - start_ns) / 1e6


def first_result(box: Sandbox) -> None:
    result = collect(box.agent.exec(["true"]))
    if result.exit_code != 0 or result.signal or result.timed_out:
        raise RuntimeError(f"sandbox {box.id}: first `true` gave {result.to_json()}")


def destroy_all(res: Resources, boxes: list[Sandbox], threads: int = CLEANUP_THREADS) -> list[float]:
    """Destroy ``boxes``, ``threads`` at a time; each destroy's time (ms)."""
    def one(box: Sandbox) -> float:
        t0 = time.perf_counter_ns()
        res.destroy_sandbox(box)
        return ms_since(t0)

    with ThreadPoolExecutor(max_workers=max(1, min(threads, len(boxes)))) as pool:
        return list(pool.map(one, boxes))


class _Timed:
    """Create → first result of sandboxes made on several threads; the live ones kept for the end."""

    def __init__(self, res: Resources, spec: SandboxSpec) -> None:
        self.res, self.spec = res, spec
        self.lock = threading.Lock()
        self.tti: list[float] = []
        self.created: list[float] = []
        self.boxes: list[Sandbox] = []
        self.errors: list[BaseException] = []

    def one(self) -> None:
        try:
            t0 = time.perf_counter_ns()
            box = self.res.create_sandbox(self.spec)
            created = ms_since(t0)
            with self.lock:
                self.boxes.append(box)
            first_result(box)
            tti = ms_since(t0)
            with self.lock:
                self.tti.append(tti)
                self.created.append(created)
        except BaseException as exc:  # reported by check(): a thread must not die silently
            with self.lock:
                self.errors.append(exc)

    def check(self, what: str) -> None:
        if self.errors:
            raise RuntimeError(f"{what}: {len(self.errors)} creates failed, the first: {self.errors[0]!r}") \
                from self.errors[0]


def run_threads(targets: list[Callable[[], None]], *, stagger_s: float = 0.0,
                barrier: bool = False) -> float:
    """Start one thread per target (all released together with ``barrier``, else ``stagger_s`` apart);
    the wall time (s) from the first start to the last end."""
    gate = threading.Barrier(len(targets) + 1) if barrier else None

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            if gate is not None:
                gate.wait()
            target()
        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    t0 = time.perf_counter()
    for i, thread in enumerate(threads):
        if stagger_s and i:
            time.sleep(stagger_s)
        thread.start()
    if gate is not None:
        t0 = time.perf_counter()
        gate.wait()
    for thread in threads:
        thread.join()
    return time.perf_counter() - t0


def bench_create(res: Resources, spec: SandboxSpec, samples: int, kit: Toolkit, *,
                 quick: bool = False) -> dict[str, list[float]]:
    """Rows 16a-16e and 17."""
    data: dict[str, list[float]] = {}
    # 16a: sequential, with the destroy of each timed (row 17).
    kit.progress(f"create: sequential, {samples} sandboxes one at a time (destroy timed)")
    tti: list[float] = []
    destroy: list[float] = []
    t_all = time.perf_counter()
    for i in range(samples + 1):  # the first is a warm-up, not counted
        t0 = time.perf_counter_ns()
        box = res.create_sandbox(spec)
        first_result(box)
        elapsed = ms_since(t0)
        t0 = time.perf_counter_ns()
        res.destroy_sandbox(box)
        gone = ms_since(t0)
        if i == 0:
            t_all = time.perf_counter()
            continue
        tti.append(elapsed)
        destroy.append(gone)
    data["create_seq_tti"] = tti
    data["create_seq_wall_s"] = [time.perf_counter() - t_all]
    data["destroy_caller"] = destroy
    kit.progress(f"create: sequential p50 {p50(tti):.0f} ms, destroy p50 {p50(destroy):.1f} ms")
    # 16b/16c: closed loop with 4 and 16 creators; the sandboxes stay live until the level ends.
    for creators in CREATOR_LEVELS:
        total = max(samples // 2, 2 * creators) if not quick else creators  # 15 and 32 by default
        timed = _Timed(res, spec)
        counter = iter(range(total))
        counter_lock = threading.Lock()

        def creator(timed: _Timed = timed, counter: Any = counter, lock: threading.Lock = counter_lock) -> None:
            while True:
                with lock:
                    if next(counter, None) is None:
                        return
                timed.one()
                if timed.errors:
                    return

        kit.progress(f"create: {creators} concurrent creators, {total} sandboxes")
        try:
            wall = run_threads([creator] * creators, barrier=True)
            timed.check(f"{creators} creators")
        finally:
            destroy_all(res, timed.boxes)
        data[f"create_c{creators}_tti"] = timed.tti
        data[f"create_c{creators}_wall_s"] = [wall]
        kit.progress(f"create: {creators} creators: p50 {p50(timed.tti):.0f} ms, {total / wall:.1f} sandboxes/s")
    # 16d: staggered launches, 16e: a burst.
    for key, count, stagger, barrier in (("stagger", max(5, samples * 2 // 3), STAGGER_S, False),
                                         ("burst", 10 if quick else BURST, 0.0, True)):
        timed = _Timed(res, spec)
        kit.progress(f"create: {key}, {count} sandboxes" + (f", one every {stagger * 1000:.0f} ms" if stagger else
                                                            " released at once"))
        try:
            wall = run_threads([timed.one] * count, stagger_s=stagger, barrier=barrier)
            timed.check(key)
        finally:
            destroy_all(res, timed.boxes)
        data[f"create_{key}_tti"] = timed.tti
        data[f"create_{key}_wall_s"] = [wall]
        kit.progress(f"create: {key}: p50 {p50(timed.tti):.0f} ms, p95 {p95(timed.tti):.0f} ms, "
                     f"{count / wall:.1f} sandboxes/s")
    return data


def bench_scale(res: Resources, spec: SandboxSpec, n: int, kit: Toolkit,
                memory_reading: MemoryReading) -> dict[str, list[float]]:
    """Row 19: ``n`` live idle sandboxes of 128 MiB."""
    spec = spec.model_copy(update={"memory": SCALE_MEMORY})
    data: dict[str, list[float]] = {}
    available_before = psutil.virtual_memory().available
    timed = _Timed(res, spec)
    counter = iter(range(n))
    lock = threading.Lock()

    def creator() -> None:
        while True:
            with lock:
                i = next(counter, None)
            if i is None or timed.errors:
                return
            timed.one()
            if (i + 1) % 25 == 0:
                kit.progress(f"scale: {i + 1}/{n} created")

    kit.progress(f"scale: creating {n} sandboxes of {SCALE_MEMORY // MIB} MiB with {SCALE_CREATORS} creators")
    try:
        wall = run_threads([creator] * SCALE_CREATORS, barrier=True)
        timed.check("scale create")
        boxes = list(timed.boxes)
        data["scale_create_tti"] = timed.tti
        data["scale_create_wall_s"] = [wall]
        kit.progress(f"scale: {n} live after {wall:.1f} s; reading the memory of each")
        time.sleep(2.0)  # let the last ones' start-up settle into idle (not a readiness wait: all answered)
        host: list[float] = []
        for box in boxes:
            reading = memory_reading(box.container, "agent.py")
            host.append(reading["cgroup_usage"] + reading["shim_pss"])
        data["scale_host_memory"] = host
        data["scale_available_drop"] = [float(available_before - psutil.virtual_memory().available)]
        kit.progress(f"scale: host memory per sandbox p50 {p50(host) / MIB:.1f} MiB; every one runs `true`, "
                     f"{SCALE_ANSWERERS} at once")

        def answer(box: Sandbox) -> float:
            t0 = time.perf_counter_ns()
            first_result(box)
            return ms_since(t0)

        with ThreadPoolExecutor(max_workers=SCALE_ANSWERERS) as pool:
            data["scale_answer"] = list(pool.map(answer, boxes))
        kit.progress(f"scale: answers p50 {p50(data['scale_answer']):.1f} ms, max {max(data['scale_answer']):.0f} ms;"
                     f" destroying all {n}, {CLEANUP_THREADS} at once")
        t0 = time.perf_counter()
        data["scale_destroy"] = destroy_all(res, boxes)
        data["scale_destroy_wall_s"] = [time.perf_counter() - t0]
        data["scale_sandboxes"] = [float(n)]
    finally:
        destroy_all(res, [b for b in timed.boxes if b.id in res.sandboxes])
    return data


def _per_s(data: dict[str, list[float]], key: str) -> float:
    return len(data[f"{key}_tti"]) / data[f"{key}_wall_s"][0]


def add_create_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 16a-16e and 17 (``add`` takes ``Row``'s arguments)."""
    if "create_seq_tti" not in data:
        return
    levels = [("create_seq", "16a. cold create, sequential (1 creator; each destroyed before the next)")]
    levels += [(f"create_c{c}", f"16{'bc'[i]}. cold create, {c} concurrent creators (closed loop, kept live)")
               for i, c in enumerate(CREATOR_LEVELS)]
    levels += [("create_stagger", f"16d. cold create, staggered (one launch every {STAGGER_S * 1000:.0f} ms)"),
               ("create_burst", f"16e. cold create, burst of {len(data['create_burst_tti'])} released at once")]
    for key, label in levels:
        values = data[f"{key}_tti"]
        per_s = _per_s(data, key)
        add(f"{label}: create → first result ({len(values)} sandboxes)", "time", values, "—", None,
            f"— (info; {per_s:.1f} sandboxes/s, p95 {p95(values):.0f} ms)",
            extra={"p95": p95(values), "per_s": per_s, "wall_s": data[f"{key}_wall_s"][0]})
    destroy = data["destroy_caller"]
    add(f"17. destroy latency to the caller: `Sandbox.destroy()` returns ({len(destroy)} sandboxes of 16a)", "time",
        destroy, "—", None, f"p50 ≤ {TARGET_DESTROY_P50_MS:g} ms", lambda r: r.cb(p50) <= TARGET_DESTROY_P50_MS)


def add_scale_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 19a-19d."""
    if "scale_sandboxes" not in data:
        return
    n = int(data["scale_sandboxes"][0])
    wall = data["scale_create_wall_s"][0]
    tti = data["scale_create_tti"]
    add(f"19a. scale: {n} sandboxes of 128 MiB created by {SCALE_CREATORS} creators, each create → first result",
        "time", tti, "—", None, f"— (info; all {n} in {wall:.1f} s: {n / wall:.1f} sandboxes/s, p95 {p95(tti):.0f} ms)",
        extra={"p95": p95(tti), "per_s": n / wall, "wall_s": wall})
    drop = data["scale_available_drop"][0] / n
    limit = TARGET_SCALE_MEMORY_MIB * MIB
    add(f"19b. scale: host memory per idle sandbox, {n} live (cgroup usage + shim PSS, as 4b)", "mem",
        data["scale_host_memory"], "—", None,
        f"≤ {TARGET_SCALE_MEMORY_MIB:g} MiB (host MemAvailable fell {drop / MIB:.1f} MiB per sandbox)",
        lambda r: r.cb(p50) <= limit, extra={"available_drop_per_sandbox_mib": drop / MIB})
    answers = data["scale_answer"]
    add(f"19c. scale: every one of the {n} answers `true` while all are live ({SCALE_ANSWERERS} at once)", "time",
        answers, "—", None, f"max ≤ {TARGET_SCALE_ANSWER_MS:g} ms (max {max(answers):.0f} ms)",
        lambda r: max(r.callbox) <= TARGET_SCALE_ANSWER_MS, extra={"max": max(answers)})
    destroy_wall = data["scale_destroy_wall_s"][0]
    add(f"19d. scale: destroying all {n} ({CLEANUP_THREADS} at once), each `destroy()`", "time",
        data["scale_destroy"], "—", None, f"— (info; all {n} in {destroy_wall:.1f} s)",
        extra={"wall_s": destroy_wall})
