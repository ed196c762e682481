"""What the audit chain (:mod:`harness.audit.chain`) costs per call.

The call is the one of row 6 (:mod:`tests.bench.bench_overhead`): a real ``Session`` with the
default policy, a file-backed audit store and a tool whose handler returns at once. Two
stores in one directory, one chained as every store is, one with its chain switched off
(its TEMP triggers dropped and nothing sealed: a store no callbox makes), take their calls
in turn, so that the machine's drift and the stores' growth hit both alike. The difference
of the two p50s is the chain's cost per call: its triggers, the entries of the call's two
transactions (its claim, its result) and their hashes.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import load_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from tests.bench.bench_overhead import CALLS_PER_RUN, NOOP
from tests.bench.bench_results import p50

TARGET_OVERHEAD_P50_MS = 0.3
"""Row 6's target, which the chained call must keep."""


def _unchained(store: AuditStore) -> None:
    """Switch the chain of ``store``'s connection off (the benchmark's baseline only)."""

    def drop(conn: object) -> None:
        import sqlite3

        assert isinstance(conn, sqlite3.Connection)
        names = conn.execute("SELECT name FROM temp.sqlite_master WHERE type = 'trigger' "
                             "AND name GLOB 'audit_chain_*'").fetchall()
        for (name,) in names:
            conn.execute(f'DROP TRIGGER temp."{name}"')

    store._read(drop)
    store._chain = None


def bench_audit_chain(samples: int, warmup: int) -> dict[str, list[float]]:
    """Per-call harness overhead (ms) with the chain and without, ``samples`` calls each."""
    registry = ToolRegistry()
    registry.register(NOOP)
    policy = load_policy(None)
    arguments = '{"command": "ls -la", "workdir": null, "timeout_ms": 5000}'
    data: dict[str, list[float]] = {"chain_on": [], "chain_off": []}
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "chained.sqlite3") as chained, \
            AuditStore(Path(tmp) / "unchained.sqlite3") as unchained:
        _unchained(unchained)
        stores = {"chain_on": chained, "chain_off": unchained}
        sessions = {key: Session(registry, policy, store, run_id=f"{key}-0") for key, store in stores.items()}
        for i in range(warmup + samples):
            for key in (("chain_on", "chain_off") if i % 2 else ("chain_off", "chain_on")):
                if i % CALLS_PER_RUN == 0:
                    sessions[key] = Session(registry, policy, stores[key], run_id=f"{key}-{i}")
                call = ToolCall("noop", arguments, f"c{i}")
                t0 = time.perf_counter_ns()
                result = sessions[key].call(call)
                elapsed = (time.perf_counter_ns() - t0) / 1e6
                assert not result.is_error, result.text
                if i >= warmup:
                    data[key].append(elapsed)
        if unchained.chain_head().seq > 1:
            raise RuntimeError("the baseline store chained its calls")
        if chained.chain_head().seq < 2 * samples:
            raise RuntimeError("the chained store did not chain every call")
    return data


def add_audit_chain_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Row 6b (``add`` takes ``Row``'s arguments)."""
    if "chain_on" not in data:
        return
    on, off = data["chain_on"], data["chain_off"]
    cost = p50(on) - p50(off)
    add("6b. harness overhead per call with the audit chain (row 6's call; chained vs unchained store)", "time",
        on, "the same call, a store with its chain switched off (interleaved)", off,
        f"p50 ≤ {TARGET_OVERHEAD_P50_MS:g} ms (chain's cost per call: p50 {cost * 1000:.0f} µs)",
        lambda r: p50(on) <= TARGET_OVERHEAD_P50_MS, extra={"chain_cost_ms": cost})
