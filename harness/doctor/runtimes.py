"""``callbox doctor``'s runtime items: the OCI runtimes the daemon has, and gVisor's health.

``daemon.runtimes`` lists what ``docker info`` calls Runtimes (and the default one).
``daemon.runsc`` says whether a sandbox with ``runtime = "runsc"`` works here: a warning
when the daemon has no runsc (``make runsc`` installs it), else the result of starting one
sandbox under it through the engine (``probe_runsc``), running a command in it and reading
what the command saw: PASS when the command ran under gVisor's kernel, FAIL with the reason
when the sandbox did not start, ran nothing, or ran on the host's kernel after all.

As with the other items the checks are pure functions (of ``docker info`` and a
:class:`RuntimeProbe`); only :func:`probe_runsc` touches the engine.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from harness.doctor.report import CheckResult, result_maker

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

RUNSC: Final = "runsc"
PROBE_COMMAND = "cat /proc/version; echo '--- dmesg'; dmesg 2>/dev/null | head -n 3; true"
"""Run as a tool process under runsc: the kernel it sees (gVisor's Sentry says so in its
boot log, which ``dmesg`` shows without privilege; the host's log is not readable)."""
GVISOR_MARK = "gVisor"
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
        return make("PASS", f"{probe.reason} ({entry.get('path', '?')} {flags})")
    return make("FAIL", f"runsc is configured ({flags}) but unhealthy: {probe.reason}")


def runtime_checks(info: Mapping[str, Any], probe: RuntimeProbe | None = None) -> list[CheckResult]:
    return [check_runtimes(info), check_runsc(info, probe)]


def judge_probe_output(text: str) -> tuple[bool, str]:
    """Whether ``PROBE_COMMAND``'s output shows gVisor's kernel, and what it shows."""
    kernel, _, dmesg = text.partition("--- dmesg")
    version = kernel.strip().splitlines()[0] if kernel.strip() else "no /proc/version"
    if GVISOR_MARK in dmesg:
        return True, f"the tools run on gVisor's kernel ({version.strip()})"
    return False, f"the sandbox's command did not see gVisor's kernel (it saw {version.strip()!r})"


def probe_runsc(engine: DockerEngine, info: Mapping[str, Any]) -> RuntimeProbe | None:
    """Start one sandbox under runsc through the engine's real code path, run
    ``PROBE_COMMAND`` as a tool process, destroy it; None when the daemon has no runsc."""
    from harness.core.errors import CallboxError
    from harness.engine.exec_result import collect
    from harness.engine.spec import SandboxSpec

    if RUNSC not in (info.get("Runtimes") or {}):
        return None
    started = time.monotonic()
    try:
        sandbox = engine.create(SandboxSpec(runtime="runsc"))
    except CallboxError as exc:
        return RuntimeProbe(False, f"the sandbox did not start: {exc.message}")
    start_s = time.monotonic() - started
    try:
        result = collect(sandbox.agent.exec(PROBE_COMMAND, timeout_ms=20_000))
    except CallboxError as exc:
        return RuntimeProbe(False, f"the sandbox started in {start_s:.1f} s but ran no command: {exc.message}",
                            start_s)
    finally:
        sandbox.destroy()
    if result.exit_code != 0:
        return RuntimeProbe(False, f"the sandbox's probe command exited {result.exit_code}", start_s)
    healthy, shown = judge_probe_output(result.stdout.data().decode("utf-8", "replace"))
    if healthy:
        shown = f"a sandbox started in {start_s:.1f} s and {shown}"
    return RuntimeProbe(healthy, shown, start_s)
