"""``callbox doctor``: what this host gives a sandbox, checked item by item.

The engine items are in ``engine_checks``, the container items (CIS Docker Benchmark
section 5) in ``container_checks``, the daemon, runc and host items in ``daemon_checks``,
the OCI runtimes (and whether a gVisor sandbox works, from a ``runtimes.RuntimeProbe``) in
``runtimes``; each is a pure function of the ``Evidence`` that ``evidence.gather`` collects,
``catalog`` lists them all (title, scope, what each needs, the fix) and ``report`` renders
the results. :func:`docker_report` runs them on the engine DOCKER_HOST names, and still
reports when that engine does not answer.
"""

from __future__ import annotations

from typing import Literal

from harness.doctor.container_checks import container_checks
from harness.doctor.daemon_checks import daemon_checks, host_checks
from harness.doctor.engine_checks import check_reachable, check_sandbox, connect, skipped, unreachable_report
from harness.doctor.evidence import Evidence
from harness.doctor.report import CheckResult
from harness.doctor.runtimes import RuntimeProbe, runtime_checks

NEEDS_SANDBOX = "needs a sandbox, and none started (engine.sandbox)"


def run_checks(ev: Evidence, runsc: RuntimeProbe | None = None) -> list[CheckResult]:
    """Every check on ``ev``; ``runsc``: a sandbox started under gVisor (``runtimes.probe_runsc``)."""
    engine = [check_reachable(ev.version), check_sandbox(ev.container, ev.start_s, ev.sandbox_problem)]
    results = [*engine, *container_checks(ev), *daemon_checks(ev), *runtime_checks(ev.info, runsc), *host_checks(ev)]
    if ev.sandbox_problem is None:
        return results
    from harness.doctor.catalog import info

    return [skipped(r.id, NEEDS_SANDBOX) if info(r.id).needs == "sandbox" and r.id != "engine.sandbox" else r
            for r in results]


def docker_report(runtime: Literal["runc", "runsc"] = "runc") -> list[CheckResult]:
    """Every check, on a sandbox started under ``runtime`` on the engine DOCKER_HOST names;
    when that engine does not answer (or is lost on the way), the report says why."""
    from harness.core.errors import EngineUnavailable
    from harness.doctor.evidence import gather
    from harness.doctor.runtimes import probe_runsc

    engine, problem = connect()
    if engine is None:
        return unreachable_report(problem or "no answer")
    try:
        evidence = gather(engine, runtime)
        return run_checks(evidence, probe_runsc(engine, evidence.info, evidence))
    except EngineUnavailable as exc:
        return unreachable_report(exc.message)
