"""The warm pool against a cold create, in one run: create -> first result (``true``).

Run as ``python -m tests.bench.bench_pool [--samples N] [--burst N] [--json PATH]``.

* sequential: callbox ``engine.create`` of a pooled spec (a claim) then the first exec,
  interleaved with a cold create of the same spec on an engine without a pool; before each
  sample the pool is refilled (untimed), so every claim finds a sandbox ready and the refill
  thread is idle while either side is timed;
* burst: ``--burst`` creates at once (one thread each) against a pool holding that many,
  then the same burst cold.

Destroys are not timed. Everything started is removed in ``finally``. Results go to stdout
(Markdown) and, with ``--json``, to a file (one object per row: key, what, p50, p95, p99, unit).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE

SPEC = SandboxSpec(image=IMAGE, memory=128 << 20)
FILL_TIMEOUT_S = 600.0


def _first_result(engine: DockerEngine) -> tuple[float, Sandbox]:
    """Milliseconds from create to the first result of ``true``, and the sandbox."""
    start = time.perf_counter()
    box = engine.create(SPEC)
    result = collect(box.agent.exec(["true"]))
    elapsed = (time.perf_counter() - start) * 1000
    if result.exit_code != 0:
        raise RuntimeError(f"true failed in sandbox {box.id}: {result}")
    return elapsed, box


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _row(key: str, what: str, samples: list[float]) -> dict[str, Any]:
    return {"key": key, "what": what, "n": len(samples), "p50": statistics.median(samples),
            "p95": _quantile(samples, 0.95), "p99": _quantile(samples, 0.99), "unit": "ms"}


def sequential(pooled: DockerEngine, cold: DockerEngine, samples: int) -> list[dict[str, Any]]:
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
            if engine is pooled and pool.claims != before + 1:
                raise RuntimeError("a pooled create did not claim")
            if index >= 3:
                into.append(elapsed)
    return [_row("pool-claim", "warm pool: create -> first result (claim)", claims),
            _row("pool-cold", "cold create -> first result (same run)", colds)]


def burst(engine: DockerEngine, size: int, key: str, what: str) -> dict[str, Any]:
    boxes: list[Sandbox] = []
    try:
        with ThreadPoolExecutor(max_workers=size) as threads:
            results = list(threads.map(lambda _: _first_result(engine), range(size)))
        boxes = [box for _, box in results]
        return _row(key, what, [ms for ms, _ in results])
    finally:
        with ThreadPoolExecutor(max_workers=8) as threads:
            list(threads.map(lambda box: box.destroy(), boxes))


def _engine(client: Any, root: Path) -> DockerEngine:
    return DockerEngine(client, run_root=root, reap_on_start=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--burst", type=int, default=50, help="concurrent creates (0: skip the burst rows)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    base = DockerEngine.connect(reap_on_start=False)
    roots = [Path(tempfile.mkdtemp(prefix="cbx-bpool-", dir="/tmp")) for _ in range(2)]
    pooled, cold = _engine(base.client, roots[0]), _engine(base.client, roots[1])
    rows: list[dict[str, Any]] = []
    closers: list[Callable[[], object]] = []
    try:
        pool = pooled.enable_pool([SPEC], size=1)
        closers.append(pool.close)
        print("sequential ...", file=sys.stderr)
        rows += sequential(pooled, cold, args.samples)
        pool.close()
        if args.burst > 0:
            big = _engine(base.client, roots[0])
            big_pool = big.enable_pool([SPEC], size=args.burst)
            closers.append(big_pool.close)
            print(f"filling a pool of {args.burst} ...", file=sys.stderr)
            if not big_pool.wait_filled(FILL_TIMEOUT_S):
                raise RuntimeError("the pool did not fill")
            rows.append(burst(big, args.burst, "pool-burst", f"burst of {args.burst} creates, pool of {args.burst}"))
            claimed = big_pool.claims
            big_pool.close()
            rows.append(burst(cold, args.burst, "cold-burst", f"burst of {args.burst} cold creates"))
            rows[-2]["claimed"] = claimed
    finally:
        for close in closers:
            close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    print("| row | what | n | p50 ms | p95 ms | p99 ms |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print(f"| {row['key']} | {row['what']} | {row['n']} | {row['p50']:.1f} | {row['p95']:.1f} | {row['p99']:.1f} |")
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
