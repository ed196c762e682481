"""Background jobs of a sandbox's agent (sandbox.v1.Jobs): start, list, attach with replay,
input, resize, signal, kill, terminals."""

from __future__ import annotations

import grpc


class JobsClient:
    """One sandbox agent's jobs operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
