"""TCP connections into a sandbox over its agent's socket (sandbox.v1.Ports), and host-side port forwarding."""

from __future__ import annotations

import grpc


class PortsClient:
    """One sandbox agent's ports operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
