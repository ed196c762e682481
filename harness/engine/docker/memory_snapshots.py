"""Memory snapshots: a gVisor sandbox's processes and memory, saved beside its files and
resumed by a restore or fork (``callbox sandbox snapshot ID NAME --memory``).

How a memory image is taken, on a sandbox with ``runtime = "runsc"``:

1. the agent is asked (``QUIESCE_SIGNAL``, through the container's init) to close its gRPC
   socket. gVisor cannot save a socket bound on the host, and the agent's is: its directory
   is bind-mounted from the host (runsc's ``--host-uds=create``). The agent stops its
   server (a call under way ends; jobs, shells, terminals and their processes keep running),
   removes the socket and writes ``quiesced`` in the socket directory;
2. ``runsc checkpoint --leave-running`` saves the whole sandbox kernel (every process, its
   memory, the tmpfs writable places, the loopback network with its listening sockets) into
   the snapshot's ``memory/`` directory, uncompressed (the fast way), and lets it run on;
3. the harness writes ``resume`` in the socket directory: the agent listens again.

A restore or fork from it creates a new container with the snapshot's spec and asks the
runtime to restore the image instead of starting the container: a marker file named after the
container (``RESTORE_DIR``), which callbox's runsc wrapper (scripts/callbox-runsc, installed
by ``make runsc``) turns from ``runsc start`` into ``runsc restore``. The new sandbox's socket
directory already holds ``resume``, so its agent, which wakes up where the image left it,
listens at once in its own directory. The marker is gone after a start that used it; one
still there means the runtime started the container fresh (a wrapper from before memory
snapshots), which is refused, never taken for a restore.

What does not survive: connections to the outside (a sandbox with a network other than
``none`` is refused), calls that were under way (their streams end), and host data in a mount
(a restore mounts the same host directory again; a file a process held open there must
still exist). The tool user and every path stay those of the snapshot's spec.

Under runc, ``--memory`` is refused (``refuse_unless_possible``): the one way to save
processes there, CRIU, must run as root on the host with CAP_SYS_ADMIN over the container
and ptrace its processes, and restores them with the same pids in a fresh pid namespace;
Docker offers it only as an experimental daemon feature (``docker checkpoint``), which this
engine does not enable, and Debian's ``criu`` (3.17.1 on bookworm) fails in its own start-up
on a 6.18 kernel (its vDSO check). See docs/sandboxes.md for what it would take.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import docker.errors

from harness.core.errors import CallboxError, ErrorCode, short_reason
from harness.engine.docker.snapshots import MEMORY, MemoryImage, SnapshotError
from harness.engine.spec import SandboxSpec

WaitHealthy = Callable[["Sandbox", float], None]

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.sandbox import Sandbox

RUNTIME = "runsc"
RESTORE_DIR = Path("/run/callbox-runsc/restore")
"""Where the harness asks callbox's runsc wrapper to restore a container (one file per
container id, holding the image directory); the wrapper reads the same default."""
QUIESCE_SIGNAL = "SIGUSR2"
"""The agent's (sandbox/server.py ``QUIESCE_SIGNAL``)."""
QUIESCABLE_FILE = "quiescable"
"""The agent writes it when it listens, if it knows ``QUIESCE_SIGNAL`` (an older agent dies of it)."""
QUIESCED_FILE = "quiesced"
RESUME_FILE = "resume"
LOCK_FILE = "memory-snapshot.lock"
QUIESCE_TIMEOUT_S = 10.0
CHECKPOINT_TIMEOUT_S = 300.0
NETWORKS = ("none",)
"""The networks a memory snapshot can keep (its loopback lives in gVisor's own stack)."""


SNAPSHOT = ("a memory snapshot (--memory)", "a snapshot without --memory keeps its files")
"""What ``refuse_unless_possible`` names: what was asked, and what works instead."""


def refuse_unless_possible(spec: SandboxSpec, label: str, asked: tuple[str, str] = SNAPSHOT) -> None:
    """Saving the processes of a sandbox running ``spec`` is possible, else a clear error;
    ``asked``: what the caller asked for and what works instead (default a memory snapshot)."""
    what, instead = asked
    if spec.runtime != RUNTIME:
        raise CallboxError(
            f"sandbox {label} runs under {spec.runtime}, which cannot save its processes: {what} "
            f"needs runtime = \"{RUNTIME}\" (gVisor; `make runsc`, then create the sandbox with "
            f"--runtime {RUNTIME}). Under runc the only way would be CRIU, which needs root with CAP_SYS_ADMIN over "
            f"the container and Docker's experimental checkpoints (docs/sandboxes.md); {instead}",
            code=ErrorCode.NOT_SUPPORTED)
    if spec.network not in NETWORKS:
        raise CallboxError(
            f"sandbox {label} has network {spec.network!r}: {what} keeps only sandboxes with network "
            "\"none\" (connections to the outside and the egress proxy cannot be carried into a restored "
            f"sandbox); {instead}", code=ErrorCode.NOT_SUPPORTED)
    if os.geteuid() != 0:
        raise CallboxError(
            f"{what} runs `runsc checkpoint` on the runtime's state, which only root may: run it as root",
            code=ErrorCode.PERMISSION_DENIED)


def runtime_command(engine: DockerEngine, container_id: str) -> list[str]:
    """The runtime's binary and global flags as Docker runs it for this container: the
    registered path and runtimeArgs, and the state root the sandbox process was given."""
    runtimes = engine.docker_info().get("Runtimes") or {}
    registered = runtimes.get(RUNTIME) or {}
    path = str(registered.get("path") or RUNTIME)
    args = [str(a) for a in registered.get("runtimeArgs") or ()]
    try:
        pid = int(engine.client.api.inspect_container(container_id)["State"].get("Pid") or 0)
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if pid else []
    except (OSError, docker.errors.DockerException) as exc:
        raise SnapshotError(f"cannot find the gVisor sandbox of container {container_id[:12]}: "
                            f"{short_reason(exc)}") from None
    root = next((a.decode()[len("--root="):] for a in cmdline if a.startswith(b"--root=")), None)
    if root is None:
        raise SnapshotError(f"container {container_id[:12]} does not run under gVisor here (its process names "
                            "no runsc state root)")
    return [path, *args, f"--root={root}"]


def _wait_for(path: Path, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise SnapshotError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.002)


def listening_again(sandbox: Sandbox, wait_healthy: WaitHealthy, timeout: float = QUIESCE_TIMEOUT_S) -> None:
    """Wait until the agent listens again and answers (its socket first, so the client's
    channel does not try too early and back off)."""
    from harness.engine.docker.sandbox import AGENT_SOCKET_NAME

    deadline = time.monotonic() + timeout
    while not (sandbox.socket_dir / AGENT_SOCKET_NAME).exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    wait_healthy(sandbox, max(0.1, deadline - time.monotonic()))


def save(engine: DockerEngine, sandbox: Sandbox, directory: Path, wait_healthy: WaitHealthy) -> MemoryImage:
    """Save the processes and memory of ``sandbox`` into ``directory / MEMORY``; it runs on.
    ``wait_healthy(sandbox, timeout)`` waits for its agent to answer again (the living
    sandbox's own wait, passed in: this module sits below it)."""
    refuse_unless_possible(sandbox.spec, sandbox.label)
    command = runtime_command(engine, sandbox.container_id)
    with locked(sandbox):
        image = directory / MEMORY
        started = time.monotonic()
        try:
            frozen = checkpoint(engine, sandbox, image, command, leave_running=True)
        finally:
            (sandbox.socket_dir / RESUME_FILE).write_text("1\n")
            listening_again(sandbox, wait_healthy)
    size = sum(f.stat().st_size for f in image.rglob("*") if f.is_file())
    return MemoryImage(directory=MEMORY, runtime=RUNTIME, runtime_version=runtime_version(command),
                       bytes=size, seconds=round(time.monotonic() - started, 3), frozen_seconds=round(frozen, 3))


def runtime_version(command: list[str]) -> str:
    """The first line of ``runsc --version``."""
    version = subprocess.run([command[0], "--version"], capture_output=True, text=True, timeout=30,
                             check=False).stdout.splitlines()
    return version[0] if version else ""


@contextlib.contextmanager
def locked(sandbox: Sandbox) -> Iterator[None]:
    """One memory snapshot (or pause to disk) of a sandbox at a time, in any process."""
    with open(sandbox.socket_dir / LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def checkpoint(engine: DockerEngine, sandbox: Sandbox, image: Path, command: list[str], *,
               leave_running: bool) -> float:
    """Ask the agent to close its socket, then save the sandbox into ``image`` with ``runsc
    checkpoint``; ``leave_running``: it runs on (its agent waits for ``RESUME_FILE``), else
    gVisor stops it and its container exits. The seconds the checkpoint took."""
    if not (sandbox.socket_dir / QUIESCABLE_FILE).exists():
        raise SnapshotError(f"the agent of sandbox {sandbox.label} predates memory snapshots (its image is older "
                            "than this callbox): create the sandbox again from a current image to take one",
                            code=ErrorCode.NOT_SUPPORTED)
    quiesced, resume = sandbox.socket_dir / QUIESCED_FILE, sandbox.socket_dir / RESUME_FILE
    for leftover in (quiesced, resume):
        leftover.unlink(missing_ok=True)
    try:
        engine.client.api.kill(sandbox.container_id, signal=QUIESCE_SIGNAL)
        _wait_for(quiesced, QUIESCE_TIMEOUT_S, f"the agent of sandbox {sandbox.label} closing its socket")
    except docker.errors.DockerException as exc:
        raise SnapshotError(f"cannot ask the agent of sandbox {sandbox.label} to close its socket: "
                            f"{short_reason(exc)}") from None
    started = time.monotonic()
    done = subprocess.run(
        [*command, "checkpoint", *(["--leave-running"] if leave_running else []), "--compression=none",
         "--exclude-committed-zero-pages", f"--image-path={image}", sandbox.container_id],
        capture_output=True, text=True, timeout=CHECKPOINT_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise SnapshotError(f"gVisor could not save sandbox {sandbox.label} ({shlex.join(command[:1])} "
                            f"checkpoint): {(done.stderr or done.stdout).strip()[-500:]}")
    return time.monotonic() - started


def restore_request(image: Path) -> Callable[[str], None]:
    """What ``run_container`` calls between creating and starting a container that restores
    ``image``: the marker callbox's runsc wrapper turns into ``runsc restore``. Refused
    before any container exists unless this is root (the marker is root's to write)."""
    if os.geteuid() != 0:
        raise CallboxError("restoring a memory snapshot asks the runtime for `runsc restore`, which only root may: "
                           "run it as root (or fork the snapshot's files: a snapshot without --memory)",
                           code=ErrorCode.PERMISSION_DENIED)
    if not (image / "checkpoint.img").is_file():
        raise SnapshotError(f"the memory image {image} is incomplete (no checkpoint.img): it cannot be restored",
                            code=ErrorCode.DATA_LOST)

    def request(container_id: str) -> None:
        RESTORE_DIR.mkdir(parents=True, mode=0o700, exist_ok=True)
        marker = RESTORE_DIR / container_id
        marker.write_text(f"{image}\n")
        marker.chmod(0o600)
    return request


def check_restored(container_id: str) -> None:
    """The wrapper consumed the marker of ``container_id``: the container was restored, not
    started fresh (a marker left means a runsc wrapper from before memory snapshots)."""
    marker = RESTORE_DIR / container_id
    if marker.exists():
        with contextlib.suppress(OSError):
            marker.unlink()
        raise SnapshotError(
            "the runtime started the sandbox fresh instead of restoring its memory image: the runsc wrapper "
            "registered with Docker predates memory snapshots; run `make runsc` (as root) to update it",
            code=ErrorCode.NOT_SUPPORTED)


def forget_request(container_id: str) -> None:
    with contextlib.suppress(OSError):
        (RESTORE_DIR / container_id).unlink()
