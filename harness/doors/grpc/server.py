"""``callbox serve --grpc ADDR``: the ``harness.v1.Executor``, ``harness.v1.Sandboxes`` and
``harness.v1.Undo`` services, with auth, health and reflection.

:func:`serve_grpc` starts the server in the background and returns a :class:`GrpcServer`
handle (``stop()``, ``wait()``, ``serve_forever()``). Decisions:

* **Address.** No address (or ``unix:PATH``, or anything containing ``/``) is a unix socket;
  the default is ``executor.sock`` in the runtime directory that also holds the sandboxes'
  socket directories (``/run/callbox`` for root, else ``$XDG_RUNTIME_DIR/callbox`` or
  ``/tmp/callbox-UID``). The directory is made 0700 when created and the socket is chmod
  0600. A stale socket is removed; a live one (another server answers) is an error.
  ``HOST:PORT`` (``[::1]:PORT``, port 0 picks a free one) is TCP; ``SO_REUSEPORT`` is off,
  so a busy port is an error instead of a silently shared one.
* **TLS.** TCP without TLS is refused unless ``insecure=True`` (bearer tokens would cross
  the network in clear text). ``tls_cert`` + ``tls_key`` (PEM files) serve TLS on either
  kind of address.
* **Fairness and quotas.** Each client may have at most a quarter of the server's
  ``max_workers`` threads busy with its long RPCs at once (streamed ones such as CallTool,
  and CreateSandbox, Fork, Snapshot; its ``concurrent_calls`` quota when lower); one more is
  RESOURCE_EXHAUSTED at once, so one client's flood leaves threads to the others. Quick
  unary RPCs (DeleteSandbox, GetStatus, ...) are not counted: a client at its share can
  still delete a sandbox or cancel. The quotas of :mod:`harness.doors.quota_ledger` apply to CreateSandbox,
  Fork and CallTool.
* **Auth.** A server interceptor checks ``authorization: Bearer TOKEN`` on every RPC except
  the standard health service (so probes such as ``grpc_health_probe`` work without a
  secret; it reveals only SERVING / NOT_SERVING). A missing or unknown token is
  UNAUTHENTICATED with an ``ErrorDetail`` like every other error. Tokens: see
  :mod:`harness.doors.grpc.tokens`.
* **Health and reflection.** ``grpc.health.v1.Health`` (``sandbox.health``, no extra
  package) reports SERVING for ``""``, ``harness.v1.Executor``, ``harness.v1.Sandboxes`` and
  ``harness.v1.Undo`` until shutdown starts. Reflection lists Executor, Sandboxes, Undo, Health and Reflection and can
  describe each of them (it is served from a descriptor pool holding their files).
* **Shutdown.** ``stop(grace)``: health goes NOT_SERVING, new sandboxes are refused,
  running tool calls are cancelled (their processes killed), the server stops accepting
  and waits up to ``grace`` seconds for RPCs in flight, then every sandbox the server owns
  is destroyed and its run ended (``server_shutdown``). Expired sandboxes
  (``ttl_seconds``) are destroyed by a reaper thread while the server runs.
* **Restarts.** With ``keep_sandboxes=True`` the gRPC door's sandboxes (and those of an
  E2B door sharing its executor) are left running at ``stop`` instead, and a server started
  on the same audit store adopts them before it serves (:mod:`harness.doors.grpc.adoption`;
  the E2B door adopts its own when it starts).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Literal

import grpc
from google.protobuf import descriptor, descriptor_pb2, descriptor_pool
from grpc_reflection.v1alpha import reflection, reflection_pb2  # type: ignore[import-untyped]

from harness.audit.store import AuditStore
from harness.core.errors import CallboxError, ErrorCode
from harness.core.policy import Policy, load_policy
from harness.core.registry import ToolRegistry
from harness.doors.grpc.adoption import adopt
from harness.doors.grpc.errors import ServiceError, abort, quota_refused
from harness.doors.grpc.sandboxes import SandboxesService
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import Limits
from harness.doors.grpc.tokens import TOKEN_ENV, TokenSet, bearer_token, server_tokens
from harness.doors.grpc.undo import UndoService
from harness.doors.profiles import PolicySource
from harness.doors.quota_ledger import QuotaExceeded, QuotaKeeper, fair_share
from harness.engine.docker.engine import DockerEngine
from harness.tools import registry_for
from harness.v1 import executor_pb2, executor_pb2_grpc, sandboxes_pb2, sandboxes_pb2_grpc, undo_pb2, undo_pb2_grpc
from harness.wire import MAX_MESSAGE_BYTES, default_executor_socket
from sandbox import health

__all__ = [
    "EXECUTOR_SERVICE",
    "SANDBOXES_SERVICE",
    "UNDO_SERVICE",
    "Address",
    "GrpcServer",
    "ServeError",
    "default_socket_path",
    "parse_address",
    "serve_grpc",
]

log = logging.getLogger("callbox.grpc")

EXECUTOR_SERVICE = executor_pb2.DESCRIPTOR.services_by_name["Executor"].full_name
SANDBOXES_SERVICE = sandboxes_pb2.DESCRIPTOR.services_by_name["Sandboxes"].full_name
UNDO_SERVICE = undo_pb2.DESCRIPTOR.services_by_name["Undo"].full_name
_SUN_PATH_MAX = 107
_UNAUTHENTICATED_EXEMPT = (f"/{health.SERVICE_NAME}/",)
_LONG_UNARY = frozenset({f"/{EXECUTOR_SERVICE}/CreateSandbox", f"/{SANDBOXES_SERVICE}/Fork",
                         f"/{SANDBOXES_SERVICE}/Snapshot", f"/{UNDO_SERVICE}/RevertRun"})
"""The unary RPCs that hold a thread for long (a sandbox start, a snapshot): counted in a
client's share like the streamed ones (the other unary RPCs are quick and always served)."""


class ServeError(CallboxError):
    """The server cannot start as asked; the message names the option and the fix."""

    code = ErrorCode.INVALID_CONFIG


# --- addresses ---------------------------------------------------------------------------------------


def default_socket_path() -> Path:
    return default_executor_socket()


@dataclass(frozen=True)
class Address:
    kind: Literal["unix", "tcp"]
    value: str
    """The socket path, or ``host:port``."""

    @property
    def bind_target(self) -> str:
        return f"unix:{self.value}" if self.kind == "unix" else self.value


def parse_address(text: str | None, *, name: str = "--grpc") -> Address:
    """``None``/``""`` (the default socket), ``unix:PATH``, a path, or ``HOST:PORT``; a
    ServeError names the setting as ``name`` (``"[doors.grpc] listen ="`` for a file's key)."""
    raw = (text or "").strip()
    if not raw:
        return Address("unix", str(default_socket_path()))
    if raw.startswith("unix:"):
        path = raw[len("unix:"):]
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise ServeError(f"{name} {text!r}: unix: needs a socket path, e.g. unix:/run/callbox/executor.sock")
        return Address("unix", os.path.abspath(path))
    if "/" in raw:
        return Address("unix", os.path.abspath(raw))
    host, sep, port = raw.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ServeError(
            f"{name} {text!r} is neither a socket path nor HOST:PORT; use e.g. 127.0.0.1:50051, [::1]:50051, "
            "or unix:/path/executor.sock"
        )
    if host.startswith("[") != host.endswith("]"):
        raise ServeError(f"{name} {text!r}: write an IPv6 host in brackets, e.g. [::1]:{port}")
    return Address("tcp", f"{host or '0.0.0.0'}:{int(port)}")  # noqa: S104 (":PORT" means every interface)


def _prepare_socket_path(path: Path) -> None:
    if len(str(path).encode()) > _SUN_PATH_MAX:
        raise ServeError(f"socket path {path} is longer than {_SUN_PATH_MAX} bytes; choose a shorter one")
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=0o700)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ServeError(f"{path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        path.unlink(missing_ok=True)  # stale: nobody listens
        return
    finally:
        probe.close()
    raise ServeError(f"another server is listening on {path}; stop it or choose another socket path")


# --- auth ---------------------------------------------------------------------------------------------


def _unauthenticated(message: str) -> Callable[[Any, grpc.ServicerContext], Any]:
    def fail(request: Any, context: grpc.ServicerContext) -> Any:
        abort(context, ServiceError(ErrorCode.UNAUTHENTICATED, message))

    return fail


class _AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Lets through only RPCs with a known bearer token (the health service excepted), each
    client at most ``share`` at once (:func:`_fair`)."""

    def __init__(self, tokens: TokenSet, quotas: QuotaKeeper | None = None, share: int = 1 << 30,
                 capacity: int | None = None) -> None:
        self.tokens = tokens
        self.quotas = quotas
        self.share = share
        self.capacity = capacity
        """The server's threads: past its share, a client is served while a share of them stays free."""

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        method: str = handler_call_details.method or ""
        if method.startswith(_UNAUTHENTICATED_EXEMPT):
            return continuation(handler_call_details)
        token = bearer_token(handler_call_details.invocation_metadata)
        client = self.tokens.lookup(token) if token is not None else None
        if client is not None:
            handler = continuation(handler_call_details)
            if handler is None or self.quotas is None:
                return handler
            if not (handler.request_streaming or handler.response_streaming or method in _LONG_UNARY):
                return handler  # quick: never kept from a client, even one at its share (DeleteSandbox)
            return _fair(handler, client, self.quotas, self.share, self.capacity)
        if token is None:
            message = (f"this request carries no bearer token; send the metadata 'authorization: Bearer TOKEN' with "
                       f"a token of this server (the one `callbox serve --grpc` printed on its first start; "
                       f"harness.client sends {TOKEN_ENV} or its token= argument)")
        else:
            message = "the bearer token is not valid for this server"
        fail = _unauthenticated(message)
        handler = continuation(handler_call_details)
        if handler is None or not (handler.request_streaming or handler.response_streaming):
            return grpc.unary_unary_rpc_method_handler(fail)
        if handler.request_streaming and handler.response_streaming:
            return grpc.stream_stream_rpc_method_handler(fail)
        if handler.request_streaming:
            return grpc.stream_unary_rpc_method_handler(fail)
        return grpc.unary_stream_rpc_method_handler(fail)


def _fair(handler: Any, client: str, quotas: QuotaKeeper, share: int, capacity: int | None = None) -> Any:
    """``handler`` counted as one of ``client``'s requests in flight from its start until the
    RPC ends (however it ends: the RPC's termination callback); beyond the client's share of
    the server's threads it is RESOURCE_EXHAUSTED at once, leaving the threads to the others
    (see :mod:`harness.doors.quota_ledger`)."""

    def enter(context: grpc.ServicerContext) -> None:
        try:
            quotas.enter(client, door="grpc", share=share, capacity=capacity)
        except QuotaExceeded as refusal:
            abort(context, quota_refused(refusal))
        if not context.add_callback(lambda: quotas.leave(client, door="grpc")):
            quotas.leave(client, door="grpc")  # the RPC has already ended

    def unary(behavior: Callable[[Any, grpc.ServicerContext], Any]) -> Callable[[Any, grpc.ServicerContext], Any]:
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            enter(context)
            return behavior(request, context)

        return run

    def streamed(behavior: Callable[[Any, grpc.ServicerContext], Iterator[Any]]
                 ) -> Callable[[Any, grpc.ServicerContext], Iterator[Any]]:
        def run(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            enter(context)
            yield from behavior(request, context)

        return run

    if handler.unary_unary is not None:
        return handler._replace(unary_unary=unary(handler.unary_unary))
    if handler.stream_unary is not None:
        return handler._replace(stream_unary=unary(handler.stream_unary))
    if handler.unary_stream is not None:
        return handler._replace(unary_stream=streamed(handler.unary_stream))
    return handler._replace(stream_stream=streamed(handler.stream_stream))


# --- reflection ----------------------------------------------------------------------------------------


def _health_file() -> descriptor_pb2.FileDescriptorProto:
    """The health messages of ``sandbox.health`` plus the service itself, as grpc.health.v1 publishes it."""
    proto = descriptor_pb2.FileDescriptorProto()
    health.HealthCheckRequest.DESCRIPTOR.file.CopyToProto(proto)
    proto.name = "grpc/health/v1/health.proto"
    service = proto.service.add(name="Health")
    request, response = ".grpc.health.v1.HealthCheckRequest", ".grpc.health.v1.HealthCheckResponse"
    service.method.add(name="Check", input_type=request, output_type=response)
    service.method.add(name="Watch", input_type=request, output_type=response, server_streaming=True)
    return proto


def _reflection_pool() -> descriptor_pool.DescriptorPool:
    pool = descriptor_pool.DescriptorPool()
    added: set[str] = set()

    def add(file: descriptor.FileDescriptor) -> None:
        if file.name in added:
            return
        for dependency in file.dependencies:
            add(dependency)
        proto = descriptor_pb2.FileDescriptorProto()
        file.CopyToProto(proto)
        pool.Add(proto)
        added.add(file.name)

    add(executor_pb2.DESCRIPTOR)
    add(sandboxes_pb2.DESCRIPTOR)
    add(undo_pb2.DESCRIPTOR)
    add(reflection_pb2.DESCRIPTOR)
    pool.Add(_health_file())
    return pool


# --- the handle ------------------------------------------------------------------------------------------


class GrpcServer:
    """A running executor server. ``stop()`` shuts it down gracefully (see the module docstring)."""

    def __init__(
        self,
        *,
        server: grpc.Server,
        service: ExecutorService,
        health_service: health.HealthService,
        address: Address,
        port: int | None,
        tls: bool,
        socket_inode: int | None,
        owned_audit: AuditStore | None,
    ) -> None:
        self.server = server
        self.service = service
        self.health = health_service
        self.address = address
        self.port = port
        self.tls = tls
        self._socket_inode = socket_inode
        self._owned_audit = owned_audit
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self.destroyed: list[str] = []

    @property
    def tokens(self) -> TokenSet:
        return self.service.tokens

    @property
    def target(self) -> str:
        """What a client passes to connect (``unix:/path`` or ``host:port``)."""
        if self.address.kind == "unix":
            return f"unix:{self.address.value}"
        host = self.address.value.rpartition(":")[0]
        if host in ("0.0.0.0", "[::]", ""):  # noqa: S104
            host = "localhost"
        return f"{host}:{self.port}"

    def __repr__(self) -> str:
        return f"GrpcServer({self.target}{' tls' if self.tls else ''})"

    def stop(self, grace: float = 5.0) -> list[str]:
        """Stop serving and destroy every sandbox this server owns (with ``keep_sandboxes``,
        the kept ones are left running: ``service.left_running``); the ids destroyed. Idempotent."""
        with self._stop_lock:
            if self._stopped.is_set():
                return []
            self.health.set("", health.NOT_SERVING)
            self.health.set(EXECUTOR_SERVICE, health.NOT_SERVING)
            self.health.set(SANDBOXES_SERVICE, health.NOT_SERVING)
            self.health.set(UNDO_SERVICE, health.NOT_SERVING)
            self.service.begin_shutdown()
            self.server.stop(grace).wait()
            self.destroyed = self.service.shutdown()
            if self._socket_inode is not None:
                path = Path(self.address.value)
                with contextlib.suppress(OSError):
                    if path.lstat().st_ino == self._socket_inode:
                        path.unlink()
            if self._owned_audit is not None:
                self._owned_audit.close()
            self._stopped.set()
            log.info("gRPC executor on %s stopped; destroyed %d sandbox(es), left %d running for the next server",
                     self.target, len(self.destroyed), len(self.service.left_running))
            return self.destroyed

    def wait(self, timeout: float | None = None) -> bool:
        """Block until ``stop`` has finished (True) or ``timeout`` passes (False)."""
        return self._stopped.wait(timeout)

    def serve_forever(self, grace: float = 5.0) -> None:
        """Block until SIGINT or SIGTERM, then ``stop(grace)`` (call from the main thread, as the CLI does)."""
        requested = threading.Event()

        def on_signal(signum: int, frame: FrameType | None) -> None:
            requested.set()

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            while not requested.wait(0.5) and not self._stopped.is_set():
                pass
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self.stop(grace)

    def __enter__(self) -> GrpcServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _read_pem(path: Path, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise ServeError(f"--tls-{what} {path} cannot be read: {exc.strerror or exc}") from None


def announce_token(message: str) -> None:
    """Show the one-time message of a token generated on first start (standard error)."""
    print(f"callbox: {message}", file=sys.stderr, flush=True)


def serve_grpc(
    addr: str | None = None,
    *,
    token_file: Path | None = None,
    insecure: bool = False,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    policy: Policy | None = None,
    audit: AuditStore | None = None,
    registry: ToolRegistry | None = None,
    max_sandboxes_per_client: int | None = None,
    max_sandboxes_total: int = 64,
    max_workers: int = 128,
    engine_factory: Callable[[], DockerEngine] | None = None,
    announce: Callable[[str], None] | None = announce_token,
    tokens: TokenSet | None = None,
    reaper_interval_s: float = 5.0,
    keep_sandboxes: bool = False,
    quotas: QuotaKeeper | None = None,
    policies: PolicySource | None = None,
) -> GrpcServer:
    """Start the executor service in the background; see the module docstring.

    ``addr``: ``None`` (the default unix socket), ``unix:PATH``, a path, or ``HOST:PORT``.
    ``policy`` defaults to the packaged default policy, ``audit`` to the default audit store
    (``CALLBOX_AUDIT_DB``), ``registry`` to the built-in tools and those the policy declares. ``announce`` receives the
    one-time message showing a token generated on first start. ``tokens`` bypasses the
    token sources (tests). ``keep_sandboxes``: leave the sandboxes running at ``stop`` and
    adopt those an earlier server on this audit store left, before serving (needs the
    Docker engine now). ``quotas``: every client's quotas, shared with the server's other
    doors (default: a keeper of this server's own, fair shares only); each client may have at
    most a quarter of the ``max_workers`` threads in flight. ``policies``: a client's policy
    (its profile's; default: ``policy`` for every client). Raises ServeError (exit code 2) for a bad address, TLS or
    token configuration, or a socket/port that cannot be bound.
    """
    address = parse_address(addr)
    if (tls_cert is None) != (tls_key is None):
        raise ServeError("TLS needs both --tls-cert and --tls-key (PEM files)")
    tls = tls_cert is not None
    if address.kind == "tcp" and not tls and not insecure:
        raise ServeError(
            f"refusing to serve TCP {address.value} without TLS: bearer tokens would cross the network in clear text; "
            "pass --tls-cert and --tls-key, or --insecure to accept that (e.g. on a trusted loopback)"
        )
    credentials = None
    if tls_cert is not None and tls_key is not None:
        credentials = grpc.ssl_server_credentials([(_read_pem(tls_key, "key"), _read_pem(tls_cert, "cert"))])
    token_set = tokens if tokens is not None else server_tokens(token_file, announce=announce)
    limits = Limits(max_sandboxes_per_client=max_sandboxes_per_client, max_sandboxes_total=max_sandboxes_total)
    owned_audit = AuditStore() if audit is None else None
    store = audit if audit is not None else owned_audit
    assert store is not None
    try:
        served = policy or load_policy(None)
        service = ExecutorService(
            registry=registry or registry_for(served), policy=served, audit=store,
            tokens=token_set, limits=limits, engine_factory=engine_factory,
            keep_sandboxes=keep_sandboxes,
            quotas=quotas, policies=policies,
        )
        if keep_sandboxes:
            log.info("gRPC executor: %s", adopt(service).summary())
        if address.kind == "unix":
            _prepare_socket_path(Path(address.value))
        server = grpc.server(
            ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="callbox-grpc"),
            interceptors=[_AuthInterceptor(token_set, service.quotas, fair_share(max_workers), max_workers)],
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ],
        )
        executor_pb2_grpc.add_ExecutorServicer_to_server(service, server)
        sandboxes_pb2_grpc.add_SandboxesServicer_to_server(SandboxesService(service), server)
        undo_pb2_grpc.add_UndoServicer_to_server(UndoService(service), server)
        health_service = health.HealthService()
        server.add_generic_rpc_handlers((health_service.handler(),))
        reflection.enable_server_reflection(
            (EXECUTOR_SERVICE, SANDBOXES_SERVICE, UNDO_SERVICE, health.SERVICE_NAME, reflection.SERVICE_NAME), server,
            pool=_reflection_pool(),
        )
        try:
            if credentials is not None:
                port = server.add_secure_port(address.bind_target, credentials)
            else:
                port = server.add_insecure_port(address.bind_target)
        except RuntimeError as exc:
            raise ServeError(f"cannot listen on {address.value}: {exc}") from None
        if address.kind == "tcp" and not port:
            raise ServeError(f"cannot listen on {address.value} (in use, or not an address of this host)")
        server.start()
    except BaseException:
        if owned_audit is not None:
            owned_audit.close()
        raise
    inode = None
    if address.kind == "unix":
        path = Path(address.value)
        os.chmod(path, 0o600)
        inode = path.lstat().st_ino
    health_service.set("", health.SERVING)
    health_service.set(EXECUTOR_SERVICE, health.SERVING)
    health_service.set(SANDBOXES_SERVICE, health.SERVING)
    health_service.set(UNDO_SERVICE, health.SERVING)
    service.start_reaper(reaper_interval_s)
    handle = GrpcServer(
        server=server, service=service, health_service=health_service, address=address,
        port=port if address.kind == "tcp" else None, tls=tls, socket_inode=inode, owned_audit=owned_audit,
    )
    log.debug("gRPC executor listening on %s (%d client token(s) from %s)", handle.target, len(token_set),
              token_set.source)
    return handle
