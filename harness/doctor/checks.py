"""``callbox doctor``: what this host gives a sandbox, checked item by item.

The container items (CIS Docker Benchmark section 5) are in ``container_checks``, the
daemon, runc and host items in ``daemon_checks``, the OCI runtimes (and whether a gVisor
sandbox works, from a ``runtimes.RuntimeProbe``) in ``runtimes``; each is a pure function of the
``Evidence`` that ``evidence.gather`` collects, and ``report`` renders the results.
"""

from __future__ import annotations

from harness.doctor.container_checks import container_checks
from harness.doctor.daemon_checks import daemon_checks, host_checks
from harness.doctor.evidence import Evidence
from harness.doctor.report import CheckResult
from harness.doctor.runtimes import RuntimeProbe, runtime_checks


def run_checks(ev: Evidence, runsc: RuntimeProbe | None = None) -> list[CheckResult]:
    """Every check on ``ev``; ``runsc``: a sandbox started under gVisor (``runtimes.probe_runsc``)."""
    return [*container_checks(ev), *daemon_checks(ev), *runtime_checks(ev.info, runsc), *host_checks(ev)]
