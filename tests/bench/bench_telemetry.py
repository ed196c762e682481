"""What metrics and tracing add to the harness overhead per call (target: at most 5%).

The call is the one of row 6 (:mod:`tests.bench.bench_overhead`): a real ``Session`` with the
default policy and a file-backed audit store, a tool whose handler returns at once. Three
configurations are timed, interleaved call by call on the same session (so the audit
store's growth and the machine's drift hit them alike):

* ``off``: metrics recording a no-op and tracing off (what is left is the instrumentation's
  own skeleton: two clock reads and a check per step);
* ``metrics``: metrics recorded, tracing off (the default of ``callbox serve``);
* ``on``: metrics recorded and tracing on, every span exported in batches from the export
  thread (as with an OTLP endpoint) to an exporter that drops it: what tracing costs the call
  itself, the export thread's work included as far as it competes with the calls.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import load_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.telemetry import metrics, tracing
from tests.bench.bench_overhead import CALLS_PER_RUN, NOOP
from tests.bench.bench_results import TIMES, p50

TARGET_TELEMETRY_FACTOR = 1.05
MODES = ("off", "metrics", "on")


class DroppingExporter(SpanExporter):
    """Takes every span and throws it away (counting them, to show tracing was on)."""

    def __init__(self) -> None:
        self.spans = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _no_record(*_args: Any) -> None:
    pass


def bench_telemetry(samples: int, warmup: int) -> dict[str, list[float]]:
    """Per-call harness overhead (ms) in each of ``MODES``, ``samples`` calls each."""
    registry = ToolRegistry()
    registry.register(NOOP)
    policy = load_policy(None)
    arguments = '{"command": "ls -la", "workdir": null, "timeout_ms": 5000}'
    data: dict[str, list[float]] = {f"telemetry_{mode}": [] for mode in MODES}
    exporter = DroppingExporter()
    tracing.configure(None, exporter=exporter, batch=True)
    exporting = tracing._state.exporting  # switched on and off call by call below, cheaply
    recording = metrics.record_call
    modes: dict[str, Callable[[], None]] = {
        "off": lambda: _set(None, _no_record),
        "metrics": lambda: _set(None, recording),
        "on": lambda: _set(exporting, recording),
    }
    try:
        with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.sqlite3") as audit:
            harness = Session(registry, policy, audit, run_id="tbench-0")
            n = 0
            for i in range(warmup + samples):
                for mode in MODES:
                    if n % CALLS_PER_RUN == 0:
                        harness = Session(registry, policy, audit, run_id=f"tbench-{n}")
                    modes[mode]()
                    call = ToolCall("noop", arguments, f"c{n}")
                    t0 = time.perf_counter_ns()
                    result = harness.call(call)
                    elapsed = (time.perf_counter_ns() - t0) / 1e6
                    assert not result.is_error, result.text
                    n += 1
                    if i >= warmup:
                        data[f"telemetry_{mode}"].append(elapsed)
    finally:
        _set(exporting, recording)
        tracing.shutdown()
    if exporter.spans == 0:
        raise RuntimeError("tracing was on but no span reached the exporter")
    return data


def _set(exporting: Any, record: Callable[..., None]) -> None:
    tracing._state.exporting = exporting
    metrics.record_call = record  # type: ignore[assignment]


def add_telemetry_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 21a-21b (``add`` takes ``Row``'s arguments)."""
    if "telemetry_on" not in data:
        return
    on, metrics_only, off = data["telemetry_on"], data["telemetry_metrics"], data["telemetry_off"]
    factor = TARGET_TELEMETRY_FACTOR
    on_factor, metrics_factor = p50(on) / p50(off), p50(metrics_only) / p50(off)
    add("21a. harness overhead per call, metrics + tracing on (batch exporter, spans dropped)", "time", on,
        "the same call, metrics and tracing off (interleaved)", off,
        f"p50 ≤ {factor:g}{TIMES} baseline (on/off: {on_factor:.3f}{TIMES})", lambda r: on_factor <= factor,
        extra={"on_off": on_factor})
    add("21b. harness overhead per call, metrics on, tracing off (the default)", "time", metrics_only,
        "the same call, metrics and tracing off (interleaved)", off,
        f"— (info; on/off: {metrics_factor:.3f}{TIMES})", extra={"on_off": metrics_factor})
