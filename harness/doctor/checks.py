"""``callbox doctor``: what this host gives a sandbox, checked item by item.

The container items are the CIS Docker Benchmark's section 5 ("Container Runtime"),
numbered as in **CIS Docker Benchmark v1.2.0** (2019-07-29); the same numbering is used
by v1.3.x-v1.5.0 and by docker-bench-security's ``5_container_runtime.sh``. v1.6.0
(2023) inserted "5.1 Ensure swarm mode is not Enabled, if not needed" and shifted every
later item by one (there 5.5 is "privileged containers are not used", 5.29 the PIDs
limit), so add one to compare with v1.6.0 or later. Each check is written here from
the item's published title and audit, applied to one sandbox started through the
harness's real code path (``DockerEngine.create(SandboxSpec())``). Items that cannot
apply are left out: 5.6 sshd, 5.8 needed ports and 5.13 host interface (a sandbox has
no network and publishes nothing), 5.14 restart policy (sandboxes are never
restarted), 5.22/5.23 ``docker exec`` (callbox never uses it), 5.26 health check
(the agent's gRPC health check is used instead), 5.27 latest image (built offline).

Beside them: the daemon settings that matter for untrusted code (user-namespace
remapping, live-restore, the daemon-wide no-new-privileges default and log size
limits, the CIS section 2 items of those names, whose numbers differ between versions,
so they carry ids of their own) and the runc version against the container-escape fixes;
and what the host kernel provides (seccomp, enforceable cgroup limits, the OOM-kill
counter callbox's ``oom_killed`` needs).

Every check is a pure function of the evidence (``docker inspect`` of the sandbox,
``docker info``, ``docker version``, ``/etc/docker/daemon.json`` when readable, a probe
run as a tool process inside the sandbox, runc's package changelog when readable), so
each is unit-tested against hand-written dicts; ``gather`` collects the evidence.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine, Sandbox

Status = Literal["PASS", "WARN", "FAIL"]
Scope = Literal["container", "daemon", "host"]

CIS_VERSION = "CIS Docker Benchmark v1.2.0"
APPARMOR_ABSENT = "AppArmor is not available on this host (host-dependent)"
SELINUX_ABSENT = "SELinux is not available on this host (host-dependent)"
HOST_DEPENDENT_IDS = frozenset({"5.1", "5.2"})
"""Container items whose outcome depends only on what the host kernel offers."""

AGENT_CAPABILITIES = frozenset({"SETUID", "SETGID", "KILL"})
"""The only capabilities a sandbox may add: the agent (uid 0) needs SETUID and SETGID to
start tool processes under the tool uid/gid and KILL to signal and reap their process
trees; tool processes themselves run with an empty capability set."""

# CIS 5.5 names these host directories; the kernel and configuration trees count with
# everything under them (a bind of /etc/shadow is as bad as one of /etc).
SENSITIVE_DIRS = ("/", "/boot", "/dev", "/etc", "/lib", "/proc", "/sys", "/usr")
SENSITIVE_TREES = ("/boot", "/dev", "/etc", "/proc", "/sys")
ENGINE_SOCKET_NAMES = ("docker.sock", "containerd.sock", "dockershim.sock", "crio.sock", "podman.sock")

DAEMON_JSON = Path("/etc/docker/daemon.json")
RUNC_CHANGELOGS = (Path("/usr/share/doc/runc/changelog.Debian.gz"),)
"""Debian and Ubuntu ship the package changelog here; it lists backported CVE fixes."""

LEAKY_VESSELS = "CVE-2024-21626"
RUNC_2025 = ("CVE-2025-31133", "CVE-2025-52565", "CVE-2025-52881")

PROBE_COMMAND = (
    "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
    "echo '--- memory.oom_control'; cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; "
    "echo '--- memory.events'; cat /sys/fs/cgroup/memory.events 2>/dev/null; true"
)
"""Run by the agent as a tool process: its own credentials and the cgroup counters."""


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    status: Status
    reason: str
    scope: Scope

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "status": self.status, "reason": self.reason,
                "scope": self.scope}

    def line(self, id_width: int = 0) -> str:
        return f"{self.status}  {self.id:<{id_width}}  {self.title}: {self.reason}"


@dataclass(frozen=True)
class Probe:
    """What a tool process inside the sandbox sees (``PROBE_COMMAND``'s output, parsed)."""

    status: dict[str, str] = field(default_factory=dict)
    """Fields of its /proc/self/status: CapEff, NoNewPrivs, Seccomp."""
    oom_control: str | None = None
    """Text of /sys/fs/cgroup/memory/memory.oom_control (cgroup v1), if readable."""
    memory_events: str | None = None
    """Text of /sys/fs/cgroup/memory.events (cgroup v2), if readable."""


def parse_probe(text: str) -> Probe:
    status: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("--- "):
            current = sections.setdefault(line[4:].strip(), [])
        elif current is not None:
            current.append(line)
        else:
            key, sep, value = line.partition(":")
            if sep:
                status[key.strip()] = value.strip()

    def section(name: str) -> str | None:
        lines = sections.get(name)
        return "\n".join(lines) if lines else None

    return Probe(status=status, oom_control=section("memory.oom_control"),
                 memory_events=section("memory.events"))


@dataclass(frozen=True)
class Evidence:
    """Everything the checks look at; ``gather`` fills it from a live engine."""

    container: Mapping[str, Any]
    """``docker inspect`` of the sandbox (the low-level API's dict)."""
    info: Mapping[str, Any]
    """``docker info``."""
    version: Mapping[str, Any]
    """``docker version``."""
    daemon_config: Mapping[str, Any] | None
    """Parsed daemon.json; {} when the file does not exist; None when it cannot be read."""
    daemon_config_note: str = ""
    """Why ``daemon_config`` is None or empty (shown in reasons)."""
    probe: Probe | None = None
    runc_cli: str | None = None
    """``runc --version`` output, used only when ``docker version`` does not name runc."""
    runc_changelog: str | None = None
    """runc's distribution changelog, when readable on this (local) host."""
    expected_seccomp: str | None = None
    """callbox's own seccomp profile (compact JSON), to recognise it in SecurityOpt."""
    engine_sockets: tuple[str, ...] = ()
    """Host paths of the engine's socket besides the well-known names."""
    packet_filter_problem: str | None = None
    """Why networked sandboxes would be refused here (``PacketFilter.problem``); None: they work."""
    remote_engine: bool = False
    """The engine is not on this host, so its packet filter cannot be checked from here."""


def _result(check_id: str, title: str, scope: Scope) -> Callable[[Status, str], CheckResult]:
    def make(status: Status, reason: str) -> CheckResult:
        return CheckResult(check_id, title, status, reason, scope)

    return make


def _host_config(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("HostConfig") or {}


def security_opts(container: Mapping[str, Any]) -> dict[str, str]:
    """HostConfig.SecurityOpt as {name: value}; accepts ``k=v``, legacy ``k:v`` and bare ``k``."""
    opts: dict[str, str] = {}
    for item in _host_config(container).get("SecurityOpt") or []:
        positions = [i for i in (item.find("="), item.find(":")) if i >= 0]
        if positions:
            cut = min(positions)
            opts[item[:cut].strip().lower()] = item[cut + 1:].strip()
        else:
            opts[item.strip().lower()] = "true"
    return opts


def _daemon_security_options(info: Mapping[str, Any]) -> set[str]:
    """``name=...`` of each entry of docker info's SecurityOptions."""
    names = set()
    for entry in info.get("SecurityOptions") or []:
        for part in str(entry).split(","):
            key, _, value = part.partition("=")
            if key == "name":
                names.add(value)
    return names


def _mounts(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(container.get("Mounts") or [])


def _probe_value(probe: Probe | None, key: str) -> str | None:
    return None if probe is None else probe.status.get(key)


# ---- section 5: the sandbox container ----------------------------------------------------


def check_apparmor(container: Mapping[str, Any], info: Mapping[str, Any]) -> CheckResult:
    make = _result("5.1", "AppArmor profile enabled", "container")
    if "apparmor" not in _daemon_security_options(info):
        return make("WARN", APPARMOR_ABSENT)
    profile = container.get("AppArmorProfile") or ""
    if security_opts(container).get("apparmor") == "unconfined" or profile in ("", "unconfined"):
        return make("FAIL", f"the sandbox runs without an AppArmor profile ({profile or 'none'}) "
                            "although the host supports AppArmor")
    return make("PASS", f"profile {profile}")


def check_selinux(container: Mapping[str, Any], info: Mapping[str, Any]) -> CheckResult:
    make = _result("5.2", "SELinux security options set", "container")
    if "selinux" not in _daemon_security_options(info):
        return make("WARN", SELINUX_ABSENT)
    label = security_opts(container).get("label", "")
    process_label = container.get("ProcessLabel") or ""
    if label in ("disable", "disabled") or not process_label:
        return make("FAIL", "the sandbox runs without an SELinux process label although the daemon enforces SELinux")
    return make("PASS", f"process label {process_label}")


def _cap_name(cap: str) -> str:
    name = cap.strip().upper()
    return name.removeprefix("CAP_")


def check_capabilities(container: Mapping[str, Any], probe: Probe | None = None) -> CheckResult:
    make = _result("5.3", "Linux kernel capabilities restricted", "container")
    hc = _host_config(container)
    added = [_cap_name(c) for c in hc.get("CapAdd") or []]
    dropped = {_cap_name(c) for c in hc.get("CapDrop") or []}
    problems = []
    if "ALL" not in dropped:
        problems.append("not all capabilities are dropped (Docker's default set stays)")
    extra = [c for c in added if c not in AGENT_CAPABILITIES]
    if extra:
        problems.append(f"added beyond SETUID, SETGID, KILL: {', '.join(extra)}")
    cap_eff = _probe_value(probe, "CapEff")
    if cap_eff is not None and int(cap_eff or "0", 16) != 0:
        problems.append(f"a tool process has effective capabilities {cap_eff}")
    if problems:
        return make("FAIL", "; ".join(problems))
    kept = ", ".join(c for c in ("SETUID", "SETGID", "KILL") if c in added) or "none"
    seen = " (CapEff 0 observed in one)" if cap_eff is not None else ""
    return make("PASS", f"all dropped, added back: {kept} (the agent keeps them to start tool processes under "
                        f"the tool uid/gid and to signal them); tool processes run with none{seen}")


def check_privileged(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.4", "privileged containers not used", "container")
    if _host_config(container).get("Privileged"):
        return make("FAIL", "the sandbox runs privileged: every capability and every host device")
    return make("PASS", "not privileged")


def _is_sensitive(path: str) -> bool:
    norm = "/" + os.path.normpath(path).lstrip("/") if path else ""
    return norm in SENSITIVE_DIRS or any(norm.startswith(tree + "/") for tree in SENSITIVE_TREES)


def check_sensitive_mounts(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.5", "sensitive host system directories not mounted", "container")
    found = [f"{m.get('Source')} -> {m.get('Destination')} ({'rw' if m.get('RW') else 'ro'})"
             for m in _mounts(container) if m.get("Type", "bind") == "bind" and _is_sensitive(str(m.get("Source", "")))]
    if found:
        return make("FAIL", "mounted: " + "; ".join(found))
    binds = [m for m in _mounts(container) if m.get("Type", "bind") == "bind"]
    return make("PASS", f"{len(binds)} bind mount(s), none of {', '.join(SENSITIVE_DIRS)} or below "
                        f"{', '.join(SENSITIVE_TREES)}")


def _published_ports(container: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(container port, host port) of every published port."""
    ports: list[tuple[str, int]] = []
    sources = [(container.get("NetworkSettings") or {}).get("Ports") or {},
               _host_config(container).get("PortBindings") or {}]
    for source in sources:
        for inner, bindings in source.items():
            for binding in bindings or []:
                host_port = str((binding or {}).get("HostPort") or "")
                if host_port.isdigit() and (inner, int(host_port)) not in ports:
                    ports.append((inner, int(host_port)))
    return ports


def check_privileged_ports(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.7", "privileged ports not mapped", "container")
    ports = _published_ports(container)
    low = [f"{inner} on host port {host}" for inner, host in ports if 0 < host < 1024]
    if low:
        return make("FAIL", "published on a privileged host port: " + ", ".join(low))
    if not ports:
        return make("PASS", "no port is published")
    return make("PASS", f"{len(ports)} port(s) published, all on host ports >= 1024")


def check_host_network(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.9", "host network namespace not shared", "container")
    mode = _host_config(container).get("NetworkMode") or "default"
    if mode == "host":
        return make("FAIL", "network mode host: the sandbox shares the host's network stack")
    return make("PASS", f"network mode {mode}")


def check_memory(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.10", "memory usage limited", "container")
    hc = _host_config(container)
    memory = int(hc.get("Memory") or 0)
    swap = int(hc.get("MemorySwap") or 0)
    if memory <= 0:
        return make("FAIL", "no memory limit: one sandbox can exhaust the host's memory")
    mib = f"{memory / (1 << 20):g} MiB"
    if swap == memory:
        return make("PASS", f"{mib}, no swap (memory-swap equals it)")
    if swap < 0:
        return make("WARN", f"{mib}, but unlimited swap (memory-swap -1)")
    return make("WARN", f"{mib}, but {max(swap - memory, 0) / (1 << 20):g} MiB of swap on top "
                        "(callbox sets memory-swap equal to the limit)")


def check_cpu(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.11", "CPU priority set", "container")
    hc = _host_config(container)
    nano = int(hc.get("NanoCpus") or 0)
    quota, period = int(hc.get("CpuQuota") or 0), int(hc.get("CpuPeriod") or 0) or 100_000
    shares = int(hc.get("CpuShares") or 0)
    parts = []
    if nano > 0:
        parts.append(f"{nano / 1e9:g} CPU(s)")
    if quota > 0:
        parts.append(f"CFS quota {quota / period:g} CPU(s)")
    if shares > 0:
        parts.append(f"cpu-shares {shares}")
    if not parts:
        return make("FAIL", "no CPU limit or shares: one sandbox can take every core")
    return make("PASS", ", ".join(parts))


def check_read_only_root(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.12", "root filesystem mounted read only", "container")
    if not _host_config(container).get("ReadonlyRootfs"):
        return make("FAIL", "the root filesystem is writable")
    scratch = ", ".join(sorted(_host_config(container).get("Tmpfs") or {})) or "none"
    return make("PASS", f"read-only; writable scratch only on size-limited tmpfs: {scratch}")


def _namespace_check(check_id: str, title: str, key: str, what: str) -> Callable[[Mapping[str, Any]], CheckResult]:
    def check(container: Mapping[str, Any]) -> CheckResult:
        make = _result(check_id, title, "container")
        mode = str(_host_config(container).get(key) or "")
        if mode == "host":
            return make("FAIL", f"{key} host: the sandbox shares the host's {what}")
        if mode.startswith("container:"):
            return make("WARN", f"{key} {mode}: shares another container's {what}")
        return make("PASS", f"own {what} ({key} {mode or 'default'})")

    return check


check_host_pid = _namespace_check("5.15", "host PID namespace not shared", "PidMode", "process namespace")
check_host_uts = _namespace_check("5.20", "host UTS namespace not shared", "UTSMode", "UTS namespace")


def check_host_ipc(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.16", "host IPC namespace not shared", "container")
    mode = str(_host_config(container).get("IpcMode") or "")
    if mode == "host":
        return make("FAIL", "IpcMode host: the sandbox shares the host's IPC namespace")
    if mode in ("private", "none"):
        return make("PASS", f"IpcMode {mode}")
    return make("WARN", f"IpcMode {mode or 'default'}: other containers can join this IPC namespace")


def check_devices(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.17", "host devices not directly exposed", "container")
    hc = _host_config(container)
    devices = [str(d.get("PathOnHost", d)) for d in hc.get("Devices") or []]
    requests = hc.get("DeviceRequests") or []
    rules = hc.get("DeviceCgroupRules") or []
    if devices or requests or rules:
        what = list(devices)
        if requests:
            what.append(f"{len(requests)} device request(s)")
        if rules:
            what.append(f"device cgroup rules {', '.join(map(str, rules))}")
        return make("FAIL", "exposed: " + ", ".join(what))
    return make("PASS", "no host devices, device requests or device cgroup rules")


def check_ulimits(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.18", "default ulimit overridden where needed", "container")
    ulimits = _host_config(container).get("Ulimits") or []
    if not ulimits:
        return make("WARN", "no per-container ulimits: the daemon's defaults apply")
    shown = ", ".join(f"{u.get('Name')}={u.get('Soft')}" for u in ulimits)
    return make("PASS", shown)


def check_mount_propagation(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.19", "mount propagation mode not shared", "container")
    shared = [f"{m.get('Destination')} ({m.get('Propagation')})" for m in _mounts(container)
              if str(m.get("Propagation") or "") in ("shared", "rshared")]
    if shared:
        return make("FAIL", "shared propagation: " + ", ".join(shared))
    modes = sorted({str(m.get("Propagation") or "default") for m in _mounts(container)})
    return make("PASS", f"no shared mounts (propagation: {', '.join(modes) or 'no mounts'})")


def check_seccomp(container: Mapping[str, Any], info: Mapping[str, Any], probe: Probe | None = None,
                  expected_profile: str | None = None) -> CheckResult:
    make = _result("5.21", "default seccomp profile not disabled", "container")
    value = security_opts(container).get("seccomp")
    if value == "unconfined":
        return make("FAIL", "seccomp=unconfined: no syscall filter")
    if "seccomp" not in _daemon_security_options(info):
        return make("FAIL", "the daemon has no seccomp support: no syscall filter applies")
    mode = _probe_value(probe, "Seccomp")
    if mode is not None and mode != "2":
        return make("FAIL", f"a tool process runs with seccomp mode {mode} (2 = filter)")
    seen = "; filter mode observed in a tool process" if mode is not None else ""
    if value is None:
        return make("WARN", "Docker's default profile, which still allows io_uring on Docker 20.10; "
                            "callbox ships a profile without it" + seen)
    if value.startswith("{"):
        try:
            compact = json.dumps(json.loads(value), separators=(",", ":"))
        except ValueError:
            compact = value
        if expected_profile is not None and compact == expected_profile:
            return make("PASS", "callbox's profile, Docker's default minus io_uring_*" + seen)
        return make("PASS", "a custom profile" + seen)
    return make("PASS", f"profile {value}{seen}")


def check_cgroup_parent(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.24", "cgroup usage confirmed", "container")
    parent = _host_config(container).get("CgroupParent") or ""
    if parent:
        return make("WARN", f"custom cgroup parent {parent}: confirm its limits")
    return make("PASS", "the daemon's default cgroup parent")


def _daemon_no_new_privileges(config: Mapping[str, Any] | None) -> bool:
    return bool(config) and (config or {}).get("no-new-privileges") is True


def check_no_new_privileges(container: Mapping[str, Any], probe: Probe | None = None,
                            daemon_config: Mapping[str, Any] | None = None) -> CheckResult:
    make = _result("5.25", "restricted from acquiring additional privileges", "container")
    value = security_opts(container).get("no-new-privileges")
    set_here = value is not None and value.lower() in ("", "true", "1")
    observed = _probe_value(probe, "NoNewPrivs")
    if observed is not None and observed != "1":
        return make("FAIL", f"a tool process has NoNewPrivs {observed}: setuid binaries can raise privileges")
    seen = "; NoNewPrivs 1 observed in a tool process" if observed is not None else ""
    if set_here:
        return make("PASS", "no-new-privileges set on the container" + seen)
    if _daemon_no_new_privileges(daemon_config):
        return make("PASS", "no-new-privileges is the daemon default" + seen)
    return make("FAIL", "no-new-privileges is not set: setuid binaries can raise privileges")


def check_pids_limit(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.28", "PIDs cgroup limit used", "container")
    limit = _host_config(container).get("PidsLimit")
    if limit is None or int(limit) <= 0:
        return make("FAIL", "no PIDs limit: a fork bomb can exhaust the host's process table")
    return make("PASS", f"pids-limit {limit}")


def check_default_bridge(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.29", "Docker's default bridge docker0 not used", "container")
    mode = _host_config(container).get("NetworkMode") or "default"
    networks = sorted(((container.get("NetworkSettings") or {}).get("Networks") or {}).keys())
    if mode in ("default", "bridge") or "bridge" in networks:
        return make("FAIL", "on the default bridge: reachable from every other container on docker0")
    if mode == "none":
        return make("PASS", "network none: no network at all, so not on the default bridge")
    if mode == "host":
        return make("PASS", "not on the default bridge (but see 5.9: host network)")
    return make("PASS", f"on network {mode}")


def check_host_userns(container: Mapping[str, Any]) -> CheckResult:
    make = _result("5.30", "host user namespace not shared", "container")
    mode = str(_host_config(container).get("UsernsMode") or "")
    if mode == "host":
        return make("FAIL", "UsernsMode host: the sandbox opts out of user-namespace remapping")
    return make("PASS", "UsernsMode is not host (the sandbox does not opt out of remapping; whether the daemon "
                        "remaps at all is daemon.userns)")


def check_engine_socket(container: Mapping[str, Any], engine_sockets: Iterable[str] = ()) -> CheckResult:
    make = _result("5.31", "Docker socket not mounted", "container")
    sockets = {s for s in engine_sockets if s}
    found = []
    for m in _mounts(container):
        for path in (str(m.get("Source") or ""), str(m.get("Destination") or "")):
            if path in sockets or os.path.basename(path) in ENGINE_SOCKET_NAMES:
                found.append(f"{m.get('Source')} -> {m.get('Destination')}")
                break
    if found:
        return make("FAIL", "an engine socket is mounted (control of the engine is root on the host): "
                            + "; ".join(found))
    return make("PASS", "no Docker or containerd socket among the mounts")


def container_checks(ev: Evidence) -> list[CheckResult]:
    c, info, probe = ev.container, ev.info, ev.probe
    return [
        check_apparmor(c, info),
        check_selinux(c, info),
        check_capabilities(c, probe),
        check_privileged(c),
        check_sensitive_mounts(c),
        check_privileged_ports(c),
        check_host_network(c),
        check_memory(c),
        check_cpu(c),
        check_read_only_root(c),
        check_host_pid(c),
        check_host_ipc(c),
        check_devices(c),
        check_ulimits(c),
        check_mount_propagation(c),
        check_host_uts(c),
        check_seccomp(c, info, probe, ev.expected_seccomp),
        check_cgroup_parent(c),
        check_no_new_privileges(c, probe, ev.daemon_config),
        check_pids_limit(c),
        check_default_bridge(c),
        check_host_userns(c),
        check_engine_socket(c, ev.engine_sockets),
    ]


# ---- the daemon ----------------------------------------------------------------------------


def check_userns_remap(info: Mapping[str, Any]) -> CheckResult:
    make = _result("daemon.userns", "user-namespace remapping", "daemon")
    options = _daemon_security_options(info)
    if "rootless" in options:
        return make("PASS", "rootless daemon: uid 0 in a sandbox is the daemon's unprivileged user on the host")
    if "userns" in options:
        return make("PASS", "userns-remap on: uid 0 in a sandbox is an unprivileged subordinate uid on the host")
    return make("WARN", "userns-remap is off: uid 0 in a sandbox (the agent, which keeps SETUID, SETGID and KILL) "
                        "is uid 0 on the host, so an escape from the agent lands as host root; tool processes run "
                        "as an unprivileged uid with no capabilities. Set \"userns-remap\": \"default\" in daemon.json")


def check_live_restore(info: Mapping[str, Any]) -> CheckResult:
    make = _result("daemon.live-restore", "live-restore enabled", "daemon")
    if info.get("LiveRestoreEnabled"):
        return make("PASS", "sandboxes keep running while dockerd restarts or is upgraded")
    return make("WARN", "live-restore is off: restarting or upgrading dockerd stops every sandbox (calls in flight "
                        "fail; gc removes what is left). Set \"live-restore\": true in daemon.json")


def check_daemon_no_new_privileges(daemon_config: Mapping[str, Any] | None, note: str = "") -> CheckResult:
    make = _result("daemon.no-new-privileges", "no-new-privileges as the daemon default", "daemon")
    if _daemon_no_new_privileges(daemon_config):
        return make("PASS", "\"no-new-privileges\": true in daemon.json")
    if daemon_config is None or (not daemon_config and note):
        where = note or "daemon.json not readable"
    else:
        where = "daemon.json does not set \"no-new-privileges\": true"
    return make("WARN", f"not the daemon default ({where}): containers started outside callbox can gain privileges "
                        "through setuid binaries; callbox sets it on every sandbox anyway (5.25)")


def check_log_size(container: Mapping[str, Any], info: Mapping[str, Any],
                   daemon_config: Mapping[str, Any] | None) -> CheckResult:
    make = _result("daemon.log-size", "container log size limited", "daemon")
    log_config = _host_config(container).get("LogConfig") or {}
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
    make = _result("daemon.runc", "runc has the container-escape fixes", "daemon")
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
    ]


# ---- the host ------------------------------------------------------------------------------


def check_seccomp_available(info: Mapping[str, Any]) -> CheckResult:
    make = _result("host.seccomp", "seccomp available", "host")
    for entry in info.get("SecurityOptions") or []:
        if "name=seccomp" in str(entry):
            profile = dict(p.partition("=")[::2] for p in str(entry).split(",")).get("profile", "default")
            return make("PASS", f"the kernel and daemon support seccomp (daemon default profile: {profile})")
    return make("FAIL", "the daemon reports no seccomp support: sandboxes would run without a syscall filter")


def check_cgroup_limits(info: Mapping[str, Any]) -> CheckResult:
    make = _result("host.cgroup-limits", "the kernel enforces the sandbox limits", "host")
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


def check_oom_counter(info: Mapping[str, Any], probe: Probe | None) -> CheckResult:
    make = _result("host.oom-counter", "OOM-kill counter readable in the sandbox", "host")
    version = info.get("CgroupVersion") or "1"
    if probe is None:
        return make("WARN", f"cgroup v{version}; the in-sandbox probe did not run, so the counter is unchecked")
    if _counter(probe.oom_control) is not None:
        return make("PASS", f"cgroup v{version}: memory.oom_control has oom_kill, so callbox reports oom_killed")
    if _counter(probe.memory_events) is not None:
        return make("PASS", f"cgroup v{version}: memory.events has oom_kill, so callbox reports oom_killed")
    return make("WARN", f"cgroup v{version}: no oom_kill counter is readable in the sandbox (it needs Linux 4.13+), "
                        "so an OOM kill is reported as a plain SIGKILL (exit 137) without oom_killed")


def check_packet_filter(problem: str | None, remote_engine: bool) -> CheckResult:
    make = _result("host.netfilter", "networked sandboxes can be filtered", "host")
    if remote_engine:
        return make("WARN", "the engine is on another host: callbox cannot install its packet filter there, so "
                            "network modes other than 'none' are refused")
    if problem is not None:
        return make("WARN", f"network modes other than 'none' will be refused: {problem}")
    return make("PASS", "iptables and Docker's DOCKER-USER chain are there: allowlist and open sandboxes get "
                        "filters that keep them from the host, each other and link-local metadata")


def host_checks(ev: Evidence) -> list[CheckResult]:
    return [check_seccomp_available(ev.info), check_cgroup_limits(ev.info), check_oom_counter(ev.info, ev.probe),
            check_packet_filter(ev.packet_filter_problem, ev.remote_engine)]


def run_checks(ev: Evidence) -> list[CheckResult]:
    return [*container_checks(ev), *daemon_checks(ev), *host_checks(ev)]


def summary(results: Iterable[CheckResult]) -> str:
    items = list(results)
    counts = {s: sum(r.status == s for r in items) for s in ("PASS", "WARN", "FAIL")}
    return (f"callbox doctor: {len(items)} checks, {counts['PASS']} pass, {counts['WARN']} warn, "
            f"{counts['FAIL']} fail (container items: {CIS_VERSION} section 5 numbering)")


def render_text(results: Iterable[CheckResult]) -> str:
    items = list(results)
    width = max((len(r.id) for r in items), default=0)
    return "\n".join([*(r.line(width) for r in items), summary(items)])


# ---- gathering the evidence (the only part that touches the engine and the host) ----------


def _local_engine() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return not host or host.startswith("unix://")


def _engine_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


def read_daemon_config(path: Path = DAEMON_JSON) -> tuple[dict[str, Any] | None, str]:
    """(settings, note): {} when the file is absent, None when it cannot be read or parsed."""
    if not _local_engine():
        return None, "not readable: the engine is remote"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}, f"no {path}: the daemon runs on its defaults"
    except OSError as exc:
        return None, f"{path} not readable: {exc.strerror or exc}"
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError as exc:
        return None, f"{path} is not valid JSON: {exc}"
    return (data, "") if isinstance(data, dict) else (None, f"{path} is not a JSON object")


def _read_runc_changelog() -> str | None:
    if not _local_engine():
        return None
    for path in RUNC_CHANGELOGS:
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
                return handle.read(1 << 20)
        except (OSError, EOFError):
            continue
    return None


def _runc_cli() -> str | None:
    try:
        done = subprocess.run(["runc", "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _probe(sandbox: Sandbox) -> Probe | None:
    from harness.core.errors import CallboxError
    from harness.engine.exec_result import collect

    try:
        result = collect(sandbox.agent.exec(PROBE_COMMAND, timeout_ms=20_000))
    except CallboxError:
        return None
    if result.exit_code != 0:
        return None
    return parse_probe(result.stdout.data().decode("utf-8", "replace"))


def gather(engine: DockerEngine) -> Evidence:
    """Start a sandbox through the real code path, inspect and probe it, destroy it; read
    the engine's info and version, daemon.json and runc's changelog when local."""
    import docker.errors

    from harness.core.errors import EngineUnavailable
    from harness.engine.docker.engine import seccomp_profile
    from harness.engine.docker.networks import engine_is_local
    from harness.engine.spec import SandboxSpec

    client = engine.client
    try:
        info = client.info()
        version = client.version()
    except docker.errors.DockerException as exc:
        raise EngineUnavailable(f"cannot query the Docker engine: {exc}") from None
    sandbox = engine.create(SandboxSpec())
    try:
        try:
            container = client.api.inspect_container(sandbox.container_id)
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot inspect the sandbox: {exc}") from None
        probe = _probe(sandbox)
    finally:
        sandbox.destroy()
    daemon_config, note = read_daemon_config()
    needs_cli = not any(str(c.get("Name", "")).lower() == "runc" for c in version.get("Components") or [])
    return Evidence(
        container=container, info=info, version=version, daemon_config=daemon_config, daemon_config_note=note,
        probe=probe, runc_cli=_runc_cli() if needs_cli and _local_engine() else None,
        runc_changelog=_read_runc_changelog(), expected_seccomp=seccomp_profile(),
        engine_sockets=(_engine_socket(),),
        packet_filter_problem=engine.networks.packet_filter.problem() if engine_is_local(client) else None,
        remote_engine=not engine_is_local(client),
    )
