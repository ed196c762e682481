"""Sessions for the loop's unit tests: each on a registry of in-process tools and an audit
store the test owns, and none ever starting a sandbox."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from harness.audit.store import AuditStore
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session

SessionMaker = Callable[..., Session]
"""``make(policy=None, run_id=None)``: a new Session (a new run, or ``run_id`` again)."""


def no_engine() -> Any:
    raise AssertionError("unit tests never start a sandbox")


@contextlib.contextmanager
def session_maker(registry: Callable[[], ToolRegistry], audit: AuditStore) -> Iterator[SessionMaker]:
    """Makes Sessions on a fresh ``registry()`` each; every one is closed on the way out."""
    made: list[Session] = []

    def make(policy: Policy | None = None, run_id: str | None = None) -> Session:
        harness = Session(registry(), policy or Policy(), audit, run_id=run_id, engine_factory=no_engine)
        made.append(harness)
        return harness

    try:
        yield make
    finally:
        for harness in made:
            harness.close()
