"""Harness overhead per call, without the sandbox round trip (target: p50 ≤ 0.3 ms).

A real ``Session`` with the default policy and a file-backed audit store runs a tool
whose handler returns at once, so what is timed is exactly validate + authorize +
audit (claim, decision, running mark, result) + shaping.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall, ToolOutput
from harness.core.policy import load_policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session
from harness.core.validation import validate_call


class NoopArgs(BaseModel):
    """Arguments shaped like the shell tool's."""

    model_config = ConfigDict(extra="forbid")
    command: str
    workdir: str | None = None
    timeout_ms: int | None = None


def _noop(_ctx: Any, args: NoopArgs) -> ToolOutput:
    return ToolOutput(text=f"ran {args.command}")


NOOP = Tool(ToolDefinition(name="noop", description="Does nothing (benchmark).", input_model=NoopArgs,
                           command_field="command", path_fields=("workdir",)), _noop)


CALLS_PER_RUN = 100


def bench_overhead(samples: int, warmup: int) -> dict[str, list[float]]:
    registry = ToolRegistry()
    registry.register(NOOP)
    policy = load_policy(None)
    arguments = '{"command": "ls -la", "workdir": null, "timeout_ms": 5000}'
    data: dict[str, list[float]] = {"harness_overhead": [], "validate_only": []}
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.sqlite3") as audit:
        harness = Session(registry, policy, audit, run_id="bench-0")
        for i in range(warmup + samples):
            if i % CALLS_PER_RUN == 0:  # runs of a typical size (the call budget is counted per run)
                harness = Session(registry, policy, audit, run_id=f"bench-{i}")
            call = ToolCall("noop", arguments, f"c{i}")
            t0 = time.perf_counter_ns()
            result = harness.call(call)
            elapsed = (time.perf_counter_ns() - t0) / 1e6
            assert not result.is_error, result.text
            t1 = time.perf_counter_ns()
            validate_call(NOOP.definition, arguments)
            validate_ms = (time.perf_counter_ns() - t1) / 1e6
            if i >= warmup:
                data["harness_overhead"].append(elapsed)
                data["validate_only"].append(validate_ms)
    return data
