"""The gRPC door's sessions: one client's sandbox and its run, and the limits.

The expiry clock of a session follows the engine's (:mod:`harness.engine.docker.lifetime`):
while its sandbox is paused the clock stands still (``reap_expired`` leaves it alone until
it has been paused for longer than its policy's ``sandbox.paused_ttl_seconds``, as the
engine's gc does); a resume or a keep-alive takes the expiry the engine reports. A session
with an ``on_expiry`` hook (the E2B door's ``lifecycle.on_timeout = "pause"``) is offered to
it when its time is up, and is kept if the hook paused it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from harness.audit.store import AuditError, AuditStore
from harness.core.policy import Policy
from harness.core.session import Session
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.quota_ledger import Reservation
from harness.doors.start_queue import default_slots
from harness.engine.base import is_living
from harness.v1 import executor_pb2

__all__ = ["DEFAULT_CLIENT_SHARE", "REMOVED", "ClientSession", "Limits"]

REMOVED = "removed"
"""How a run ends whose sandbox the operator removed from outside its server (``callbox sandbox rm``)."""

log = logging.getLogger("callbox.executor")


DEFAULT_CLIENT_SHARE = 16
"""Live sandboxes a client is sure of when no per-client limit is set (``client_share``)."""


@dataclass(frozen=True)
class Limits:
    """Live sandboxes a client may have, and the server in total."""

    max_sandboxes_per_client: int | None = None
    """A hard limit on each client's live sandboxes, set explicitly by the operator
    (``--max-per-client``, ``limits.max_per_client``); None: only the work-conserving share."""
    max_sandboxes_total: int = 64
    max_starting: int = field(default_factory=default_slots)
    """Sandboxes the host starts at once; more creates wait in line (:mod:`harness.doors.start_queue`)."""
    client_share: int = DEFAULT_CLIENT_SHARE
    """Without a hard limit (or a ``live_sandboxes`` quota), a client past this many live
    sandboxes may still create up to ``max_sandboxes_total`` while no other client waits to
    start one; while another waits, its creates wait behind it (:mod:`harness.doors.start_queue`)."""

    def __post_init__(self) -> None:
        if min(self.max_sandboxes_per_client or 1, self.max_sandboxes_total, self.max_starting,
               self.client_share) < 1:
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
        self.reservation: Reservation | None = None
        """Its place in its client's quotas, given back when it closes (or is released)."""
        self.kept = False
        """Kept for the next server: a stopping server that keeps sandboxes leaves it running."""
        self.on_expiry: Callable[[ClientSession], bool] | None = None
        """Offered the running session when its time is up (``reap_expired``); True: it
        paused the sandbox, which is then kept (until its paused TTL), False: it is removed."""

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
            return self.paused_at + self.policy.sandbox.paused_ttl_seconds <= now
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

    def restore_clock(self, *, created: float, expires: float, paused_at: float | None,
                      remaining: float | None) -> None:
        """Take the clock of a sandbox adopted after a server restart (its run's creation, and
        its expiry or pause as the engine's records say)."""
        with self._lock:
            self.created = created
            self.expires = expires
            self.paused_at = paused_at
            self._remaining = max(0.0, remaining if remaining is not None else expires - time.time())

    @property
    def sandbox_id(self) -> str:
        return self.harness.run_id

    @property
    def removed(self) -> bool:
        """Whether its sandbox was removed from outside this server (``callbox sandbox rm ID``
        by the operator, gc of another process) while it is still live here (cheap: a file
        check). Its doors then answer NOT_FOUND for it, and the reaper's next round ends it
        (run ``removed``, its client's quotas get its place back)."""
        box = self.harness.active_sandbox
        return not self.closed and is_living(box) and box.removed

    def release(self) -> int:
        """Stop serving this session but leave its sandbox running and its run open (a
        server that keeps its sandboxes, stopping): cancel running calls, let go of the
        sandbox; the calls cancelled. Idempotent."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        self._give_back()
        cancelled = self.harness.cancel_calls()
        box = self.harness.detach()
        self.harness.close()  # no sandbox any more: nothing is destroyed
        agent = getattr(box, "agent", None)
        if agent is not None:
            with contextlib.suppress(Exception):
                agent.close()
        log.info("sandbox %s of client %s left running for the next server", self.sandbox_id, self.client)
        return cancelled

    def hold(self, reservation: Reservation | None) -> None:
        """Keep ``reservation`` (its place in its client's quotas) until the session ends."""
        self.reservation = reservation
        if self.closed and reservation is not None:
            reservation.release()

    def _give_back(self) -> None:
        if self.reservation is not None:
            self.reservation.release()

    def close(self, audit: AuditStore, reason: str) -> int:
        """Cancel running calls, destroy the sandbox, end the run; the calls cancelled. Idempotent."""
        with self._lock:
            if self.closed:
                return 0
            self.closed = True
        self._give_back()
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

