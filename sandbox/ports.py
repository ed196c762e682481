"""TCP connections to the sandbox's own loopback, tunnelled over the agent socket (sandbox.v1.Ports)."""

from __future__ import annotations

from sandbox.v1 import ports_pb2_grpc


class PortsService(ports_pb2_grpc.PortsServicer):
    """sandbox.v1.Ports: each Connect stream is one TCP connection to 127.0.0.1:port."""
