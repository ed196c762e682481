"""runsc (gVisor) against runc, measured in the same run: section ``runtimes`` of ``make bench``
(rows 20a-20d: ``bench_runtimes`` and ``add_runtime_rows``), or alone with
``python -m tests.bench.bench_runtimes [--samples N]``.

* 20a cold start: ``engine.create`` → agent ready, the two runtimes interleaved (the
  removal of each sandbox is waited for, untimed, before the next create);
* 20b exec round trip of ``true`` in a live sandbox of each runtime, interleaved;
* 20c streaming ``head -c 16M /dev/zero`` sandbox → harness;
* 20d memory per idle sandbox: the container's memory cgroup usage (``docker stats``:
  under runsc the cgroup holds gVisor's Sentry and gofer, whose memory is the tools' too),
  two sandboxes of each runtime after one call each.

A runtime the daemon lacks (no ``make runsc``) leaves the section's rows out and says so.
A figure runsc cannot produce (a command that does not run there) is left out with the
reason on stderr; the others are still measured. Everything started is removed in ``finally``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from harness.core.errors import CallboxError
from harness.engine.docker.engine import DockerEngine, Sandbox
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.bench.bench_results import p50, p95
from tests.conftest import IMAGE

RUNTIMES = ("runc", "runsc")
STREAM_BYTES = 16 << 20
IDLE_BOXES = 2
DRAIN_S = 60.0
SKIPPED: dict[str, str] = {}
"""Figures left out of the last run, with the reason (shown under the rows)."""


def _spec(runtime: str) -> SandboxSpec:
    return SandboxSpec(image=IMAGE, runtime="runsc" if runtime == "runsc" else "runc")


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _cold(engine: DockerEngine, runtime: str) -> float:
    start = time.perf_counter()
    box = engine.create(_spec(runtime))
    elapsed = _ms(start)
    box.destroy()
    engine.drain(DRAIN_S)  # untimed: no removal runs while the next create is timed
    return elapsed


def _exec_true(box: Sandbox) -> float:
    start = time.perf_counter()
    result = collect(box.agent.exec(["true"]))
    elapsed = _ms(start)
    if result.exit_code != 0:
        raise RuntimeError(f"true exited {result.exit_code}")
    return elapsed


def _stream(box: Sandbox) -> float:
    start = time.perf_counter()
    result = collect(box.agent.exec(["head", "-c", str(STREAM_BYTES), "/dev/zero"],
                                    output_cap_bytes=2 * STREAM_BYTES, rpc_timeout=120))
    elapsed = _ms(start)
    if result.exit_code != 0 or result.stdout.total_bytes != STREAM_BYTES:
        raise RuntimeError(f"stream: exit {result.exit_code}, {result.stdout.total_bytes} bytes")
    return elapsed


def _cgroup_usage(engine: DockerEngine, box: Sandbox) -> float:
    stats = engine.client.api.stats(box.container_id, stream=False)
    return float((stats.get("memory_stats") or {}).get("usage") or 0)


def _sampled(label: str, runtime: str, fn: Callable[[], float], samples: int, out: dict[str, list[float]],
             key: str) -> None:
    """``samples`` of ``fn`` into ``out[key]``; the first failure stops the figure and is noted."""
    try:
        for _ in range(samples):
            out.setdefault(key, []).append(fn())
    except (CallboxError, RuntimeError) as exc:
        out.pop(key, None)
        SKIPPED[key] = f"{label} under {runtime}: {exc}"


def measure(engine: DockerEngine, samples: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    """Every figure, raw: ``rt_<figure>_<runtime>`` in ms (bytes for memory)."""
    SKIPPED.clear()
    runtimes = engine.client.info().get("Runtimes") or {}
    if "runsc" not in runtimes:
        SKIPPED["runtimes"] = "the Docker engine has no runsc runtime (run `make runsc`)"
        progress(f"runtimes: skipped: {SKIPPED['runtimes']}")
        return {}
    data: dict[str, list[float]] = {}
    cold_n = max(3, samples // 6)
    progress(f"runtimes: cold start create -> ready, {cold_n} each, interleaved")
    for _ in range(cold_n):
        for runtime in RUNTIMES:
            _sampled("create", runtime, lambda r=runtime: _cold(engine, r), 1, data, f"rt_cold_{runtime}")
    boxes: list[Sandbox] = []
    try:
        live = {}
        for runtime in RUNTIMES:
            live[runtime] = engine.create(_spec(runtime))
            boxes.append(live[runtime])
        progress(f"runtimes: exec `true` round trip, {samples} each, interleaved")
        for _ in range(samples):
            for runtime in RUNTIMES:
                key = f"rt_exec_{runtime}"
                if key in SKIPPED:
                    continue
                _sampled("exec true", runtime, lambda b=live[runtime]: _exec_true(b), 1, data, key)
        stream_n = max(3, samples // 10)
        progress(f"runtimes: stream {STREAM_BYTES >> 20} MiB, {stream_n} each")
        for runtime in RUNTIMES:
            _sampled("stream", runtime, lambda b=live[runtime]: _stream(b), stream_n, data, f"rt_stream_{runtime}")
        progress(f"runtimes: memory of {IDLE_BOXES} idle sandboxes each")
        for runtime in RUNTIMES:
            idle = [live[runtime]]
            for _ in range(IDLE_BOXES - 1):
                idle.append(engine.create(_spec(runtime)))
                boxes.append(idle[-1])
            for box in idle:  # idle after one call, as in row 4 (where a command can run at all)
                with contextlib.suppress(CallboxError):
                    collect(box.agent.exec(["true"]))
            data[f"rt_mem_{runtime}"] = [_cgroup_usage(engine, box) for box in idle]
    finally:
        for box in boxes:
            box.destroy()
        engine.drain(DRAIN_S)
    for key, why in SKIPPED.items():
        progress(f"runtimes: {key} left out: {why}")
    return data


def bench_runtimes(res: Any, samples: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    """Rows 20a-20d of ``make bench`` (section ``runtimes``)."""
    return measure(res.engine, samples, progress)


ROWS = (
    ("20a. runsc cold start: create → agent ready", "time", "cold"),
    ("20b. runsc exec round trip of `true`, live sandbox", "time", "exec"),
    (f"20c. runsc stream sandbox → harness, `head -c {STREAM_BYTES >> 20}M /dev/zero`", "rate", "stream"),
    ("20d. runsc memory per idle sandbox (cgroup usage)", "mem", "mem"),
)


def add_runtime_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Rows 20a-20d (``add`` takes ``Row``'s arguments): runsc's figure, runc's as the baseline."""
    for what, kind, figure in ROWS:
        runsc, runc = data.get(f"rt_{figure}_runsc"), data.get(f"rt_{figure}_runc")
        if not runsc or not runc:
            continue
        add(what, kind, runsc, "runc, same run" + (", interleaved" if figure in ("cold", "exec") else ""), runc,
            "— (info)", rate_bytes=STREAM_BYTES if kind == "rate" else 0, extra={"p95": p95(runsc)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args(argv)
    engine = DockerEngine.connect(reap_on_start=False)
    data = measure(engine, args.samples, lambda text: print(text, file=sys.stderr))
    summary = {key: {"n": len(values), "p50": p50(values)} for key, values in data.items()}
    print(json.dumps({"figures": summary, "left_out": SKIPPED}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
