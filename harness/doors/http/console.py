"""What the console shows and does: pending approvals with their run's context, live
sandboxes with their resources, runs and their calls, and the egress log, read from the
audit store and the executor; approving, denying and killing.

**Who sees what.** Each method takes ``viewer``: None for an operator, who sees every
client's work; a client's name for a client, who sees only its own runs (``meta.client``),
their approvals, calls and egress, and its own sandboxes. The actions are the operator's
(:mod:`harness.doors.http.app` refuses a client before calling them).

Every action goes the way the other doors take: an approval is resolved with the audit
store's ``resolve_approval`` (as ``callbox approvals`` and the gRPC ``ResolveApproval`` do),
``by = "console:CLIENT"``, so the waiting client's re-sent call runs once (or gets the
denial's reason); a sandbox is killed through the executor's ``delete_session``, which cancels
its running calls, destroys the container and ends its run (``killed_by_console``), as
``DeleteSandbox`` does.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

from harness.audit.browse import CallPoint, EgressPoint, Filters
from harness.audit.errors import unknown_run
from harness.audit.records import ACTION_TOOL_PREFIX, EGRESS_TOOL, Approval, RunRecord
from harness.audit.store import AuditError, AuditStore
from harness.core.errors import ERRORS, AgentCallError, CallboxError, ErrorCode
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.service import ExecutorService
from harness.doors.quota_ledger import Usage
from harness.doors.quotas import Quotas
from harness.engine.desktop import VNC_PORT
from harness.engine.ports import Tunnel

__all__ = ["ACTOR_PREFIX", "KILL_REASON", "PAGE_SIZE", "ClientQuota", "Console", "ConsoleError", "LiveSandbox",
           "PendingApproval", "PoolStatus"]

ACTOR_PREFIX = "console"
"""Who resolved an approval from the console: ``console:CLIENT``."""
KILL_REASON = "killed_by_console"
"""The end reason of a run whose sandbox was killed from the console."""
EARLIER_CALLS_SHOWN = 10
"""The run's calls shown beside a pending approval (the latest ones before it)."""
PENDING_SHOWN = 100
"""Pending approvals shown on one page (the oldest first)."""
REASON_MAX = 2000
"""A denial's reason is cut at this many characters (the model reads it)."""
PAGE_SIZE = 100
"""Rows on one page of runs, resolved approvals or egress decisions."""
NO_DISPLAY = ("nothing listens on the VNC port of sandbox {id}: its image is not the desktop image "
              "(callbox-sandbox-desktop), or its display has not started yet (it starts with the first "
              "computer call)")
"""A denial's reason is cut at this many characters (the model reads it)."""


class ConsoleError(CallboxError):
    """An action the console cannot take; ``status`` is the HTTP status the error table gives its code."""

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message, code=code)
        self.status = ERRORS[code].http_status


class _Stats(Protocol):
    cpu_usage_s: float
    memory_bytes: int
    pids: int


@dataclass(frozen=True)
class PendingApproval:
    """A call waiting for a person, with what an operator needs to decide."""

    approval: Approval
    run: RunRecord | None
    earlier: list[dict[str, Any]]
    """The run's latest calls before this one (oldest first), as ``calls_for_run`` gives them."""
    earlier_total: int
    """How many calls the run had before this one."""

    @property
    def door(self) -> str:
        return str(self.run.meta.get("door") or "?") if self.run is not None else "?"

    @property
    def client(self) -> str:
        return str(self.run.meta.get("client") or "?") if self.run is not None else "?"


@dataclass(frozen=True)
class LiveSandbox:
    """A live sandbox of the executor, as the console lists it."""

    sandbox_id: str
    client: str
    created: float
    expires: float
    state: str
    """``running``, ``paused``, or ``gone`` (its container no longer answers)."""
    cpu_seconds: float | None
    cpu_percent: float | None
    """CPU use since the console last looked (since it started, the first time), in % of its CPU limit."""
    memory_bytes: int | None
    memory_limit: int
    cpus: float
    pids: int | None
    """Processes and threads in its cgroup (what its pids limit counts)."""
    pids_limit: int
    container: str | None
    paused_at: float | None = None
    """When it was paused (None: not paused)."""


@dataclass(frozen=True)
class PoolStatus:
    """The executor's warm pool: sandboxes started ahead that a create claims."""

    size: int
    """The floor the pool refills to."""
    ceiling: int
    """The most it grows to when creates find it empty."""
    ready: int
    """Warm sandboxes ready now."""


@dataclass(frozen=True)
class ClientQuota:
    """One client's use of the server and its quotas (None: no limit of that kind)."""

    client: str
    usage: Usage
    limits: Quotas


class Console:
    """The console's reads and actions over one audit store and, when the server runs one,
    the doors' executor (None: runs, approvals and egress only)."""

    def __init__(self, audit: AuditStore, executor: ExecutorService | None) -> None:
        self.audit = audit
        self.executor = executor
        self._cpu_lock = threading.Lock()
        self._cpu_seen: dict[str, tuple[float, float]] = {}
        """sandbox id -> (when, CPU seconds) of the last reading, for the CPU % column."""

    # ---- approvals -------------------------------------------------------------------------------

    def pending(self, limit: int = PENDING_SHOWN, *, viewer: str | None = None
                ) -> tuple[list[PendingApproval], int]:
        """The oldest ``limit`` pending approvals, each with its run and the calls before it,
        and how many are pending in all."""
        found: list[PendingApproval] = []
        runs: dict[str, tuple[RunRecord | None, list[dict[str, Any]]]] = {}
        waiting = self.audit.list_approvals("pending")
        if viewer is not None:
            waiting = [a for a in waiting if self._run_of(a.run_id, viewer) is not None]
        for approval in waiting[:limit]:
            if approval.run_id not in runs:
                try:
                    runs[approval.run_id] = (self.audit.get_run(approval.run_id),
                                             self.audit.calls_for_run(approval.run_id))
                except AuditError:
                    runs[approval.run_id] = (None, [])
            run, calls = runs[approval.run_id]
            index = next((i for i, c in enumerate(calls) if c.get("call_id") == approval.call_id), len(calls))
            before = calls[:index]
            found.append(PendingApproval(approval, run, before[-EARLIER_CALLS_SHOWN:], len(before)))
        return found, len(waiting)

    def resolve(self, approval_id: str, approve: bool, *, client: str, reason: str | None,
                scope: str | None = None) -> tuple[Approval, str]:
        """Approve or deny a pending approval as ``console:CLIENT`` (``scope``: an egress
        approval's, see ``resolve_approval``); the approval and a sentence saying what happens
        next. ConsoleError (404 unknown, 409 already resolved)."""
        text = (reason or "").strip()[:REASON_MAX] or None
        try:
            resolved = self.audit.resolve_approval(approval_id, approve, by=f"{ACTOR_PREFIX}:{client}", reason=text,
                                                   scope=scope)
        except AuditError as error:
            raise ConsoleError(error.message, error.code) from None
        if resolved.tool == EGRESS_TOOL and not approve:
            what = f"approval {resolved.id} denied: the held connection is refused"
        elif resolved.scope is not None:
            what = (f"approval {resolved.id} approved: the held connection proceeds"
                    + (", and later ones to the same destination go through" if resolved.scope == "sandbox" else ""))
        elif approve and resolved.tool.startswith(ACTION_TOOL_PREFIX):
            what = (f"approval {resolved.id} approved; the sandbox action "
                    f"{resolved.tool.removeprefix(ACTION_TOOL_PREFIX)} runs when its client repeats it")
        elif approve:
            what = f"approval {resolved.id} approved; the call runs when its client sends it again"
        else:
            what = f"approval {resolved.id} denied; the model gets the denial" + (f": {text}" if text else "")
        return resolved, what

    # ---- live sandboxes --------------------------------------------------------------------------

    def sandboxes(self, *, viewer: str | None = None) -> list[LiveSandbox] | None:
        """The executor's live sandboxes, oldest first, with CPU and memory from their
        cgroups; None when this server runs no executor."""
        if self.executor is None:
            return None
        now = time.time()
        found = []
        live = self.executor.live_sandboxes()
        for sandbox_id, client in live.items():
            if viewer is not None and client != viewer:
                continue
            try:
                session = self.executor.session_of(sandbox_id, client)
            except ServiceError:
                continue  # deleted meanwhile
            box = session.harness.active_sandbox
            spec = box.spec if box is not None else session.harness.spec
            stats = self._stats(box)
            found.append(LiveSandbox(
                sandbox_id=sandbox_id, client=client, created=session.created, expires=session.expires_at(now),
                state=("paused" if session.paused else "running") if stats is not None else "gone",
                cpu_seconds=stats.cpu_usage_s if stats is not None else None,
                cpu_percent=self._cpu_percent(sandbox_id, session.created, stats, spec.cpus),
                memory_bytes=stats.memory_bytes if stats is not None else None, memory_limit=int(spec.memory),
                cpus=float(spec.cpus), pids=stats.pids if stats is not None else None, pids_limit=int(spec.pids),
                container=str(getattr(box, "container_id", "") or "")[:12] or None, paused_at=session.paused_at,
            ))
        with self._cpu_lock:
            for gone in set(self._cpu_seen) - set(live):
                del self._cpu_seen[gone]
        return sorted(found, key=lambda s: s.created)

    @staticmethod
    def _stats(box: object) -> _Stats | None:
        """One reading of the sandbox's cgroup (the engine's own ``stats``: cgroup files, else
        the Docker stats API); None when it has none (not started, gone, no living sandboxes)."""
        read = getattr(box, "stats", None)
        if read is None:
            return None
        try:
            stats: _Stats = read()
        except CallboxError:
            return None
        return stats

    def _cpu_percent(self, sandbox_id: str, created: float, stats: _Stats | None, cpus: float) -> float | None:
        if stats is None:
            return None
        now = time.time()
        with self._cpu_lock:
            since, before = self._cpu_seen.get(sandbox_id, (created, 0.0))
            self._cpu_seen[sandbox_id] = (now, stats.cpu_usage_s)
        wall = max(now - since, 1e-3)
        return round(min(100.0, 100.0 * max(0.0, stats.cpu_usage_s - before) / (wall * max(cpus, 0.01))), 1)

    def sandbox(self, sandbox_id: str, *, viewer: str | None = None) -> LiveSandbox:
        """One live sandbox (as :meth:`sandboxes` shows it); ConsoleError 404 when none lives here."""
        found = next((b for b in self.sandboxes(viewer=viewer) or [] if b.sandbox_id == sandbox_id), None)
        if found is None:
            raise ConsoleError(f"no live sandbox {sandbox_id} on this server (already deleted or expired?)",
                               ErrorCode.NOT_FOUND)
        return found

    def pool(self) -> PoolStatus | None:
        """The executor's warm pool; None without an executor or a pool (``[pool] size = 0``)."""
        if self.executor is None or not self.executor.policy.pool.enabled:
            return None
        settings = self.executor.policy.pool
        pool = getattr(self.executor.engine_factory, "pool", None)
        ready = pool.pooled() if pool is not None else 0
        return PoolStatus(size=settings.size, ceiling=settings.ceiling, ready=ready)

    def quotas(self, *, viewer: str | None = None) -> list[ClientQuota]:
        """Each client's use and quotas: the clients with a live sandbox, or ``viewer`` alone."""
        if self.executor is None:
            return []
        keeper = self.executor.quotas
        clients = {viewer} if viewer is not None else set(self.executor.live_sandboxes().values())
        return [ClientQuota(client, keeper.usage(client), keeper.limits(client)) for client in sorted(clients)]

    def kill(self, sandbox_id: str, *, client: str) -> str:
        """Destroy a live sandbox through the executor (its running calls cancelled, its run
        ended ``killed_by_console``); a sentence saying what was done. ConsoleError 404 when
        no such sandbox lives here."""
        if self.executor is None:
            raise ConsoleError("this server runs no gRPC or E2B door, so it has no live sandboxes to kill",
                               ErrorCode.NOT_FOUND)
        owner = self.executor.live_sandboxes().get(sandbox_id)
        if owner is None:
            raise ConsoleError(f"no live sandbox {sandbox_id} on this server (already deleted or expired?)",
                               ErrorCode.NOT_FOUND)
        try:
            session = self.executor.session_of(sandbox_id, owner)
        except ServiceError:
            raise ConsoleError(f"no live sandbox {sandbox_id} on this server (already deleted or expired?)",
                               ErrorCode.NOT_FOUND) from None
        with contextlib.suppress(AuditError):
            self.audit.update_run_meta(sandbox_id, {"killed_by": f"{ACTOR_PREFIX}:{client}"})
        cancelled = self.executor.delete_session(session, KILL_REASON)
        calls = f"; {cancelled} running call(s) cancelled" if cancelled else ""
        return f"sandbox {sandbox_id} of client {owner} killed{calls}"

    # ---- the live view ---------------------------------------------------------------------------

    def _live_session(self, sandbox_id: str, viewer: str | None) -> Any:
        missing = ConsoleError(f"no live sandbox {sandbox_id} on this server (already deleted or expired?)",
                               ErrorCode.NOT_FOUND)
        if self.executor is None:
            raise missing
        owner = self.executor.live_sandboxes().get(sandbox_id)
        if owner is None or (viewer is not None and owner != viewer):
            raise missing
        try:
            return self.executor.session_of(sandbox_id, owner)
        except ServiceError:
            raise missing from None

    def sandbox_image(self, sandbox_id: str, *, viewer: str | None = None) -> str:
        """The image a live sandbox runs (its noVNC is the live view's); ConsoleError 404 for none."""
        session = self._live_session(sandbox_id, viewer)
        box = session.harness.active_sandbox
        return str((box.spec if box is not None else session.harness.spec).image)

    def desktop_tunnel(self, sandbox_id: str, *, viewer: str | None = None) -> Tunnel:
        """A tunnel to the live sandbox's VNC server. ConsoleError: 404 for no such sandbox,
        409 while it is paused or before its container started, ``connection_refused`` when
        nothing listens (not the desktop image, or its display has not started)."""
        session = self._live_session(sandbox_id, viewer)
        if session.paused:
            raise ConsoleError(f"sandbox {sandbox_id} is paused: its live view shows once it is resumed",
                               ErrorCode.PAUSED)
        box = session.harness.active_sandbox
        agent = getattr(box, "agent", None)
        if agent is None:
            raise ConsoleError(f"sandbox {sandbox_id} has not started its container yet; its live view shows once "
                               "it has", ErrorCode.CONFLICT)
        try:
            tunnel: Tunnel = agent.ports.connect(VNC_PORT)
        except AgentCallError as error:
            if error.reason == "CONNECTION_REFUSED":
                raise ConsoleError(NO_DISPLAY.format(id=sandbox_id), ErrorCode.CONNECTION_REFUSED) from None
            raise ConsoleError(f"the live view of sandbox {sandbox_id} cannot reach its VNC server: {error.message}",
                               error.code) from None
        return tunnel

    # ---- runs, calls, egress ---------------------------------------------------------------------

    def runs(self, filters: Filters, page: int = 1, *, viewer: str | None = None) -> tuple[list[RunRecord], int]:
        """Page ``page`` (from 1) of the runs matching ``filters``, newest first, and how many
        match; a client's ``viewer`` narrows them to its own whatever ``filters`` says."""
        return self.audit.find_runs(_own(filters, viewer), offset=_offset(page), limit=PAGE_SIZE)

    def history(self, filters: Filters, page: int = 1, *, viewer: str | None = None
                ) -> tuple[list[tuple[Approval, str]], int]:
        """Page ``page`` of the resolved approvals (with each one's client), latest first, and how many match."""
        return self.audit.resolved_approvals(_own(filters, viewer), offset=_offset(page), limit=PAGE_SIZE)

    def pending_count(self, *, viewer: str | None = None) -> int:
        """How many approvals wait for a person (of ``viewer``'s runs only, for a client)."""
        return self.audit.count_pending(viewer)

    def activity(self, since: float, *, viewer: str | None = None) -> tuple[list[CallPoint], list[EgressPoint]]:
        """The calls and egress decisions since ``since`` (a client's own only), for the charts."""
        return self.audit.calls_since(since, viewer), self.audit.egress_since(since, viewer)

    def run(self, run_id: str, *, viewer: str | None = None) -> tuple[RunRecord, list[dict[str, Any]], list[Approval]]:
        """A run, its calls in order (with the decision that stands) and its approvals;
        ConsoleError 404 (another client's run is unknown to a client, as at the other doors)."""
        try:
            run = self.audit.get_run(run_id)
            if viewer is not None and run.meta.get("client") != viewer:
                raise unknown_run(run_id)
            calls = self.audit.calls_for_run(run_id)
        except AuditError as error:
            raise ConsoleError(error.message, error.code) from None
        return run, calls, self.audit.list_approvals(None, run_id=run_id)

    def run_image(self, run_id: str, digest: str, *, viewer: str | None = None) -> tuple[str, bytes]:
        """``(media_type, data)`` of a picture a call of ``run_id`` returned (``digest``: its
        sha256); ConsoleError 404 unless the run is the viewer's and one of its calls names it."""
        _, calls, _ = self.run(run_id, viewer=viewer)
        named = any(isinstance(entry, dict) and entry.get("sha256") == digest
                    for call in calls for entry in call.get("images") or ())
        found = self.audit.image_blob(digest) if named else None
        if found is None:
            raise ConsoleError(f"run {run_id} has no picture {digest}", ErrorCode.NOT_FOUND)
        return found

    def _run_of(self, run_id: str, viewer: str) -> RunRecord | None:
        """``run_id``'s record when it is ``viewer``'s, else None."""
        try:
            run = self.audit.get_run(run_id)
        except AuditError:
            return None
        return run if run.meta.get("client") == viewer else None

    def live_count(self, *, viewer: str | None = None) -> int | None:
        """How many sandboxes live on the executor (``viewer``'s only, for a client); None without one."""
        if self.executor is None:
            return None
        return sum(1 for client in self.executor.live_sandboxes().values() if viewer is None or client == viewer)

    def live(self) -> set[str]:
        """The ids of the executor's live sandboxes (each is its run's id)."""
        return set(self.executor.live_sandboxes()) if self.executor is not None else set()

    def egress(self, filters: Filters, page: int = 1, *, viewer: str | None = None
               ) -> tuple[list[dict[str, Any]], int]:
        """Page ``page`` of the egress proxies' decisions matching ``filters``, newest first, and how many match."""
        return self.audit.find_egress(_own(filters, viewer), offset=_offset(page), limit=PAGE_SIZE)


def _own(filters: Filters, viewer: str | None) -> Filters:
    """``filters`` narrowed to ``viewer``'s own work (a client), or as they are (an operator)."""
    return filters if viewer is None else dataclasses.replace(filters, client=viewer)


def _offset(page: int) -> int:
    return (max(page, 1) - 1) * PAGE_SIZE
