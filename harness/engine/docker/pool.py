"""A warm pool: pre-started, never-used sandboxes, so a create that matches one is a claim.

Opt-in: an engine has no pool unless one is enabled (``DockerEngine.enable_pool``, which
the servers do when the policy's ``[pool]`` asks for one). Without it nothing changes.

**Fingerprint.** Pooled sandboxes are kept per fingerprint (:func:`fingerprint`): every
field of the ``SandboxSpec`` (as ``for_host`` makes it: canonical mount sources) that a
running container cannot change: ``image``, ``runtime``, ``memory``, ``cpus``, ``pids``, ``network``,
``allow_hosts``, ``ask_timeout``, ``egress_allow``, ``egress_deny``, ``mounts`` (source, target, read-only, uid,
gid), ``workdir``, ``tmp_size``, ``workspace_size``, ``home_size``, ``scratch_dirs``, ``noexec``, ``nofile``,
``fsize``; and, beside it, the tool uid/gid the spec resolves to when the claim is made (a rw mount whose
owner changed since the pooled container started does not match). Five fields are left
out, each for a reason:

* ``env``: the container never has it; the agent gives it to each tool process it starts
  (``Sandbox.runtime``), so a claimed sandbox simply carries the claimer's spec;
* ``ttl_seconds``: the clock is set at claim (below);
* ``paused_ttl_seconds``: read from the lifetime record, written with the claimer's spec at claim;
* ``allowed_mount_roots``: a check ``for_host`` has already applied to the claimer's spec;
* ``placement``: which node a sandbox goes to was decided before it reached this node's pool.

A spec with mounts, limits or an image that no pooled container has never matches and
the create falls back to a cold start: nothing is applied to a pooled container at claim
except its clock, owner and name. Only ``network = "none"`` specs are pooled: the other
modes have a per-sandbox network and egress proxy with an expiry of their own, so
``WarmPool`` refuses them and their creates are always cold.

**Claim.** Under the pool's lock the entry is taken out of the pool before anything else
is done with it, so no sandbox is handed out twice; the claimer is the first and only user
(the pool runs nothing in it but an entry's ``prepare``). Its agent must answer a health check
(``CLAIM_HEALTH_TIMEOUT_S``); one that does not is destroyed and the create goes cold. While
that check's round trip runs, the claimer's clock, owner and name are written where gc,
``list_sandboxes`` and ``callbox ps`` read them (a sandbox that then does not answer is
destroyed with them): the agent's expiry file and the lifetime record (:mod:`.lifetime`) get
claim time + the claimer's TTL (the full TTL, counted from the claim), the record the
claimer's owner and name (a name is claimed exactly as a cold create claims it). The
container's labels cannot change: their ``callbox.owner`` is this process (also the
pool's), their ``callbox.created`` and ``callbox.expires`` the pooled start; gc follows the
record, not those labels, whenever a record exists, and a pooled sandbox always has one.

**While pooled** a sandbox is listed with owner :data:`POOL_OWNER`. Its lifetime record
makes it expire and be reaped like any other (its TTL: the pooled spec's ``ttl_seconds``),
and, since it belongs to this process, any gc removes it once this process is gone. The
refill thread replaces one before it gets within ``EXPIRY_MARGIN`` of its expiry.

**Limits.** The pool holds at most ``max_total`` sandboxes over all fingerprints (default:
the ceiling times the number of specs), counting those being started. ``room``, if given,
is asked before each start: the most sandboxes the pool may hold right now; a server passes
its total limit minus its live sandboxes, so live + pooled never exceeds that limit through
a refill (a create is never refused for the pool's sake: the pool gives way). A claimed
sandbox is an ordinary sandbox of its claimer from then on and counts as one of its own.

**Refill** runs in one daemon thread: at most one create at a time, ``pause_s`` between
creates, and it waits while a claim is in progress or was made in the last ``pause_s``
(claims come first). It keeps each fingerprint at its floor (``size``); each claim that
finds its fingerprint empty raises that fingerprint's target by one, up to the ceiling
(``max``), and each pooled sandbox that expires unclaimed lowers it by one, down to the floor.

**Entries of their own.** A spec may come as a :class:`PoolEntry`: its own floor and ceiling
(instead of the pool's ``size`` and ``max``) and a ``prepare`` step, run in each of its
sandboxes once started and before it is pooled (the E2B door starts the code interpreter's
server there, so a claimer's first cell finds its kernel warm); a sandbox whose ``prepare``
fails is destroyed. Entries may also be added to a running pool (:meth:`WarmPool.add`).
An entry whose image is not on the host is dropped at its first start, with one warning;
one whose ``prepare`` fails ``PREPARE_FAILURES`` times in a row is dropped likewise. A plain
spec's prepare is the desktop's (:func:`harness.engine.desktop.pool_prepare`): a sandbox whose
image has the desktop is pooled with its display and Chromium up (nothing for other images).

**Shutdown** (``close``) stops the thread and destroys every pooled sandbox, returning once
their containers are gone (``CLOSE_DRAIN_S`` at most: gc removes what is left).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import grpc

from harness.core.errors import CallboxError, ErrorCode
from harness.engine import desktop
from harness.engine.base import LivingSandbox, PoolEntry
from harness.engine.docker import living
from harness.engine.docker.kept import write_expiry
from harness.engine.docker.lifetime import release_name, write_record
from harness.engine.spec import SandboxSpec
from sandbox.health import CHECK_METHOD, SERVING, HealthCheckRequest, HealthCheckResponse

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine
    from harness.engine.docker.sandbox import Sandbox

__all__ = ["POOL_OWNER", "PoolEntry", "WarmPool", "fingerprint"]

log = logging.getLogger("callbox.engine.pool")

POOL_OWNER = "callbox:pool"
"""The owner a pooled, not yet claimed sandbox is listed with."""
NOT_PART_OF_FINGERPRINT = frozenset({"env", "ttl_seconds", "paused_ttl_seconds", "allowed_mount_roots",
                                     "placement"})
"""Spec fields a claim does not need to match (see the module docstring)."""
CLAIM_HEALTH_TIMEOUT_S = 1.0
EXPIRY_MARGIN = 0.1
"""A pooled sandbox is replaced once less than this share of its TTL (at least 10 s) is left."""
CLOSE_DRAIN_S = 60.0
"""How long ``close`` waits for its sandboxes' containers to be removed."""
IDLE_WAKE_S = 5.0
"""How often an idle refill thread looks for pooled sandboxes close to their expiry."""
PREPARE_FAILURES = 3
"""An entry whose ``prepare`` fails this many times in a row is no longer pooled."""


def fingerprint(spec: SandboxSpec) -> str:
    """The pool key of ``spec`` (which should be ``for_host``'s result): a hash of every
    field a running container cannot change (the module docstring lists them)."""
    values = spec.model_dump(mode="json", exclude=set(NOT_PART_OF_FINGERPRINT))
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class _Slot:
    """The pooled sandboxes of one fingerprint and how many the refill thread aims for."""

    spec: SandboxSpec
    uid: int
    gid: int
    size: int
    max: int
    target: int
    ready: deque[Sandbox] = field(default_factory=deque)
    starting: int = 0
    prepare: Callable[[LivingSandbox], None] | None = None
    label: str = ""
    failures: int = 0
    """``prepare``'s failures in a row."""

    def drop(self, why: str) -> None:
        """(Under the lock.) Keep no more sandboxes of this fingerprint, saying ``why`` once."""
        log.warning("the warm pool no longer keeps %s sandboxes: %s", self.label or "these", why)
        self.size = self.max = self.target = 0


class WarmPool:
    """Pre-started sandboxes for the ``specs`` given, ``size`` (floor) to ``max`` (ceiling)
    of each; see the module docstring. Start the refill thread with ``start``."""

    def __init__(self, engine: DockerEngine, specs: Sequence[SandboxSpec | PoolEntry], *, size: int,
                 max: int | None = None,
                 max_total: int | None = None, pause_s: float = 0.05,
                 room: Callable[[], int] | None = None) -> None:
        ceiling = size if max is None else max
        if size < 0 or ceiling < size:
            raise CallboxError(f"a pool needs 0 <= size <= max, not size {size} and max {ceiling}",
                               code=ErrorCode.INVALID_CONFIG)
        self.engine = engine
        self.pause_s = pause_s
        entries = [raw if isinstance(raw, PoolEntry) else PoolEntry(raw, size, ceiling, prepare=desktop.pool_prepare)
                   for raw in specs]
        self.max_total = max_total if max_total is not None else sum(entry.max for entry in entries)
        self.room = room
        self._slots: dict[str, _Slot] = {}
        for entry in entries:
            key, slot = self._slot(entry)
            self._slots[key] = slot
        self._lock = threading.Condition()
        self._claiming = 0
        self._last_claim = 0.0
        self._closed = False
        self._thread: threading.Thread | None = None
        self.claims = 0
        """Claims served from the pool (a counter for tests and benchmarks)."""
        self.misses = 0
        """Creates of a pooled fingerprint that found it empty (and went cold)."""

    def _slot(self, entry: PoolEntry) -> tuple[str, _Slot]:
        if entry.spec.network != "none":
            raise CallboxError(f"only network = \"none\" sandboxes are pooled, not {entry.spec.network!r}",
                               code=ErrorCode.INVALID_CONFIG)
        if entry.size < 0 or entry.max < entry.size:
            raise CallboxError(f"a pool needs 0 <= size <= max, not size {entry.size} and max {entry.max}",
                               code=ErrorCode.INVALID_CONFIG)
        spec = entry.spec.for_host(self.engine.host_limits())
        uid, gid = spec.tool_identity()
        return _key(spec, uid, gid), _Slot(spec, uid, gid, entry.size, entry.max, entry.size,
                                           prepare=entry.prepare, label=entry.label)

    def add(self, entry: PoolEntry) -> bool:
        """Pool ``entry`` too (``max_total`` grows by its ``max``); False if its fingerprint
        is pooled already (the entry is then ignored)."""
        key, slot = self._slot(entry)
        with self._lock:
            if key in self._slots or self._closed:
                return False
            self._slots[key] = slot
            self.max_total += entry.max
            self._lock.notify_all()
        return True

    # ---- claims ----------------------------------------------------------------------------------

    def claim(self, spec: SandboxSpec, uid: int, gid: int, *, name: str | None, owner: str | None,
              ttl: float) -> Sandbox | None:
        """A never-used sandbox for ``spec`` (``for_host``'s result) made the claimer's, or
        None (no such fingerprint, none ready, or its agent does not answer: create cold)."""
        slot = self._slots.get(_key(spec, uid, gid))
        if slot is None:
            return None
        with self._lock:
            if self._closed:
                return None
            if not slot.ready:
                self.misses += 1
                slot.target = min(slot.max, slot.target + 1)
                self._lock.notify_all()
                return None
            sandbox = slot.ready.popleft()  # out of the pool before anything else: never twice
            self._claiming += 1
        try:
            # The health check's round trip runs while the claim is written (both take a few
            # ms, tens in a burst of claims); a sandbox that does not answer is destroyed
            # with what was written for it, and the create goes cold.
            answer = _ask_health(sandbox)
            try:
                claimed = self._hand_over(sandbox, spec, name=name, owner=owner, ttl=ttl)
            except BaseException:
                answer.cancel()
                raise
            if _answered(answer):
                with self._lock:  # concurrent claims: an unlocked += can lose a count
                    self.claims += 1
                return claimed
            log.warning("pooled sandbox %s does not answer; destroying it", sandbox.id)
            if name is not None:
                release_name(self.engine.run_root, name, sandbox.id)
            self._discard(sandbox)
            return None
        finally:
            with self._lock:
                self._claiming -= 1
                self._last_claim = time.monotonic()
                self._lock.notify_all()

    def _hand_over(self, sandbox: Sandbox, spec: SandboxSpec, *, name: str | None, owner: str | None,
                   ttl: float) -> Sandbox:
        engine = self.engine
        if name is not None:
            try:
                living.claim(engine, name, sandbox.id)
            except BaseException:
                with self._lock:  # still never used: back to the pool
                    sandbox_slot = self._slots[_key(sandbox.spec, sandbox.tool_uid, sandbox.tool_gid)]
                    sandbox_slot.ready.appendleft(sandbox)
                raise
        try:
            now = time.time()
            sandbox.spec, sandbox.name, sandbox.owner = spec, name, owner
            sandbox.created_at, sandbox.expires = now, now + ttl
            write_expiry(sandbox.socket_dir, sandbox.expires)
            write_record(engine.run_root, living.new_record(sandbox, ttl_s=ttl, owner=owner,
                                                            process=engine.owner.label()))
            sandbox.recorded = True
        except BaseException:
            if name is not None:
                release_name(engine.run_root, name, sandbox.id)
            self._discard(sandbox)
            raise
        return sandbox

    # ---- refill ------------------------------------------------------------------------------

    def start(self) -> WarmPool:
        """Start the refill thread (once); returns the pool."""
        with self._lock:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._refill_loop, name="callbox-pool-refill", daemon=True)
                self._thread.start()
        return self

    def pooled(self, spec: SandboxSpec | None = None) -> int:
        """How many sandboxes are ready (of ``spec``'s fingerprint, else in all)."""
        with self._lock:
            if spec is None:
                return sum(len(s.ready) for s in self._slots.values())
            checked = spec.for_host(self.engine.host_limits())
            slot = self._slots.get(_key(checked, *checked.tool_identity()))
            return 0 if slot is None else len(slot.ready)

    def pooled_ids(self) -> list[str]:
        """The ids of the sandboxes ready now."""
        with self._lock:
            return [s.id for slot in self._slots.values() for s in slot.ready]

    def wait_filled(self, timeout: float | None = None) -> bool:
        """Wait until every fingerprint holds its target (or the pool closes); whether it does."""
        with self._lock:
            return self._lock.wait_for(lambda: self._closed or all(
                len(s.ready) >= s.target for s in self._slots.values()), timeout) and not self._closed

    def wait_settled(self, timeout: float | None = None) -> bool:
        """Wait until the refill thread has nothing to start (its targets, ``max_total`` or
        ``room`` reached, or a claim's quiet time running) and no start is in progress;
        whether it settled in time."""
        with self._lock:
            return self._lock.wait_for(lambda: self._closed or (
                not any(s.starting for s in self._slots.values()) and self._next_slot() is None), timeout)

    def _refill_loop(self) -> None:
        while True:
            expired: list[Sandbox] = []
            with self._lock:
                slot = self._next_slot()
                while slot is None and not self._closed:
                    if not self._lock.wait(self._idle_wait()) and (expired := self._take_expiring()):
                        break
                    slot = self._next_slot()
                if self._closed:
                    return
                if slot is not None:
                    slot.starting += 1
            for sandbox in expired:
                self._discard(sandbox)
            if slot is None:
                continue
            try:
                self._start_one(slot)
            finally:
                with self._lock:
                    slot.starting -= 1
                    self._lock.notify_all()
                    self._lock.wait_for(lambda: self._closed, self.pause_s)

    def _idle_wait(self) -> float:
        """(Under the lock.) How long an idle refill thread waits unless woken: until the
        quiet time after the last claim is over, else ``IDLE_WAKE_S`` (to look at expiries)."""
        quiet = self.pause_s - (time.monotonic() - self._last_claim)
        return min(IDLE_WAKE_S, quiet) if quiet > 0 and not self._claiming else IDLE_WAKE_S

    def _next_slot(self) -> _Slot | None:
        """(Under the lock.) The fingerprint to start a sandbox for now: below its target,
        within ``max_total`` and ``room``, and no claim in progress or just made."""
        if self._closed or self._claiming or time.monotonic() - self._last_claim < self.pause_s:
            return None
        held = sum(len(s.ready) + s.starting for s in self._slots.values())
        if held >= self.max_total or held >= self._room():
            return None
        for slot in self._slots.values():
            if len(slot.ready) + slot.starting < slot.target:
                return slot
        return None

    def _room(self) -> int:
        if self.room is None:
            return self.max_total
        try:
            return self.room()
        except Exception:  # a broken callback stops refilling, never the refill thread
            log.exception("the warm pool's room callback failed")
            return 0

    def _take_expiring(self) -> list[Sandbox]:
        """(Under the lock.) The pooled sandboxes close to their expiry, out of the pool."""
        now, taken = time.time(), []
        for slot in self._slots.values():
            margin = max(10.0, slot.spec.ttl_seconds * EXPIRY_MARGIN)
            for sandbox in [s for s in slot.ready if s.expires - now < margin]:
                slot.ready.remove(sandbox)
                slot.target = max(slot.size, slot.target - 1)
                taken.append(sandbox)
        return taken

    def _start_one(self, slot: _Slot) -> None:
        engine = self.engine
        sandbox_id = uuid.uuid4().hex[:12]
        ttl = float(slot.spec.ttl_seconds)
        try:
            engine.run_root.mkdir(parents=True, mode=0o700, exist_ok=True)
            sandbox = engine._start(slot.spec, sandbox_id, engine.run_root / sandbox_id, slot.uid, slot.gid,
                                    name=None, owner=None, ttl=ttl, record=False,
                                    ready_timeout=30.0)
        except Exception as exc:
            with self._lock:
                if isinstance(exc, CallboxError) and exc.code is ErrorCode.IMAGE_NOT_FOUND:
                    slot.drop(str(exc))  # said once: a missing image does not come back by itself
                    return
                log.warning("the warm pool could not start a sandbox: %s", exc)
                self._lock.wait_for(lambda: self._closed, max(1.0, self.pause_s))  # do not spin on a broken engine
            return
        if slot.prepare is not None and not self._prepare(slot, sandbox):
            return
        try:
            write_record(engine.run_root, living.new_record(sandbox, ttl_s=ttl, owner=POOL_OWNER,
                                                            process=engine.owner.label()))
        except BaseException:
            sandbox.destroy()
            raise
        with self._lock:
            if not self._closed:
                slot.ready.append(sandbox)
                return
        sandbox.destroy()  # closed meanwhile

    def _prepare(self, slot: _Slot, sandbox: Sandbox) -> bool:
        """Run ``slot``'s prepare in ``sandbox``; whether it succeeded (else the sandbox is gone)."""
        assert slot.prepare is not None
        try:
            slot.prepare(sandbox)
        except Exception as exc:
            self._discard(sandbox)
            with self._lock:
                slot.failures += 1
                if slot.failures >= PREPARE_FAILURES:
                    slot.drop(f"preparing one failed {slot.failures} times in a row, last: {exc}")
                else:
                    log.warning("the warm pool could not prepare a %s sandbox: %s", slot.label or "pooled", exc)
                    self._lock.wait_for(lambda: self._closed, max(1.0, self.pause_s))
            return False
        slot.failures = 0
        return True

    # ---- shutdown --------------------------------------------------------------------------------

    def close(self) -> list[str]:
        """Stop refilling and destroy every pooled sandbox (waiting for a start in progress
        and, bounded, for the removals); the ids destroyed. Idempotent."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
        with self._lock:
            doomed = [s for slot in self._slots.values() for s in slot.ready]
            for slot in self._slots.values():
                slot.ready.clear()
        for sandbox in doomed:
            self._discard(sandbox)
        # A destroy removes the container in the background; a closed pool has none left.
        if not self.engine.drain(CLOSE_DRAIN_S):
            log.warning("the warm pool's sandboxes were not all removed within %.0f s; gc removes the rest",
                        CLOSE_DRAIN_S)
        return [s.id for s in doomed]

    def _discard(self, sandbox: Sandbox) -> None:
        try:
            sandbox.destroy()
        except Exception as exc:  # gc removes what is left (its record says it belongs to this process)
            log.warning("destroying pooled sandbox %s failed: %s", sandbox.id, exc)


def _ask_health(sandbox: Sandbox) -> grpc.Future:
    """Start the agent's health check (``Sandbox.agent.health``, without waiting for it)."""
    check = sandbox.agent.channel.unary_unary(
        CHECK_METHOD, request_serializer=HealthCheckRequest.SerializeToString,
        response_deserializer=HealthCheckResponse.FromString)
    future: grpc.Future = check.future(HealthCheckRequest(service=""), timeout=CLAIM_HEALTH_TIMEOUT_S)
    return future


def _answered(answer: grpc.Future) -> bool:
    """Whether the health check ``_ask_health`` started says the agent is serving."""
    try:
        return int(answer.result().status) == SERVING
    except (grpc.RpcError, grpc.FutureCancelledError):
        return False


def _key(spec: SandboxSpec, uid: int, gid: int) -> str:
    return f"{fingerprint(spec)}:{uid}:{gid}"
