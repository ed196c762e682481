"""Every check ``callbox doctor`` makes, in one table: its id, title, scope, what it needs to
run, what it checks and the fix when it does not pass.

The checks take their title and scope from here (``report.result_maker``), so the table is
what the report shows; the troubleshooting documentation is generated from it
(:func:`markdown`; ``python -m harness.doctor.catalog`` prints it). ``needs`` says what a
check cannot do without: ``host`` (only this machine), ``engine`` (an answering Docker
engine), ``sandbox`` (a sandbox started on it), ``cluster`` (the Ray cluster) or ``config``
(the server configuration file). When the engine does not answer, the checks that need it
are reported as skipped (``SKIP``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Scope = Literal["engine", "container", "daemon", "host", "cluster", "config"]
Needs = Literal["host", "engine", "sandbox", "cluster", "config"]

_SERVE = "callbox sets it on every sandbox; a FAIL means something between callbox and the container changed it " \
         "(a daemon plugin or default, a modified callbox): find and remove that"


@dataclass(frozen=True)
class CheckInfo:
    id: str
    title: str
    scope: Scope
    needs: Needs
    checks: str
    """What the check looks at, in a sentence."""
    fix: str
    """What to do when it warns or fails."""


CHECKS: tuple[CheckInfo, ...] = (
    # ---- the engine and its sandbox -----------------------------------------------------
    CheckInfo("engine.reachable", "the Docker engine answers", "engine", "engine",
              "The engine DOCKER_HOST names (default unix:///var/run/docker.sock) answers a ping; its version.",
              "Start dockerd (`sudo systemctl start docker`, or `make engine` in a callbox checkout), or point "
              "DOCKER_HOST at a running engine; permission denied on the socket: add the user to the docker group."),
    CheckInfo("engine.sandbox", "a sandbox starts", "engine", "sandbox",
              "One sandbox starts through callbox's own code path (the image, the runtime, the agent answering).",
              "Image missing: `callbox image build`; runtime runsc missing: `make runsc`; otherwise the reason "
              "names the failing step."),
    # ---- CIS Docker Benchmark v1.2.0 section 5, on that sandbox ---------------------------
    CheckInfo("5.1", "AppArmor profile enabled", "container", "sandbox",
              "The sandbox runs under an AppArmor profile when the host has AppArmor. Not applicable under gVisor "
              "(runsc ignores AppArmor profiles; the tools' system calls go to gVisor's kernel).",
              "Host without AppArmor: a warning only. Unconfined: remove apparmor=unconfined from the daemon's "
              "security options."),
    CheckInfo("5.2", "SELinux security options set", "container", "sandbox",
              "The sandbox has an SELinux process label when the daemon enforces SELinux. Not applicable under "
              "gVisor (runsc ignores SELinux labels).",
              "Host without SELinux: a warning only. Disabled label: remove label=disable from the daemon's options."),
    CheckInfo("5.3", "Linux kernel capabilities restricted", "container", "sandbox",
              "All capabilities dropped, only SETUID, SETGID and KILL added back (for the agent); a tool process "
              "runs with none (CapEff 0).", _SERVE),
    CheckInfo("5.4", "privileged containers not used", "container", "sandbox",
              "The sandbox is not privileged.", _SERVE),
    CheckInfo("5.5", "sensitive host system directories not mounted", "container", "sandbox",
              "No bind mount of /, /boot, /dev, /etc, /lib, /proc, /sys, /usr or below them.",
              "Remove the mount from the policy's [[sandbox.mounts]]."),
    CheckInfo("5.7", "privileged ports not mapped", "container", "sandbox",
              "No port is published on a host port below 1024.", _SERVE),
    CheckInfo("5.9", "host network namespace not shared", "container", "sandbox",
              "The sandbox does not use the host's network stack.", _SERVE),
    CheckInfo("5.10", "memory usage limited", "container", "sandbox",
              "A memory limit, with no swap on top of it.",
              "callbox sets memory-swap equal to the limit: swap on top means something changed it, or the "
              "kernel does not account swap (host.cgroup-limits)."),
    CheckInfo("5.11", "CPU priority set", "container", "sandbox", "A CPU limit or CPU shares.", _SERVE),
    CheckInfo("5.12", "root filesystem mounted read only", "container", "sandbox",
              "The root filesystem is read-only; scratch space only on size-limited tmpfs.", _SERVE),
    CheckInfo("5.15", "host PID namespace not shared", "container", "sandbox",
              "The sandbox has its own process namespace.", _SERVE),
    CheckInfo("5.16", "host IPC namespace not shared", "container", "sandbox",
              "The sandbox has a private IPC namespace.", _SERVE),
    CheckInfo("5.17", "host devices not directly exposed", "container", "sandbox",
              "No host devices, device requests or device cgroup rules.", _SERVE),
    CheckInfo("5.18", "default ulimit overridden where needed", "container", "sandbox",
              "Per-sandbox ulimits (nofile, core, fsize).", _SERVE),
    CheckInfo("5.19", "mount propagation mode not shared", "container", "sandbox",
              "No mount with shared propagation.", _SERVE),
    CheckInfo("5.20", "host UTS namespace not shared", "container", "sandbox",
              "The sandbox has its own UTS namespace.", _SERVE),
    CheckInfo("5.21", "default seccomp profile not disabled", "container", "sandbox",
              "callbox's seccomp profile (Docker's default minus io_uring) applies; a tool process runs in filter "
              "mode.",
              "seccomp=unconfined or no seccomp in the daemon: use a daemon and kernel with seccomp."),
    CheckInfo("5.24", "cgroup usage confirmed", "container", "sandbox",
              "The sandbox sits under the daemon's default cgroup parent.",
              "A custom cgroup parent: confirm its limits."),
    CheckInfo("5.25", "restricted from acquiring additional privileges", "container", "sandbox",
              "no-new-privileges is set; a tool process shows NoNewPrivs 1 (gVisor's /proc does not show it).",
              _SERVE),
    CheckInfo("5.28", "PIDs cgroup limit used", "container", "sandbox",
              "A pids limit (a fork bomb stays inside the sandbox).", _SERVE),
    CheckInfo("5.29", "Docker's default bridge docker0 not used", "container", "sandbox",
              "The sandbox is not on docker0 (network none, or a network of its own).", _SERVE),
    CheckInfo("5.30", "host user namespace not shared", "container", "sandbox",
              "The sandbox does not opt out of user-namespace remapping.", _SERVE),
    CheckInfo("5.31", "Docker socket not mounted", "container", "sandbox",
              "No Docker, containerd, CRI-O or Podman socket among the mounts.",
              "Remove the socket's mount from the policy's [[sandbox.mounts]]."),
    # ---- the daemon ----------------------------------------------------------------------
    CheckInfo("daemon.userns", "user-namespace remapping", "daemon", "engine",
              "The daemon remaps uid 0 of a sandbox to an unprivileged host uid (userns-remap or rootless).",
              'Set "userns-remap": "default" in /etc/docker/daemon.json and restart dockerd.'),
    CheckInfo("daemon.live-restore", "live-restore enabled", "daemon", "engine",
              "Sandboxes keep running while dockerd restarts or is upgraded.",
              'Set "live-restore": true in /etc/docker/daemon.json.'),
    CheckInfo("daemon.no-new-privileges", "no-new-privileges as the daemon default", "daemon", "host",
              "daemon.json makes no-new-privileges the default of every container (callbox sets it anyway).",
              'Set "no-new-privileges": true in /etc/docker/daemon.json.'),
    CheckInfo("daemon.log-size", "container log size limited", "daemon", "engine",
              "The json-file logs of sandboxes have a max-size.",
              'Set "log-opts": {"max-size": "10m"} in /etc/docker/daemon.json.'),
    CheckInfo("daemon.runc", "runc has the container-escape fixes", "daemon", "host",
              "runc's version (or its distribution changelog) has the fixes for CVE-2024-21626 and the 2025 "
              "escapes (CVE-2025-31133, CVE-2025-52565, CVE-2025-52881).",
              "Upgrade runc (1.2.8, 1.3.3 or later), or your distribution's package with the backported fixes."),
    CheckInfo("daemon.address-pools", "networked sandboxes", "daemon", "engine",
              "How many more networked sandboxes (allowlist, open) the daemon's address pools leave room for.",
              'Give dockerd more, smaller pools ("default-address-pools" in daemon.json) and remove unused '
              "networks (`callbox gc`, `docker network prune`)."),
    CheckInfo("daemon.runtimes", "OCI runtimes of the daemon", "daemon", "engine",
              "The runtimes docker info lists, and the default one.", "None: it only informs."),
    CheckInfo("daemon.runsc", "gVisor (runsc) sandboxes start and run commands", "daemon", "engine",
              "runsc is a runtime of the daemon with --oci-seccomp, and a sandbox under it runs a command that sees "
              "gVisor's kernel (its uname -v, Docker's recorded runtime; dmesg when readable).",
              "`make runsc` installs gVisor and registers it with the flags callbox needs."),
    CheckInfo("daemon.runsc_network", "gVisor's own network stack for runsc sandboxes", "daemon", "engine",
              "runsc is registered with --network=sandbox: networked runsc sandboxes (open, allowlist) get gVisor's "
              "TCP/IP, not the host kernel's, and network none still only lo.",
              "`sudo make runsc` replaces an older --network=none (or --network=host) registration, then restart "
              "callbox."),
    # ---- the host ------------------------------------------------------------------------
    CheckInfo("host.seccomp", "seccomp available", "host", "engine",
              "The kernel and the daemon support seccomp.", "Use a kernel and a dockerd built with seccomp."),
    CheckInfo("host.cgroup-limits", "the kernel enforces the sandbox limits", "host", "engine",
              "The cgroups enforce memory, swap, pids and CPU quota.",
              "Enable the missing controllers (e.g. swapaccount=1 on the kernel command line)."),
    CheckInfo("host.oom-counter", "OOM-kill counter readable in the sandbox", "host", "sandbox",
              "A tool process can read the cgroup's oom_kill counter, so an OOM kill is reported as oom_killed. "
              "Not applicable under gVisor (its cgroup files have no counter).",
              "Linux 4.13 or later."),
    CheckInfo("host.netfilter", "networked sandboxes can be filtered", "host", "engine",
              "iptables and Docker's DOCKER-USER chain are there, so allowlist and open sandboxes get their filters.",
              "Run callbox as root on the engine's host, with iptables, and let dockerd manage iptables (its "
              "DOCKER-USER chain)."),
    CheckInfo("host.pid-max", "pids for many live sandboxes", "host", "host",
              "kernel.pid_max leaves room for many live sandboxes (each idle one takes about 95 pids).",
              "sysctl -w kernel.pid_max=4194304 (and kernel.pid_max = 4194304 in /etc/sysctl.d/ to keep it)."),
    # ---- the server configuration (doctor --config FILE) ---------------------------------
    CheckInfo("config.file", "the server configuration loads", "config", "config",
              "The file loads and validates as `callbox config check` and `callbox serve` read it.",
              "The reason names the key and the fix."),
    *(CheckInfo(f"config.{door.replace('_', '-')}", f"the {name} can listen", "config", "config",
                f"{key} parses (with the door's own parser) and its port or unix socket is free to bind, or held "
                "by a running callbox serve.",
                "Stop what holds the port (the reason names the process when this user can see it) or choose "
                "another address.")
      for door, name, key in (("grpc", "gRPC door", "[doors.grpc] listen"),
                              ("mcp_http", "MCP HTTP door", "[doors.mcp_http] listen"),
                              ("e2b", "E2B door", "[doors.e2b] listen"),
                              ("http", "HTTP endpoint", "[http] listen"))),
    CheckInfo("config.tokens", "the token file is private and parses", "config", "config",
              "[auth] token_file exists, is a regular file of mode 0600 (no group or other access) and parses "
              "as NAME:TOKEN lines.", "chmod 600 FILE; one NAME:TOKEN line per client."),
    CheckInfo("config.tls-cert", "the TLS certificate is valid", "config", "config",
              "[tls] cert exists, is readable, parses as a PEM certificate and is within its validity dates "
              "(how long until it expires; a warning within 30 days).",
              "Renew the certificate and point [tls] cert at it."),
    CheckInfo("config.tls-key", "the TLS key is private and matches the certificate", "config", "config",
              "[tls] key exists, is readable, parses as an unencrypted PEM private key, is not readable by group "
              "or others, and belongs to [tls] cert.",
              "chmod 600 the key; give the key the certificate was issued for."),
    CheckInfo("config.audit", "the audit store can be written", "config", "config",
              "[audit] db (default $CALLBOX_AUDIT_DB or the state dir): its directory exists, or can be made, "
              "and is writable, and the database file is writable.",
              "Create the directory, or make it writable by the user callbox serve runs as."),
    CheckInfo("config.log", "the log file can be written", "config", "config",
              "[log] file: its directory exists and is writable (absent: standard error).",
              "Create the directory, or make it writable by the user callbox serve runs as."),
    # ---- the Ray engine ------------------------------------------------------------------
    CheckInfo("ray.installed", "Ray installed (2.52 or later, for token authentication)", "cluster", "host",
              "ray is importable here, at 2.52 or later.", "pip install 'callbox[ray]'."),
    CheckInfo("ray.token", "the harness authenticates to the cluster (token)", "cluster", "host",
              "A token file readable by its owner only, and RAY_AUTH_MODE not turning tokens off.",
              "Set [ray] token_file (mode 0600), or unset RAY_AUTH_MODE."),
    CheckInfo("ray.cluster-auth", "the cluster refuses callers without its token", "cluster", "cluster",
              "A call without a token is refused.",
              "Start every node with RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH, the head first."),
    CheckInfo("ray.reachable", "the cluster answers and this machine joins it as a driver", "cluster", "cluster",
              "The cluster answers with the token, and this machine joins it and leaves again.",
              "Check [ray] address and that the head's GCS port is reachable."),
    CheckInfo("ray.nodes", "nodes that hold sandboxes (callbox_sandboxes)", "cluster", "cluster",
              "Nodes advertising the callbox_sandboxes resource, alive, with their capacity.",
              "Start workers with `ray start --address=... --resources='{\"callbox_sandboxes\": N}'`."),
    CheckInfo("ray.images", "each node holds the sandbox image", "cluster", "cluster",
              "Each sandbox node has this machine's sandbox image (by content hash).",
              "The engine loads a missing or stale image when it connects; see its log if it did not."),
)

BY_ID: dict[str, CheckInfo] = {info.id: info for info in CHECKS}


def info(check_id: str) -> CheckInfo:
    """The catalog's entry for ``check_id`` (KeyError: a check missing from the table)."""
    return BY_ID[check_id]


def docker_ids() -> list[str]:
    """The ids a Docker report has, in its order (the engine's, the sandbox's items, the
    daemon's, the host's)."""
    return [i.id for i in CHECKS if i.scope in ("engine", "container", "daemon", "host")]


def markdown() -> str:
    """The catalog as a Markdown table (for the troubleshooting documentation:
    ``python -m harness.doctor.catalog`` prints it)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| check | what it checks | needs | the fix |", "|---|---|---|---|"]
    for item in CHECKS:
        rows.append(f"| `{item.id}` {cell(item.title)} | {cell(item.checks)} | {item.needs} | {cell(item.fix)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown())
