"""Ports.Connect tunnels and host port forwarding against the agent's real gRPC service (in this
process, on a unix socket) and a local TCP server standing in for a program in the sandbox.

In this process the agent's loopback is the host's, so the "sandbox port" is a port of a server
thread here. Every wait is on an event or a socket read with a timeout, never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from harness.core.errors import AgentCallError, UsageError
from harness.engine.agent_client import AgentClient
from harness.engine.ports import PortForward, Tunnel, forward_port
from sandbox.ports import PortsService
from sandbox.server import AgentConfig, build_server
from sandbox.v1 import ports_pb2_grpc

TIMEOUT = 10.0
Handler = Callable[[socket.socket], None]


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(TIMEOUT)
    chunks = []
    while data := sock.recv(1 << 16):
        chunks.append(data)
    return b"".join(chunks)


def joined(chunks: Iterator[bytes]) -> bytes:
    return b"".join(chunks)


class LocalServer:
    """A TCP server on 127.0.0.1 running ``handler`` for each connection in its own thread;
    what a handler raises is kept and re-raised by ``check``."""

    def __init__(self, handler: Handler, port: int = 0) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port: int = self.listener.getsockname()[1]
        self.errors: list[BaseException] = []
        self.handled = threading.Semaphore(0)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            with conn:
                self.handler(conn)
        except BaseException as exc:  # handed to the test thread
            self.errors.append(exc)
        finally:
            self.handled.release()

    def wait_handled(self) -> None:
        assert self.handled.acquire(timeout=TIMEOUT), "the server never finished a connection"
        if self.errors:
            raise self.errors[0]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._thread.join(TIMEOUT)


@contextlib.contextmanager
def local_server(handler: Handler, port: int = 0) -> Iterator[LocalServer]:
    server = LocalServer(handler, port)
    try:
        yield server
    finally:
        server.close()


def echo(conn: socket.socket) -> None:
    """Echo until the client's end of file, then close."""
    conn.settimeout(TIMEOUT)
    while data := conn.recv(1 << 16):
        conn.sendall(data)


def free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def short_dir() -> Iterator[Path]:
    # A unix socket path is at most 108 bytes; pytest's tmp_path can be longer.
    import tempfile

    path = Path(tempfile.mkdtemp(prefix="cbx-ports-", dir="/tmp"))
    try:
        yield path
    finally:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()


@pytest.fixture(scope="module")
def service() -> PortsService:
    return PortsService(max_tunnels=3)


@pytest.fixture(scope="module")
def client(short_dir: Path, service: PortsService) -> Iterator[AgentClient]:
    """An AgentClient of a gRPC server holding the agent's PortsService (three tunnels at most)."""
    socket_path = str(short_dir / "ports.sock")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
    ports_pb2_grpc.add_PortsServicer_to_server(service, server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    try:
        with AgentClient(socket_path) as agent:
            yield agent
    finally:
        server.stop(grace=1).wait()


@pytest.fixture(autouse=True)
def no_tunnel_left(service: PortsService) -> Iterator[None]:
    yield
    assert service.wait_open_tunnels(0, TIMEOUT), f"{service.open_tunnels} tunnels still open after the test"
    assert not [t.name for t in threading.enumerate() if t.name.startswith(("tunnel-", "forward-"))]


def test_echo_through_the_real_agent_server(short_dir: Path) -> None:
    # The service as build_server wires it: 1 MiB both ways through one tunnel.
    socket_path = str(short_dir / "agent.sock")
    agent = build_server(AgentConfig(socket=socket_path, workspace=str(short_dir), roots=[str(short_dir)],
                                     user=None, max_concurrent=2))
    agent.server.add_insecure_port(f"unix:{socket_path}")
    agent.server.start()
    payload = os.urandom(1 << 20)
    try:
        with local_server(echo) as server, AgentClient(socket_path) as client, \
                client.ports.connect(server.port) as tunnel:

            def send() -> None:
                tunnel.send(payload)
                tunnel.shutdown_write()

            sender = threading.Thread(target=send)
            sender.start()
            assert joined(tunnel.recv()) == payload
            sender.join(TIMEOUT)
            server.wait_handled()
    finally:
        agent.server.stop(grace=1).wait()


def test_half_close_from_the_client_then_the_server_answers(client: AgentClient) -> None:
    def handler(conn: socket.socket) -> None:
        request = read_all(conn)  # returns only at the client's end of file
        conn.sendall(b"got %d bytes: %s" % (len(request), request))

    with local_server(handler) as server, client.ports.connect(server.port) as tunnel:
        assert isinstance(tunnel, Tunnel) and tunnel.port == server.port
        tunnel.send(b"ping ")
        tunnel.send(b"pong")
        tunnel.shutdown_write()
        assert joined(tunnel.recv()) == b"got 9 bytes: ping pong"
        server.wait_handled()


def test_half_close_from_the_server_keeps_the_other_direction_open(client: AgentClient) -> None:
    received: list[bytes] = []

    def handler(conn: socket.socket) -> None:
        conn.sendall(b"hello, then end of file")
        conn.shutdown(socket.SHUT_WR)
        received.append(read_all(conn))

    with local_server(handler) as server, client.ports.connect(server.port) as tunnel:
        assert joined(tunnel.recv()) == b"hello, then end of file"
        tunnel.send(b"still writing after the server's end of file")
        tunnel.shutdown_write()
        server.wait_handled()
    assert received == [b"still writing after the server's end of file"]


def test_refused_and_invalid_ports(client: AgentClient) -> None:
    port = free_port()
    with pytest.raises(AgentCallError) as refused:
        client.ports.connect(port)
    assert refused.value.reason == "CONNECTION_REFUSED"
    assert f"port {port}" in refused.value.message and "nothing listens" in refused.value.message
    for bad in (0, 70000):
        with pytest.raises(AgentCallError) as invalid:
            client.ports.connect(bad)
        assert invalid.value.reason == "INVALID_ARGUMENT", invalid.value.message


def test_cancel_closes_the_socket_and_the_cap_holds(client: AgentClient, service: PortsService) -> None:
    saw_eof = threading.Event()

    def handler(conn: socket.socket) -> None:
        if read_all(conn) == b"":
            saw_eof.set()

    with local_server(handler) as server:
        tunnels = [client.ports.connect(server.port) for _ in range(service.max_tunnels)]
        try:
            with pytest.raises(AgentCallError) as busy:
                client.ports.connect(server.port)
            assert busy.value.reason == "BUSY" and busy.value.retryable
            tunnels[0].close()  # a cancel, with neither side at end of file
            assert saw_eof.wait(TIMEOUT), "the agent kept the sandbox-side socket open after a cancel"
            assert service.wait_open_tunnels(service.max_tunnels - 1, TIMEOUT)
            with pytest.raises(BrokenPipeError):
                tunnels[0].send(b"late")
            assert joined(tunnels[0].recv()) == b""
        finally:
            for tunnel in tunnels:
                tunnel.close()


def _connect_host(forward: PortForward) -> socket.socket:
    return socket.create_connection((forward.host, forward.host_port), timeout=TIMEOUT)


def assert_reset(forward: PortForward) -> None:
    """A connection the forward refuses is reset (the reset may even beat connect's return)."""
    with pytest.raises(ConnectionResetError), _connect_host(forward) as sock:
        sock.recv(1)


def test_forward_carries_connections_and_survives_a_refused_port(client: AgentClient) -> None:
    peers: list[tuple[str, int]] = []
    port = free_port()
    with forward_port(client, port, on_connection=peers.append) as forward:
        assert forward.host == "127.0.0.1" and forward.host_port > 0
        # Nothing listens yet: the host connection is closed with a reset, the forward lives on.
        assert_reset(forward)
        with local_server(echo, port) as server:
            for text in (b"first", b"second"):
                with _connect_host(forward) as sock:
                    sock.sendall(text)
                    sock.shutdown(socket.SHUT_WR)
                    assert read_all(sock) == text
                server.wait_handled()
        assert forward.connections == 3
        assert len(peers) == 3 and all(host == "127.0.0.1" for host, _ in peers)


def test_forward_close_ends_live_connections_promptly(client: AgentClient) -> None:
    def handler(conn: socket.socket) -> None:
        conn.sendall(b"ready")
        read_all(conn)  # until the forward's close reaches us

    with local_server(handler) as server:
        forward = forward_port(client, server.port)
        with _connect_host(forward) as sock:
            assert sock.recv(5) == b"ready"
            assert forward.active == 1
            forward.close()
            server.wait_handled()
            assert forward.active == 0
            with contextlib.suppress(ConnectionResetError):
                assert sock.recv(1) == b""
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection((forward.host, forward.host_port), timeout=TIMEOUT).close()


def test_on_connection_can_refuse(client: AgentClient) -> None:
    def deny(peer: tuple[str, int]) -> None:
        raise PermissionError(f"{peer} is not allowed")

    with local_server(echo) as server, forward_port(client, server.port, on_connection=deny) as forward:
        assert_reset(forward)
        assert forward.connections == 1


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.1", "example.com", "::"])
def test_forward_listens_on_loopback_only(client: AgentClient, host: str) -> None:
    with pytest.raises(UsageError, match=r"127\.0\.0\.1"):
        forward_port(client, 8000, host=host)



def test_a_closed_agent_client_refuses_cleanly(client: AgentClient) -> None:
    closed = AgentClient(client.target.removeprefix("unix:"))
    with forward_port(closed, 8000) as forward:
        closed.close()
        with pytest.raises(AgentCallError) as error:
            closed.ports.connect(8000)
        assert error.value.grpc_code == "UNAVAILABLE"
        assert_reset(forward)  # logged, never a traceback in the forward's thread
