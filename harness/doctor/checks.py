"""``callbox doctor``: what this host gives a sandbox, checked item by item.

The container items (CIS Docker Benchmark section 5) are in ``container_checks``, the
daemon, runc and host items in ``daemon_checks``; each is a pure function of the
``Evidence`` that ``evidence.gather`` collects, and ``report`` renders the results.
"""

from __future__ import annotations

from harness.doctor.container_checks import container_checks
from harness.doctor.daemon_checks import daemon_checks, host_checks
from harness.doctor.evidence import Evidence
from harness.doctor.report import CheckResult


def run_checks(ev: Evidence) -> list[CheckResult]:
    return [*container_checks(ev), *daemon_checks(ev), *host_checks(ev)]
