"""The gRPC door's sessions: one client's sandbox and its run, the limits, the shared engine.

The expiry clock of a session follows the engine's (:mod:`harness.engine.docker.lifetime`):
while its sandbox is paused the clock stands still (``reap_expired`` leaves it alone unless
it has been paused for more than ``PAUSE_LIMIT_FACTOR`` times its TTL, as the engine's gc
does); a resume or a keep-alive takes the expiry the engine reports.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from harness.audit.store import AuditError, AuditStore
from harness.core.errors import CallboxError
from harness.core.policy import Policy
from harness.core.sandbox_settings import PoolSettings
from harness.core.session import Session
from harness.doors.grpc.overrides import SandboxOverrides
from harness.engine.base import Engine
from harness.engine.docker.engine import DockerEngine
from harness.engine.docker.lifetime import PAUSE_LIMIT_FACTOR
from harness.engine.spec import SandboxSpec
from harness.v1 import executor_pb2

__all__ = ["ClientSession", "Limits", "SharedEngine"]

log = logging.getLogger("callbox.executor")


class SharedEngine:
    """One Docker engine connection for all sessions (connected on first use; reaps leftovers then).

    With ``pool`` (the policy's ``[pool]``, ``size`` > 0) the engine gets a warm pool of the
    ``pool_specs`` (:mod:`harness.engine.docker.pool`) when it connects; ``room``: the most
    sandboxes the pool may hold at a time (the server's total limit minus its live ones).
    ``close`` destroys the pooled sandboxes."""

    def __init__(self, connect: Callable[[], Engine] = DockerEngine.connect, *, pool: PoolSettings | None = None,
                 pool_specs: list[SandboxSpec] | None = None, room: Callable[[], int] | None = None) -> None:
        self._connect = connect
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._pool = pool if pool is not None and pool.size > 0 else None
        self.pool_specs = list(pool_specs or [])
        """The specs pooled (a door may add its own before the first connect)."""
        self._room = room

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = self._connect()
                pooled = [spec for spec in self.pool_specs if spec.network == "none"]
                if len(pooled) < len(self.pool_specs):
                    log.warning("the warm pool holds network = \"none\" sandboxes only; other creates start cold")
                if self._pool is not None and isinstance(self._engine, DockerEngine) and pooled:
                    try:
                        self._engine.enable_pool(pooled, size=self._pool.size, max=self._pool.ceiling,
                                                 pause_s=self._pool.pause_s, room=self._room)
                    except CallboxError as exc:  # e.g. a mount missing now: creates say so, cold
                        log.warning("no warm pool: %s", exc)
            return self._engine

    def warm(self) -> None:
        """Connect now (a warm pool starts filling); a failure is logged, the first create retries."""
        try:
            self()
        except Exception as exc:
            log.warning("cannot start the warm pool yet: %s", exc)

    def close(self) -> list[str]:
        """Destroy the pooled sandboxes (if a pool was started); their ids."""
        with self._lock:
            engine = self._engine
        if isinstance(engine, DockerEngine) and engine.pool is not None:
            return engine.pool.close()
        return []


@dataclass(frozen=True)
class Limits:
    """Live sandboxes a client may have, and the server in total."""

    max_sandboxes_per_client: int = 16
    max_sandboxes_total: int = 64

    def __post_init__(self) -> None:
        if self.max_sandboxes_per_client < 1 or self.max_sandboxes_total < 1:
            raise ValueError("sandbox limits must be at least 1")


class ClientSession:
    """One client's sandbox and the harness of its run."""

    def __init__(self, client: str, harness: Session, policy: Policy, tools: list[str], ttl_seconds: int,
                 overrides: SandboxOverrides | None = None) -> None:
        self.client = client
        self.harness = harness
        self.policy = policy
        self.tools = tools
        self.overrides = overrides or SandboxOverrides()
        """What the client asked for (a snapshot of this sandbox remembers it for its forks)."""
        self.ttl_seconds = ttl_seconds
        self.created = time.time()
        self.expires = self.created + ttl_seconds
        self.paused_at: float | None = None
        """When its sandbox was paused (None: running); the clock stands still meanwhile."""
        self._remaining = 0.0
        self._lock = threading.Lock()
        self.closed = False

    # ---- the expiry clock (see the module docstring) -------------------------------------------

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def expires_at(self, now: float) -> float:
        """When it expires (while paused: if it were resumed ``now``)."""
        return now + self._remaining if self.paused_at is not None else self.expires

    def due(self, now: float) -> bool:
        """Whether the reaper destroys it at ``now``."""
        if self.paused_at is not None:
            return self.paused_at + PAUSE_LIMIT_FACTOR * self.ttl_seconds <= now
        return self.expires <= now

    def mark_paused(self, now: float) -> None:
        with self._lock:
            if self.paused_at is None:
                self._remaining = max(0.0, self.expires - now)
                self.paused_at = now

    def mark_resumed(self, expires: float) -> None:
        """Running again; ``expires``: the engine's new expiry (moved later by the pause)."""
        with self._lock:
            self.paused_at = None
            self.expires = expires

    def mark_kept_alive(self, expires: float, now: float) -> None:
        """``expires``: the engine's new expiry (while paused: ``now`` plus the time it will have)."""
        with self._lock:
            self.expires = expires
            if self.paused_at is not None:
                self._remaining = max(0.0, expires - now)

    @property
    def sandbox_id(self) -> str:
        return self.harness.run_id

    def close(self, audit: AuditStore, reason: str) -> int:
        """Cancel running calls, destroy the sandbox, end the run; the calls cancelled. Idempotent."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        cancelled = 0
        try:
            cancelled = self.harness.close()
        except Exception:
            log.exception("destroying sandbox %s of client %s failed", self.sandbox_id, self.client)
        with contextlib.suppress(AuditError):
            audit.end_run(self.sandbox_id, reason)
        log.info("sandbox %s of client %s destroyed (%s)", self.sandbox_id, self.client, reason)
        return cancelled

    def message(self) -> executor_pb2.Sandbox:
        box = self.harness.active_sandbox
        spec = box.spec if box is not None else self.harness.spec
        return executor_pb2.Sandbox(
            sandbox_id=self.sandbox_id, memory_bytes=spec.memory, cpus=spec.cpus, pids=spec.pids,
            network=spec.network, workdir=spec.workdir, ttl_seconds=spec.ttl_seconds, tools=self.tools,
            created_unix=self.created, expires_unix=self.expires_at(time.time()), image=spec.image,
            mounts=[executor_pb2.Mount(source=str(m.source), target=m.target, read_write=not m.read_only)
                    for m in spec.mounts],
        )

