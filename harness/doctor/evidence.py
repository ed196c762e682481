"""The evidence ``callbox doctor`` judges, and how it is gathered.

Every check is a pure function of the evidence (``docker inspect`` of the sandbox,
``docker info``, ``docker version``, ``/etc/docker/daemon.json`` when readable, a probe
run as a tool process inside the sandbox, runc's package changelog when readable, the
engine's networks and, for a local engine, this host's routes, nameservers and dockerd's
command line), so
each is unit-tested against hand-written dicts; ``gather`` collects the evidence from a
live engine, and the readers here pick the fields the checks share out of it.
"""

from __future__ import annotations

import gzip
import ipaddress
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.doctor.gvisor import KERNEL_PROBE, KernelSeen, Verdict, host_kernel_version, judge, parse_kernel

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine, Sandbox

DAEMON_JSON = Path("/etc/docker/daemon.json")
PROC = Path("/proc")
RESOLV_CONF = Path("/etc/resolv.conf")
RUNC_CHANGELOGS = (Path("/usr/share/doc/runc/changelog.Debian.gz"),)
"""Debian and Ubuntu ship the package changelog here; it lists backported CVE fixes."""

PROBE_COMMAND = (
    "grep -E '^(CapEff|NoNewPrivs|Seccomp):' /proc/self/status; "
    "echo '--- memory.oom_control'; cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null; "
    "echo '--- memory.events'; cat /sys/fs/cgroup/memory.events 2>/dev/null; "
    f"{KERNEL_PROBE}; true"
)
"""Run by the agent as a tool process: its own credentials, the cgroup counters and the
kernel it runs on (``gvisor.KERNEL_PROBE``)."""


@dataclass(frozen=True)
class Probe:
    """What a tool process inside the sandbox sees (``PROBE_COMMAND``'s output, parsed)."""

    status: dict[str, str] = field(default_factory=dict)
    """Fields of its /proc/self/status: CapEff, NoNewPrivs, Seccomp."""
    oom_control: str | None = None
    """Text of /sys/fs/cgroup/memory/memory.oom_control (cgroup v1), if readable."""
    memory_events: str | None = None
    """Text of /sys/fs/cgroup/memory.events (cgroup v2), if readable."""
    kernel: KernelSeen | None = None
    """The kernel it runs on (``uname -v``, ``/proc/version``, ``dmesg``)."""


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
                 memory_events=section("memory.events"), kernel=parse_kernel(sections))


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
    networks: tuple[Mapping[str, Any], ...] | None = None
    """``docker network ls`` (each network with its IPAM subnets); None when not listed."""
    networks_note: str = ""
    """Why ``networks`` is None."""
    host_networks: tuple[str, ...] | None = None
    """CIDRs of this host's IPv4 routes and nameservers, which Docker keeps new networks
    clear of; None when the engine is remote (its host's are unknown)."""
    dockerd_args: tuple[str, ...] | None = None
    """dockerd's command line, when it runs on this host and its process is visible."""
    pid_max: int | None = None
    """This host's ``kernel.pid_max`` (every thread of every sandbox takes a pid); None when
    the engine is remote or it cannot be read."""
    host_kernel: str | None = None
    """This host's ``uname -v``, when the engine runs here (a sandbox on runc sees it too)."""
    start_s: float | None = None
    """Seconds from create to an answering agent for the checked sandbox."""
    sandbox_problem: str | None = None
    """Why no sandbox started (then ``container`` is empty and ``probe`` None)."""


def host_config(container: Mapping[str, Any]) -> Mapping[str, Any]:
    return container.get("HostConfig") or {}


def security_opts(container: Mapping[str, Any]) -> dict[str, str]:
    """HostConfig.SecurityOpt as {name: value}; accepts ``k=v``, legacy ``k:v`` and bare ``k``."""
    opts: dict[str, str] = {}
    for item in host_config(container).get("SecurityOpt") or []:
        positions = [i for i in (item.find("="), item.find(":")) if i >= 0]
        if positions:
            cut = min(positions)
            opts[item[:cut].strip().lower()] = item[cut + 1:].strip()
        else:
            opts[item.strip().lower()] = "true"
    return opts


def daemon_security_options(info: Mapping[str, Any]) -> set[str]:
    """``name=...`` of each entry of docker info's SecurityOptions."""
    names = set()
    for entry in info.get("SecurityOptions") or []:
        for part in str(entry).split(","):
            key, _, value = part.partition("=")
            if key == "name":
                names.add(value)
    return names


def mounts(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list(container.get("Mounts") or [])


def probe_value(probe: Probe | None, key: str) -> str | None:
    return None if probe is None else probe.status.get(key)


def daemon_no_new_privileges(config: Mapping[str, Any] | None) -> bool:
    return bool(config) and (config or {}).get("no-new-privileges") is True


def kernel_seen(ev: Evidence) -> KernelSeen | None:
    """What the checked sandbox showed of its kernel, with the runtime Docker recorded for
    it and this host's kernel version; None when its probe did not run."""
    if ev.probe is None or ev.probe.kernel is None:
        return None
    runtime = str(host_config(ev.container).get("Runtime") or "") or None
    return replace(ev.probe.kernel, docker_runtime=runtime, host_version=ev.host_kernel)


def gvisor_verdict(ev: Evidence) -> Verdict | None:
    """Whether the checked sandbox's tools run on gVisor's kernel (None: not known)."""
    seen = kernel_seen(ev)
    return None if seen is None else judge(seen)


def under_gvisor(ev: Evidence) -> bool:
    verdict = gvisor_verdict(ev)
    return verdict is not None and verdict.gvisor


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


def read_host_networks(proc: Path = PROC, resolv_conf: Path = RESOLV_CONF) -> tuple[str, ...]:
    """The IPv4 routes (``/proc/net/route``: little-endian hex destination and mask) and the
    nameservers (as /32s) of this host; what cannot be read is left out."""
    found: list[str] = []
    try:
        rows = (proc / "net" / "route").read_text().splitlines()[1:]
    except OSError:
        rows = []
    for row in rows:
        fields = row.split()
        if len(fields) < 8:
            continue
        try:
            destination = ipaddress.IPv4Address(int(fields[1], 16).to_bytes(4, "little"))
            prefix = bin(int(fields[7], 16)).count("1")
        except ValueError:
            continue
        found.append(f"{destination}/{prefix}")
    try:
        lines = resolv_conf.read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        words = line.split()
        if len(words) >= 2 and words[0] == "nameserver" and ":" not in words[1]:
            found.append(f"{words[1]}/32")
    return tuple(found)


def read_pid_max(proc: Path = PROC) -> int | None:
    """``kernel.pid_max`` of this host, or None if unreadable."""
    try:
        return int((proc / "sys/kernel/pid_max").read_text().strip())
    except (OSError, ValueError):
        return None


def read_dockerd_args(proc: Path = PROC) -> tuple[str, ...] | None:
    """The command line of the dockerd process on this host, None when none is visible."""
    try:
        entries = [e for e in proc.iterdir() if e.name.isdigit()]
    except OSError:
        return None
    for entry in entries:
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if args and os.path.basename(args[0].decode("utf-8", "replace")) == "dockerd":
            return tuple(a.decode("utf-8", "replace") for a in args if a)
    return None


def _list_networks(client: Any) -> tuple[tuple[Mapping[str, Any], ...] | None, str]:
    import docker.errors

    try:
        return tuple(client.api.networks()), ""
    except docker.errors.DockerException as exc:
        return None, f"docker network ls failed: {exc}"


def read_runc_changelog() -> str | None:
    if not _local_engine():
        return None
    for path in RUNC_CHANGELOGS:
        try:
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as handle:
                return handle.read(1 << 20)
        except (OSError, EOFError):
            continue
    return None


def runc_cli() -> str | None:
    try:
        done = subprocess.run(["runc", "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def _probe(sandbox: Sandbox) -> Probe | None:
    from harness.core.errors import CallboxError
    from harness.engine.exec_result import collect

    try:
        result = collect(sandbox.agent.exec_buffered(PROBE_COMMAND, timeout_ms=20_000))
    except CallboxError:
        return None
    if result.exit_code != 0:
        return None
    return parse_probe(result.stdout.data().decode("utf-8", "replace"))


def gather(engine: DockerEngine, runtime: Literal["runc", "runsc"] = "runc") -> Evidence:
    """Start a sandbox through the real code path (under ``runtime``), inspect and probe it,
    destroy it; read the engine's info, version and networks; daemon.json, runc's changelog,
    this host's routes, nameservers, kernel version and dockerd's command line when local.
    A sandbox that does not start leaves its evidence empty and says why (``sandbox_problem``);
    an engine lost on the way is EngineUnavailable."""
    import docker.errors
    import requests

    from harness.core.errors import EngineUnavailable
    from harness.engine.docker.engine import seccomp_profile
    from harness.engine.docker.networks import engine_is_local

    client = engine.client
    try:
        info = client.info()
        version = client.version()
    except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
        raise EngineUnavailable(f"cannot query the Docker engine: {exc}") from None
    container, probe, start_s, problem = _checked_sandbox(engine, runtime)
    daemon_config, note = read_daemon_config()
    networks, networks_note = _list_networks(client)
    local = engine_is_local(client)
    # A rootless daemon lives in a network namespace of its own: this host's routes are not its.
    own_netns = local and "rootless" not in daemon_security_options(info)
    needs_cli = not any(str(c.get("Name", "")).lower() == "runc" for c in version.get("Components") or [])
    return Evidence(
        container=container, info=info, version=version, daemon_config=daemon_config, daemon_config_note=note,
        probe=probe, runc_cli=runc_cli() if needs_cli and _local_engine() else None,
        runc_changelog=read_runc_changelog(), expected_seccomp=seccomp_profile(),
        engine_sockets=(_engine_socket(),),
        packet_filter_problem=engine.networks.packet_filter.problem() if local else None,
        remote_engine=not local, networks=networks, networks_note=networks_note,
        host_networks=read_host_networks() if own_netns else None,
        dockerd_args=read_dockerd_args() if local else None,
        pid_max=read_pid_max() if local else None,
        host_kernel=host_kernel_version() if local else None,
        start_s=start_s, sandbox_problem=problem,
    )


def _checked_sandbox(engine: DockerEngine, runtime: Literal["runc", "runsc"]
                     ) -> tuple[Mapping[str, Any], Probe | None, float | None, str | None]:
    """Start the sandbox the checks look at, inspect and probe it, destroy it: its ``docker
    inspect``, its probe, the seconds it took to start, and why it did not start (then the
    rest is empty)."""
    import time

    import docker.errors

    from harness.core.errors import CallboxError, EngineUnavailable
    from harness.engine.spec import SandboxSpec

    started = time.monotonic()
    try:
        sandbox = engine.create(SandboxSpec(runtime=runtime))
    except EngineUnavailable:
        raise
    except CallboxError as exc:  # no image, no such runtime, an agent that never answered
        return {}, None, None, exc.message
    start_s = time.monotonic() - started
    try:
        try:
            container = engine.client.api.inspect_container(sandbox.container_id)
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot inspect the sandbox: {exc}") from None
        return container, _probe(sandbox), start_s, None
    finally:
        sandbox.destroy()
