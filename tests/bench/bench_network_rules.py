"""Row 7c: a running sandbox's network rules changed (``update_network``) until they are enforced.

One allowlist sandbox whose ceiling is ``192.0.2.1`` (TEST-NET-1, never routed: the proxy
refuses it as not globally routable, so nothing is ever sent anywhere). Each sample denies
everything (untimed), then allows that address with ``Sandbox.set_network_rules`` (what every
door's update calls) and, from the moment the call returns, has ``curl`` in the sandbox ask
the proxy for it until the proxy's answer is no longer the rules' refusal: the time until a
request to the newly allowed host passes the rules (here it goes on to the address check,
which stands for the host answering)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec

TARGET = "192.0.2.1"
RULES_REFUSAL = "denied by this sandbox's network rules"
TARGET_ENFORCED_MS = 1000.0
"""The issue's goal: applied within a second."""


def bench_network_update(create: Callable[[SandboxSpec], Any], destroy: Callable[[Any], None], spec: SandboxSpec,
                         samples: int, warmup: int, progress: Callable[[str], None]) -> dict[str, list[float]]:
    box = create(spec.model_copy(update={"network": "allowlist", "allow_hosts": (TARGET,),
                                         "egress_deny": ("0.0.0.0/0",)}))
    command = ["curl", "-sS", "-m", "5", f"http://{TARGET}/"]
    out: list[float] = []
    try:
        for i in range(warmup + samples):
            box.set_network_rules((), ("0.0.0.0/0",))
            box.set_network_rules((TARGET,), ("0.0.0.0/0",))
            t0 = time.perf_counter_ns()
            while True:
                body = collect(box.agent.exec(command, env=box.spec.env)).stdout.data().decode(errors="replace")
                if RULES_REFUSAL not in body:
                    break
                if time.perf_counter_ns() - t0 > 10e9:
                    raise RuntimeError(f"the new rule was not enforced within 10 s: {body.strip()}")
            if i >= warmup:
                out.append((time.perf_counter_ns() - t0) / 1e6)
        progress(f"network update: {samples} samples")
    finally:
        destroy(box)
    return {"network_update_enforced": out}
