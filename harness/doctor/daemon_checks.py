"""``callbox doctor``'s daemon and host items.

The daemon settings that matter for untrusted code (user-namespace remapping,
live-restore, the daemon-wide no-new-privileges default and log size limits, the CIS
section 2 items of those names, whose numbers differ between versions, so they carry ids
of their own), the runc version against the container-escape fixes and the address pools
left for networked sandboxes (``address_pools``); and what the host
kernel provides (seccomp, enforceable cgroup limits, the OOM-kill counter callbox's
``oom_killed`` needs, the packet filter networked sandboxes need).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from harness.doctor.address_pools import check_address_pools
from harness.doctor.evidence import (
    Evidence,
    Probe,
    daemon_no_new_privileges,
    daemon_security_options,
    host_config,
    under_gvisor,
)
from harness.doctor.report import CheckResult, result_maker
from sandbox.workers import AGENT_OTHER_THREADS, CORE_WORKERS

LEAKY_VESSELS = "CVE-2024-21626"
RUNC_2025 = ("CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881")


# ---- the daemon ----------------------------------------------------------------------------


def check_userns_remap(info: Mapping[str, Any]) -> CheckResult:
    make = result_maker("daemon.userns")
    options = daemon_security_options(info)
    if "rootless" in options:
        return make("PASS", "rootless daemon: uid 0 in a sandbox is the daemon's unprivileged user on the host")
    if "userns" in options:
        return make("PASS", "userns-remap on: uid 0 in a sandbox is an unprivileged subordinate uid on the host")
    return make("WARN", "userns-remap is off: uid 0 in a sandbox (the agent, which keeps SETUID, SETGID and KILL) "
                        "is uid 0 on the host, so an escape from the agent lands as host root; tool processes run "
                        "as an unprivileged uid with no capabilities. Set \"userns-remap\": \"default\" in daemon.json")


def check_live_restore(info: Mapping[str, Any]) -> CheckResult:
    make = result_maker("daemon.live-restore")
    if info.get("LiveRestoreEnabled"):
        return make("PASS", "sandboxes keep running while dockerd restarts or is upgraded")
    return make("WARN", "live-restore is off: restarting or upgrading dockerd stops every sandbox (calls in flight "
                        "fail; gc removes what is left). Set \"live-restore\": true in daemon.json")


def check_daemon_no_new_privileges(daemon_config: Mapping[str, Any] | None, note: str = "") -> CheckResult:
    make = result_maker("daemon.no-new-privileges")
    if daemon_no_new_privileges(daemon_config):
        return make("PASS", "\"no-new-privileges\": true in daemon.json")
    if daemon_config is None or (not daemon_config and note):
        where = note or "daemon.json not readable"
    else:
        where = "daemon.json does not set \"no-new-privileges\": true"
    return make("WARN", f"not the daemon default ({where}): containers started outside callbox can gain privileges "
                        "through setuid binaries; callbox sets it on every sandbox anyway (5.25)")


def check_log_size(container: Mapping[str, Any], info: Mapping[str, Any],
                   daemon_config: Mapping[str, Any] | None) -> CheckResult:
    make = result_maker("daemon.log-size")
    log_config = host_config(container).get("LogConfig") or {}
    driver = str(log_config.get("Type") or info.get("LoggingDriver") or "json-file")
    options = dict((daemon_config or {}).get("log-opts") or {})
    options.update(log_config.get("Config") or {})
    max_size = options.get("max-size")
    if driver == "none":
        return make("PASS", "logging driver none: nothing is kept")
    if driver == "local":
        return make("PASS", f"local driver, max-size {max_size or '20m (its default)'}")
    if driver == "json-file":
        if max_size:
            return make("PASS", f"json-file, max-size {max_size}, max-file {options.get('max-file', '1')}")
        return make("WARN", "json-file without max-size: what a sandbox writes to its stdout/stderr (the agent's "
                            "log) grows on the host without bound. Set \"log-opts\": {\"max-size\": \"10m\"} "
                            "in daemon.json")
    return make("PASS", f"logs go to the {driver} driver, whose retention bounds them")


_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)(?:-rc\.?(\d+))?")
_DISTRO_MARK = re.compile(r"deb\d|ubuntu|\.el\d|\.fc\d|\+ds|dfsg|\.amzn|suse", re.IGNORECASE)


def runc_version(version: Mapping[str, Any], info: Mapping[str, Any], runc_cli: str | None = None
                 ) -> tuple[str, str] | None:
    """(version, build/commit) of the daemon's runc: ``docker version`` components, then
    ``docker info``'s RuncCommit, then ``runc --version``; None when none says."""
    for component in version.get("Components") or []:
        if str(component.get("Name", "")).lower() == "runc" and component.get("Version"):
            details = component.get("Details") or {}
            return str(component["Version"]), str(details.get("GitCommit") or "")
    commit = str((info.get("RuncCommit") or {}).get("ID") or "")
    if _VERSION.match(commit):
        return commit.lstrip("v"), commit
    if runc_cli:
        found = re.search(r"runc version (\S+)", runc_cli)
        if found:
            build = re.search(r"commit: (\S+)", runc_cli)
            return found.group(1), build.group(1) if build else ""
    return None


def _version_key(text: str) -> tuple[int, int, int, float] | None:
    match = _VERSION.match(text)
    if not match:
        return None
    rc = float(match.group(4)) if match.group(4) else float("inf")
    return int(match.group(1)), int(match.group(2)), int(match.group(3)), rc


def _fixed_leaky_vessels(key: tuple[int, int, int, float]) -> bool:
    return key >= (1, 1, 12, float("inf"))


def _fixed_2025(key: tuple[int, int, int, float]) -> bool:
    major, minor = key[0], key[1]
    if (major, minor) < (1, 2):
        return False
    if (major, minor) == (1, 2):
        return key >= (1, 2, 8, float("inf"))
    if (major, minor) == (1, 3):
        return key >= (1, 3, 3, float("inf"))
    if (major, minor) == (1, 4):
        return key >= (1, 4, 0, 3.0)
    return True


def changelog_fixes(changelog: str | None, build: str, version: str) -> set[str] | None:
    """CVE ids a distribution changelog says its package fixes, if the changelog belongs to
    this very build (its first entry names it); None when it cannot be used."""
    if not changelog:
        return None
    first = changelog.lstrip().splitlines()[0] if changelog.strip() else ""
    named = re.search(r"\(([^)]+)\)", first)
    if not named or named.group(1) not in {build, version}:
        return None
    return set(re.findall(r"CVE-\d{4}-\d{4,}", changelog))


def check_runc(version_build: tuple[str, str] | None, changelog: str | None = None) -> CheckResult:
    make = result_maker("daemon.runc")
    if version_build is None:
        return make("WARN", "the runc version is unknown (neither docker version nor runc --version names it)")
    version, build = version_build
    shown = f"runc {version}" + (f" ({build})" if build and build != version else "")
    match = _VERSION.match(version)
    key = _version_key(version)
    if match is None or key is None:
        return make("WARN", f"{shown}: version not recognised, cannot tell which fixes it has")
    # Anything after the upstream version ("+ds1", "-0ubuntu1") marks a distribution build.
    distro = bool(version[match.end():]) or bool(_DISTRO_MARK.search(build))
    backported = changelog_fixes(changelog, build, version)
    leaky_fixed = _fixed_leaky_vessels(key) or (backported is not None and LEAKY_VESSELS in backported)
    missing_2025 = [] if _fixed_2025(key) else [c for c in RUNC_2025 if backported is None or c not in backported]
    notes = []
    if not _fixed_leaky_vessels(key) and leaky_fixed:
        notes.append(f"{LEAKY_VESSELS} fixed by the distribution (its package changelog)")
    if not leaky_fixed:
        if distro and backported is None:
            return make("WARN", f"{shown} is a distribution build of an upstream version without the fix for "
                                f"{LEAKY_VESSELS} (\"Leaky Vessels\", fixed upstream in 1.1.12); distributions "
                                "backport fixes and its changelog could not be read here: check the distribution's "
                                "advisory" + (f"; also missing upstream: {', '.join(missing_2025)}" if missing_2025
                                              else ""))
        return make("FAIL", f"{shown} lacks the fix for {LEAKY_VESSELS} (\"Leaky Vessels\", fixed in 1.1.12): a "
                            "process started in a container can reach the host filesystem through a leaked "
                            "directory descriptor. Upgrade runc")
    if missing_2025:
        unconfirmed = " (a distribution build whose changelog could not be read)" if distro and backported is None \
            else ""
        prefix = f"{shown}{unconfirmed}" + (f": {notes[0]}, but it" if notes else "")
        return make("WARN", f"{prefix} lacks the fixes for {', '.join(missing_2025)} (fixed in 1.2.8, 1.3.3, "
                            "1.4.0-rc.3): escapes through runc's mounts over /dev/null and /dev/console and its "
                            "writes to /proc while it sets a container up; exploiting them needs an "
                            "attacker-controlled image or the power to start racing containers with shared mounts, "
                            "and callbox gives "
                            "sandboxed code neither (a locally built image, rprivate mounts fixed by the policy, no "
                            "engine access). Upgrade runc")
    fixed = ", ".join((LEAKY_VESSELS, *RUNC_2025))
    return make("PASS", f"{shown} has the fixes for {fixed}" + (f" ({notes[0]})" if notes else ""))


def daemon_checks(ev: Evidence) -> list[CheckResult]:
    return [
        check_userns_remap(ev.info),
        check_live_restore(ev.info),
        check_daemon_no_new_privileges(ev.daemon_config, ev.daemon_config_note),
        check_log_size(ev.container, ev.info, ev.daemon_config),
        check_runc(runc_version(ev.version, ev.info, ev.runc_cli), ev.runc_changelog),
        check_address_pools(ev),
    ]


# ---- the host ------------------------------------------------------------------------------


def check_seccomp_available(info: Mapping[str, Any]) -> CheckResult:
    make = result_maker("host.seccomp")
    for entry in info.get("SecurityOptions") or []:
        if "name=seccomp" in str(entry):
            profile = dict(p.partition("=")[::2] for p in str(entry).split(",")).get("profile", "default")
            return make("PASS", f"the kernel and daemon support seccomp (daemon default profile: {profile})")
    return make("FAIL", "the daemon reports no seccomp support: sandboxes would run without a syscall filter")


def check_cgroup_limits(info: Mapping[str, Any]) -> CheckResult:
    make = result_maker("host.cgroup-limits")
    wanted = {"MemoryLimit": "memory", "SwapLimit": "swap", "PidsLimit": "pids", "CpuCfsQuota": "CPU quota"}
    missing = [name for key, name in wanted.items() if info.get(key) is False]
    version = info.get("CgroupVersion") or "1"
    driver = info.get("CgroupDriver") or "?"
    if missing:
        return make("FAIL", f"cgroup v{version} ({driver}) cannot enforce: {', '.join(missing)}; the daemon "
                            "drops those limits with a warning, so sandboxes run without them")
    return make("PASS", f"cgroup v{version} ({driver} driver) enforces memory, swap, pids and CPU quota")


def _counter(text: str | None) -> int | None:
    for line in (text or "").splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def check_oom_counter(info: Mapping[str, Any], probe: Probe | None, gvisor: bool = False) -> CheckResult:
    make = result_maker("host.oom-counter")
    version = info.get("CgroupVersion") or "1"
    if gvisor:
        return make("SKIP", "not applicable under gVisor: the tools see gVisor's own cgroup files, which have no "
                            f"oom_kill counter; the limit is the host's cgroup v{version} around the whole sandbox, "
                            "so a tool over it stops the sandbox, and callbox reports the container killed for "
                            "running out of memory")
    if probe is None:
        return make("WARN", f"cgroup v{version}; the in-sandbox probe did not run, so the counter is unchecked")
    if _counter(probe.oom_control) is not None:
        return make("PASS", f"cgroup v{version}: memory.oom_control has oom_kill, so callbox reports oom_killed")
    if _counter(probe.memory_events) is not None:
        return make("PASS", f"cgroup v{version}: memory.events has oom_kill, so callbox reports oom_killed")
    return make("WARN", f"cgroup v{version}: no oom_kill counter is readable in the sandbox (it needs Linux 4.13+), "
                        "so an OOM kill is reported as a plain SIGKILL (exit 137) without oom_killed")


def check_packet_filter(problem: str | None, remote_engine: bool) -> CheckResult:
    make = result_maker("host.netfilter")
    if remote_engine:
        return make("WARN", "the engine is on another host: callbox cannot install its packet filter there, so "
                            "network modes other than 'none' are refused")
    if problem is not None:
        return make("WARN", f"network modes other than 'none' will be refused: {problem}")
    return make("PASS", "iptables and Docker's DOCKER-USER chain are there: allowlist and open sandboxes get "
                        "filters that keep them from the host, each other and link-local metadata")


SHIM_THREADS = 11
"""Threads of a sandbox's containerd-shim (outside its cgroup, but host pids all the same)."""
PIDS_PER_IDLE_SANDBOX = CORE_WORKERS + AGENT_OTHER_THREADS + 2 + SHIM_THREADS
"""Host pids an idle sandbox holds (30): the agent's core of RPC workers (kept so that a fork
bomb cannot keep it from serving; more start on demand and end when idle) and its other
threads, its spawner, docker-init, and its containerd-shim's threads."""


def check_pid_max(pid_max: int | None, remote_engine: bool) -> CheckResult:
    make = result_maker("host.pid-max")
    if remote_engine or pid_max is None:
        where = "the engine is on another host" if remote_engine else "/proc/sys/kernel/pid_max is not readable"
        return make("WARN", f"unknown: {where}; each idle sandbox takes about {PIDS_PER_IDLE_SANDBOX} of the "
                            "host's pids (kernel.pid_max)")
    room = pid_max // PIDS_PER_IDLE_SANDBOX
    reason = (f"kernel.pid_max {pid_max}: room for about {room} live sandboxes (each idle one takes about "
              f"{PIDS_PER_IDLE_SANDBOX} pids: every thread is one)")
    if room < 500:
        return make("PASS", f"{reason}; for more, raise it: sysctl -w kernel.pid_max=4194304 "
                            "(and kernel.pid_max = 4194304 in /etc/sysctl.d/ to keep it)")
    return make("PASS", reason)


def host_checks(ev: Evidence) -> list[CheckResult]:
    return [check_seccomp_available(ev.info), check_cgroup_limits(ev.info),
            check_oom_counter(ev.info, ev.probe, under_gvisor(ev)),
            check_packet_filter(ev.packet_filter_problem, ev.remote_engine),
            check_pid_max(ev.pid_max, ev.remote_engine)]

