"""``make bench`` section ``interpreter``: ``e2b_code_interpreter`` (unmodified) against
``callbox serve --e2b``, on the code-interpreter image variant (built first when missing).

Rows:

14f. ``run_code("1+1")`` round trip in a live sandbox (its default context's kernel started by
     a first, untimed cell), vs ``commands.run("python3 -c 'print(1+1)'")`` in the same sandbox
     through the same door (a plain exec: a new interpreter each time, no state);
14g. ``Sandbox.create()`` → the first ``run_code("1+1")`` result, from the warm pool: a second
     server whose policy has ``[pool] code_interpreter = 1`` (each sample waits until the pool
     holds a prepared sandbox again: its server started, its default kernel up), against the
     same from a cold start (the first server, no pool: the container, the server's start and
     the default context's kernel); the kills are untimed;
14h. the ``python`` tool's cell ``1+1`` through the harness's call path (``Session.call``: policy,
     audit, bounds; its kernel started by a first, untimed call), vs the ``shell`` tool's
     ``python3 -c 'print(1+1)'`` in the same run's sandbox.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2b_code_interpreter import Sandbox

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import Policy
from harness.core.session import Session
from harness.engine.docker.pool import POOL_OWNER
from harness.engine.image.build import default_repo_root
from harness.engine.image.variants import build_variant
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from tests.bench.bench_e2b import e2b_door, ms_since, p99
from tests.bench.bench_living import Resources, Toolkit

ROUND_TRIP_MIN_SAMPLES = 100
REFILL_WAIT_S = 180.0
"""How long a warm sample waits for the pool to hold a prepared sandbox again."""


def first_result(opts: dict[str, Any]) -> float:
    """ms from ``Sandbox.create()`` to the first ``run_code("1+1")`` result (the kill untimed)."""
    t0 = time.perf_counter_ns()
    sandbox = Sandbox.create(**opts)
    try:
        result = sandbox.run_code("1+1")
        first = ms_since(t0)
    finally:
        sandbox.kill()
    if result.text != "2":
        raise RuntimeError(f"first run_code('1+1'): {result}")
    return first


def wait_pooled(res: Resources, image: str, pid: int) -> None:
    """Wait until the warm pool of server process ``pid`` holds a prepared sandbox of ``image``
    (its record is written then)."""
    deadline = time.monotonic() + REFILL_WAIT_S
    while not any(info.owner == POOL_OWNER and info.image == image and f"/{pid}/" in info.process
                  for info in res.engine.list_sandboxes(stats=False)):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the warm pool held no code-interpreter sandbox within {REFILL_WAIT_S:g} s")
        time.sleep(0.1)


def bench_interpreter(res: Resources, samples: int, warmup: int, kit: Toolkit, *,
                      quick: bool = False) -> dict[str, list[float]]:
    """Rows 14f-14g; the server and every sandbox started here are gone when it returns."""
    kit.progress("interpreter: the code-interpreter image variant (built when missing)")
    image = build_variant(res.engine.client, "code-interpreter", repo_root=default_repo_root(),
                          progress=kit.progress).tag
    data: dict[str, list[float]] = {}
    with e2b_door(image) as door:
        opts = door.opts()

        def cold() -> dict[str, float]:
            return {"ci_cold_first": first_result(opts)}

        data.update(kit.interleaved("interpreter cold start", [cold], max(3, samples // 3), min(warmup, 1), every=5))
        sandbox = Sandbox.create(timeout=600, **opts)
        try:
            sandbox.run_code("1+1")  # the default context's kernel

            def cell() -> dict[str, float]:
                t0 = time.perf_counter_ns()
                result = sandbox.run_code("1+1")
                elapsed = ms_since(t0)
                if result.text != "2":
                    raise RuntimeError(f"run_code('1+1'): {result}")
                return {"ci_run_code": elapsed}

            def plain() -> dict[str, float]:
                t0 = time.perf_counter_ns()
                result = sandbox.commands.run("python3 -c 'print(1+1)'")
                elapsed = ms_since(t0)
                if result.stdout.strip() != "2":
                    raise RuntimeError(f"python3 -c: {result}")
                return {"ci_python_c": elapsed}

            rounds = samples if quick else max(samples, ROUND_TRIP_MIN_SAMPLES)
            data.update(kit.interleaved("interpreter run_code('1+1')", [cell, plain], rounds, warmup, every=25))
        finally:
            sandbox.kill()
    data.update(python_tool(res, image, kit, samples if quick else max(samples, ROUND_TRIP_MIN_SAMPLES), warmup))
    kit.progress("interpreter: a second server, its warm pool keeping one code-interpreter sandbox")
    with e2b_door(image, "[pool]\ncode_interpreter = 1\n") as pooled_door:
        pooled_opts = pooled_door.opts()

        def warm() -> dict[str, float]:
            wait_pooled(res, image, pooled_door.proc.pid)  # untimed: the refill after the previous sample's claim
            return {"ci_warm_first": first_result(pooled_opts)}

        data.update(kit.interleaved("interpreter from the warm pool", [warm], max(3, samples // 3),
                                    min(warmup, 1), every=5))
    return data


def python_tool(res: Resources, image: str, kit: Toolkit, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Row 14h: one run (a Session on the code-interpreter image), its kernel started untimed."""
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.sqlite3") as audit, Session(
        builtin_registry(), Policy.model_validate({"budgets": {"max_tool_calls": 100_000}}), audit,
        spec=SandboxSpec(image=image), engine_factory=lambda: res.engine,
    ) as session:
        calls = iter(range(1 << 30))

        def timed(tool: str, args: dict[str, Any], want: str, name: str) -> dict[str, float]:
            t0 = time.perf_counter_ns()
            result = session.call(ToolCall(tool, args, f"c{next(calls)}"))
            elapsed = ms_since(t0)
            if result.is_error or want not in result.text:
                raise RuntimeError(f"{tool} {args}: {result.text}")
            return {name: elapsed}

        timed("python", {"code": "1+1"}, ": 2", "py_first")  # the server's start and its kernel

        def cell() -> dict[str, float]:
            return timed("python", {"code": "1+1"}, ": 2", "py_tool")

        def plain() -> dict[str, float]:
            return timed("shell", {"command": "python3 -c 'print(1+1)'"}, "\n2", "py_shell")

        return kit.interleaved("python tool cell '1+1'", [cell, plain], rounds, warmup, every=25)


def add_interpreter_rows(data: dict[str, list[float]], add: Callable[..., Any]) -> None:
    """Rows 14f-14g of the report (``add`` takes ``Row``'s arguments)."""
    if "ci_run_code" not in data:
        return
    cells = data["ci_run_code"]
    add(f"14f. e2b_code_interpreter: `run_code('1+1')` round trip, live kernel ({len(cells)} samples)", "time",
        cells, "`commands.run(\"python3 -c 'print(1+1)'\")`, same sandbox and door", data["ci_python_c"],
        f"— (info; p99 {p99(cells):.1f} ms, baseline p99 {p99(data['ci_python_c']):.1f} ms)")
    add(f"14g. e2b_code_interpreter: `Sandbox.create()` → first `run_code('1+1')` result, from the warm pool "
        f"({len(data['ci_warm_first'])} samples)", "time", data["ci_warm_first"],
        "the same, cold (no pool: container, server and kernel start)", data["ci_cold_first"], "— (info)")
    if "py_tool" in data:
        cells = data["py_tool"]
        add(f"14h. `python` tool: cell `1+1` round trip through the call path, live kernel ({len(cells)} samples)",
            "time", cells, "`shell` tool: `python3 -c 'print(1+1)'`, same run", data["py_shell"],
            f"— (info; p99 {p99(cells):.1f} ms, baseline p99 {p99(data['py_shell']):.1f} ms)")
