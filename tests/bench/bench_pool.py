"""The warm pool against a cold create, in one run: create -> first result (``true``).

Run as ``python -m tests.bench.bench_pool [--samples N] [--burst N] [--json PATH]``, or as
section ``pool`` of ``make bench`` (rows 15a-15c: ``bench_pool`` and ``add_pool_rows``).

* sequential: callbox ``engine.create`` of a pooled spec (a claim) then the first exec,
  interleaved with a cold create of the same spec on an engine without a pool; before each
  sample the pool is refilled (untimed), so every claim finds a sandbox ready and the refill
  thread is idle while either side is timed;
* burst: ``--burst`` creates at once (one thread each, released together by a barrier)
  against a pool holding that many, then the same burst cold.

Destroys are not timed (their background removals are waited for before the next figure).
Everything started is removed in ``finally``. Results go to stdout (Markdown) and, with
``--json``, to a file (one object per row: key, what, p50, p95, p99, unit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_results import p50, p95, p99
from tests.conftest import IMAGE

SPEC = SandboxSpec(image=IMAGE, memory=128 << 20)
FILL_TIMEOUT_S = 600.0
BURST = 50
TARGET_CLAIM_P50_MS = 10.0
TARGET_CLAIM_P99_MS = 50.0
TARGET_BURST_P95_MS = 100.0


def _first_result(engine: DockerEngine) -> tuple[float, Sandbox]:
    """Milliseconds from create to the first result of ``true``, and the sandbox."""
    start = time.perf_counter()
    box = engine.create(SPEC)
    try:
        result = collect(box.agent.exec(["true"]))
        elapsed = (time.perf_counter() - start) * 1000
        if result.exit_code != 0:
            raise RuntimeError(f"true failed in sandbox {box.id}: {result}")
    except BaseException:
        box.destroy()
        raise
    return elapsed, box


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _row(key: str, what: str, samples: list[float]) -> dict[str, Any]:
    return {"key": key, "what": what, "n": len(samples), "p50": statistics.median(samples),
            "p95": _quantile(samples, 0.95), "p99": _quantile(samples, 0.99), "unit": "ms"}


def sequential(pooled: DockerEngine, cold: DockerEngine, samples: int) -> tuple[list[float], list[float]]:
    """Claim -> first result and cold create -> first result, interleaved (ms each)."""
    pool = pooled.pool
    assert pool is not None
    claims: list[float] = []
    colds: list[float] = []
    for index in range(samples + 3):  # the first three warm up
        for engine, into in ((pooled, claims), (cold, colds)):
            if not pool.wait_filled(FILL_TIMEOUT_S):
                raise RuntimeError("the pool did not refill")
            before = pool.claims
            elapsed, box = _first_result(engine)
            box.destroy()
            engine.drain(FILL_TIMEOUT_S)  # untimed: no removal runs while the next one is timed
            if engine is pooled and pool.claims != before + 1:
                raise RuntimeError("a pooled create did not claim")
            if index >= 3:
                into.append(elapsed)
    return claims, colds


def burst(engine: DockerEngine, size: int, failures: list[str] | None = None) -> list[float]:
    """``size`` creates -> first result at once, one thread each, released together (ms each).

    With ``failures``, a create or first exec that fails is recorded there (its error) and the
    burst goes on; the list returned then holds the successful ones only. Without, it raises."""
    boxes: list[Sandbox] = []
    gate = threading.Barrier(size)

    def one(_: int) -> tuple[float, Sandbox] | None:
        gate.wait()
        try:
            return _first_result(engine)
        except Exception as exc:
            if failures is None:
                raise
            failures.append(f"{type(exc).__name__}: {exc}")
            return None

    try:
        with ThreadPoolExecutor(max_workers=size) as threads:
            results = [result for result in threads.map(one, range(size)) if result is not None]
        boxes = [box for _, box in results]
        return [ms for ms, _ in results]
    finally:
        for box in boxes:
            box.destroy()
        engine.drain(FILL_TIMEOUT_S)


def measure(client: Any, samples: int, size: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    """Every figure of this benchmark, raw (ms): ``pool_claim``/``pool_cold`` (sequential,
    interleaved), ``pool_burst``/``cold_burst`` (``size`` at once; none when ``size`` is 0).
    Its engines have run roots of their own; everything started is removed before it returns."""
    roots = [Path(tempfile.mkdtemp(prefix="cbx-bpool-", dir="/tmp")) for _ in range(2)]
    pooled, cold = _engine(client, roots[0]), _engine(client, roots[1])
    data: dict[str, list[float]] = {}
    closers: list[Callable[[], object]] = []
    try:
        pool = pooled.enable_pool([SPEC], size=1)
        closers.append(pool.close)
        progress(f"pool: claim vs cold create -> first result, {samples} each, interleaved")
        data["pool_claim"], data["pool_cold"] = sequential(pooled, cold, samples)
        pool.close()
        if size > 0:
            big = _engine(client, roots[0])
            big_pool = big.enable_pool([SPEC], size=size)
            closers.append(big_pool.close)
            progress(f"pool: filling a pool of {size}")
            if not big_pool.wait_filled(FILL_TIMEOUT_S):
                raise RuntimeError("the pool did not fill")
            data["pool_burst"] = burst(big, size)
            if big_pool.claims != size:
                raise RuntimeError(f"{size - big_pool.claims} of the burst's creates did not claim")
            big_pool.close()
            progress(f"pool: burst of {size} cold creates")
            data["cold_burst"] = burst(cold, size)
    finally:
        for close in closers:
            close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    return data


def bench_pool(res: Resources, samples: int, kit: Toolkit, *, quick: bool = False) -> dict[str, list[float]]:
    """Rows 15a-15c of ``make bench`` (section ``pool``)."""
    return measure(res.engine.client, samples, 5 if quick else BURST, kit.progress)


def add_pool_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 15a-15c (``add`` takes ``Row``'s arguments)."""
    if "pool_claim" not in data:
        return
    claims = data["pool_claim"]
    add(f"15a. warm pool: claim → first result ({len(claims)} claims)", "time", claims,
        "cold create → first result (same run, interleaved)", data["pool_cold"],
        f"p50 ≤ {TARGET_CLAIM_P50_MS:g} ms, p99 ≤ {TARGET_CLAIM_P99_MS:g} ms (p99 {p99(claims):.1f} ms)",
        lambda r: r.cb(p50) <= TARGET_CLAIM_P50_MS and r.cb(p99) <= TARGET_CLAIM_P99_MS,
        extra={"p95": p95(claims), "p99": p99(claims)})
    if "pool_burst" not in data:
        return
    pooled, cold = data["pool_burst"], data["cold_burst"]
    n = len(pooled)
    add(f"15b. burst of {n} concurrent creates, pool of {n}: create → first result", "time", pooled,
        f"15c. the same burst, cold (p95 {p95(cold):.0f} ms)", cold,
        f"p95 ≤ {TARGET_BURST_P95_MS:g} ms (p95 {p95(pooled):.1f} ms)",
        lambda r: p95(r.callbox) <= TARGET_BURST_P95_MS, extra={"p95": p95(pooled), "cold_p95": p95(cold)})


def _engine(client: Any, root: Path) -> DockerEngine:
    return DockerEngine(client, run_root=root, reap_on_start=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--burst", type=int, default=BURST, help="concurrent creates (0: skip the burst rows)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    base = DockerEngine.connect(reap_on_start=False)
    data = measure(base.client, args.samples, args.burst, lambda text: print(text, file=sys.stderr))
    whats = {"pool_claim": "warm pool: create -> first result (claim)",
             "pool_cold": "cold create -> first result (same run)",
             "pool_burst": f"burst of {args.burst} creates, pool of {args.burst}",
             "cold_burst": f"burst of {args.burst} cold creates"}
    rows = [_row(key, whats[key], values) for key, values in data.items()]
    print("| row | what | n | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['key']} | {row['what']} | {row['n']} | {row['p50']:.1f} | {row['p95']:.1f} | {row['p99']:.1f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
