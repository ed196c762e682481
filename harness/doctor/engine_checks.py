"""``callbox doctor``'s engine items, and its report when the engine does not answer.

``engine.reachable`` says which engine answered (its version and address), or why none did
and how to fix it: the socket DOCKER_HOST names is missing, not a socket, refused to this
user, or nobody listens on it. ``engine.sandbox`` says whether a sandbox started on it (the
image, the runtime Docker recorded, how long it took), or why not.

Doctor is the tool for exactly the case of no engine, so that case is a report too
(:func:`unreachable_report`): ``engine.reachable`` fails with the cause and the fix, the
checks that need only this host are made, and every other check of the catalog is listed as
skipped because of the engine.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.doctor import catalog
from harness.doctor.report import CheckResult, result_maker

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

DEFAULT_HOST = "unix:///var/run/docker.sock"
START_ENGINE = ("start dockerd (`sudo systemctl start docker`, or `make engine` in a callbox checkout), or set "
                "DOCKER_HOST to an engine that runs")


def engine_host(environ: Mapping[str, str] | None = None) -> str:
    """The engine DOCKER_HOST names, or the default socket."""
    return (os.environ if environ is None else environ).get("DOCKER_HOST") or DEFAULT_HOST


def _host_note(environ: Mapping[str, str] | None = None) -> str:
    set_to = (os.environ if environ is None else environ).get("DOCKER_HOST")
    return f"DOCKER_HOST={set_to}" if set_to else f"DOCKER_HOST is not set, so the default {DEFAULT_HOST}"


def unreachable_cause(host: str, error: str) -> str:
    """Why nothing answers at ``host``, from what can be seen of its socket; ``error`` is the
    client's own message."""
    if not host.startswith("unix://"):
        return f"no answer from {host} ({error})"
    path = Path(host.removeprefix("unix://"))
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return f"there is no socket at {path}: dockerd is not running, or DOCKER_HOST names the wrong path"
    except OSError as exc:
        return f"{path} cannot be looked at ({exc.strerror or exc})"
    if not stat.S_ISSOCK(mode):
        return f"{path} is not a socket: DOCKER_HOST names the wrong path"
    if not os.access(path, os.R_OK | os.W_OK):
        return (f"this user may not use the engine's socket {path} (permission denied): add it to the docker group "
                "(`sudo usermod -aG docker $USER`, then log in again) or run as root")
    return f"nothing answers on {path} ({error}): dockerd stopped, or is still starting"


def check_reachable(version: Mapping[str, Any] | None, problem: str | None = None,
                    environ: Mapping[str, str] | None = None) -> CheckResult:
    """``version``: ``docker version`` of the engine that answered; ``problem``: why none did."""
    make = result_maker("engine.reachable")
    host = engine_host(environ)
    if problem is not None or version is None:
        cause = unreachable_cause(host, problem or "no answer")
        return make("FAIL", f"{cause}; {START_ENGINE} ({_host_note(environ)}). No sandbox can start, so the "
                            "checks that need one are skipped")
    shown = f"Docker {version.get('Version', '?')} (API {version.get('ApiVersion', '?')})"
    return make("PASS", f"{shown} at {host}")


def check_sandbox(container: Mapping[str, Any], start_s: float | None, problem: str | None = None) -> CheckResult:
    """Whether the checked sandbox started (``container``: its ``docker inspect``)."""
    make = result_maker("engine.sandbox")
    if problem is not None:
        return make("FAIL", f"the sandbox did not start: {problem}; the checks of a sandbox are skipped")
    image = str((container.get("Config") or {}).get("Image") or "?")
    runtime = str((container.get("HostConfig") or {}).get("Runtime") or "the daemon's default")
    took = f" in {start_s:.1f} s" if start_s is not None else ""
    return make("PASS", f"image {image}, runtime {runtime}, its agent answered{took}")


def skipped(check_id: str, because: str) -> CheckResult:
    return result_maker(check_id)("SKIP", f"skipped: {because}")


def connect() -> tuple[DockerEngine | None, str | None]:
    """The engine DOCKER_HOST names, or None and the client's reason when it does not answer."""
    import docker
    import docker.errors
    import requests

    from harness.core.errors import short_reason
    from harness.engine.docker.engine import DockerEngine

    try:
        client = docker.from_env(timeout=60)
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        return None, short_reason(exc)
    return DockerEngine(client), None


def host_only_results() -> dict[str, CheckResult]:
    """The checks made without the engine: this host's daemon.json, runc and pid_max."""
    from harness.doctor.daemon_checks import check_daemon_no_new_privileges, check_pid_max, check_runc, runc_version
    from harness.doctor.evidence import read_daemon_config, read_pid_max, read_runc_changelog, runc_cli

    local = engine_host().startswith("unix://")
    config, note = read_daemon_config()
    cli = runc_cli() if local else None
    results = [
        check_daemon_no_new_privileges(config, note),
        check_runc(runc_version({}, {}, cli), read_runc_changelog()),
        check_pid_max(read_pid_max() if local else None, not local),
    ]
    return {r.id: r for r in results}


def unreachable_report(problem: str, environ: Mapping[str, str] | None = None) -> list[CheckResult]:
    """The Docker report when the engine does not answer: every check of the catalog, in
    order; those that need the engine skipped because of it."""
    made = host_only_results()
    because = "no Docker engine answers (engine.reachable)"
    results = []
    for check_id in catalog.docker_ids():
        if check_id == "engine.reachable":
            results.append(check_reachable(None, problem, environ))
        elif check_id in made:
            results.append(made[check_id])
        else:
            results.append(skipped(check_id, because))
    return results
