"""``callbox doctor [--json]``: the posture of this host for running untrusted code.

Starts one sandbox through the harness's real code path (under ``--runtime``, else the
runtime the policy of ``--policy`` or ``--config`` gives its sandboxes, else runc), inspects
and probes it, destroys it, and prints one result per check (``PASS|WARN|FAIL|SKIP  <id>  <title>:
<reason>``, wrapped to the terminal) plus a summary; ``--json`` prints a list of {id, title,
status, reason, scope}. Exit status 0 when no check fails, 1 otherwise (2 usage). The checks
are in ``harness.doctor`` (``catalog`` lists them; ``checks.docker_report`` runs them). An
engine that does not answer is a report too: ``engine.reachable`` fails with the cause and
the fix, and the checks that need the engine are skipped; so is a sandbox that does not
start (``engine.sandbox``).

With the Ray engine (``--engine ray`` and its ``--ray-*`` flags, or the ``engine`` and
``[ray]`` of ``--config FILE`` or ``--policy FILE``, as ``callbox serve`` and ``callbox
run`` would choose) the checks are the cluster's instead (:mod:`harness.doctor.ray_checks`):
Ray installed, token authentication on both sides, the cluster reached and joined (then
left), its sandbox nodes and their images. A cluster that cannot be reached is a FAIL line,
not an exit 125.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from harness.cli.options import engine_options

COMMANDS = ("doctor",)


def add_parsers(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="check what this host gives a sandbox (CIS Docker Benchmark section 5, daemon, runc)",
        description="Start one sandbox the way callbox does, inspect it and the engine, and print one line "
                    "per check: PASS, WARN, FAIL or SKIP with the reason. Exit 1 if any check fails.",
    )
    doctor.add_argument("--json", action="store_true", help="print a JSON list of {id, title, status, reason, scope}")
    doctor.add_argument("--config", type=Path, metavar="FILE",
                        help="check the engine of this server configuration (its engine and [ray])")
    doctor.add_argument("--policy", type=Path, metavar="FILE",
                        help="check the engine this policy names, with a sandbox under its runtime")
    doctor.add_argument("--runtime", choices=["runc", "runsc"],
                        help="start the checked sandbox under this OCI runtime (default: the policy's, else runc)")
    engine_options(doctor)


def run(args: argparse.Namespace) -> int:
    # Imported here so `--help` and usage errors never load the docker SDK.
    from harness.doctor.report import render_text

    choice, runtime = _choice(args)
    if choice.ray is not None:
        from harness.doctor.ray_checks import gather_ray, ray_checks

        results = ray_checks(gather_ray(choice.ray))
    else:
        from harness.doctor.checks import docker_report

        results = docker_report(args.runtime or runtime)
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render_text(results))
    return 1 if any(r.status == "FAIL" for r in results) else 0


def _choice(args: argparse.Namespace) -> tuple[Any, Literal["runc", "runsc"]]:
    """The engine to check (the flags over ``--config``'s engine, else ``--policy``'s) and
    the runtime of the policy's sandboxes (runc without one)."""
    from harness.cli.options import engine_choice
    from harness.core.errors import UsageError
    from harness.core.policy import load_policy
    from harness.engine.select import choice_of

    if args.config is not None and args.policy is not None:
        raise UsageError("give --config or --policy, not both (a configuration names its policy)")
    base = None
    runtime: Literal["runc", "runsc"] = "runc"
    if args.config is not None:
        from harness.cli.server_config import load_config, served_policy

        policy = served_policy((config := load_config(args.config)).policy.file, config)
        base = choice_of(policy.engine, policy.ray)  # the file's engine over its policy's
        runtime = policy.sandbox.runtime
    elif args.policy is not None:
        policy = load_policy(args.policy)
        base = choice_of(policy.engine, policy.ray)
        runtime = policy.sandbox.runtime
    choice = engine_choice(args, base)
    if choice.ray is not None:
        try:
            return choice.model_copy(update={"ray": choice.ray.anchored(Path.cwd())}), runtime
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return choice, runtime
