"""Finding and removing what the Ray test cluster puts on this machine, even after a crash.

A process is the cluster's if it lives in a worker's network namespace, carries the marker
CBRAY_NODE in its environment (every process the cluster starts does, and passes it on), is
recorded in the pid record with the same start time (a reused pid is never mistaken for it), or
names one of the cluster's directories on its command line. Containers of the workers' dockerds
are found by their cgroups. This process and its ancestors are never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

from tests.ray.layout import BRIDGE, FORWARD_RULE, MARKER, OUR_ROOTS, PID_RECORD, WORKERS, Worker

DAEMONS = ("dockerd", "containerd", "containerd-shim")
"""Process names (``comm``) of the workers' Docker engines, stopped after Ray and the containers."""


def read(path: str | Path) -> bytes | None:
    try:
        return Path(path).read_bytes()
    except OSError:
        return None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot: with the pid, its identity."""
    stat = read(f"/proc/{pid}/stat")
    return int(stat.rsplit(b")", 1)[1].split()[19]) if stat else None


def comm(pid: int) -> str:
    return (read(f"/proc/{pid}/comm") or b"").decode(errors="replace").strip()


def alive(pid: int) -> bool:
    """Running (a zombie is not)."""
    stat = read(f"/proc/{pid}/stat")
    return stat is not None and stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def ancestors() -> set[int]:
    """This process and its ancestors: never the cluster's, whatever their command line says."""
    pids, pid = set(), os.getpid()
    while pid > 0 and pid not in pids:
        pids.add(pid)
        stat = read(f"/proc/{pid}/stat")
        pid = int(stat.rsplit(b")", 1)[1].split()[1]) if stat else 0
    return pids


def netns_inode(worker: Worker) -> int | None:
    try:
        return worker.netns_path.stat().st_ino
    except OSError:
        return None


def find_processes() -> dict[int, str]:
    """Every running process of the cluster but its containers': pid -> node ("head", "w1", …;
    "?" when only its command line names the cluster's directories)."""
    namespaces = {ino: w.name for w in WORKERS if (ino := netns_inode(w)) is not None}
    skip = ancestors()
    marker = MARKER.encode() + b"="
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in skip or not alive(int(entry)):
            continue
        pid = int(entry)
        try:
            netns = os.stat(f"/proc/{pid}/ns/net").st_ino
        except OSError:
            continue
        if netns in namespaces:
            found[pid] = namespaces[netns]
            continue
        for var in (read(f"/proc/{pid}/environ") or b"").split(b"\0"):
            if var.startswith(marker):
                found[pid] = var[len(marker):].decode(errors="replace")
                break
        else:
            cmdline = read(f"/proc/{pid}/cmdline") or b""
            if any(str(root).encode() + b"/" in cmdline for root in OUR_ROOTS):
                found[pid] = "?"
    return found


def record_pids() -> None:
    """Append every process of the cluster with its start time to the pid record (a restarted
    node adds its new processes)."""
    with PID_RECORD.open("a") as record:
        for pid, node in sorted(find_processes().items()):
            if (started := start_time(pid)) is not None:
                record.write(f"{pid} {started} {node} {comm(pid)}\n")


def recorded_pids() -> set[int]:
    """The recorded processes still running as themselves."""
    pids = set()
    for line in (read(PID_RECORD) or b"").decode().splitlines():
        pid, started, *_rest = line.split()
        if start_time(int(pid)) == int(started) and alive(int(pid)):
            pids.add(int(pid))
    return pids


def kill(pids: Iterable[int], sig: signal.Signals = signal.SIGKILL) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def ray_processes(node: str | None = None) -> set[int]:
    """The cluster's processes other than the workers' Docker engines (of ``node`` only if given)."""
    found = find_processes()
    pids = (set(found) | recorded_pids()) if node is None else {p for p, n in found.items() if n == node}
    return {p for p in pids if comm(p) not in DAEMONS}


def cgroup_dirs() -> list[Path]:
    """The cgroups the workers' dockerds put their containers under, deepest first
    (``--cgroup-parent`` is relative to dockerd's own cgroup, so they are searched for by name)."""
    names = {w.cgroup_parent for w in WORKERS}
    found: list[Path] = []
    for top, dirs, _files in os.walk("/sys/fs/cgroup"):
        for name in [d for d in dirs if d in names]:
            found.extend(Path(sub) for sub, _d, _f in os.walk(Path(top) / name))
        depth = len(Path(top).relative_to("/sys/fs/cgroup").parts)
        dirs[:] = [d for d in dirs if d not in names] if depth < 4 else []
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


def container_processes() -> set[int]:
    return {int(pid) for cgroup in cgroup_dirs() for pid in (read(cgroup / "cgroup.procs") or b"").split()}


def kill_everything(deadline_s: float = 10.0) -> None:
    """SIGKILL every process of the cluster, containers included, until none is left."""
    end = time.monotonic() + deadline_s
    while (left := set(find_processes()) | recorded_pids() | container_processes()) and time.monotonic() < end:
        kill(left)
        time.sleep(0.1)


def _run_quietly(*argv: str) -> int:
    return subprocess.run(argv, capture_output=True, timeout=60, check=False).returncode


def remove_host_state() -> list[str]:
    """Remove the cluster's cgroups, mounts, forward rule, namespaces, links and directories
    (its processes must be gone first); what could not be removed."""
    for cgroup in cgroup_dirs():
        with contextlib.suppress(OSError):
            cgroup.rmdir()
    for point in our_mounts():
        _run_quietly("umount", "-l", point)
    while _run_quietly("iptables", "-w", "-C", *FORWARD_RULE) == 0:
        _run_quietly("iptables", "-w", "-D", *FORWARD_RULE)
    for worker in WORKERS:
        _run_quietly("ip", "netns", "del", worker.netns)
        _run_quietly("ip", "link", "del", worker.veth)
    _run_quietly("ip", "link", "del", BRIDGE)
    for root in OUR_ROOTS:
        shutil.rmtree(root, ignore_errors=True)
    left = [str(p) for p in OUR_ROOTS if p.exists()]
    left += [f"cgroup {c}" for c in cgroup_dirs()]
    left += [f"link {name}" for name in (BRIDGE, *(w.veth for w in WORKERS)) if Path(f"/sys/class/net/{name}").exists()]
    left += [f"namespace {w.netns}" for w in WORKERS if w.netns_path.exists()]
    left += [f"process {pid} ({comm(pid)})" for pid in find_processes()]
    return left


def anything_left() -> bool:
    """Whether any trace of a cluster is on this machine."""
    return bool(find_processes() or any(p.exists() for p in OUR_ROOTS)
                or Path(f"/sys/class/net/{BRIDGE}").exists() or any(w.netns_path.exists() for w in WORKERS))


def our_mounts() -> list[str]:
    """Mount points under the cluster's directories (a crashed dockerd leaves overlays and
    container namespace files), deepest first."""
    points = []
    for line in (read("/proc/self/mountinfo") or b"").decode().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if any(point == str(root) or point.startswith(f"{root}/") for root in OUR_ROOTS):
            points.append(point)
    return sorted(points, key=len, reverse=True)
