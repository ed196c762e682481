"""Bursts of concurrent creates: 100 at once against a pool of 100, and 100 at once with no pool.

Section ``burst`` of ``make bench`` (rows 30a-30b). Each figure is one sandbox's create -> first
``true`` result, for creates released together by a barrier, one thread each (``bench_pool.burst``).
A create (or its first exec) that fails is counted, not fatal: the rows give the failures beside
the p50 and p95 of the ones that succeeded. The pooled burst first fills a pool of the burst's
size and waits until it is full (untimed); the cold burst runs on an engine with no pool.
Destroys are untimed and waited for between the two.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bench.bench_living import Resources, Toolkit
from tests.bench.bench_pool import FILL_TIMEOUT_S, SPEC, _engine, burst
from tests.bench.bench_results import p95

BURST = 100
QUICK_BURST = 10
TARGET_POOLED_P95_MS = 200.0
FIRST_ERRORS = 3
"""How many distinct failure messages the progress lines show."""


def measure(client: Any, size: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    """``burst_pooled``/``burst_cold`` (ms of the creates that succeeded) and
    ``burst_pooled_failed``/``burst_cold_failed`` (one value: how many failed); ``burst_claimed``
    (one value: how many of the pooled burst's creates claimed a pooled sandbox)."""
    roots = [Path(tempfile.mkdtemp(prefix="cbx-bburst-", dir="/tmp")) for _ in range(2)]
    pooled, cold = _engine(client, roots[0]), _engine(client, roots[1])
    data: dict[str, list[float]] = {}
    pool = pooled.enable_pool([SPEC], size=size)
    try:
        progress(f"burst: filling a pool of {size}")
        if not pool.wait_filled(FILL_TIMEOUT_S):
            raise RuntimeError(f"the pool of {size} did not fill in {FILL_TIMEOUT_S:g} s")
        for name, engine in (("pooled", pooled), ("cold", cold)):
            progress(f"burst: {size} concurrent creates, {name}")
            failures: list[str] = []
            data[f"burst_{name}"] = burst(engine, size, failures)
            data[f"burst_{name}_failed"] = [float(len(failures))]
            if failures:
                progress(f"burst, {name}: {len(failures)} of {size} failed: {sorted(set(failures))[:FIRST_ERRORS]}")
            if engine is pooled:
                data["burst_claimed"] = [float(pool.claims)]
                pool.close()
    finally:
        pool.close()
        for root in roots:
            shutil.rmtree(root, ignore_errors=True)
    return data


def bench_burst(res: Resources, kit: Toolkit, *, quick: bool = False) -> dict[str, list[float]]:
    """Rows 30a-30b of ``make bench`` (section ``burst``)."""
    return measure(res.engine.client, QUICK_BURST if quick else BURST, kit.progress)


def add_burst_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 30a-30b (``add`` takes ``Row``'s arguments)."""
    if "burst_pooled" not in data:
        return
    pooled, cold = data["burst_pooled"], data["burst_cold"]
    pooled_failed, cold_failed = int(data["burst_pooled_failed"][0]), int(data["burst_cold_failed"][0])
    claimed = int(data["burst_claimed"][0])
    size = len(pooled) + pooled_failed
    add(f"30a. burst of {size} concurrent creates, pool of {size}: create → first result "
        f"({claimed} claimed, {pooled_failed} failed)", "time", pooled,
        f"30b. the same burst, no pool (p95 {_p95(cold):.0f} ms, {cold_failed} failed)", cold,
        f"p95 ≤ {TARGET_POOLED_P95_MS:g} ms, no failure (p95 {_p95(pooled):.1f} ms)",
        lambda r: pooled_failed == 0 and _p95(r.callbox) <= TARGET_POOLED_P95_MS,
        extra={"p95": _p95(pooled), "failed": pooled_failed, "claimed": claimed, "cold_p95": _p95(cold),
               "cold_failed": cold_failed})
    add(f"30b. burst of {len(cold) + cold_failed} concurrent creates, no pool: create → first result "
        f"({cold_failed} failed)", "time", cold, "—", None,
        f"all succeed, p95 reported (p95 {_p95(cold):.0f} ms)", lambda r: cold_failed == 0,
        extra={"p95": _p95(cold), "failed": cold_failed})


def _p95(values: list[float]) -> float:
    return p95(values) if values else float("nan")
