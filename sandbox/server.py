"""The agent's gRPC server: process, filesystem and health services on a unix socket."""

from __future__ import annotations

import _thread
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc

from sandbox.changes import ChangesService
from sandbox.errors import answer, stream
from sandbox.fs import FilesystemService
from sandbox.health import SERVING, HealthService
from sandbox.identity import FsIdentity, acting_as, drop_supplementary_groups
from sandbox.jobs import JobManager, JobsService
from sandbox.launch import SpawnerLauncher, ToolUser
from sandbox.ports import PortsService
from sandbox.process import ProcessRunner
from sandbox.shell import ShellManager, ShellService
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

log = logging.getLogger("callbox.agent")

MAX_MESSAGE_BYTES = 64 << 20
EXPIRY_FILE = "expires"
EXPIRY_RECHECK_S = 5.0
_T = TypeVar("_T")


class ProcessService(process_pb2_grpc.ProcessServicer):
    """Exec, Signal and WriteStdin over the ProcessRunner."""

    def __init__(self, runner: ProcessRunner) -> None:
        self.runner = runner

    def Exec(
        self, request: process_pb2.ExecRequest, context: grpc.ServicerContext
    ) -> Iterator[process_pb2.ExecEvent]:
        return stream(context, lambda on_start: self.runner.run(request, on_start))

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
    spawner: Spawner | None = None
    """Starts tool processes; None starts them from this process (slower, for tests)."""


class PrestartedPool(futures.Executor):
    """A fixed set of worker threads, all running before the first RPC.

    Threads count against the container's pids limit. A fork bomb in the sandbox can
    use up every pid; a pool that starts threads on demand would then fail to start
    one, and gRPC's request loop would wedge. Starting them all now means serving
    never needs a new thread.

    gRPC's server only submits calls and watches their futures. The workers are started
    with ``_thread`` rather than as ``threading.Thread`` objects: those start one at a
    time, each waiting for the new thread to run, which makes a pool of 72 cost several
    milliseconds more of the agent's start-up; here all are started back to back and
    one barrier waits for them together.
    """

    def __init__(self, workers: int) -> None:
        self._queue: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._workers = workers
        self._shutdown = False
        self._lock = threading.Lock()
        barrier = threading.Barrier(workers + 1)
        for _ in range(workers):
            _thread.start_new_thread(self._work, (barrier,))
        barrier.wait()

    def _work(self, barrier: threading.Barrier) -> None:
        barrier.wait()
        while (item := self._queue.get()) is not None:
            item.run()
            del item  # the finished call's arguments and result are not kept alive

    def submit(
        self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any
    ) -> futures.Future[_T]:
        future: futures.Future[_T] = futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put(_WorkItem(future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers once the queued calls are done (``wait`` is not supported:
        workers busy in a long-lived call are daemon threads the process may exit over)."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            for _ in range(self._workers):
                self._queue.put(None)


class _WorkItem:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: futures.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # handed to the future, as ThreadPoolExecutor does
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)


@dataclass(frozen=True)
class Agent:
    """The server and the parts that must be stopped with it."""

    server: grpc.Server
    runner: ProcessRunner
    jobs: JobManager
    health: HealthService


def build_server(config: AgentConfig) -> Agent:
    launcher = SpawnerLauncher(config.spawner) if config.spawner is not None else None
    runner = ProcessRunner(config.user, config.workspace, config.max_concurrent, launcher)
    identity = FsIdentity(config.user.uid, config.user.gid) if config.user else None
    workers = config.max_concurrent + config.spare_workers
    server = grpc.server(
        PrestartedPool(workers),
        maximum_concurrent_rpcs=workers,
        options=[
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
        ],
    )
    process_pb2_grpc.add_ProcessServicer_to_server(ProcessService(runner), server)
    files = FilesystemService(roots=list(config.roots), workspace=config.workspace, identity=identity)
    filesystem_pb2_grpc.add_FilesystemServicer_to_server(files, server)
    changes_pb2_grpc.add_ChangesServicer_to_server(ChangesService(files), server)
    shell_pb2_grpc.add_ShellServicer_to_server(
        ShellService(ShellManager(config.user, config.workspace, launcher)), server
    )
    jobs = JobManager(config.user, config.workspace, launcher)
    jobs_pb2_grpc.add_JobsServicer_to_server(JobsService(jobs), server)
    ports_pb2_grpc.add_PortsServicer_to_server(PortsService(), server)
    health = HealthService()
    server.add_generic_rpc_handlers((health.handler(),))
    return Agent(server, runner, jobs, health)


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


def serve(config: AgentConfig) -> int:
    """Serve until SIGTERM or SIGINT; return the process exit code."""
    owner = _socket_dir_owner(os.path.dirname(config.socket))
    if config.user is not None and os.geteuid() == 0:
        # File operations act as the tool user via setfsuid/setfsgid; root's own
        # supplementary groups would still count in those permission checks.
        drop_supplementary_groups()
    agent = build_server(config)
    server, runner, health = agent.server, agent.runner, agent.health
    old_umask = os.umask(0o177)
    try:
        # The socket belongs to whoever owns its directory (the harness's user on the
        # host), so a harness that is not root can connect and nobody else can.
        with acting_as(owner):
            if os.path.lexists(config.socket):
                os.unlink(config.socket)
            server.add_insecure_port(f"unix:{config.socket}")
        server.start()
    finally:
        os.umask(old_umask)
    health.set("", SERVING)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("agent serving on %s", config.socket)
    expiry_file = os.path.join(os.path.dirname(config.socket), EXPIRY_FILE)
    why = "its container is being stopped: the Docker engine stopped or restarted, or `docker stop`"
    while not stop.wait(timeout=EXPIRY_RECHECK_S):
        if _expired(expiry_file, owner):
            # Nobody will ever clean up after us: stop, so the container stops too.
            log.info("the sandbox expired (%s); stopping", expiry_file)
            why = "it reached its expiry"
            break
    runner.stop(why)
    agent.jobs.stop(why)
    server.stop(grace=2).wait()
    return 0
