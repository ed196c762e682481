"""The cost of redacting secrets from every result, per call, on a 16 KiB and a 1 MiB output.

A real ``Session`` with a file-backed audit store runs a tool whose handler returns a
prepared output at once, so a call is validate + authorize + audit + strip terminal codes
+ redact + bound. The same call path with redaction off (``builtin_patterns = false`` and
nothing else to redact: the redactor is inactive) is the baseline, interleaved with it.
Redaction on is the default policy plus one secret env value, the typical setup. The
output is an ordinary build and test log (paths, hex digests, UUIDs, timings) with no
secret in it, the common case; a second figure times ``Redactor.redact`` alone.
"""

from __future__ import annotations

import hashlib
import random
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall, ToolOutput
from harness.core.policy import parse_policy
from harness.core.redaction import Redactor
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session

KIB = 1024
SIZES = {"16k": 16 * KIB, "1m": 1024 * KIB}
SECRET_ENV = "CALLBOX_BENCH_SECRET"
CALLS_PER_RUN = 100


def typical_output(size: int, seed: int = 0) -> str:
    """A log of about ``size`` bytes that looks like what tools print."""
    rng = random.Random(seed)
    lines: list[str] = []
    total = 0
    while total < size:
        digest = hashlib.sha256(rng.randbytes(8)).hexdigest()
        line = rng.choice([
            f"tests/test_mod_{rng.randint(1, 99)}.py::test_case_{rng.randint(1, 999)} PASSED [{rng.randint(1, 99)}%]",
            f"commit {digest[:40]} ({uuid.UUID(int=rng.getrandbits(128))})",
            f"  Downloading package-{rng.randint(1, 9)}.{rng.randint(0, 20)}.tar.gz sha256:{digest}",
            f"INFO {time.strftime('%H:%M:%S')} worker {rng.randint(1, 8)} finished job in {rng.random():.3f}s",
            f"/usr/lib/python3.11/site-packages/lib_{rng.randint(1, 50)}/module.py:{rng.randint(1, 900)}: warning",
        ])
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


class Args(BaseModel):
    model_config = ConfigDict(extra="forbid")
    size: str


def bench_redaction(samples: int, warmup: int) -> dict[str, list[float]]:
    outputs = {key: typical_output(size) for key, size in SIZES.items()}

    def handler(_ctx: Any, args: Args) -> ToolOutput:
        text = outputs[args.size]
        return ToolOutput(text=text, raw_bytes=len(text))

    registry = ToolRegistry([Tool(ToolDefinition("log", "Prints a log (benchmark).", Args), handler)])
    on = parse_policy(f'[redaction]\nsecret_env = ["{SECRET_ENV}"]\n')
    off = parse_policy("[redaction]\nbuiltin_patterns = false\n")
    env = {SECRET_ENV: "bench-" + "secret-" + "value-0123456789"}
    data: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, AuditStore(Path(tmp) / "audit.sqlite3") as audit:
        sessions: dict[str, Session] = {}

        def session(policy_key: str, i: int) -> Session:
            if i % CALLS_PER_RUN == 0 or policy_key not in sessions:
                policy = on if policy_key == "on" else off
                made = Session(registry, policy, audit, run_id=f"bench-redaction-{policy_key}-{i}")
                made.redactor = Redactor.for_policy(policy.redaction, env, {})
                assert made.redactor.active is (policy_key == "on")
                sessions[policy_key] = made
            return sessions[policy_key]

        for size in SIZES:
            count = samples if size == "16k" else max(30, samples // 10)
            for i in range(warmup + count):
                order = ("on", "off") if i % 2 == 0 else ("off", "on")
                for policy_key in order:
                    harness = session(policy_key, i)
                    call = ToolCall("log", {"size": size}, f"{size}-{i}")
                    t0 = time.perf_counter_ns()
                    result = harness.call(call)
                    elapsed = (time.perf_counter_ns() - t0) / 1e6
                    assert not result.is_error and "redactions" not in result.meta, result.text[:200]
                    if i >= warmup:
                        data.setdefault(f"redaction_call_{policy_key}_{size}", []).append(elapsed)
                if i >= warmup:
                    redactor = sessions["on"].redactor
                    t0 = time.perf_counter_ns()
                    redactor.redact(outputs[size])
                    data.setdefault(f"redaction_only_{size}", []).append((time.perf_counter_ns() - t0) / 1e6)
    return data
