"""The E2B door's sandboxes as a server builds them, for tests that call its handlers directly."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.audit.store import AuditStore
from harness.core.policy import parse_policy
from harness.doors.e2b.boxes import E2bSandboxes
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import Limits
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.tools import registry_for


@dataclass
class DoorState:
    """What a test needs of the door's sandboxes: them, their executor, audit store and engine."""

    sandboxes: E2bSandboxes
    executor: ExecutorService
    audit: AuditStore
    engine: DockerEngine


@contextlib.contextmanager
def e2b_sandboxes(engine: Any, policy: str, *, prefix: str, keys: Mapping[str, str],
                  templates: Mapping[str, str] | None = None, limits: Limits | None = None) -> Iterator[DoorState]:
    """An ExecutorService over the session's engine (its own audit store and snapshot
    directory in a temporary directory) with ``E2bSandboxes`` on it: ``policy`` and the
    ``templates`` are policy texts, ``keys`` the clients' API keys. Every sandbox is
    destroyed and the directory removed afterwards."""
    state = Path(tempfile.mkdtemp(prefix=prefix))
    docker_engine = DockerEngine(engine.client, reap_on_start=False, snapshot_dir=state / "snapshots")
    audit = AuditStore(state / "audit.sqlite3")
    served = parse_policy(policy)
    executor = ExecutorService(registry=registry_for(served), policy=served, audit=audit,
                               tokens=TokenSet(dict(keys), source="test tokens"), limits=limits,
                               engine_factory=lambda: docker_engine)
    sandboxes = E2bSandboxes(executor, {name: parse_policy(text) for name, text in (templates or {}).items()})
    try:
        yield DoorState(sandboxes, executor, audit, docker_engine)
    finally:
        executor.shutdown()
        audit.close()
        shutil.rmtree(state, ignore_errors=True)
