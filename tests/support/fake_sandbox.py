"""A stand-in sandbox for the unit tests of a Session whose handlers never use the sandbox."""

from __future__ import annotations

from typing import Any


class FakeSandbox:
    """What a Session needs of a sandbox when its handlers never use it."""

    id = "box-1"
    agent = None

    def new_egress_events(self) -> list[Any]:
        return []

    def destroy(self) -> None:
        pass
