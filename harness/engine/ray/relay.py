"""The node-side relay: the harness's gRPC calls to the agents of this node's sandboxes, over TCP.

An agent listens only on a unix socket on its own node. The relay serves one TLS port on the
node's address and forwards every call to the socket of the sandbox the call names, byte for
byte: one generic handler takes any method path, with no (de)serialization, and makes the same
call as a stream-stream call on a channel to that sandbox's socket (one connection per sandbox,
reused). Unary and server-streaming methods are stream-stream calls with one request or one
response on the wire, so every method of the agent (and any it gains later) passes unchanged.
The agent's methods known to take one request go as unary-stream calls instead, which saves a
thread hand-off or two per call (:data:`UNARY_REQUEST_METHODS`); the bytes are the same.

What the caller sees is what the agent said: its initial metadata, every message in order,
its trailing metadata (the agent's ``ErrorDetail`` included), status code and details. The
caller's deadline becomes the forwarded call's; a caller that cancels (or whose connection
dies) cancels the forwarded call, and the agent then stops what it started; flow control holds
end to end, since the relay reads the next message from one side only when the other took the
last one.

**Credentials.** Each registered sandbox has its own token (``secrets.token_urlsafe(32)``);
a call names its sandbox in ``callbox-sandbox`` metadata and carries ``authorization: Bearer
<token>``. A call whose sandbox is unknown or whose token is wrong is refused with
UNAUTHENTICATED and one message for both, so a caller learns nothing about which sandboxes
exist. Neither key is passed on to the agent. Tokens and socket paths are kept in the state
directory (0700, the file 0600), so a relay that restarts accepts the tokens the harness
holds; at start the relay takes back every kept sandbox whose socket is still there.

**Bounds.** At most ``max_streams`` calls are forwarded at once (each holds one worker thread
for its whole life); one beyond is refused at once with RESOURCE_EXHAUSTED (retryable) naming
the limit, never queued. Messages are bounded as on every callbox channel
(:data:`harness.wire.MAX_MESSAGE_BYTES`).

**A sandbox gone.** A socket that is gone or refuses fails the call with UNAVAILABLE, as on
the node itself, which the harness reads as the sandbox having gone away; so does a call still
running when its sandbox is unregistered.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import grpc.experimental

from harness.core.errors import CallboxError
from harness.engine.agent_client import RELAY_AUTH_KEY, RELAY_SANDBOX_KEY
from harness.engine.ray.relay_tls import relay_identity
from harness.wire import MAX_MESSAGE_BYTES

__all__ = ["DEFAULT_MAX_STREAMS", "TOKENS_FILE", "AgentRelay"]

log = logging.getLogger("callbox.relay")

DEFAULT_MAX_STREAMS = 128
"""Calls one relay forwards at once (each holds a worker thread while it lasts)."""
TOKENS_FILE = "relay-sandboxes.json"
"""In the state directory: each registered sandbox's token and socket path."""
SPARE_WORKERS = 8
"""Worker threads beyond ``max_streams``: they refuse the calls over the limit with a message."""
REFUSED = "the relay refused the call: the sandbox id or its token is missing or wrong"
"""Said for an unknown sandbox and for a wrong token alike."""
GONE = "the sandbox was removed from its node while the call ran"
_UNKNOWN_TOKEN = secrets.token_urlsafe(32)
"""Compared against when a call names no registered sandbox (so the refusal takes as long)."""
NO_DEADLINE_S = 1e8
"""A call's time remaining above this means it has no deadline."""

_SINGLE_THREADED = (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)
_BACKEND_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.enable_retries", 0),
]
_SERVER_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),  # a port already taken fails the start instead of being shared
    # the harness pings every second, with calls or without: allow it (any interval above half
    # a second, with no strikes and no limit on pings without data)
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.http2.max_pings_without_data", 0),
    # and find a harness that vanished (in about five seconds), to cancel what it left running
    ("grpc.keepalive_time_ms", 2_000),
    ("grpc.keepalive_timeout_ms", 3_000),
    ("grpc.http2.ping_timeout_ms", 3_000),  # gRPC's other pings too (a minute by default)
]
_NOT_FORWARDED = frozenset({RELAY_SANDBOX_KEY, RELAY_AUTH_KEY, "user-agent", "te", "content-type", "host"})


def _unary_request_methods() -> frozenset[str]:
    """The agent's methods that take one request (all but the client-streaming ones)."""
    from sandbox import health
    from sandbox.v1 import changes_pb2, filesystem_pb2, jobs_pb2, ports_pb2, process_pb2, shell_pb2

    paths = {health.CHECK_METHOD, f"/{health.SERVICE_NAME}/Watch"}
    for module in (changes_pb2, filesystem_pb2, jobs_pb2, ports_pb2, process_pb2, shell_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            paths.update(f"/{service.full_name}/{m.name}" for m in service.methods if not m.client_streaming)
    return frozenset(paths)


UNARY_REQUEST_METHODS = _unary_request_methods()
"""Forwarded as unary-stream calls: the relay reads the one request itself, so no thread of
gRPC's has to feed a request stream, and reads the answer on its own worker thread (about a
millisecond less per call on a busy machine). Every other path is forwarded as stream-stream."""


class _Backend:
    """One registered sandbox: its token and the channels to its agent's socket (the same
    connection: one channel object for stream-stream calls, one reading unary-stream calls
    on the calling thread)."""

    def __init__(self, sandbox_id: str, socket_path: str, token: str) -> None:
        self.sandbox_id = sandbox_id
        self.socket_path = socket_path
        self.token = token
        self.closed = False
        self._calls: dict[str, Any] = {}
        self._open()

    def _open(self) -> None:
        target = f"unix:{self.socket_path}"
        self._channel = grpc.insecure_channel(target, options=_BACKEND_OPTIONS)
        self._single = grpc.insecure_channel(target, options=[*_BACKEND_OPTIONS, _SINGLE_THREADED])
        self._calls = {}

    def reopen(self) -> None:
        """New channels (after :meth:`close`) for a relay started again."""
        self._open()

    def close(self) -> None:
        for channel in (self._single, self._channel):
            with contextlib.suppress(Exception):
                channel.close()

    def call(self, method: str, unary_request: bool) -> Any:
        """The multi-callable of ``method`` (cached): unary-stream or stream-stream, bytes through."""
        key = f"u{method}" if unary_request else method
        multicallable = self._calls.get(key)
        if multicallable is None:
            multicallable = self._single.unary_stream(method) if unary_request else self._channel.stream_stream(method)
            self._calls[key] = multicallable
        return multicallable


def _forwarded(metadata: Sequence[tuple[str, Any]] | None) -> tuple[tuple[str, Any], ...]:
    """The metadata passed on: everything but the relay's own keys and the transport's."""
    return tuple((key, value) for key, value in metadata or ()
                 if key not in _NOT_FORWARDED and not key.startswith((":", "grpc-")))


def _remaining(context: grpc.ServicerContext) -> float | None:
    remaining: float = context.time_remaining()
    return None if remaining > NO_DEADLINE_S else remaining


class AgentRelay:
    """A TLS gRPC server on ``bind_host`` forwarding each call to the agent of the sandbox it names.

    ``bind_host`` is the node's address (an IP address, which the certificate names);
    ``port`` 0 takes any free port (:attr:`address` says which). ``state_dir`` keeps the
    certificate, its key and the sandboxes' tokens across restarts."""

    def __init__(self, *, bind_host: str, port: int = 0, state_dir: Path,
                 max_streams: int = DEFAULT_MAX_STREAMS) -> None:
        if max_streams < 1:
            raise ValueError("max_streams must be at least 1")
        self.bind_host = bind_host
        self.port = port
        self.state_dir = state_dir
        self.max_streams = max_streams
        self._identity = relay_identity(state_dir, bind_host)
        self._lock = threading.Lock()
        self._backends: dict[str, _Backend] = {}
        self._active = 0
        self._active_lock = threading.Lock()  # not the registry's: that one is held while it writes a file
        self._server: grpc.Server | None = None
        self._bound = 0
        self._restore()

    # ---- the contract ------------------------------------------------------------------------

    def start(self) -> None:
        """Listen on ``bind_host:port``; a port that cannot be bound is a CallboxError."""
        if self._server is not None:
            return
        workers = self.max_streams + SPARE_WORKERS
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="callbox-relay"),
            handlers=[_Router(self)], options=_SERVER_OPTIONS, maximum_concurrent_rpcs=workers,
        )
        credentials = grpc.ssl_server_credentials([(self._identity.key_pem, self._identity.certificate_pem)])
        target = f"{_host_part(self.bind_host)}:{self.port}"
        try:
            bound = server.add_secure_port(target, credentials)
        except RuntimeError as error:  # gRPC raises when it cannot bind
            bound, reason = 0, str(error)
        else:
            reason = "the address is taken or not this machine's"
        if not bound:
            server.stop(None)
            raise CallboxError(f"the agent relay cannot listen on {target}: {reason}")
        server.start()
        self._server, self._bound = server, bound
        log.info("agent relay listening on %s (%d sandbox(es) registered)", self.address, len(self._backends))

    @property
    def address(self) -> str:
        """``ip:port`` the harness dials (once started)."""
        if not self._bound:
            raise CallboxError("the agent relay is not started")
        return f"{_host_part(self.bind_host)}:{self._bound}"

    @property
    def certificate_pem(self) -> bytes:
        """The relay's certificate, which the harness pins."""
        return self._identity.certificate_pem

    def register(self, sandbox_id: str, socket_path: str) -> str:
        """Forward calls for ``sandbox_id`` to the agent on ``socket_path``; return its token
        (the same one again for a sandbox already registered, even across a restart)."""
        if not sandbox_id or not sandbox_id.isascii() or not sandbox_id.isprintable() or " " in sandbox_id:
            raise ValueError(f"sandbox id {sandbox_id!r} cannot travel in gRPC metadata")
        with self._lock:
            backend = self._backends.get(sandbox_id)
            if backend is not None and backend.socket_path == socket_path:
                return backend.token
            token = backend.token if backend is not None else secrets.token_urlsafe(32)
            if backend is not None:  # the same sandbox on another socket: the old channels go
                backend.closed = True
                backend.close()
            self._backends[sandbox_id] = _Backend(sandbox_id, socket_path, token)
            self._save()
        return token

    def unregister(self, sandbox_id: str) -> None:
        """Stop forwarding for ``sandbox_id`` and forget its token; calls still running end with
        UNAVAILABLE. Nothing happens for a sandbox not registered."""
        with self._lock:
            backend = self._backends.pop(sandbox_id, None)
            if backend is None:
                return
            self._save()
        backend.closed = True
        backend.close()

    @property
    def active(self) -> int:
        """Calls being forwarded now."""
        return self._active

    def registered(self) -> list[str]:
        with self._lock:
            return sorted(self._backends)

    def stop(self, grace: float | None = None) -> None:
        """Stop serving (calls in flight get ``grace`` seconds, then are cancelled) and close the
        channels to the agents. The tokens stay in the state directory."""
        server, self._server, self._bound = self._server, None, 0
        if server is not None:
            server.stop(grace).wait()
        with self._lock:
            backends = list(self._backends.values())
        for backend in backends:
            backend.close()
            backend.reopen()  # a later start serves it again

    # ---- serving -----------------------------------------------------------------------------

    def _authorize(self, metadata: Sequence[tuple[str, Any]] | None) -> _Backend | None:
        """The backend a call's metadata names, if its token is right."""
        sandbox_id = token = None
        for key, value in metadata or ():
            if key == RELAY_SANDBOX_KEY and sandbox_id is None:
                sandbox_id = value
            elif key == RELAY_AUTH_KEY and token is None:
                token = value
        if not isinstance(sandbox_id, str) or not isinstance(token, str):
            return None
        scheme, _, presented = token.partition(" ")
        if scheme.lower() != "bearer":
            return None
        backend = self._backends.get(sandbox_id)
        # compared even for an unknown sandbox, so the answer takes as long either way
        expected = backend.token if backend is not None else _UNKNOWN_TOKEN
        if not hmac.compare_digest(presented.strip().encode(), expected.encode()):
            return None
        return backend

    def _forward(self, backend: _Backend, method: str, request: bytes | Iterator[bytes],
                 context: grpc.ServicerContext) -> Iterator[bytes]:
        """Make the call on the sandbox's socket and pass everything of it back; ``request`` is
        the one request of a method in UNARY_REQUEST_METHODS (bytes), else the request stream."""
        with self._active_lock:
            full = self._active >= self.max_streams
            if not full:
                self._active += 1
        if full:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED,
                          f"the node's relay is carrying its limit of {self.max_streams} calls; retry when one ends")
        try:
            single = isinstance(request, bytes)
            multicallable = backend.call(method, single)
            call = multicallable(request, timeout=_remaining(context),
                                 metadata=_forwarded(context.invocation_metadata()))
            context.add_callback(call.cancel)  # the caller went away or its deadline passed
            with contextlib.suppress(grpc.RpcError):  # its status is passed on below
                if single:
                    # The single-threaded call holds its lock while it waits for headers, and its
                    # cancel() takes that lock: wait for the first message (or the end) instead,
                    # which comes after the headers, so a cancel is never held up.
                    responses = iter(call)
                    first = next(responses, None)
                    _pass_initial(call, context)
                    if first is not None:
                        yield first
                        yield from responses
                else:
                    # a tunnel counts as open on the agent's headers, before any message
                    _pass_initial(call, context)
                    yield from call
            code, details = call.code(), call.details()
            trailing = call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))
            if code == grpc.StatusCode.CANCELLED and backend.closed and context.is_active():
                code, details = grpc.StatusCode.UNAVAILABLE, GONE
            if code != grpc.StatusCode.OK:
                context.set_code(code)
                context.set_details(details or "")
        finally:
            with self._active_lock:
                self._active -= 1

    # ---- the state directory -------------------------------------------------------------------

    @property
    def _tokens_path(self) -> Path:
        return self.state_dir / TOKENS_FILE

    def _restore(self) -> None:
        """Take back the kept sandboxes whose sockets are still there."""
        try:
            kept = json.loads(self._tokens_path.read_text())["sandboxes"]
            entries = {str(k): (str(v["token"]), str(v["socket"])) for k, v in kept.items()}
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("relay: %s does not read (%s); its sandboxes must be registered again",
                        self._tokens_path, error)
            return
        dropped = 0
        for sandbox_id, (token, socket_path) in entries.items():
            if os.path.exists(socket_path):
                self._backends[sandbox_id] = _Backend(sandbox_id, socket_path, token)
            else:
                dropped += 1
        if dropped:
            with self._lock:
                self._save()

    def _save(self) -> None:
        """Write the tokens file at once (0600); the caller holds the lock."""
        payload = {"version": 1, "sandboxes": {
            b.sandbox_id: {"token": b.token, "socket": b.socket_path} for b in self._backends.values()}}
        path = self._tokens_path
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(payload, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)


def _pass_initial(call: Any, context: grpc.ServicerContext) -> None:
    """Send the agent's initial metadata on, if it sent any."""
    initial = call.initial_metadata()
    if initial:
        context.send_initial_metadata(_forwarded(initial))


def _host_part(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


class _Router(grpc.GenericRpcHandler):  # type: ignore[misc]
    """Every method path: refused without the sandbox's credentials, else forwarded."""

    def __init__(self, relay: AgentRelay) -> None:
        self._relay = relay

    def service(self, handler_call_details: Any) -> grpc.RpcMethodHandler:
        backend = self._relay._authorize(handler_call_details.invocation_metadata)
        if backend is None:
            return grpc.stream_stream_rpc_method_handler(_refuse)
        method: str = handler_call_details.method
        relay = self._relay

        def forward(request: bytes | Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
            return relay._forward(backend, method, request, context)

        if method in UNARY_REQUEST_METHODS:
            return grpc.unary_stream_rpc_method_handler(forward)
        return grpc.stream_stream_rpc_method_handler(forward)


def _refuse(_requests: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[bytes]:
    context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
    raise AssertionError("unreachable: abort raises")
