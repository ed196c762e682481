"""TCP connections to the sandbox's own loopback, tunnelled over the agent socket (sandbox.v1.Ports).

Each Connect stream is one TCP connection. The agent runs in the container's network
namespace, so its loopback is the sandbox's, and it exists even with no network at all. The
agent connects to nothing else: the address is fixed here, the client only names the port.

Two pumps per tunnel: a thread takes the client's frames and writes them to the socket (an
eof frame, or the end of the client's stream, shuts the socket's write side); the RPC's own
thread reads the socket and yields frames (end of file: a frame with eof). The stream ends
when both directions are closed, or at once when the RPC is cancelled.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator

import grpc

from sandbox.errors import (
    BUSY,
    CONNECTION_REFUSED,
    INTERNAL,
    INVALID_ARGUMENT,
    AgentError,
    Cancellable,
    stream,
)
from sandbox.v1 import ports_pb2, ports_pb2_grpc

log = logging.getLogger("callbox.agent.ports")

MAX_TUNNELS = 16
"""Open tunnels at once. Each holds one of the agent's prestarted RPC threads for its whole
life and starts one more thread, and both count against the sandbox's pids reserve."""
FRAME_BYTES = 64 << 10
"""The most data one frame towards the client carries (one ``recv``)."""
CONNECT_TIMEOUT_S = 10.0
LOOPBACK_V4 = "127.0.0.1"
LOOPBACK_V6 = "::1"
"""Tried when 127.0.0.1 refuses: a server bound to ``localhost`` may listen on ::1 only."""
OPEN_METADATA_KEY = "callbox-tunnel"
"""Initial metadata the agent sends once the TCP connection is up, so the client can tell a
connected tunnel from a refused one before any data flows."""
OPEN_METADATA = ((OPEN_METADATA_KEY, "open"),)


def _try_connect(family: socket.AddressFamily, address: str, port: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        sock.connect((address, port))
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        sock.close()
        raise
    return sock


def connect_loopback(port: int) -> socket.socket:
    """A TCP connection to ``port`` on the sandbox's loopback (127.0.0.1, else ::1)."""
    try:
        return _try_connect(socket.AF_INET, LOOPBACK_V4, port)
    except ConnectionRefusedError:
        pass
    except TimeoutError:
        raise AgentError(BUSY, f"port {port} in the sandbox did not accept the connection within "
                               f"{CONNECT_TIMEOUT_S:g} s (its listen backlog may be full); retry later") from None
    except OSError as error:
        raise AgentError(INTERNAL, f"could not connect to port {port} in the sandbox: {error}") from None
    try:
        return _try_connect(socket.AF_INET6, LOOPBACK_V6, port)
    except OSError:
        # Refused, or no IPv6 loopback at all: either way nothing listens there.
        raise AgentError(CONNECTION_REFUSED, f"nothing listens on port {port} in the sandbox "
                                             f"(127.0.0.1:{port} and [::1]:{port} refused the connection); "
                                             "start the server first, or check its port") from None


class _Tunnel:
    """One live connection: the socket and the two pumps that share it."""

    def __init__(self, sock: socket.socket, port: int) -> None:
        self.sock = sock
        self.port = port
        self._lock = threading.Lock()
        self._cancelled = False
        self._closed = False

    def cancel(self) -> None:
        """The RPC ended or is being torn down: wake both pumps (idempotent)."""
        with self._lock:
            self._cancelled = True
            if not self._closed:
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        # Under the lock, so a cancel() from gRPC's callback thread never shuts down a file
        # descriptor number that close() has just freed for reuse.
        with self._lock:
            self._closed = True
            self.sock.close()

    def pump_in(self, frames: Iterable[ports_pb2.TunnelFrame]) -> None:
        """The client's frames to the socket until an eof frame, the end of the client's
        stream, a cancelled RPC or a socket the program closed; then shut the write side."""
        try:
            for frame in frames:
                if frame.data:
                    self.sock.sendall(frame.data)
                if frame.eof:
                    break
        except grpc.RpcError:
            return  # the RPC was cancelled; cancel() shuts the socket down
        except OSError as error:
            if error.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN, errno.EBADF):
                log.warning("tunnel to port %d: writing failed: %s", self.port, error)
            return
        with self._lock:
            if not self._closed:
                with contextlib.suppress(OSError):
                    self.sock.shutdown(socket.SHUT_WR)

    def pump_out(self) -> Iterator[ports_pb2.TunnelFrame]:
        """Frames of what the program sends, then one with eof when it closes its side."""
        while True:
            try:
                data = self.sock.recv(FRAME_BYTES)
            except OSError:
                data = b""  # reset by the program: to the client it is the end of the data
            if not data:
                break
            yield ports_pb2.TunnelFrame(data=data)
        if not self._cancelled:
            yield ports_pb2.TunnelFrame(eof=True)


class PortsService(ports_pb2_grpc.PortsServicer):
    """sandbox.v1.Ports: each Connect stream is one TCP connection to 127.0.0.1:port."""

    def __init__(self, max_tunnels: int = MAX_TUNNELS) -> None:
        self.max_tunnels = max_tunnels
        self._changed = threading.Condition()
        self._open = 0

    @property
    def open_tunnels(self) -> int:
        with self._changed:
            return self._open

    def wait_open_tunnels(self, count: int, timeout: float) -> bool:
        """Wait until exactly ``count`` tunnels are open (their sockets closed and threads ended
        for the rest); False on timeout."""
        with self._changed:
            return self._changed.wait_for(lambda: self._open == count, timeout)

    def Connect(
        self, request_iterator: Iterator[ports_pb2.TunnelFrame], context: grpc.ServicerContext
    ) -> Iterator[ports_pb2.TunnelFrame]:
        return stream(context, lambda on_start: self._connect(request_iterator, context, on_start))

    def _connect(
        self,
        requests: Iterator[ports_pb2.TunnelFrame],
        context: grpc.ServicerContext,
        on_start: Callable[[Cancellable], None],
    ) -> Iterator[ports_pb2.TunnelFrame]:
        first = next(requests, None)
        if first is None:
            raise AgentError(INVALID_ARGUMENT, "the tunnel stream ended before its first frame, which names the port")
        if not 1 <= first.port <= 65535:
            raise AgentError(INVALID_ARGUMENT, f"port {first.port} is not a TCP port (1-65535)")
        with self._changed:
            if self._open >= self.max_tunnels:
                raise AgentError(BUSY, f"{self.max_tunnels} tunnels are open already; close one and retry")
            self._open += 1
            self._changed.notify_all()
        try:
            tunnel = _Tunnel(connect_loopback(first.port), first.port)
            try:
                yield from self._pump(tunnel, itertools.chain((first,), requests), context, on_start)
            finally:
                tunnel.close()
        finally:
            with self._changed:
                self._open -= 1
                self._changed.notify_all()

    @staticmethod
    def _pump(
        tunnel: _Tunnel,
        frames: Iterable[ports_pb2.TunnelFrame],
        context: grpc.ServicerContext,
        on_start: Callable[[Cancellable], None],
    ) -> Iterator[ports_pb2.TunnelFrame]:
        on_start(tunnel)  # cancel() runs when the RPC ends, however it ends
        if not context.is_active():
            return
        writer = threading.Thread(target=tunnel.pump_in, args=(frames,), name=f"tunnel-{tunnel.port}", daemon=True)
        try:
            writer.start()
        except RuntimeError:
            raise AgentError(BUSY, "the agent could not start a thread for the tunnel (the sandbox is out of "
                                   "processes); retry later") from None
        try:
            context.send_initial_metadata(OPEN_METADATA)
            yield from tunnel.pump_out()
            writer.join()  # the program closed its side: wait for the client to close its own
        finally:
            tunnel.cancel()
            writer.join()
