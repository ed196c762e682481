"""``callbox doctor [--json]``: the posture of this host for running untrusted code.

Starts one sandbox through the harness's real code path (under ``--runtime``, else the
runtime the policy of ``--policy`` or ``--config`` gives its sandboxes, else runc), inspects
and probes it, destroys it, and prints one result per check (``PASS|WARN|FAIL|SKIP  <id>
<title>: <reason>``, wrapped to the terminal) plus a summary; ``--json`` prints a list of
{id, title, status, reason, scope}. Exit status 0 when no check fails, 1 otherwise (2 usage).
The checks are in ``harness.doctor`` (``catalog`` lists them; ``checks.docker_report`` runs
them). An engine that does not answer is a report too: ``engine.reachable`` fails with the
cause and the fix, and the checks that need the engine are skipped.

``--config FILE`` first checks what the server configuration needs to start
(:mod:`harness.doctor.config_checks`: the file as ``callbox config check`` loads it, the
doors' addresses, tokens, TLS, audit store and log file), then its engine.

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
from typing import TYPE_CHECKING, Any, Literal

from harness.cli.options import engine_options

if TYPE_CHECKING:
    from harness.core.policy import Policy
    from harness.doctor.config_checks import ServerCheck

COMMANDS = ("doctor",)


def add_parsers(sub: Any) -> None:
    doctor = sub.add_parser(
        "doctor", help="check what this host gives a sandbox (CIS Docker Benchmark section 5, daemon, runc)",
        description="Start one sandbox the way callbox does, inspect it and the engine, and print one result "
                    "per check: PASS, WARN, FAIL or SKIP with the reason. Exit 1 if any check fails.",
    )
    doctor.add_argument("--json", action="store_true", help="print a JSON list of {id, title, status, reason, scope}")
    doctor.add_argument("--config", type=Path, metavar="FILE",
                        help="check what this server configuration needs to start (doors, tokens, TLS, audit "
                             "store, log file), then its engine")
    doctor.add_argument("--policy", type=Path, metavar="FILE",
                        help="check the engine this policy names, with a sandbox under its runtime")
    doctor.add_argument("--runtime", choices=["runc", "runsc"],
                        help="start the checked sandbox under this OCI runtime (default: the policy's, else runc)")
    engine_options(doctor)


def run(args: argparse.Namespace) -> int:
    # Imported here so `--help` and usage errors never load the docker SDK.
    from harness.core.errors import UsageError
    from harness.doctor.report import CheckResult, render_text

    if args.config is not None and args.policy is not None:
        raise UsageError("give --config or --policy, not both (a configuration names its policy)")
    results: list[CheckResult] = []
    server = None
    if args.config is not None:
        from harness.doctor.config_checks import config_report

        server = config_report(args.config)
        results += server.results
    policy = _policy(args, server)
    choice = _choice(args, policy, server)
    if choice.ray is not None:
        from harness.doctor.ray_checks import gather_ray, ray_checks

        results += ray_checks(gather_ray(choice.ray))
    else:
        from harness.doctor.checks import docker_report

        results += docker_report(_runtime(args, policy))
    if args.json:
        print(json.dumps([r.to_json() for r in results], indent=2))
    else:
        print(render_text(results))
    return 1 if any(r.status == "FAIL" for r in results) else 0


def _policy(args: argparse.Namespace, server: ServerCheck | None) -> Policy | None:
    """The policy whose sandboxes are checked: the configuration's served one, or ``--policy``'s."""
    from harness.core.policy import load_policy

    if server is not None:
        return server.policy
    if args.policy is not None:
        return load_policy(args.policy)
    return None


def _runtime(args: argparse.Namespace, policy: Policy | None) -> Literal["runc", "runsc"]:
    if args.runtime is not None:
        return args.runtime  # type: ignore[no-any-return]
    return policy.sandbox.runtime if policy is not None else "runc"


def _choice(args: argparse.Namespace, policy: Policy | None, server: ServerCheck | None) -> Any:
    """The engine to check: the flags over the policy's (a configuration's engine is in the
    policy it serves; the file's own when that policy cannot be loaded)."""
    from harness.cli.options import engine_choice
    from harness.core.errors import UsageError
    from harness.engine.select import choice_of

    if policy is not None:
        base = choice_of(policy.engine, policy.ray)
    elif server is not None and server.config is not None:
        base = server.config.engine_choice()
    else:
        base = None
    choice = engine_choice(args, base)
    if choice.ray is not None:
        try:
            return choice.model_copy(update={"ray": choice.ray.anchored(Path.cwd())})
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    return choice
