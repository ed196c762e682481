"""``callbox doctor``'s runtime items: the OCI runtimes the daemon has, and gVisor's health.

``daemon.runtimes`` lists what ``docker info`` calls Runtimes (and the default one).
``daemon.runsc`` says whether a sandbox with ``runtime = "runsc"`` works here: a warning
when the daemon has no runsc (``make runsc`` installs it), else the result of starting one
sandbox under it through the engine (``probe_runsc``), running a command in it and reading
what the command saw (:mod:`harness.doctor.gvisor`: the kernel version gVisor reports, the
runtime Docker recorded): PASS when the command ran under gVisor's kernel, FAIL with the
reason when the sandbox did not start, ran nothing, or ran on the host's kernel after all.
When the sandbox doctor checks item by item already ran under runsc, its evidence is used
instead of starting a second one. ``daemon.runsc_network`` (when the daemon has runsc) says
which network stack its registration gives gVisor (:mod:`harness.engine.runsc_network`):
its own (``--network=sandbox``, what ``make runsc`` sets) passes; the older
``--network=none`` (networked runsc sandboxes are refused) and ``--network=host`` (the
host kernel's stack behind gVisor) warn, with the upgrade.

As with the other items the checks are pure functions (of ``docker info`` and a
:class:`RuntimeProbe`); only :func:`probe_runsc` touches the engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from harness.doctor.evidence import Evidence, gvisor_verdict, host_config, parse_probe
from harness.doctor.gvisor import KERNEL_PROBE, RUNSC, host_kernel_version, judge
from harness.doctor.report import CheckResult, result_maker
from harness.engine.runsc_network import UPGRADE, engine_runsc_stack

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

PROBE_COMMAND = f"{KERNEL_PROBE}; true"
"""Run as a tool process under runsc: the kernel it sees."""
OCI_SECCOMP: Final = "--oci-seccomp"
"""The runsc flag that makes gVisor apply the container's seccomp profile to the tools."""


@dataclass(frozen=True)
class RuntimeProbe:
    """What starting one sandbox under runsc showed."""

    healthy: bool
    reason: str
    """Why it is unhealthy, or what shows it healthy."""
    start_s: float | None = None
    """Seconds from create to an answering agent, when it started."""


def daemon_runtimes(info: Mapping[str, Any]) -> list[str]:
    """The runtime names ``docker info`` lists, sorted."""
    return sorted(str(name) for name in (info.get("Runtimes") or {}))


def check_runtimes(info: Mapping[str, Any]) -> CheckResult:
    make = result_maker("daemon.runtimes")
    names = daemon_runtimes(info)
    default = str(info.get("DefaultRuntime") or "runc")
    if not names:
        return make("WARN", "docker info lists no runtimes (an old or remote engine?); sandboxes use the default, "
                            f"{default}")
    return make("PASS", f"{', '.join(names)} (default {default}); a sandbox chooses with runtime = \"runc\" | "
                        "\"runsc\" in [sandbox] or --runtime")


def check_runsc(info: Mapping[str, Any], probe: RuntimeProbe | None) -> CheckResult:
    make = result_maker("daemon.runsc")
    runtimes = info.get("Runtimes") or {}
    if RUNSC not in runtimes:
        return make("WARN", "the daemon has no runsc runtime, so sandboxes with runtime = \"runsc\" cannot start "
                            "(tools share the host's kernel under runc); `make runsc` installs gVisor and adds it")
    entry = runtimes.get(RUNSC) or {}
    args = [str(a) for a in entry.get("runtimeArgs") or []]
    flags = " ".join(args) or "no flags"
    if OCI_SECCOMP not in args:
        return make("FAIL", f"runsc is configured ({flags}) without {OCI_SECCOMP}, so gVisor would not apply the "
                            "sandbox's seccomp profile and callbox's agent refuses to start there; `make runsc` "
                            "sets the flags callbox needs")
    if probe is None:
        return make("WARN", f"runsc is configured ({entry.get('path', '?')} {flags}) but no sandbox was started "
                            "under it to check it")
    if probe.healthy:
        return make("PASS", f"{probe.reason}; runsc is {entry.get('path', '?')} {flags}")
    return make("FAIL", f"runsc is configured ({flags}) but unhealthy: {probe.reason}")


def check_runsc_network(info: Mapping[str, Any]) -> CheckResult:
    """The network stack of the daemon's runsc (SKIP when the daemon has none)."""
    make = result_maker("daemon.runsc_network")
    stack = engine_runsc_stack(info)
    if stack is None:
        return make("SKIP", "the daemon has no runsc runtime (daemon.runsc)")
    path = str(((info.get("Runtimes") or {}).get(RUNSC) or {}).get("path") or "?")
    if stack == "sandbox":
        return make("PASS", f"gVisor's own network stack (--network=sandbox, through {path}): every network mode "
                            "runs under runsc, a tool's TCP/IP never reaches the host's kernel")
    if stack == "none":
        return make("WARN", "runsc is registered with --network=none (callbox's older setting): sandboxes with "
                            f"network open or allowlist are refused under runsc; {UPGRADE}")
    if stack == "host":
        return make("WARN", "runsc is registered with --network=host: a tool's sockets are the host kernel's (in "
                            f"the container's namespace), weaker than gVisor's own stack; {UPGRADE}")
    return make("WARN", f"runsc is registered with an unknown --network={stack}; {UPGRADE}")


def runtime_checks(info: Mapping[str, Any], probe: RuntimeProbe | None = None) -> list[CheckResult]:
    return [check_runtimes(info), check_runsc(info, probe), check_runsc_network(info)]


def judge_probe_output(text: str, docker_runtime: str | None = None,
                       host_version: str | None = None) -> tuple[bool, str]:
    """Whether ``PROBE_COMMAND``'s output shows gVisor's kernel, and what shows it
    (``docker_runtime``: the runtime Docker recorded; ``host_version``: this host's
    ``uname -v``, when the engine is local)."""
    from dataclasses import replace

    seen = parse_probe(text).kernel
    if seen is None:
        return False, "the sandbox's command printed nothing of its kernel"
    verdict = judge(replace(seen, docker_runtime=docker_runtime, host_version=host_version))
    return verdict.gvisor, verdict.reason


def probe_from_evidence(ev: Evidence) -> RuntimeProbe | None:
    """The runsc item judged from the checked sandbox itself, when Docker ran it under runsc
    and its probe showed its kernel; None otherwise."""
    if str(host_config(ev.container).get("Runtime") or "") != RUNSC:
        return None
    verdict = gvisor_verdict(ev)
    if verdict is None:
        return None
    started = f"a sandbox started in {ev.start_s:.1f} s and " if ev.start_s is not None else ""
    return RuntimeProbe(verdict.gvisor, f"{started}{verdict.reason}" if verdict.gvisor else verdict.reason,
                        ev.start_s)


def probe_runsc(engine: DockerEngine, info: Mapping[str, Any], ev: Evidence | None = None) -> RuntimeProbe | None:
    """Start one sandbox under runsc through the engine's real code path, run
    ``PROBE_COMMAND`` as a tool process, destroy it; None when the daemon has no runsc.
    ``ev``: the checked sandbox's evidence, used instead when it ran under runsc."""
    from harness.core.errors import CallboxError
    from harness.engine.docker.networks import engine_is_local
    from harness.engine.exec_result import collect
    from harness.engine.spec import SandboxSpec

    if RUNSC not in (info.get("Runtimes") or {}):
        return None
    if ev is not None and (known := probe_from_evidence(ev)) is not None:
        return known
    started = time.monotonic()
    try:
        sandbox = engine.create(SandboxSpec(runtime="runsc"))
    except CallboxError as exc:
        return RuntimeProbe(False, f"the sandbox did not start: {exc.message}")
    start_s = time.monotonic() - started
    try:
        result = collect(sandbox.agent.exec_buffered(PROBE_COMMAND, timeout_ms=20_000))
        recorded = _recorded_runtime(engine, sandbox.container_id)
    except CallboxError as exc:
        return RuntimeProbe(False, f"the sandbox started in {start_s:.1f} s but ran no command: {exc.message}",
                            start_s)
    finally:
        sandbox.destroy()
    if result.exit_code != 0:
        return RuntimeProbe(False, f"the sandbox's probe command exited {result.exit_code}", start_s)
    host = host_kernel_version() if engine_is_local(engine.client) else None
    healthy, shown = judge_probe_output(result.stdout.data().decode("utf-8", "replace"), recorded, host)
    if healthy:
        shown = f"a sandbox started in {start_s:.1f} s and {shown}"
    return RuntimeProbe(healthy, shown, start_s)


def _recorded_runtime(engine: DockerEngine, container_id: str) -> str | None:
    """The runtime Docker recorded for a container (None: the default, or not known)."""
    import docker.errors

    try:
        container = engine.client.api.inspect_container(container_id)
    except docker.errors.DockerException:
        return None
    return str((container.get("HostConfig") or {}).get("Runtime") or "") or None
