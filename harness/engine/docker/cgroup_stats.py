"""CPU time, memory and process count of a sandbox, read from its cgroup on the host.

The container's cgroup is found from the engine's cgroup driver: ``/docker/<id>`` with
``cgroupfs``, ``/system.slice/docker-<id>.scope`` with ``systemd`` (callbox sets no cgroup
parent of its own), tried under each cgroup mount of this host (``/proc/self/mountinfo``:
cgroup v2's unified tree and v1's per-controller trees, hybrid hosts included). If neither
exists (the daemon has a ``cgroup-parent`` of its own, or runs in a cgroup namespace), the
container's init process tells where it is (``/proc/<pid>/cgroup``). When the files are not
reachable at all (a remote engine, or one in a VM) the Docker stats API answers instead
(``one_shot``: one sample, no two-cycle wait).

Memory is what ``docker stats`` shows: usage minus the inactive file cache (tmpfs pages,
the sandbox's scratch files, count: they are shared memory, not file cache). Reading works
while the sandbox is paused (the freezer stops its processes, not its counters).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors

log = logging.getLogger("callbox.engine")

MAX_REMEMBERED = 1024
"""Cgroup paths remembered per reader."""


@dataclass(frozen=True)
class SandboxStats:
    """One reading of a sandbox's cgroup."""

    cpu_usage_s: float
    """CPU time of all its processes since it started (user + system), in seconds."""
    memory_bytes: int
    """Memory in use now (without inactive file cache), in bytes."""
    pids: int
    """Processes and threads now (the agent's included)."""
    source: str
    """Where it was read: ``cgroup v1``, ``cgroup v2`` or ``docker stats``."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class _Mount:
    point: Path
    root: str

    def directory(self, cgroup: str) -> Path | None:
        """Where cgroup path ``cgroup`` (as /proc/<pid>/cgroup names it) is under this mount."""
        if self.root == "/":
            return self.point / cgroup.lstrip("/")
        if cgroup == self.root or cgroup.startswith(self.root.rstrip("/") + "/"):
            return self.point / cgroup[len(self.root):].lstrip("/")
        return None


def _parse_mountinfo(text: str) -> tuple[_Mount | None, dict[str, _Mount]]:
    """The cgroup v2 mount and the v1 mount of each controller, from mountinfo lines."""
    unified: _Mount | None = None
    v1: dict[str, _Mount] = {}
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3:
            continue
        mount = _Mount(Path(fields[4].replace("\\040", " ")), fields[3])
        if tail[0] == "cgroup2" and unified is None:
            unified = mount
        elif tail[0] == "cgroup":
            for option in tail[2].split(","):
                if option in ("cpuacct", "memory", "pids"):
                    v1.setdefault(option, mount)
    return unified, v1


def _read_int(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _read_keyed(path: Path, key: str) -> int | None:
    """The value of ``key`` in a ``key value`` per line file (``cpu.stat``, ``memory.stat``)."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        return None
    return None


class CgroupReader:
    """Reads containers' cgroup files on this host (the engine's host, when it is local)."""

    def __init__(self, *, driver: str = "cgroupfs", version: str = "2", proc: Path = Path("/proc")) -> None:
        self.driver = driver
        self.version = version
        self.proc = proc
        self._mounts: tuple[_Mount | None, dict[str, _Mount]] | None = None
        self._found: dict[str, tuple[str, ...]] = {}
        """Container id to the cgroup path(s) found for it, so a reading is a few file reads."""

    def _mount_table(self) -> tuple[_Mount | None, dict[str, _Mount]]:
        if self._mounts is None:
            try:
                self._mounts = _parse_mountinfo((self.proc / "self" / "mountinfo").read_text())
            except OSError:
                self._mounts = (None, {})
        return self._mounts

    def _candidates(self, container_id: str, pid: int | None) -> list[str]:
        paths = [f"/docker/{container_id}", f"/system.slice/docker-{container_id}.scope"]
        if self.driver == "systemd":
            paths.reverse()
        if pid:
            with contextlib.suppress(OSError):
                for line in (self.proc / str(pid) / "cgroup").read_text().splitlines():
                    _, controllers, path = line.split(":", 2)
                    if controllers in ("", "memory") and path not in paths:
                        paths.insert(0, path)
        return paths

    def read(self, container_id: str, pid: int | None = None) -> SandboxStats | None:
        """The container's stats from its cgroup files, or None if they are not reachable
        here. ``pid`` (its init process on the host) helps find an unusual cgroup path."""
        for cgroup in self._found.get(container_id) or self._candidates(container_id, pid):
            stats = self._read_v1(cgroup) if self.version == "1" else None
            stats = stats or self._read_v2(cgroup) or self._read_v1(cgroup)
            if stats is not None:
                if len(self._found) >= MAX_REMEMBERED:
                    self._found.clear()  # containers come and go: never grow without bound
                self._found[container_id] = (cgroup,)
                return stats
        self._found.pop(container_id, None)
        return None

    def _read_v2(self, cgroup: str) -> SandboxStats | None:
        unified, _ = self._mount_table()
        directory = unified.directory(cgroup) if unified is not None else None
        if directory is None:
            return None
        usage_us = _read_keyed(directory / "cpu.stat", "usage_usec")
        memory = _read_int(directory / "memory.current")
        if usage_us is None or memory is None:
            return None
        inactive = _read_keyed(directory / "memory.stat", "inactive_file") or 0
        return SandboxStats(cpu_usage_s=usage_us / 1e6, memory_bytes=max(0, memory - inactive),
                            pids=_read_int(directory / "pids.current") or 0, source="cgroup v2")

    def _read_v1(self, cgroup: str) -> SandboxStats | None:
        _, v1 = self._mount_table()
        cpu_mount, memory_mount, pids_mount = v1.get("cpuacct"), v1.get("memory"), v1.get("pids")
        cpu_dir = cpu_mount.directory(cgroup) if cpu_mount is not None else None
        memory_dir = memory_mount.directory(cgroup) if memory_mount is not None else None
        if cpu_dir is None or memory_dir is None:
            return None
        usage_ns = _read_int(cpu_dir / "cpuacct.usage")
        memory = _read_int(memory_dir / "memory.usage_in_bytes")
        if usage_ns is None or memory is None:
            return None
        inactive = _read_keyed(memory_dir / "memory.stat", "total_inactive_file") or 0
        pids_dir = pids_mount.directory(cgroup) if pids_mount is not None else None
        pids = _read_int(pids_dir / "pids.current") if pids_dir is not None else None
        return SandboxStats(cpu_usage_s=usage_ns / 1e9, memory_bytes=max(0, memory - inactive),
                            pids=pids or 0, source="cgroup v1")


def stats_from_api(client: docker.DockerClient, container_id: str) -> SandboxStats | None:
    """One sample from the Docker stats API (when the cgroup files are not reachable)."""
    api = client.api
    try:
        try:
            sample: dict[str, Any] = api.stats(container_id, stream=False, one_shot=True)
        except docker.errors.InvalidVersion:
            sample = api.stats(container_id, stream=False)
    except docker.errors.DockerException as exc:
        log.debug("no stats for container %s: %s", container_id[:12], exc)
        return None
    cpu = ((sample.get("cpu_stats") or {}).get("cpu_usage") or {}).get("total_usage")
    memory_stats = sample.get("memory_stats") or {}
    usage = memory_stats.get("usage")
    if cpu is None or usage is None:
        return None  # a stopped container has no stats
    detail = memory_stats.get("stats") or {}
    inactive = detail.get("total_inactive_file", detail.get("inactive_file", 0))
    return SandboxStats(cpu_usage_s=float(cpu) / 1e9, memory_bytes=max(0, int(usage) - int(inactive or 0)),
                        pids=int((sample.get("pids_stats") or {}).get("current") or 0), source="docker stats")
