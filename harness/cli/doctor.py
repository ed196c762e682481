"""``callbox doctor [--json]``: the posture of this host for running untrusted code.

Starts one sandbox through the harness's real code path, inspects and probes it,
destroys it, and prints one line per check (``PASS|WARN|FAIL  <id>  <title>: <reason>``)
plus a summary; ``--json`` prints a list of {id, title, status, reason, scope}. Exit
status 0 when no check fails, 1 otherwise (2 usage, 125 engine unreachable or image
missing). The checks are in ``harness.doctor`` (``checks.run_checks`` runs them all).
"""

from __future__ import annotations

import argparse
import json
from typing import Any

COMMANDS = ("doctor",)


def add_parsers(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="check what this host gives a sandbox (CIS Docker Benchmark section 5, daemon, runc)",
        description="Start one sandbox the way callbox does, inspect it and the engine, and print one line "
                    "per check: PASS, WARN or FAIL with the reason. Exit 1 if any check fails.",
    )
    doctor.add_argument("--json", action="store_true", help="print a JSON list of {id, title, status, reason, scope}")


def run(args: argparse.Namespace) -> int:
    # Imported here so `--help` and usage errors never load the docker SDK.
    from harness.doctor.checks import run_checks
    from harness.doctor.evidence import gather
    from harness.doctor.report import render_text
    from harness.doctor.runtimes import probe_runsc
    from harness.engine.docker.engine import DockerEngine

    engine = DockerEngine.connect()
    evidence = gather(engine)
    results = run_checks(evidence, probe_runsc(engine, evidence.info))
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render_text(results))
    return 1 if any(r.status == "FAIL" for r in results) else 0
