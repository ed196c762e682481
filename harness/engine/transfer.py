"""Files both ways between the host and a sandbox's agent: streamed tar download, copy in and out, move, watch."""

from __future__ import annotations

import grpc


class TransferClient:
    """One sandbox agent's transfer operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
