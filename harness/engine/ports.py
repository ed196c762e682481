"""TCP connections into a sandbox over its agent's socket (sandbox.v1.Ports), and host-side port forwarding.

A :class:`Tunnel` is one TCP connection to a port on the sandbox's loopback, carried by one
``Ports.Connect`` stream; it needs no network in the sandbox. A :class:`PortForward` listens on
the host's loopback and carries each connection it accepts through a tunnel of its own.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import selectors
import socket
import struct
import threading
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import grpc

from harness.core.errors import AgentCallError, UsageError
from harness.engine.agent_errors import translate
from sandbox.ports import OPEN_METADATA_KEY
from sandbox.v1 import ports_pb2, ports_pb2_grpc

if TYPE_CHECKING:
    from harness.engine.agent_client import AgentClient

log = logging.getLogger("callbox.ports")

FRAME_BYTES = 256 << 10
"""The most data one frame towards the agent carries (and one read of a forwarded connection)."""
PENDING_FRAMES = 16
"""Frames queued for the agent before :meth:`Tunnel.send` waits (bounds memory per tunnel)."""
CONNECT_TIMEOUT_S = 30.0
"""How long :meth:`PortsClient.connect` waits for the agent to open the connection."""
CLOSE_WAIT_S = 5.0
"""How long :meth:`PortForward.close` waits for each connection's threads to finish."""
LISTEN_BACKLOG = 64


class _Outbox:
    """Frames waiting for gRPC to send them; bounded, so a writer waits on a slow tunnel."""

    def __init__(self, limit: int) -> None:
        self._frames: deque[ports_pb2.TunnelFrame] = deque()
        self._cond = threading.Condition()
        self._limit = limit
        self._ended = False  # nothing more will be put: the stream ends after the queued frames
        self._closed = False  # the call is over: queued frames are dropped

    def put(self, frame: ports_pb2.TunnelFrame) -> bool:
        """Queue ``frame``, waiting while the queue is full; False if the outbox is closed or ended."""
        with self._cond:
            while len(self._frames) >= self._limit and not self._closed:
                self._cond.wait()
            if self._closed or self._ended:
                return False
            self._frames.append(frame)
            self._cond.notify_all()
            return True

    def end(self) -> None:
        with self._cond:
            self._ended = True
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._frames.clear()
            self._cond.notify_all()

    def __iter__(self) -> Iterator[ports_pb2.TunnelFrame]:
        """The request stream gRPC sends (on its own thread)."""
        while True:
            with self._cond:
                while not self._frames and not self._ended and not self._closed:
                    self._cond.wait()
                if self._closed or not self._frames:
                    return
                frame = self._frames.popleft()
                self._cond.notify_all()
            yield frame


class Tunnel:
    """One TCP connection to 127.0.0.1:port in the sandbox, carried by one Ports.Connect stream.

    :meth:`send` and :meth:`shutdown_write` may be called from one thread while another reads
    :meth:`recv`. Made by :meth:`PortsClient.connect`, which returns once the agent has connected.
    """

    def __init__(self, stub: ports_pb2_grpc.PortsStub, port: int) -> None:
        """Start the stream; :meth:`wait_open` then waits for the agent's connection."""
        self.port = port
        self._outbox = _Outbox(PENDING_FRAMES)
        self._outbox.put(ports_pb2.TunnelFrame(port=port))
        self._lock = threading.Lock()
        self._write_closed = False
        self._closed = False
        # No deadline: a tunnel lives as long as its connection; close() cancels it.
        try:
            self._call = stub.Connect(iter(self._outbox))
        except ValueError as error:  # grpc: "Cannot invoke RPC on closed channel!"
            raise AgentCallError(f"cannot open a tunnel to port {port}: the agent client is closed ({error})",
                                 reason="UNSPECIFIED", grpc_code="UNAVAILABLE", retryable=False) from None
        self._call.add_done_callback(lambda _call: self._outbox.close())

    def wait_open(self, timeout: float = CONNECT_TIMEOUT_S) -> None:
        """Wait until the agent has connected; raise AgentCallError if it could not
        (CONNECTION_REFUSED when nothing listens on the port)."""
        timed_out = threading.Event()

        def expire() -> None:
            timed_out.set()
            self._call.cancel()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            opened = any(key == OPEN_METADATA_KEY for key, _ in self._call.initial_metadata() or ())
            if not opened:
                self._call.code()  # the status the agent sent with its empty metadata
        finally:
            timer.cancel()
        if opened:
            return
        with self._lock:
            closed = self._closed
        self.close()
        if timed_out.is_set():
            raise AgentCallError(f"the agent did not open a connection to port {self.port} within {timeout:g} s",
                                 reason="UNSPECIFIED", grpc_code="DEADLINE_EXCEEDED", retryable=True)
        if closed:
            raise AgentCallError(f"the tunnel to port {self.port} was closed before it opened",
                                 reason="UNSPECIFIED", grpc_code="CANCELLED", retryable=False)
        # The call has ended: the rendezvous is the RpcError with the agent's status.
        raise translate(self._call) from None

    def send(self, data: bytes) -> None:
        """Send ``data`` to the program in the sandbox; waits while earlier data is still queued.
        BrokenPipeError once the write side is shut or the tunnel is closed."""
        if self._write_closed:
            raise BrokenPipeError(f"the tunnel to port {self.port} is closed for writing")
        if len(data) <= FRAME_BYTES:
            frames: Iterator[bytes] = iter((data,))
        else:
            view = memoryview(data)
            frames = (bytes(view[start:start + FRAME_BYTES]) for start in range(0, len(view), FRAME_BYTES))
        for piece in frames:
            if piece and not self._outbox.put(ports_pb2.TunnelFrame(data=piece)):
                raise BrokenPipeError(f"the tunnel to port {self.port} is closed")

    def shutdown_write(self) -> None:
        """No more data from this side: the program in the sandbox reads end of file (idempotent)."""
        with self._lock:
            if self._write_closed:
                return
            self._write_closed = True
        self._outbox.put(ports_pb2.TunnelFrame(eof=True))
        self._outbox.end()

    def recv(self) -> Iterator[bytes]:
        """What the program sends, as it arrives; ends when the program closes its side (or
        :meth:`close` is called). A failure of the tunnel raises AgentCallError."""
        try:
            for frame in self._call:
                if frame.data:
                    yield frame.data
                if frame.eof:
                    return
        except grpc.RpcError as error:
            with self._lock:
                closed = self._closed
            if closed and isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.CANCELLED:
                return
            raise translate(error) from None

    def close(self) -> None:
        """End the connection at once, both ways (idempotent)."""
        with self._lock:
            self._closed = True
            self._write_closed = True
        self._outbox.close()
        self._call.cancel()

    def __enter__(self) -> Tunnel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PortsClient:
    """One sandbox agent's ports operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.stub = ports_pb2_grpc.PortsStub(channel)

    def connect(self, port: int, *, timeout: float = CONNECT_TIMEOUT_S) -> Tunnel:
        """One TCP connection to 127.0.0.1:port in the sandbox, once the agent has made it.
        AgentCallError: CONNECTION_REFUSED if nothing listens there, INVALID_ARGUMENT for a
        port outside 1-65535, BUSY when the agent has too many tunnels open."""
        tunnel = Tunnel(self.stub, port)
        tunnel.wait_open(timeout)
        return tunnel


def _loopback(host: str) -> tuple[str, socket.AddressFamily]:
    """The address to listen on for ``host`` and its family; UsageError unless it is loopback."""
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"cannot forward on host {host!r}: it is not an IP address; use a loopback "
                         "address such as 127.0.0.1 or ::1") from None
    if not address.is_loopback:
        raise UsageError(f"cannot forward on host {host}: a forwarded port listens on this machine's loopback "
                         "only, so nothing beyond it can reach the sandbox; use 127.0.0.1 (or ::1)")
    return str(address), socket.AF_INET6 if address.version == 6 else socket.AF_INET


def _check_port(what: str, port: int, lowest: int) -> None:
    if not lowest <= port <= 65535:
        raise UsageError(f"{what} {port} is not a TCP port; use {lowest}-65535"
                         + (" (0 picks a free one)" if lowest == 0 else ""))


def _reset(conn: socket.socket) -> None:
    """Close a host connection with a reset, so its client sees a failure, not an empty reply."""
    with contextlib.suppress(OSError):
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


class _Connection:
    """One accepted host connection and the tunnel that carries it."""

    def __init__(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        self.conn = conn
        self.peer = peer
        self.tunnel: Tunnel | None = None
        self.lock = threading.Lock()
        self.closed = False

    def abort(self) -> None:
        """Wake both pumps: cancel the tunnel, shut the host socket down (idempotent)."""
        with self.lock:
            self.closed = True
            tunnel = self.tunnel
            with contextlib.suppress(OSError):
                self.conn.shutdown(socket.SHUT_RDWR)
        if tunnel is not None:
            tunnel.close()

    def release(self) -> None:
        """Close the host socket (under the lock, so a concurrent abort never shuts down a
        descriptor number already reused)."""
        with self.lock:
            self.closed = True
            self.conn.close()


class PortForward:
    """Listens on the host's loopback; each connection it accepts goes to ``sandbox_port`` in the
    sandbox through a tunnel of its own. A context manager; :meth:`close` stops it.

    ``connections`` counts the connections accepted so far, ``active`` those still open.
    ``on_connection(peer)`` is called for each before its tunnel opens; if it raises, that
    connection is refused. A port nothing listens on in the sandbox closes the host
    connection (with a reset) and is logged; the forward keeps listening.
    """

    def __init__(self, ports: PortsClient, sandbox_port: int, *, host_port: int = 0, host: str = "127.0.0.1",
                 on_connection: Callable[[tuple[str, int]], None] | None = None) -> None:
        _check_port("sandbox port", sandbox_port, 1)
        _check_port("host port", host_port, 0)
        address, family = _loopback(host)
        self.ports = ports
        self.sandbox_port = sandbox_port
        self.on_connection = on_connection
        self.connections = 0
        self._live: set[_Connection] = set()
        # Every connection thread not yet joined: one leaves _live a moment before it ends.
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        try:
            self._listener = socket.create_server((address, host_port), family=family, backlog=LISTEN_BACKLOG)
        except OSError as error:
            raise UsageError(f"cannot listen on {address} port {host_port}: {error.strerror or error}; "
                             "pick another host port (0 picks a free one)") from None
        self._listener.setblocking(False)
        self.host = address
        self.host_port: int = self._listener.getsockname()[1]
        self._wake_read, self._wake_write = socket.socketpair()
        self._thread = threading.Thread(target=self._accept_loop, name=f"forward-{self.host_port}", daemon=True)
        self._thread.start()

    @property
    def active(self) -> int:
        with self._lock:
            return len(self._live)

    @property
    def address(self) -> str:
        """``host:port`` as a client dials it (IPv6 in brackets)."""
        return f"[{self.host}]:{self.host_port}" if ":" in self.host else f"{self.host}:{self.host_port}"

    def close(self) -> None:
        """Stop listening and close every live connection (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")
        self._thread.join(CLOSE_WAIT_S)
        self._listener.close()
        self._wake_read.close()
        self._wake_write.close()
        with self._lock:
            live = list(self._live)
        for connection in live:
            connection.abort()
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(CLOSE_WAIT_S)

    def __enter__(self) -> PortForward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as selector:
            selector.register(self._listener, selectors.EVENT_READ)
            selector.register(self._wake_read, selectors.EVENT_READ)
            while not self._closed.is_set():
                for key, _ in selector.select():
                    if key.fileobj is self._listener and not self._closed.is_set():
                        self._accept()

    def _accept(self) -> None:
        try:
            conn, peer = self._listener.accept()
        except (BlockingIOError, ConnectionAbortedError):
            return
        except OSError as error:
            # Out of file descriptors, say: the listener stays readable, so back off a little.
            log.warning("forward %s: accepting a connection failed: %s", self.address, error)
            self._closed.wait(0.1)
            return
        conn.setblocking(True)
        connection = _Connection(conn, (str(peer[0]), int(peer[1])))
        thread = threading.Thread(target=self._serve, args=(connection,), name=f"forward-{self.host_port}-conn",
                                  daemon=True)
        with self._lock:
            self.connections += 1
            self._live.add(connection)
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
        try:
            thread.start()
        except RuntimeError as error:
            log.warning("forward %s: no thread for a connection from %s: %s", self.address, connection.peer, error)
            with self._lock:
                self._live.discard(connection)
                self._threads.remove(thread)
            _reset(conn)

    def _serve(self, connection: _Connection) -> None:
        try:
            self._pump(connection)
        except Exception:
            log.exception("forward %s: the connection from %s failed", self.address, connection.peer)
        finally:
            with self._lock:
                self._live.discard(connection)
            connection.abort()
            connection.release()

    def _open(self, connection: _Connection) -> Tunnel | None:
        """The connection's tunnel, or None (logged) if it was refused."""
        where = f"forward {self.address} -> sandbox port {self.sandbox_port}"
        if self.on_connection is not None:
            try:
                self.on_connection(connection.peer)
            except Exception as error:
                log.warning("%s: connection from %s refused: %s", where, connection.peer, error)
                return None
        try:
            tunnel = Tunnel(self.ports.stub, self.sandbox_port)
            with connection.lock:
                if connection.closed:
                    tunnel.close()
                    return None
                connection.tunnel = tunnel
            tunnel.wait_open()
        except AgentCallError as error:
            if not connection.closed:
                log.warning("%s: connection from %s closed: %s", where, connection.peer, error.message)
            return None
        return tunnel

    def _pump(self, connection: _Connection) -> None:
        conn = connection.conn
        tunnel = self._open(connection)
        if tunnel is None:
            _reset(conn)
            return
        upstream = threading.Thread(target=self._upstream, args=(connection, tunnel),
                                    name=f"forward-{self.host_port}-up", daemon=True)
        upstream.start()
        try:
            for data in tunnel.recv():
                conn.sendall(data)
            # The program closed its side; the host client may still be sending.
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_WR)
        except AgentCallError as error:
            if not connection.closed:
                log.warning("forward %s -> sandbox port %d: connection from %s broken: %s", self.address,
                            self.sandbox_port, connection.peer, error.message)
            connection.abort()
        except OSError:
            connection.abort()  # the host client went away
        upstream.join()

    @staticmethod
    def _upstream(connection: _Connection, tunnel: Tunnel) -> None:
        """The host client's bytes into the tunnel; its end of file half-closes the tunnel."""
        try:
            while data := connection.conn.recv(FRAME_BYTES):
                tunnel.send(data)
        except OSError:
            connection.abort()  # the client reset, or the tunnel is gone
            return
        tunnel.shutdown_write()


def forward_port(agent: AgentClient, sandbox_port: int, *, host_port: int = 0, host: str = "127.0.0.1",
                 on_connection: Callable[[tuple[str, int]], None] | None = None) -> PortForward:
    """Forward ``host:host_port`` on this machine (loopback only; 0 picks a free port) to
    ``sandbox_port`` on the sandbox's loopback, until the returned PortForward is closed."""
    return PortForward(agent.ports, sandbox_port, host_port=host_port, host=host, on_connection=on_connection)
