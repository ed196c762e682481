"""``callbox doctor``'s container items: CIS Docker Benchmark section 5, one sandbox.

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
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from harness.doctor.evidence import (
    Evidence,
    Probe,
    daemon_no_new_privileges,
    daemon_security_options,
    host_config,
    mounts,
    probe_value,
    security_opts,
    under_gvisor,
)
from harness.doctor.report import CheckResult, result_maker

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


NOT_UNDER_GVISOR = "not applicable under gVisor: "
"""How a check that does not apply to a sandbox on gVisor's kernel begins its reason."""


def check_apparmor(container: Mapping[str, Any], info: Mapping[str, Any], gvisor: bool = False) -> CheckResult:
    make = result_maker("5.1")
    if gvisor:
        return make("SKIP", NOT_UNDER_GVISOR + "runsc does not apply AppArmor profiles (it logs that it ignores "
                                               "them); the tools' system calls go to gVisor's kernel, not the host's")
    if "apparmor" not in daemon_security_options(info):
        return make("WARN", APPARMOR_ABSENT)
    profile = container.get("AppArmorProfile") or ""
    if security_opts(container).get("apparmor") == "unconfined" or profile in ("", "unconfined"):
        return make("FAIL", f"the sandbox runs without an AppArmor profile ({profile or 'none'}) "
                            "although the host supports AppArmor")
    return make("PASS", f"profile {profile}")


def check_selinux(container: Mapping[str, Any], info: Mapping[str, Any], gvisor: bool = False) -> CheckResult:
    make = result_maker("5.2")
    if gvisor:
        return make("SKIP", NOT_UNDER_GVISOR + "runsc does not apply SELinux labels; the tools' system calls go to "
                                               "gVisor's kernel, not the host's")
    if "selinux" not in daemon_security_options(info):
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
    make = result_maker("5.3")
    hc = host_config(container)
    added = [_cap_name(c) for c in hc.get("CapAdd") or []]
    dropped = {_cap_name(c) for c in hc.get("CapDrop") or []}
    problems = []
    if "ALL" not in dropped:
        problems.append("not all capabilities are dropped (Docker's default set stays)")
    extra = [c for c in added if c not in AGENT_CAPABILITIES]
    if extra:
        problems.append(f"added beyond SETUID, SETGID, KILL: {', '.join(extra)}")
    cap_eff = probe_value(probe, "CapEff")
    if cap_eff is not None and int(cap_eff or "0", 16) != 0:
        problems.append(f"a tool process has effective capabilities {cap_eff}")
    if problems:
        return make("FAIL", "; ".join(problems))
    kept = ", ".join(c for c in ("SETUID", "SETGID", "KILL") if c in added) or "none"
    seen = " (CapEff 0 observed in one)" if cap_eff is not None else ""
    return make("PASS", f"all dropped, added back: {kept} (the agent keeps them to start tool processes under "
                        f"the tool uid/gid and to signal them); tool processes run with none{seen}")


def check_privileged(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.4")
    if host_config(container).get("Privileged"):
        return make("FAIL", "the sandbox runs privileged: every capability and every host device")
    return make("PASS", "not privileged")


def _is_sensitive(path: str) -> bool:
    norm = "/" + os.path.normpath(path).lstrip("/") if path else ""
    return norm in SENSITIVE_DIRS or any(norm.startswith(tree + "/") for tree in SENSITIVE_TREES)


def check_sensitive_mounts(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.5")
    found = [f"{m.get('Source')} -> {m.get('Destination')} ({'rw' if m.get('RW') else 'ro'})"
             for m in mounts(container) if m.get("Type", "bind") == "bind" and _is_sensitive(str(m.get("Source", "")))]
    if found:
        return make("FAIL", "mounted: " + "; ".join(found))
    binds = [m for m in mounts(container) if m.get("Type", "bind") == "bind"]
    return make("PASS", f"{len(binds)} bind mount(s), none of {', '.join(SENSITIVE_DIRS)} or below "
                        f"{', '.join(SENSITIVE_TREES)}")


def _published_ports(container: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(container port, host port) of every published port."""
    ports: list[tuple[str, int]] = []
    sources = [(container.get("NetworkSettings") or {}).get("Ports") or {},
               host_config(container).get("PortBindings") or {}]
    for source in sources:
        for inner, bindings in source.items():
            for binding in bindings or []:
                host_port = str((binding or {}).get("HostPort") or "")
                if host_port.isdigit() and (inner, int(host_port)) not in ports:
                    ports.append((inner, int(host_port)))
    return ports


def check_privileged_ports(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.7")
    ports = _published_ports(container)
    low = [f"{inner} on host port {host}" for inner, host in ports if 0 < host < 1024]
    if low:
        return make("FAIL", "published on a privileged host port: " + ", ".join(low))
    if not ports:
        return make("PASS", "no port is published")
    return make("PASS", f"{len(ports)} port(s) published, all on host ports >= 1024")


def check_host_network(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.9")
    mode = host_config(container).get("NetworkMode") or "default"
    if mode == "host":
        return make("FAIL", "network mode host: the sandbox shares the host's network stack")
    return make("PASS", f"network mode {mode}")


def check_memory(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.10")
    hc = host_config(container)
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
    make = result_maker("5.11")
    hc = host_config(container)
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
    make = result_maker("5.12")
    if not host_config(container).get("ReadonlyRootfs"):
        return make("FAIL", "the root filesystem is writable")
    scratch = ", ".join(sorted(host_config(container).get("Tmpfs") or {})) or "none"
    return make("PASS", f"read-only; writable scratch only on size-limited tmpfs: {scratch}")


def _namespace_check(check_id: str, key: str, what: str) -> Callable[[Mapping[str, Any]], CheckResult]:
    def check(container: Mapping[str, Any]) -> CheckResult:
        make = result_maker(check_id)
        mode = str(host_config(container).get(key) or "")
        if mode == "host":
            return make("FAIL", f"{key} host: the sandbox shares the host's {what}")
        if mode.startswith("container:"):
            return make("WARN", f"{key} {mode}: shares another container's {what}")
        return make("PASS", f"own {what} ({key} {mode or 'default'})")

    return check


check_host_pid = _namespace_check("5.15", "PidMode", "process namespace")
check_host_uts = _namespace_check("5.20", "UTSMode", "UTS namespace")


def check_host_ipc(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.16")
    mode = str(host_config(container).get("IpcMode") or "")
    if mode == "host":
        return make("FAIL", "IpcMode host: the sandbox shares the host's IPC namespace")
    if mode in ("private", "none"):
        return make("PASS", f"IpcMode {mode}")
    return make("WARN", f"IpcMode {mode or 'default'}: other containers can join this IPC namespace")


def check_devices(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.17")
    hc = host_config(container)
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
    make = result_maker("5.18")
    ulimits = host_config(container).get("Ulimits") or []
    if not ulimits:
        return make("WARN", "no per-container ulimits: the daemon's defaults apply")
    shown = ", ".join(f"{u.get('Name')}={u.get('Soft')}" for u in ulimits)
    return make("PASS", shown)


def check_mount_propagation(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.19")
    shared = [f"{m.get('Destination')} ({m.get('Propagation')})" for m in mounts(container)
              if str(m.get("Propagation") or "") in ("shared", "rshared")]
    if shared:
        return make("FAIL", "shared propagation: " + ", ".join(shared))
    modes = sorted({str(m.get("Propagation") or "default") for m in mounts(container)})
    return make("PASS", f"no shared mounts (propagation: {', '.join(modes) or 'no mounts'})")


def check_seccomp(container: Mapping[str, Any], info: Mapping[str, Any], probe: Probe | None = None,
                  expected_profile: str | None = None) -> CheckResult:
    make = result_maker("5.21")
    value = security_opts(container).get("seccomp")
    if value == "unconfined":
        return make("FAIL", "seccomp=unconfined: no syscall filter")
    if "seccomp" not in daemon_security_options(info):
        return make("FAIL", "the daemon has no seccomp support: no syscall filter applies")
    mode = probe_value(probe, "Seccomp")
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
    make = result_maker("5.24")
    parent = host_config(container).get("CgroupParent") or ""
    if parent:
        return make("WARN", f"custom cgroup parent {parent}: confirm its limits")
    return make("PASS", "the daemon's default cgroup parent")


def check_no_new_privileges(container: Mapping[str, Any], probe: Probe | None = None,
                            daemon_config: Mapping[str, Any] | None = None, gvisor: bool = False) -> CheckResult:
    make = result_maker("5.25")
    value = security_opts(container).get("no-new-privileges")
    set_here = value is not None and value.lower() in ("", "true", "1")
    observed = probe_value(probe, "NoNewPrivs")
    if observed is not None and observed != "1":
        return make("FAIL", f"a tool process has NoNewPrivs {observed}: setuid binaries can raise privileges")
    seen = "; NoNewPrivs 1 observed in a tool process" if observed is not None else \
        "; gVisor's /proc does not show NoNewPrivs, so it was not observed in a tool process" if gvisor else ""
    if set_here:
        return make("PASS", "no-new-privileges set on the container" + seen)
    if daemon_no_new_privileges(daemon_config):
        return make("PASS", "no-new-privileges is the daemon default" + seen)
    return make("FAIL", "no-new-privileges is not set: setuid binaries can raise privileges")


def check_pids_limit(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.28")
    limit = host_config(container).get("PidsLimit")
    if limit is None or int(limit) <= 0:
        return make("FAIL", "no PIDs limit: a fork bomb can exhaust the host's process table")
    return make("PASS", f"pids-limit {limit}")


def check_default_bridge(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.29")
    mode = host_config(container).get("NetworkMode") or "default"
    networks = sorted(((container.get("NetworkSettings") or {}).get("Networks") or {}).keys())
    if mode in ("default", "bridge") or "bridge" in networks:
        return make("FAIL", "on the default bridge: reachable from every other container on docker0")
    if mode == "none":
        return make("PASS", "network none: no network at all, so not on the default bridge")
    if mode == "host":
        return make("PASS", "not on the default bridge (but see 5.9: host network)")
    return make("PASS", f"on network {mode}")


def check_host_userns(container: Mapping[str, Any]) -> CheckResult:
    make = result_maker("5.30")
    mode = str(host_config(container).get("UsernsMode") or "")
    if mode == "host":
        return make("FAIL", "UsernsMode host: the sandbox opts out of user-namespace remapping")
    return make("PASS", "UsernsMode is not host (the sandbox does not opt out of remapping; whether the daemon "
                        "remaps at all is daemon.userns)")


def check_engine_socket(container: Mapping[str, Any], engine_sockets: Iterable[str] = ()) -> CheckResult:
    make = result_maker("5.31")
    sockets = {s for s in engine_sockets if s}
    found = []
    for m in mounts(container):
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
    gvisor = under_gvisor(ev)
    return [
        check_apparmor(c, info, gvisor),
        check_selinux(c, info, gvisor),
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
        check_no_new_privileges(c, probe, ev.daemon_config, gvisor),
        check_pids_limit(c),
        check_default_bridge(c),
        check_host_userns(c),
        check_engine_socket(c, ev.engine_sockets),
    ]

