"""Disposable, hardened sandboxes on a Docker engine (driven through the docker SDK).

``create`` starts a container with every DESIGN 4 default, waits until the agent
inside answers its health check on the per-sandbox unix socket, and returns a
``Sandbox`` holding the agent client. ``destroy`` removes the container and its
socket directory. Labels name the owner and expiry so ``gc`` can reap leftovers,
also after the harness was killed; the engine runs gc when it starts.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import docker
import docker.errors
import grpc
from docker.models.containers import Container
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from harness import labels
from harness.agent_client import AgentClient
from harness.errors import AgentCallError, EngineUnavailable, ImageNotFound, SandboxStartError
from harness.spec import AGENT_DIR, TOOL_GID, TOOL_UID, SandboxSpec
from sandbox.health import SERVING

log = logging.getLogger("callbox.engine")

AGENT_SOCKET = f"{AGENT_DIR}/agent.sock"
HOME = "/home/sandbox"
READY_TIMEOUT_S = 30.0
# The agent starts its RPC threads up front (32 commands + 8 spare) so a fork bomb cannot
# starve it; they and gRPC's own threads count against the pids limit, so the engine adds
# this reserve on top of the spec's limit, which is what tool processes get.
AGENT_MAX_CONCURRENT = 32
AGENT_PIDS_RESERVE = 64


@cache
def seccomp_profile() -> str:
    """Docker's default seccomp profile minus io_uring (see harness/data/SECCOMP.md)."""
    text = resources.files("harness").joinpath("data/seccomp.json").read_text()
    return json.dumps(json.loads(text), separators=(",", ":"))


def default_run_root() -> Path:
    """Host directory holding one socket directory per sandbox (short: sun_path is 108 bytes)."""
    if os.geteuid() == 0:
        return Path("/run/callbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "callbox" if runtime else Path(f"/tmp/callbox-{os.getuid()}")


@dataclass(frozen=True)
class SandboxInfo:
    """A live sandbox as ``callbox ps`` shows it."""

    sandbox_id: str
    container_id: str
    status: str
    owner: str
    expires: float
    created: float
    image: str


class Sandbox:
    """A running sandbox and the client of its agent. Destroy it when done (or use ``with``)."""

    def __init__(self, engine: DockerEngine, sandbox_id: str, container_id: str, socket_dir: Path,
                 spec: SandboxSpec, tool_uid: int, tool_gid: int) -> None:
        self.engine = engine
        self.id = sandbox_id
        self.container_id = container_id
        self.socket_dir = socket_dir
        self.spec = spec
        self.tool_uid = tool_uid
        self.tool_gid = tool_gid
        self.agent = AgentClient(str(socket_dir / "agent.sock"))

    @property
    def container(self) -> Container:
        """The docker SDK's high-level object for this sandbox's container (one API call)."""
        return self.engine.client.containers.get(self.container_id)

    def destroy(self) -> None:
        self.agent.close()
        self.engine.destroy(self.id)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class DockerEngine:
    """Creates, lists, destroys and reaps sandboxes on one Docker engine."""

    def __init__(self, client: docker.DockerClient, *, run_root: Path | None = None,
                 reap_on_start: bool = True) -> None:
        self.client = client
        self.run_root = run_root or default_run_root()
        self.owner = labels.Owner.current()
        self.hostname = socket.gethostname()
        if reap_on_start:
            for sandbox_id in self.gc():
                log.info("reaped leftover sandbox %s", sandbox_id)

    @classmethod
    def connect(cls, **kwargs: Any) -> DockerEngine:
        """Connect to the engine named by DOCKER_HOST (default socket); fail closed if unreachable."""
        try:
            client = docker.from_env(timeout=60)
            client.ping()
        except docker.errors.DockerException as exc:
            host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            raise EngineUnavailable(
                f"cannot reach the Docker engine at {host} ({_short(exc)}); start dockerd "
                "(`make test` and `make demo` start it) or set DOCKER_HOST. No tool runs without a sandbox."
            ) from None
        return cls(client, **kwargs)

    # ---- create ---------------------------------------------------------------------------

    def create(self, spec: SandboxSpec, *, ready_timeout: float = READY_TIMEOUT_S) -> Sandbox:
        mounts = tuple(m.canonical(spec.allowed_mount_roots) for m in spec.mounts)
        spec = spec.model_copy(update={"mounts": mounts})
        for note in spec.loosened():
            log.warning("sandbox policy loosens a default: %s", note)
        uid, gid = _tool_identity(spec)
        sandbox_id = uuid.uuid4().hex[:12]
        socket_dir = self.run_root / sandbox_id
        self.run_root.mkdir(parents=True, mode=0o700, exist_ok=True)
        socket_dir.mkdir(mode=0o700)
        try:
            container_id = self._run_container(spec, sandbox_id, socket_dir, uid, gid)
        except BaseException:
            # Also on Ctrl-C mid-request: the engine may have created the container already.
            self.destroy(sandbox_id)
            raise
        sandbox = Sandbox(self, sandbox_id, container_id, socket_dir, spec, uid, gid)
        try:
            self._wait_ready(sandbox, ready_timeout)
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    def _run_container(self, spec: SandboxSpec, sandbox_id: str, socket_dir: Path,
                       uid: int, gid: int) -> str:
        """Create and start the container through the low-level API (no extra inspect calls)."""
        now = time.time()
        label_values = {
            labels.MANAGED: "1",
            labels.SANDBOX_ID: sandbox_id,
            labels.OWNER: self.owner.label(),
            labels.CREATED: f"{now:.3f}",
            labels.EXPIRES: f"{now + spec.ttl_seconds:.0f}",
            labels.SOCKET_DIR: str(socket_dir),
        }
        roots = sorted({spec.workdir, "/workspace", "/tmp", HOME, *(m.target for m in spec.mounts)})
        command = ["--socket", AGENT_SOCKET, "--uid", str(uid), "--gid", str(gid), "--workspace", spec.workdir,
                   "--max-concurrent", str(AGENT_MAX_CONCURRENT)]
        for root in roots:
            command += ["--root", root]
        mounts = [DockerMount(AGENT_DIR, str(socket_dir), type="bind", propagation="rprivate")]
        mounts += [
            DockerMount(m.target, str(m.source), type="bind", read_only=m.read_only, propagation="rprivate")
            for m in spec.mounts
        ]
        owned = f"uid={uid},gid={gid}"
        tmpfs = {
            "/tmp": f"rw,nosuid,nodev,size={spec.effective_tmp_size},mode=1777",
            "/workspace": f"rw,nosuid,nodev,size={spec.effective_workspace_size},mode=0755,{owned}",
            HOME: f"rw,nosuid,nodev,size={16 << 20},mode=0755,{owned}",
        }
        if spec.workdir not in tmpfs and not any(m.target == spec.workdir for m in spec.mounts):
            tmpfs[spec.workdir] = f"rw,nosuid,nodev,size={spec.effective_workspace_size},mode=0755,{owned}"
        api = self.client.api
        try:
            host_config = api.create_host_config(
                init=True,
                cap_drop=["ALL"],
                cap_add=["SETUID", "SETGID", "KILL"],
                security_opt=["no-new-privileges:true", f"seccomp={seccomp_profile()}"],
                read_only=True,
                tmpfs=tmpfs,
                mounts=mounts,
                network_mode="none",
                ipc_mode="private",
                pids_limit=spec.pids + AGENT_PIDS_RESERVE,
                mem_limit=spec.memory,
                memswap_limit=spec.memory,
                nano_cpus=int(spec.cpus * 1e9),
                ulimits=[
                    Ulimit(name="nofile", soft=spec.nofile, hard=spec.nofile),
                    Ulimit(name="core", soft=0, hard=0),
                    Ulimit(name="fsize", soft=spec.fsize, hard=spec.fsize),
                ],
                privileged=False,
                auto_remove=False,
            )
            created = api.create_container(
                spec.image,
                command=command,
                name=f"callbox-{sandbox_id}",
                hostname="sandbox",
                user="0:0",
                environment={},
                labels=label_values,
                host_config=host_config,
            )
            api.start(created["Id"])
        except docker.errors.ImageNotFound:
            raise ImageNotFound(
                f"image {spec.image} not found locally; build it with `callbox image build` "
                "(there is no registry to pull from)"
            ) from None
        except docker.errors.DockerException as exc:
            self._remove_by_name(f"callbox-{sandbox_id}")
            raise SandboxStartError(f"the Docker engine could not start the sandbox: {_short(exc)}") from None
        return str(created["Id"])

    def _wait_ready(self, sandbox: Sandbox, timeout: float) -> None:
        """Wait for the agent's socket, then its health check; fail fast if the container dies."""
        deadline = time.monotonic() + timeout
        sock = sandbox.socket_dir / "agent.sock"
        next_status_check = time.monotonic() + 0.2
        delay = 0.0005
        while time.monotonic() < deadline:
            if sock.exists():
                try:
                    if sandbox.agent.health(timeout=max(0.05, min(2.0, deadline - time.monotonic()))) == SERVING:
                        return
                except AgentCallError as exc:
                    if exc.code not in (grpc.StatusCode.UNAVAILABLE.name, grpc.StatusCode.DEADLINE_EXCEEDED.name):
                        raise SandboxStartError(f"the sandbox agent failed its health check: {exc}") from None
            if time.monotonic() >= next_status_check:
                self._fail_if_exited(sandbox)
                next_status_check = time.monotonic() + 0.2
            time.sleep(delay)
            delay = min(delay * 2, 0.002)
        self._fail_if_exited(sandbox)
        raise SandboxStartError(f"the sandbox agent did not become ready within {timeout:.0f} s")

    @staticmethod
    def _fail_if_exited(sandbox: Sandbox) -> None:
        api = sandbox.engine.client.api
        state = api.inspect_container(sandbox.container_id)["State"]
        if state.get("Status") in ("exited", "dead"):
            logs = api.logs(sandbox.container_id, tail=20).decode("utf-8", "replace").strip()
            raise SandboxStartError(f"the sandbox agent exited during start-up: {logs or 'no output'}")

    # ---- destroy, list, gc -------------------------------------------------------------------

    def destroy(self, sandbox_id: str) -> None:
        """Remove the sandbox's container and socket directory; a missing one is not an error."""
        self._remove_by_name(f"callbox-{sandbox_id}")
        shutil.rmtree(self.run_root / sandbox_id, ignore_errors=True)

    def _remove_by_name(self, name: str) -> None:
        try:
            self.client.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    def list_sandboxes(self) -> list[SandboxInfo]:
        infos = []
        for c in self.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"}):
            lab: dict[str, str] = c.get("Labels") or {}
            infos.append(SandboxInfo(
                sandbox_id=lab.get(labels.SANDBOX_ID, "?"),
                container_id=c["Id"][:12],
                status=c.get("State", "?"),
                owner=lab.get(labels.OWNER, "?"),
                expires=_float(lab.get(labels.EXPIRES)),
                created=_float(lab.get(labels.CREATED)),
                image=c.get("Image", "?"),
            ))
        return sorted(infos, key=lambda i: i.created)

    def gc(self, now: float | None = None) -> list[str]:
        """Remove sandboxes that expired or whose owner process is gone; return their ids."""
        now = time.time() if now is None else now
        removed = []
        try:
            containers = self.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot list sandboxes: {_short(exc)}") from None
        live_ids = set()
        for c in containers:
            lab = c.get("Labels") or {}
            sandbox_id = lab.get(labels.SANDBOX_ID, "")
            if labels.is_expired(lab, now) or labels.is_orphaned(lab, self.hostname):
                self._remove_by_name(c["Id"])
                socket_dir = lab.get(labels.SOCKET_DIR)
                if socket_dir and Path(socket_dir).parent == self.run_root:
                    shutil.rmtree(socket_dir, ignore_errors=True)
                removed.append(sandbox_id or c["Id"][:12])
            else:
                live_ids.add(sandbox_id)
        self._remove_stale_socket_dirs(live_ids)
        return removed

    def _remove_stale_socket_dirs(self, live_ids: set[str]) -> None:
        if not self.run_root.is_dir():
            return
        for entry in self.run_root.iterdir():
            if entry.is_dir() and entry.name not in live_ids and len(entry.name) == 12:
                age = time.time() - entry.stat().st_mtime
                if age > 60:  # never race a sandbox being created right now
                    shutil.rmtree(entry, ignore_errors=True)


def _tool_identity(spec: SandboxSpec) -> tuple[int, int]:
    """Tool processes take the owner of the first non-root rw mount, else the sandbox user."""
    for mount in spec.mounts:
        if not mount.read_only:
            st = mount.source.stat()
            if st.st_uid != 0:
                return st.st_uid, st.st_gid
    return TOOL_UID, TOOL_GID


def _float(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
