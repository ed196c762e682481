"""Disposable, hardened sandboxes on a Docker engine (driven through the docker SDK).

``create`` checks the spec against the engine's host (``SandboxSpec.for_host``: cpus,
memory, mounts and their writability, before anything is created), starts a container
with every hardened default, waits until the agent
inside answers its health check on the per-sandbox unix socket, and returns a
``Sandbox`` holding the agent client. ``destroy`` removes the container and its
socket directory. Labels name the owner and expiry so ``gc`` can reap leftovers,
also after the harness was killed; the engine runs gc when it starts.

Keeping a sandbox past its process (a paused run): Docker cannot change
a container's labels after creation, so ``keep(sandbox, run_id=..., until=...)`` writes a
small record ``<run root>/kept/<sandbox id>.json`` on the host (next to the per-sandbox
socket directories, never inside one: those are mounted into the container). The record
names the owner ``run:<run_id>``, the time it is kept until, and what ``attach`` needs to
reconnect (container id, socket directory, spec, tool uid/gid). ``gc`` consults it: a
kept sandbox is removed when ``until`` has passed, and never for being orphaned (its
creating process may be long gone); a sandbox without a record is reaped exactly as
before (expired, or its owner process dead). A record gc cannot read (another user's run
root) counts as kept until the container's label expiry, so gc stays conservative; a
record whose container is gone is removed. ``attach(sandbox_id)`` (another process,
later) returns a ``Sandbox`` connected to the kept container's agent, or raises
``SandboxExpired`` saying when it expired or that it is gone (removing what is left).
``destroy`` removes the record along with the container.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, wraps
from importlib import resources
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

import docker
import docker.errors
import grpc
import requests
from docker.models.containers import Container
from docker.types import Mount as DockerMount
from docker.types import Ulimit

from harness.core.errors import (
    AgentCallError,
    CallboxError,
    EngineUnavailable,
    ImageNotFound,
    SandboxStartError,
    short_reason,
)
from harness.engine.agent_client import AgentClient
from harness.engine.base import SandboxRuntime
from harness.engine.docker import labels
from harness.engine.docker.netfilter import PacketFilter
from harness.engine.docker.networks import ROLE, Attachment, EgressEvent, SandboxNetworks
from harness.engine.spec import AGENT_DIR, TMP, HostLimits, SandboxSpec
from harness.engine.spec import HOME as _HOME
from sandbox.health import SERVING

log = logging.getLogger("callbox.engine")

AGENT_SOCKET = f"{AGENT_DIR}/agent.sock"
HOME = _HOME
"""The tool user's home directory (the benchmark builds containers with it)."""
READY_TIMEOUT_S = 30.0
KEPT_DIR = "kept"
"""Under the run root: one ``<sandbox id>.json`` record per kept sandbox (see ``keep``)."""
ATTACH_TIMEOUT_S = 10.0
STOPPED = ("exited", "dead")
"""Container states gc reaps at once: the agent in it is gone and nothing restarts it."""
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


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _engine_calls(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Losing the engine mid-request (dockerd stopped or restarting) raises the requests
    library's own errors, which docker-py passes through; make them EngineUnavailable."""

    @wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except requests.exceptions.RequestException as exc:
            if isinstance(exc, docker.errors.DockerException):  # APIError is both: an answer, not a loss
                raise
            host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
            raise EngineUnavailable(
                f"lost the Docker engine at {host} ({short_reason(exc)}): it stopped or is restarting; "
                "start dockerd again (`make test` and `make demo` start it)"
            ) from None

    return call


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


class SandboxExpired(CallboxError):
    """A kept sandbox cannot be attached: it expired or its container is gone."""

    def __init__(self, message: str, *, sandbox_id: str, expired_at: float | None) -> None:
        super().__init__(message)
        self.sandbox_id = sandbox_id
        self.expired_at = expired_at
        """When it expired (or was due to expire), if known."""


@dataclass(frozen=True)
class KeptSandbox:
    """The record ``DockerEngine.keep`` writes: a sandbox that outlives its process."""

    sandbox_id: str
    run_id: str
    until: float
    """Unix time after which gc removes it."""
    container_id: str
    socket_dir: str
    spec: dict[str, Any]
    """The SandboxSpec it was created with (``model_dump(mode="json")``)."""
    tool_uid: int
    tool_gid: int
    kept_at: float

    @property
    def owner(self) -> str:
        return f"run:{self.run_id}"

    def to_json(self) -> str:
        return json.dumps({
            "sandbox_id": self.sandbox_id, "owner": self.owner, "run_id": self.run_id, "until": self.until,
            "container_id": self.container_id, "socket_dir": self.socket_dir, "spec": self.spec,
            "tool_uid": self.tool_uid, "tool_gid": self.tool_gid, "kept_at": self.kept_at,
        }, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> KeptSandbox:
        data = json.loads(text)
        return cls(
            sandbox_id=str(data["sandbox_id"]), run_id=str(data["run_id"]), until=float(data["until"]),
            container_id=str(data["container_id"]), socket_dir=str(data["socket_dir"]), spec=dict(data["spec"]),
            tool_uid=int(data["tool_uid"]), tool_gid=int(data["tool_gid"]), kept_at=float(data["kept_at"]),
        )


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
        self.proxy_url: str | None = None
        """The egress proxy (``network = "allowlist"``), as tool processes see it."""
        self._egress_offset = 0
        """Bytes of the egress proxy's log already handed out by ``new_egress_events``."""

    def runtime(self) -> SandboxRuntime:
        """What a tool handler gets: the agent and the environment of this sandbox."""
        return SandboxRuntime(sandbox_id=self.id, agent=self.agent, env=self.spec.env, workdir=self.spec.workdir)

    def new_egress_events(self) -> list[EgressEvent]:
        """The egress proxy's decisions since the last call (empty unless allowlist)."""
        if self.spec.network != "allowlist":
            return []
        events, self._egress_offset = self.engine.networks.egress_events(self.id, offset=self._egress_offset)
        return events

    @property
    def container(self) -> Container:
        """The docker SDK's high-level object for this sandbox's container (one API call)."""
        return self.engine.client.containers.get(self.container_id)

    def destroy(self) -> None:
        self.agent.close()
        self.engine.destroy(self.id, network=self.spec.network)

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()


class DockerEngine:
    """Creates, lists, destroys and reaps sandboxes on one Docker engine."""

    def __init__(self, client: docker.DockerClient, *, run_root: Path | None = None,
                 reap_on_start: bool = True, egress_test_network: str | None = None,
                 egress_test_hosts: dict[str, str] | None = None) -> None:
        self.client = client
        self.run_root = run_root or default_run_root()
        self.owner = labels.Owner.current()
        self.hostname = socket.gethostname()
        if egress_test_network is None:
            egress_test_network = os.environ.get("CALLBOX_EGRESS_TEST_NETWORK") or None
        if egress_test_hosts is None:
            egress_test_hosts = _parse_hosts(os.environ.get("CALLBOX_EGRESS_TEST_HOSTS", ""))
        self.networks = SandboxNetworks(
            client, PacketFilter(self.run_root / "netfilter.lock"), self.run_root / "egress",
            test_network=egress_test_network, test_hosts=egress_test_hosts,
        )
        self._host: HostLimits | None = None
        if reap_on_start:
            for sandbox_id in self.gc():
                log.info("reaped leftover sandbox %s", sandbox_id)

    @classmethod
    def connect(cls, **kwargs: Any) -> DockerEngine:
        """Connect to the engine named by DOCKER_HOST (default socket); fail closed if unreachable."""
        return cls(connect_client(), **kwargs)

    # ---- create ---------------------------------------------------------------------------

    @_engine_calls
    def host_limits(self) -> HostLimits:
        """The engine host's CPUs, memory and data root (asked once per engine)."""
        if self._host is None:
            info = self.client.info()
            root = str(info.get("DockerRootDir") or "")
            self._host = HostLimits(
                cpus=int(info["NCPU"]) if info.get("NCPU") else None,
                memory=int(info["MemTotal"]) if info.get("MemTotal") else None,
                where="the Docker engine's host", engine_paths=(root,) if root.startswith("/") else (),
            )
        return self._host

    @_engine_calls
    def create(self, spec: SandboxSpec, *, ready_timeout: float = READY_TIMEOUT_S) -> Sandbox:
        """Start a sandbox for ``spec``; a spec this host cannot run (``SpecError``: too many
        cpus, a missing or unwritable mount, ...) is refused before any container exists."""
        spec = spec.for_host(self.host_limits())
        for note in spec.loosened():
            log.warning("this policy loosens a hardened default: %s", note)
        uid, gid = _tool_identity(spec)
        sandbox_id = uuid.uuid4().hex[:12]
        socket_dir = self.run_root / sandbox_id
        self.run_root.mkdir(parents=True, mode=0o700, exist_ok=True)
        socket_dir.mkdir(mode=0o700)
        write_expiry(socket_dir, time.time() + spec.ttl_seconds)
        try:
            attachment, container_id = self._run_container(spec, sandbox_id, socket_dir, uid, gid)
        except BaseException:
            # Also on Ctrl-C mid-request: the engine may have created the container already.
            self.destroy(sandbox_id, network=spec.network)
            raise
        sandbox = Sandbox(self, sandbox_id, container_id, socket_dir, spec, uid, gid)
        try:
            self._wait_ready(sandbox, ready_timeout)
            if attachment.proxied:
                sandbox.proxy_url, proxy_env = self.networks.finish_proxy(sandbox_id)
                sandbox.spec = spec.model_copy(update={"env": {**spec.env, **proxy_env}})
        except BaseException:
            sandbox.destroy()
            raise
        return sandbox

    def _run_container(self, spec: SandboxSpec, sandbox_id: str, socket_dir: Path,
                       uid: int, gid: int) -> tuple[Attachment, str]:
        """Create the sandbox's network (if any), then create and start the container
        through the low-level API (no extra inspect calls)."""
        now = time.time()
        label_values = {
            labels.MANAGED: "1",
            labels.SANDBOX_ID: sandbox_id,
            labels.OWNER: self.owner.label(),
            labels.CREATED: f"{now:.3f}",
            labels.EXPIRES: f"{now + spec.ttl_seconds:.0f}",
            labels.SOCKET_DIR: str(socket_dir),
        }
        hardening: dict[str, Any] = {
            "init": True,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges:true", f"seccomp={seccomp_profile()}"],
            "ipc_mode": "private",
            "privileged": False,
            "auto_remove": False,
        }
        attachment = self.networks.attach(sandbox_id, spec, label_values, {
            **hardening,
            "ulimits": [Ulimit(name="nofile", soft=1024, hard=1024), Ulimit(name="core", soft=0, hard=0)],
        })
        # File operations reach the scratch places that have a tmpfs and every mount (a mount
        # above a scratch place, like /home, holds whatever the host has there, maybe nothing).
        roots = sorted({spec.workdir, *spec.scratch_tmpfs(), *(m.target for m in spec.mounts)})
        command = ["--socket", AGENT_SOCKET, "--uid", str(uid), "--gid", str(gid), "--workspace", spec.workdir,
                   "--max-concurrent", str(AGENT_MAX_CONCURRENT)]
        for root in roots:
            command += ["--root", root]
        mounts = [DockerMount(AGENT_DIR, str(socket_dir), type="bind", propagation="rprivate")]
        mounts += [
            DockerMount(m.target, str(m.source), type="bind", read_only=m.read_only, propagation="rprivate")
            for m in spec.mounts
        ]
        # A scratch place a mount covers gets no tmpfs (it would hide the mount or sit under
        # it); mounts below a scratch place land on top of its tmpfs, as Docker mounts the
        # shallower path first.
        tmpfs = {place: spec.tmpfs_options(place, uid, gid) for place in spec.scratch_tmpfs()}
        api = self.client.api
        try:
            host_config = api.create_host_config(
                **hardening,
                cap_add=["SETUID", "SETGID", "KILL"],
                read_only=True,
                tmpfs=tmpfs,
                mounts=mounts,
                network_mode=attachment.network_mode,
                pids_limit=spec.pids + AGENT_PIDS_RESERVE,
                mem_limit=spec.memory,
                memswap_limit=spec.memory,
                nano_cpus=int(spec.cpus * 1e9),
                ulimits=[
                    Ulimit(name="nofile", soft=spec.nofile, hard=spec.nofile),
                    Ulimit(name="core", soft=0, hard=0),
                    Ulimit(name="fsize", soft=spec.fsize, hard=spec.fsize),
                ],
                # Tool processes raise their own OOM score to the maximum before they exec
                # (sandbox/spawner.py), so the agent is never the OOM killer's first choice.
                # (Lowering the agent's score instead needs CAP_SYS_RESOURCE in the daemon,
                # which not every host grants.)
                shm_size=spec.shm_size,
            )
            created = api.create_container(
                spec.image,
                command=command,
                name=f"callbox-{sandbox_id}",
                hostname="sandbox",
                user="0:0",
                environment=_agent_environment(spec),
                labels=label_values,
                host_config=host_config,
            )
            api.start(created["Id"])
        except docker.errors.ImageNotFound:
            raise ImageNotFound.named(spec.image) from None
        except docker.errors.DockerException as exc:
            self._remove_by_name(f"callbox-{sandbox_id}")
            raise SandboxStartError(f"the Docker engine could not start the sandbox: {short_reason(exc)}") from None
        return attachment, str(created["Id"])

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
        try:
            state = api.inspect_container(sandbox.container_id)["State"]
            if state.get("Status") not in STOPPED:
                return
            logs = api.logs(sandbox.container_id, tail=20).decode("utf-8", "replace").strip()
        except docker.errors.NotFound:  # it stopped, and a gc (another process) removed it
            raise SandboxStartError("the sandbox container stopped during start-up and was removed") from None
        raise SandboxStartError(f"the sandbox agent exited during start-up: {logs or 'no output'}")

    # ---- destroy, list, gc -------------------------------------------------------------------

    @_engine_calls
    def destroy(self, sandbox_id: str, *, network: str | None = None) -> list[EgressEvent]:
        """Remove the sandbox's container, its network and egress proxy (unless ``network``
        says it has none) and its socket directory; a missing one is not an error. Returns
        the egress proxy's decisions (also logged)."""
        self._remove_by_name(f"callbox-{sandbox_id}")
        events = [] if network == "none" else self.networks.detach(sandbox_id)
        shutil.rmtree(self.run_root / sandbox_id, ignore_errors=True)
        self._kept_path(sandbox_id).unlink(missing_ok=True)
        return events

    def _remove_by_name(self, name: str) -> None:
        try:
            self.client.api.remove_container(name, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress
                raise

    @_engine_calls
    def list_sandboxes(self) -> list[SandboxInfo]:
        infos = []
        for c in self.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"}):
            lab: dict[str, str] = c.get("Labels") or {}
            if ROLE in lab:
                continue  # an egress proxy, not a sandbox
            infos.append(SandboxInfo(
                sandbox_id=lab.get(labels.SANDBOX_ID, "?"),
                container_id=c["Id"][:12],
                status=c.get("State", "?"),
                owner=kept.owner if (kept := self._kept_for(lab)) is not None else lab.get(labels.OWNER, "?"),
                expires=kept.until if kept is not None else _float(lab.get(labels.EXPIRES)),
                created=_float(lab.get(labels.CREATED)),
                image=c.get("Image", "?"),
            ))
        return sorted(infos, key=lambda i: i.created)

    @_engine_calls
    def gc(self, now: float | None = None) -> list[str]:
        """Remove sandboxes that expired, whose owner process is gone or whose container
        stopped (its agent is gone for good: the engine restarted, it was killed, or it
        expired); return their ids. A kept sandbox (``keep``) is removed only once its keep
        has expired (``attach`` removes a stopped one)."""
        now = time.time() if now is None else now
        removed = []
        try:
            containers = self.client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot list sandboxes: {short_reason(exc)}") from None
        live_ids = set()
        for c in containers:
            lab = c.get("Labels") or {}
            if ROLE in lab:
                continue  # egress proxies go with their sandbox (networks.gc below)
            sandbox_id = lab.get(labels.SANDBOX_ID, "")
            kept = self._kept_for(lab)
            if kept is not None:
                doomed = kept.until <= now  # kept for a paused run: only its expiry counts
            else:
                doomed = (labels.is_expired(lab, now) or labels.is_orphaned(lab, self.hostname)
                          or _expiry_passed(lab.get(labels.SOCKET_DIR), now) or c.get("State") in STOPPED)
            if doomed:
                self._remove_by_name(c["Id"])
                socket_dir = lab.get(labels.SOCKET_DIR)
                if socket_dir and Path(socket_dir).parent == self.run_root:
                    shutil.rmtree(socket_dir, ignore_errors=True)
                if kept is not None and Path(socket_dir or "").parent == self.run_root:
                    self._kept_path(sandbox_id).unlink(missing_ok=True)
                removed.append(sandbox_id or c["Id"][:12])
            else:
                live_ids.add(sandbox_id)
        self._remove_stale_socket_dirs(live_ids)
        self._remove_stale_kept_records(live_ids)
        try:
            self.networks.gc(live_ids, self.hostname, now)
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot clean up sandbox networks: {short_reason(exc)}") from None
        return removed

    def _remove_stale_socket_dirs(self, live_ids: set[str]) -> None:
        if not self.run_root.is_dir():
            return
        for entry in self.run_root.iterdir():
            if entry.is_dir() and entry.name not in live_ids and len(entry.name) == 12:
                age = time.time() - entry.stat().st_mtime
                if age > 60:  # never race a sandbox being created right now
                    shutil.rmtree(entry, ignore_errors=True)


    # ---- keep a sandbox past its process, attach to it later ----------------------------------

    def _kept_path(self, sandbox_id: str, run_root: Path | None = None) -> Path:
        return (run_root or self.run_root) / KEPT_DIR / f"{sandbox_id}.json"

    @_engine_calls
    def keep(self, sandbox: Sandbox, *, run_id: str, until: float | None = None) -> KeptSandbox:
        """Keep ``sandbox`` for run ``run_id`` after this process exits, until ``until``
        (Unix time; default its label expiry, i.e. creation + the spec's ttl_seconds).
        Keeping it again replaces the record. Returns the record written."""
        if until is None:
            try:
                found = self.client.api.inspect_container(sandbox.container_id)["Config"].get("Labels") or {}
            except docker.errors.DockerException as exc:
                raise EngineUnavailable(f"cannot inspect sandbox {sandbox.id}: {short_reason(exc)}") from None
            until = _float(found.get(labels.EXPIRES))
        record = KeptSandbox(
            sandbox_id=sandbox.id, run_id=run_id, until=until, container_id=sandbox.container_id,
            socket_dir=str(sandbox.socket_dir), spec=sandbox.spec.model_dump(mode="json"),
            tool_uid=sandbox.tool_uid, tool_gid=sandbox.tool_gid, kept_at=time.time(),
        )
        write_expiry(sandbox.socket_dir, until)  # the agent stops itself then, harness or not
        self.networks.set_expiry(sandbox.id, until)  # and its egress proxy, if any
        path = self._kept_path(sandbox.id)
        path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(record.to_json())
        os.replace(temporary, path)  # atomic: gc never reads half a record
        return record

    def kept_sandbox(self, sandbox_id: str) -> KeptSandbox | None:
        """The keep record of ``sandbox_id`` under this engine's run root, if any."""
        try:
            return KeptSandbox.from_json(self._kept_path(sandbox_id).read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable keep record of sandbox %s: %s", sandbox_id, exc)
            return None

    def _kept_for(self, lab: dict[str, str]) -> KeptSandbox | None:
        """The keep record of the container with labels ``lab`` (looked up in the run root its
        socket directory lives in). An unreadable record counts as kept until the label
        expiry: gc must not reap as an orphan what it cannot tell is kept."""
        sandbox_id = lab.get(labels.SANDBOX_ID, "")
        socket_dir = lab.get(labels.SOCKET_DIR)
        if not sandbox_id or not socket_dir:
            return None
        path = self._kept_path(sandbox_id, Path(socket_dir).parent)
        try:
            return KeptSandbox.from_json(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Another user's run root is not readable by design (0700): its sandboxes are
            # that user's to judge, so say nothing. A record we should read but cannot is news.
            report = log.debug if isinstance(exc, PermissionError) else log.warning
            report("cannot read the keep record %s (%s); treating the sandbox as kept until its expiry", path, exc)
            return KeptSandbox(
                sandbox_id=sandbox_id, run_id="?", until=_float(lab.get(labels.EXPIRES)), container_id="",
                socket_dir=socket_dir, spec={}, tool_uid=-1, tool_gid=-1, kept_at=0.0,
            )

    def _remove_stale_kept_records(self, live_ids: set[str]) -> None:
        directory = self.run_root / KEPT_DIR
        if not directory.is_dir():
            return
        for entry in directory.glob("*.json"):
            if entry.stem not in live_ids and time.time() - entry.stat().st_mtime > 60:
                entry.unlink(missing_ok=True)

    @_engine_calls
    def attach(self, sandbox_id: str, *, ready_timeout: float = ATTACH_TIMEOUT_S) -> Sandbox:
        """Reconnect to a kept sandbox (from another process than the one that created it).

        Raises ``SandboxExpired`` if it is not kept, its keep expired (it is then removed),
        or its container is gone or stopped; ``SandboxStartError`` if its agent does not
        answer. The returned Sandbox stays kept until ``destroy``."""
        kept = self.kept_sandbox(sandbox_id)
        if kept is None:
            raise SandboxExpired(
                f"sandbox {sandbox_id} is not kept (it expired and was removed, or was never kept); its files are gone",
                sandbox_id=sandbox_id, expired_at=None,
            )
        when = _when(kept.until)
        if kept.until <= time.time():
            self.destroy(sandbox_id)
            raise SandboxExpired(f"sandbox {sandbox_id} expired at {when}; its files are gone",
                                 sandbox_id=sandbox_id, expired_at=kept.until)
        try:
            state = self.client.api.inspect_container(kept.container_id)["State"]
        except docker.errors.NotFound:
            self.destroy(sandbox_id)
            raise SandboxExpired(
                f"sandbox {sandbox_id} is gone (its container was removed before its expiry at {when}); "
                "its files are gone", sandbox_id=sandbox_id, expired_at=kept.until,
            ) from None
        except docker.errors.DockerException as exc:
            raise EngineUnavailable(f"cannot inspect sandbox {sandbox_id}: {short_reason(exc)}") from None
        if not state.get("Running"):
            self.destroy(sandbox_id)
            raise SandboxExpired(f"sandbox {sandbox_id} is gone (its container stopped: {state.get('Status')}); "
                                 "its files are gone", sandbox_id=sandbox_id, expired_at=kept.until)
        spec = SandboxSpec.model_validate(kept.spec)
        sandbox = Sandbox(self, sandbox_id, kept.container_id, Path(kept.socket_dir), spec, kept.tool_uid,
                          kept.tool_gid)
        sandbox.proxy_url = spec.env.get("HTTP_PROXY") if spec.network == "allowlist" else None
        sandbox.new_egress_events()  # decisions before this attach belong to the earlier process
        try:
            healthy = sandbox.agent.health(timeout=ready_timeout) == SERVING
        except AgentCallError as exc:
            sandbox.agent.close()
            raise SandboxStartError(f"the agent of kept sandbox {sandbox_id} does not answer: {exc}") from None
        if not healthy:
            sandbox.agent.close()
            raise SandboxStartError(f"the agent of kept sandbox {sandbox_id} is not serving")
        return sandbox


def connect_client(timeout: int = 60) -> docker.DockerClient:
    """A client of the engine named by DOCKER_HOST (default socket) that answered a ping;
    EngineUnavailable naming the engine and the fix otherwise."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
    except docker.errors.DockerException as exc:
        host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise EngineUnavailable(
            f"cannot reach the Docker engine at {host} ({short_reason(exc)}); start dockerd "
            "(`make test` and `make demo` start it) or set DOCKER_HOST. No tool runs without a sandbox."
        ) from None
    return client


def _when(stamp: float) -> str:
    """A Unix time as ``2025-01-02 03:04:05 UTC``."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def write_expiry(socket_dir: Path, expires: float) -> None:
    """Tell the sandbox's agent when to stop on its own (read from its socket directory)."""
    temporary = socket_dir / ".expires.tmp"
    temporary.write_text(f"{expires:.0f}\n")
    os.replace(temporary, socket_dir / "expires")


def _expiry_passed(socket_dir: str | None, now: float) -> bool:
    """Whether the expiry file the agent obeys (see ``write_expiry``) has passed."""
    if not socket_dir:
        return False
    try:
        return float((Path(socket_dir) / "expires").read_text().strip()) <= now
    except (OSError, ValueError):
        return False


def _agent_environment(spec: SandboxSpec) -> dict[str, str]:
    """The agent's own environment (tool processes get theirs from the agent, never this).
    The agent keeps runtime files in a directory it and the tool user can both write; a
    mount replacing /tmp may be writable by the tool user only (the agent has no
    CAP_DAC_OVERRIDE), so then it uses /dev/shm (a mode 1777 tmpfs) instead."""
    return {} if TMP in spec.scratch_tmpfs() else {"TMPDIR": "/dev/shm"}


def _tool_identity(spec: SandboxSpec) -> tuple[int, int]:
    """The uid/gid tool processes run as: what a rw mount asks for, else the owner of the
    first rw mount not owned by root, else the sandbox user; never 0, and every rw mount
    writable by it (``SandboxSpec.tool_identity`` raises SpecError otherwise)."""
    return spec.tool_identity()


def _parse_hosts(text: str) -> dict[str, str]:
    """``name=ip,name=ip`` (the test-only ``CALLBOX_EGRESS_TEST_HOSTS``)."""
    hosts = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, address = item.partition("=")
        if not sep or not name or not address:
            raise CallboxError(f"CALLBOX_EGRESS_TEST_HOSTS entry {item!r} is not name=ip")
        hosts[name] = address
    return hosts


def _float(value: str | None) -> float:
    try:
        return float(value or 0)
    except ValueError:
        return 0.0
