"""The agent's gRPC server: process, filesystem and health services on a unix socket."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import grpc

from sandbox.errors import answer, stream
from sandbox.fs import FilesystemService
from sandbox.health import SERVING, HealthService
from sandbox.identity import FsIdentity, acting_as, drop_supplementary_groups
from sandbox.later import Later, on_first_call
from sandbox.launch import Launcher, SpawnerLauncher, ToolUser
from sandbox.process import Execution, ProcessRunner
from sandbox.spawner import Spawner
from sandbox.v1 import (
    changes_pb2_grpc,
    filesystem_pb2_grpc,
    jobs_pb2_grpc,
    ports_pb2_grpc,
    process_pb2,
    process_pb2_grpc,
    shell_pb2_grpc,
)
from sandbox.workers import CORE_WORKERS, WorkerPool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from sandbox.changes import ChangesService
    from sandbox.jobs import JobManager, JobsService
    from sandbox.ports import PortsService
    from sandbox.shell import ShellService

log = logging.getLogger("callbox.agent")

MAX_MESSAGE_BYTES = 64 << 20
EXPIRY_FILE = "expires"
EXPIRY_RECHECK_S = 5.0
TOP_UP_S = 0.5
"""How often workers are tried again while calls wait for one (see ``WorkerPool.top_up``)."""
QUIESCE_SIGNAL = signal.SIGUSR2
"""Asks the agent to close its socket for a memory snapshot, until the harness writes
``RESUME_FILE`` (see ``_quiesce``)."""
QUIESCABLE_FILE = "quiescable"
"""Written in the socket directory whenever the agent listens: it answers ``QUIESCE_SIGNAL``
(an agent from before memory snapshots would die of it)."""
QUIESCED_FILE = "quiesced"
"""Written in the socket directory once the socket is closed and removed."""
RESUME_FILE = "resume"
"""Written by the harness in the socket directory (of this sandbox, or of one restored from
its memory image) when the agent may listen again."""
RESUME_POLL_S = 0.005
QUIESCE_GRACE_S = 1.0
"""Calls under way get this long to end before the socket closes (idle connections close at once)."""
QUIESCE_MAX_S = 120.0
"""The agent listens again after this long without a resume (a harness that died meanwhile)."""


class ProcessService(process_pb2_grpc.ProcessServicer):
    """Exec, ExecBuffered, Signal and WriteStdin over the ProcessRunner."""

    def __init__(self, runner: ProcessRunner) -> None:
        self.runner = runner

    def Exec(
        self, request: process_pb2.ExecRequest, context: grpc.ServicerContext
    ) -> Iterator[process_pb2.ExecEvent]:
        return stream(context, lambda on_start: self.runner.run(request, on_start))

    def ExecBuffered(
        self, request: process_pb2.ExecRequest, context: grpc.ServicerContext
    ) -> process_pb2.ExecEvents:
        def on_start(execution: Execution) -> None:
            context.add_callback(execution.cancel)

        return answer(context, lambda: self.runner.run_buffered(request, on_start))

    def Signal(
        self, request: process_pb2.SignalRequest, context: grpc.ServicerContext
    ) -> process_pb2.SignalResponse:
        return answer(context, lambda: process_pb2.SignalResponse(
            delivered=self.runner.signal(request.exec_id, request.signal)))

    def WriteStdin(
        self, request: process_pb2.WriteStdinRequest, context: grpc.ServicerContext
    ) -> process_pb2.WriteStdinResponse:
        return answer(context, lambda: process_pb2.WriteStdinResponse(
            pending_bytes=self.runner.write_stdin(request.exec_id, request.data, request.close)))


@dataclass(frozen=True)
class AgentConfig:
    socket: str
    workspace: str
    roots: Sequence[str]
    user: ToolUser | None
    max_concurrent: int = 32
    spare_workers: int = 40
    """RPC threads beyond one per concurrent command: health, Signal, file operations and the
    long-lived streams (job attaches, terminals, tunnels, watches), each of which holds one."""
    core_workers: int = CORE_WORKERS
    """RPC threads started up front and kept: what serves when no pid is left to start more."""
    spawner: Spawner | None = None
    """Starts tool processes; None starts them from this process (slower, for tests)."""


@dataclass(frozen=True)
class Agent:
    """The server and the parts that must be stopped with it."""

    server: grpc.Server
    runner: ProcessRunner
    jobs: Later[JobManager]
    """Built by the first Jobs call (its modules are imported then); stopped with the agent if built."""
    health: HealthService
    pool: WorkerPool
    renew: Callable[[], grpc.Server]
    """A new server with the same services and workers (a stopped one cannot listen again)."""


def build_server(config: AgentConfig) -> Agent:
    launcher = SpawnerLauncher(config.spawner) if config.spawner is not None else None
    runner = ProcessRunner(config.user, config.workspace, config.max_concurrent, launcher)
    identity = FsIdentity(config.user.uid, config.user.gid) if config.user else None
    workers = config.max_concurrent + config.spare_workers
    pool = WorkerPool(config.core_workers, workers)
    process = ProcessService(runner)
    filesystem = FilesystemService(roots=list(config.roots), workspace=config.workspace, identity=identity)
    jobs = Later(lambda: _job_manager(config, launcher))
    # Services many sandboxes are never asked for: imported and built on their first call.
    changes = on_first_call(Later(lambda: _changes_service(filesystem)))
    shell = on_first_call(Later(lambda: _shell_service(config, launcher)))
    jobs_service = on_first_call(Later(lambda: _jobs_service(jobs.value())))
    ports = on_first_call(Later(_ports_service))
    health = HealthService()

    def renew() -> grpc.Server:
        server = grpc.server(
            pool,
            maximum_concurrent_rpcs=workers,
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        process_pb2_grpc.add_ProcessServicer_to_server(process, server)
        filesystem_pb2_grpc.add_FilesystemServicer_to_server(filesystem, server)
        changes_pb2_grpc.add_ChangesServicer_to_server(changes, server)
        shell_pb2_grpc.add_ShellServicer_to_server(shell, server)
        jobs_pb2_grpc.add_JobsServicer_to_server(jobs_service, server)
        ports_pb2_grpc.add_PortsServicer_to_server(ports, server)
        server.add_generic_rpc_handlers((health.handler(),))
        return server

    return Agent(renew(), runner, jobs, health, pool, renew)


def _job_manager(config: AgentConfig, launcher: Launcher | None) -> JobManager:
    from sandbox.jobs import JobManager

    return JobManager(config.user, config.workspace, launcher)


def _jobs_service(manager: JobManager) -> JobsService:
    from sandbox.jobs import JobsService

    return JobsService(manager)


def _changes_service(filesystem: FilesystemService) -> ChangesService:
    from sandbox.changes import ChangesService

    return ChangesService(filesystem)


def _shell_service(config: AgentConfig, launcher: Launcher | None) -> ShellService:
    from sandbox.shell import ShellManager, ShellService

    return ShellService(ShellManager(config.user, config.workspace, launcher))


def _ports_service() -> PortsService:
    from sandbox.ports import PortsService

    return PortsService()


def _expired(expiry_file: str, owner: FsIdentity | None) -> bool:
    """Whether the expiry the harness wrote (Unix time, in the socket directory) has passed.

    The harness writes the file when it creates the sandbox and rewrites it when it keeps a
    paused run's sandbox longer; a missing or unreadable file never expires the sandbox.
    """
    try:
        with acting_as(owner), open(expiry_file) as f:
            expires = float(f.read().strip() or "inf")
    except (OSError, ValueError):
        return False
    return time.time() >= expires


def _socket_dir_owner(socket_dir: str) -> FsIdentity | None:
    """Create the socket directory (0700) if missing; return its owner when that is not us.

    The engine bind-mounts a directory the harness created; the agent has no
    CAP_DAC_OVERRIDE, so it enters a directory of another owner only as that owner.
    """
    os.makedirs(socket_dir, mode=0o700, exist_ok=True)
    st = os.stat(socket_dir)
    if st.st_uid == os.geteuid():
        os.chmod(socket_dir, 0o700)
        return None
    return FsIdentity(st.st_uid, st.st_gid)


def _listen(server: grpc.Server, socket: str, owner: FsIdentity | None) -> None:
    old_umask = os.umask(0o177)
    try:
        # The socket belongs to whoever owns its directory (the harness's user on the
        # host), so a harness that is not root can connect and nobody else can.
        with acting_as(owner):
            if os.path.lexists(socket):
                os.unlink(socket)
            server.add_insecure_port(f"unix:{socket}")
        server.start()
        with acting_as(owner), open(os.path.join(os.path.dirname(socket), QUIESCABLE_FILE), "w") as f:
            f.write(f"{QUIESCE_SIGNAL.name}\n")
    finally:
        os.umask(old_umask)


def _quiesce(agent: Agent, socket: str, owner: FsIdentity | None, stop: threading.Event) -> grpc.Server:
    """Close the socket for a memory snapshot, wait for the harness's resume, listen again
    (a new server: calls under way end; jobs, shells and processes keep running).

    gVisor cannot save a socket bound on the host, which the agent's is: its directory is
    the host's. A sandbox restored from the memory image wakes up here, in its own socket
    directory, where the harness wrote the resume before starting it."""
    directory = os.path.dirname(socket)
    agent.server.stop(grace=QUIESCE_GRACE_S).wait()
    with acting_as(owner):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(socket)
        with open(os.path.join(directory, QUIESCED_FILE), "w") as f:
            f.write(f"{os.getpid()}\n")
    log.info("socket closed for a memory snapshot; waiting for %s", RESUME_FILE)
    resume = os.path.join(directory, RESUME_FILE)
    deadline = time.monotonic() + QUIESCE_MAX_S
    while time.monotonic() < deadline and not stop.is_set():
        with acting_as(owner):
            if os.path.exists(resume):
                break
        time.sleep(RESUME_POLL_S)
    with acting_as(owner):
        for name in (RESUME_FILE, QUIESCED_FILE):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(directory, name))
    if stop.is_set():
        return agent.server
    server = agent.renew()
    _listen(server, socket, owner)
    log.info("agent serving again on %s", socket)
    return server


def serve(config: AgentConfig) -> int:
    """Serve until SIGTERM or SIGINT; return the process exit code."""
    owner = _socket_dir_owner(os.path.dirname(config.socket))
    if config.user is not None and os.geteuid() == 0:
        # File operations act as the tool user via setfsuid/setfsgid; root's own
        # supplementary groups would still count in those permission checks.
        drop_supplementary_groups()
    agent = build_server(config)
    runner, health = agent.runner, agent.health
    _listen(agent.server, config.socket, owner)
    health.set("", SERVING)
    stop = threading.Event()
    quiesce = threading.Event()
    wake = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()
        wake.set()

    def on_quiesce(_signum: int, _frame: object) -> None:
        quiesce.set()
        wake.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(QUIESCE_SIGNAL, on_quiesce)
    log.info("agent serving on %s", config.socket)
    expiry_file = os.path.join(os.path.dirname(config.socket), EXPIRY_FILE)
    why = "its container is being stopped: the Docker engine stopped or restarted, or `docker stop`"
    while True:
        wake.wait(timeout=TOP_UP_S if agent.pool.waiting else EXPIRY_RECHECK_S)
        wake.clear()
        agent.pool.top_up()
        if stop.is_set():
            break
        if quiesce.is_set():
            quiesce.clear()
            agent = replace(agent, server=_quiesce(agent, config.socket, owner, stop))
            continue
        if _expired(expiry_file, owner):
            # Nobody will ever clean up after us: stop, so the container stops too.
            log.info("the sandbox expired (%s); stopping", expiry_file)
            why = "it reached its expiry"
            break
    runner.stop(why)
    if agent.jobs.built:
        agent.jobs.value().stop(why)
    agent.server.stop(grace=2).wait()
    return 0
