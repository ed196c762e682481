"""Enforcing per-client quotas and fair shares, the same way in every door.

One :class:`QuotaKeeper` serves every door of a server (one process), so a client's use is
counted once whichever door it comes through. Per client name it keeps:

* its **live sandboxes** (count, CPUs and memory added up): :meth:`QuotaKeeper.reserve_sandbox`
  checks ``live_sandboxes``, ``cpus``, ``memory`` and ``sandboxes_per_hour`` and holds a
  :class:`Reservation` until the sandbox ends (``release``); a sandbox that never started is
  also taken out of the hour (``refund``);
* the **sandboxes created** and the **tool calls started** in sliding windows (an hour, a
  minute): the event times in a deque, the ones older than the window dropped on the next
  look, so a check is a few comparisons (counted with or without a quota, so a quota set
  by a reload counts what came before it);
* its **requests in flight** at each door (:meth:`QuotaKeeper.enter`), for fairness.

A refusal is :class:`QuotaExceeded`: the quota's name, its limit, the use, and when it frees
up: for a window, the seconds until its oldest event leaves it; for the live totals, when one
of the client's sandboxes ends (no time can be known: ``retry_after_s`` is then a hint of
:data:`SANDBOX_RETRY_S`); a sandbox asking alone for more than a quota never fits and is not
retryable. Each refusal is counted in ``callbox_quota_refusals{client,quota,door}``.

Limits come from a resolver (``client name -> Quotas``, the server configuration's
``client_quotas``), asked once per client and cached; :meth:`QuotaKeeper.configure` swaps the
resolver (a configuration reload): the use counted so far stays, the new limits apply from
the next check, and a client over a lowered limit keeps what it has but gets no more.

Fairness: a door's requests run on a bounded set of threads (the gRPC server's pool, the E2B
door's workers, the MCP door's call limiter), and a long request (a streamed tool call, a
sandbox start, an E2B process stream) holds its thread throughout. Unbounded, one client
sending many at once would take every thread and the others' requests would wait behind
its. So each client is sure of a *share* of a door's threads (the door's ``fair_share``: a
quarter of them by default, or the client's ``concurrent_calls`` quota when lower, which is
then a hard limit); beyond its share a client is still served while the door keeps a share's
worth of threads free for the others (a client alone is not held back), and refused at once
past that (``concurrent_calls``, frees up when one of them ends) instead of queued. Another
client always finds a free thread. Only what holds a thread for long counts (the gRPC door's streamed RPCs and
its sandbox creates, forks and snapshots; the E2B door's creates, envd streams and file
transfers; MCP tool calls): quick requests such as deleting a sandbox are always served.
The other shared things need no share of their own: the executor's call
workers start a thread per call with no bound (:mod:`harness.doors.grpc.workers`), the
engine takes creates as they come, and a client's creates are bounded by its
``live_sandboxes`` (creates in progress count) and by its share of the door's threads.

Thread-safe: one lock guards every client's books, held for a few dictionary and deque
operations (no I/O, no callback) per check.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from harness.core.errors import CallboxError, ErrorCode
from harness.core.units import format_size
from harness.doors.quotas import Quotas
from harness.telemetry import metrics

__all__ = ["CALL_RETRY_S", "DEFAULT_SHARE", "HOUR_S", "MINUTE_S", "SANDBOX_RETRY_S", "QuotaExceeded", "QuotaKeeper",
           "Reservation", "Usage", "fair_share"]

HOUR_S = 3600.0
MINUTE_S = 60.0
SANDBOX_RETRY_S = 5.0
"""The retry hint (Retry-After) when a quota frees up only as one of the client's sandboxes ends."""
CALL_RETRY_S = 1.0
"""The retry hint when a client's share frees up as one of its requests in flight ends."""
DEFAULT_SHARE = 0.25
"""The fraction of a door's threads one client may hold at once."""

QuotaSource = Callable[[str], Quotas]


def fair_share(capacity: int, share: float = DEFAULT_SHARE) -> int:
    """How many of a door's ``capacity`` threads one client may hold at once (at least 1)."""
    return max(1, int(capacity * share))


class QuotaExceeded(CallboxError):
    """A request over one of its client's quotas; ``message`` names the quota, the limit, the
    use and when it frees up."""

    code = ErrorCode.LIMIT_REACHED

    def __init__(self, *, client: str, quota: str, limit: float, used: float, door: str, message: str,
                 frees_in_s: float | None, retry_after_s: float, retryable: bool = True) -> None:
        super().__init__(message)
        self.client = client
        self.quota = quota
        self.limit = limit
        self.used = used
        self.door = door
        self.frees_in_s = frees_in_s
        """Seconds until the window has room again (None: when a sandbox or request ends)."""
        self.retry_after_s = retry_after_s
        """When a retry may succeed: ``frees_in_s``, or a hint when that is not a time."""
        self.retryable = retryable

    @property
    def retry_after(self) -> int:
        """``retry_after_s`` in whole seconds, rounded up (an HTTP ``Retry-After``)."""
        return max(1, math.ceil(self.retry_after_s))


@dataclass
class _Books:
    """One client's use."""

    live: int = 0
    millicpus: int = 0
    memory: int = 0
    created: deque[float] = field(default_factory=deque)
    calls: deque[float] = field(default_factory=deque)
    in_flight: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Usage:
    """A snapshot of one client's use (the console and tests read it)."""

    live_sandboxes: int
    cpus: float
    memory: int
    sandboxes_last_hour: int
    calls_last_minute: int
    in_flight: dict[str, int]


class Reservation:
    """A sandbox's place in its client's live totals (and in the hour), until ``release``."""

    def __init__(self, keeper: QuotaKeeper, client: str, millicpus: int, memory: int, created_at: float | None) -> None:
        self.keeper = keeper
        self.client = client
        self.millicpus = millicpus
        self.memory = memory
        self._created_at = created_at
        self._released = False

    @property
    def released(self) -> bool:
        return self._released

    def release(self) -> None:
        """The sandbox ended (or never started): its place in the live totals is free. Idempotent."""
        self.keeper._release(self)

    def refund(self) -> None:
        """The sandbox never started: it leaves the hour's count too. Idempotent."""
        self.keeper._refund(self)


def _cpus(millicpus: int) -> str:
    return f"{millicpus / 1000:g}"


def _prune(events: deque[float], now: float, window: float) -> None:
    horizon = now - window
    while events and events[0] <= horizon:
        events.popleft()


class QuotaKeeper:
    """Every client's quota books (see the module docstring). ``quotas`` resolves a client's
    limits (None: no quota of any kind, fair shares only); ``clock`` is monotonic seconds."""

    def __init__(self, quotas: QuotaSource | None = None, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._source: QuotaSource = quotas or (lambda _client: Quotas())
        self._clock = clock
        self._lock = threading.Lock()
        self._books: dict[str, _Books] = {}
        self._limits: dict[str, Quotas] = {}

    # ---- limits ----------------------------------------------------------------------------

    def configure(self, quotas: QuotaSource | None) -> None:
        """Take limits from ``quotas`` from now on (a reload); the use counted so far stays."""
        with self._lock:
            self._source = quotas or (lambda _client: Quotas())
            self._limits = {}

    def limits(self, client: str) -> Quotas:
        """``client``'s quotas (resolved once, until the next ``configure``)."""
        with self._lock:
            return self._limits_locked(client)

    def _limits_locked(self, client: str) -> Quotas:
        found = self._limits.get(client)
        if found is None:
            found = self._limits[client] = self._source(client)
        return found

    def _books_locked(self, client: str) -> _Books:
        books = self._books.get(client)
        if books is None:
            books = self._books[client] = _Books()
        return books

    # ---- sandboxes -----------------------------------------------------------------------------

    def reserve_sandbox(self, client: str, *, cpus: float = 0.0, memory: int = 0, door: str) -> Reservation:
        """A place for one more sandbox of ``client`` (``cpus`` and ``memory``: its limits),
        counted in the hour now; QuotaExceeded naming the first quota it would break."""
        millicpus = round(cpus * 1000)
        with self._lock:
            limits = self._limits_locked(client)
            books = self._books_locked(client)
            now = self._clock()
            refusal = self._sandbox_refusal(client, limits, books, millicpus, memory, now, door)
            if refusal is None:
                books.live += 1
                books.millicpus += millicpus
                books.memory += memory
                _prune(books.created, now, HOUR_S)
                books.created.append(now)
                return Reservation(self, client, millicpus, memory, now)
        metrics.record_quota_refusal(client, refusal.quota, door)
        raise refusal

    def adopt_sandbox(self, client: str, *, cpus: float = 0.0, memory: int = 0) -> Reservation:
        """Count a sandbox that already runs (re-adopted after a restart) without any check:
        it uses the client's totals from now on, and may leave the client over them."""
        millicpus = round(cpus * 1000)
        with self._lock:
            books = self._books_locked(client)
            books.live += 1
            books.millicpus += millicpus
            books.memory += memory
        return Reservation(self, client, millicpus, memory, None)

    def _sandbox_refusal(self, client: str, limits: Quotas, books: _Books, millicpus: int, memory: int,
                         now: float, door: str) -> QuotaExceeded | None:
        def ends(quota: str, limit: float, used: float, what: str, *, alone: bool = False) -> QuotaExceeded:
            if alone:
                return QuotaExceeded(client=client, quota=quota, limit=limit, used=used, door=door,
                                     message=f"{what}: this sandbox alone asks for more than client {client!r}'s "
                                             f"quota {quota} allows, so it never fits; ask for less",
                                     frees_in_s=None, retry_after_s=SANDBOX_RETRY_S, retryable=False)
            return QuotaExceeded(client=client, quota=quota, limit=limit, used=used, door=door,
                                 message=f"{what}; it frees up when one of its sandboxes ends (delete one, or wait "
                                         "until one expires)",
                                 frees_in_s=None, retry_after_s=SANDBOX_RETRY_S)

        if limits.live_sandboxes is not None and books.live >= limits.live_sandboxes:
            return ends("live_sandboxes", limits.live_sandboxes, books.live,
                        f"client {client!r} has {books.live} live sandbox{'es' if books.live != 1 else ''}, "
                        f"its quota live_sandboxes ({limits.live_sandboxes})")
        if limits.cpus is not None and books.millicpus + millicpus > round(limits.cpus * 1000):
            what = (f"this sandbox's {_cpus(millicpus)} CPUs beside the {_cpus(books.millicpus)} of client "
                    f"{client!r}'s live sandboxes make {_cpus(books.millicpus + millicpus)} (quota cpus = "
                    f"{limits.cpus:g})")
            return ends("cpus", limits.cpus, books.millicpus / 1000, what,
                        alone=millicpus > round(limits.cpus * 1000))
        if limits.memory is not None and books.memory + memory > limits.memory:
            what = (f"this sandbox's {format_size(memory)} of memory beside the {format_size(books.memory)} of "
                    f"client {client!r}'s live sandboxes make {format_size(books.memory + memory)} (quota memory = "
                    f"{format_size(limits.memory)})")
            return ends("memory", limits.memory, books.memory, what, alone=memory > limits.memory)
        if limits.sandboxes_per_hour is not None:
            _prune(books.created, now, HOUR_S)
            if len(books.created) >= limits.sandboxes_per_hour:
                wait = books.created[0] + HOUR_S - now
                return QuotaExceeded(
                    client=client, quota="sandboxes_per_hour", limit=limits.sandboxes_per_hour,
                    used=len(books.created), door=door, frees_in_s=wait, retry_after_s=wait,
                    message=f"client {client!r} created {len(books.created)} sandboxes in the last hour (quota "
                            f"sandboxes_per_hour = {limits.sandboxes_per_hour}); the next one frees up in "
                            f"{math.ceil(wait)} s")
        return None

    def _release(self, reservation: Reservation) -> None:
        with self._lock:
            if reservation._released:
                return
            reservation._released = True
            books = self._books_locked(reservation.client)
            books.live = max(0, books.live - 1)
            books.millicpus = max(0, books.millicpus - reservation.millicpus)
            books.memory = max(0, books.memory - reservation.memory)

    def _refund(self, reservation: Reservation) -> None:
        with self._lock:
            created_at, reservation._created_at = reservation._created_at, None
            if created_at is None:
                return
            books = self._books_locked(reservation.client)
            with contextlib.suppress(ValueError):  # already out of the window
                books.created.remove(created_at)

    # ---- calls ------------------------------------------------------------------------------------

    def start_call(self, client: str, *, door: str) -> None:
        """Count a tool call ``client`` starts now; QuotaExceeded (``calls_per_minute``) when
        the last minute already holds its quota's worth."""
        with self._lock:
            limit = self._limits_locked(client).calls_per_minute
            books = self._books_locked(client)
            now = self._clock()
            _prune(books.calls, now, MINUTE_S)
            if limit is None or len(books.calls) < limit:
                books.calls.append(now)
                return
            used = len(books.calls)
            wait = books.calls[0] + MINUTE_S - now
        metrics.record_quota_refusal(client, "calls_per_minute", door)
        raise QuotaExceeded(client=client, quota="calls_per_minute", limit=limit, used=used, door=door,
                            frees_in_s=wait, retry_after_s=wait,
                            message=f"client {client!r} started {used} tool calls in the last minute (quota "
                                    f"calls_per_minute = {limit}); the next one frees up in {math.ceil(wait)} s")

    # ---- fair shares --------------------------------------------------------------------------------

    def enter(self, client: str, *, door: str, share: int, capacity: int | None = None) -> None:
        """One more request of ``client`` in flight at ``door``, which lets one client hold
        ``share`` at once (lower when the client's ``concurrent_calls`` quota says so);
        QuotaExceeded (``concurrent_calls``) beyond. With the door's ``capacity`` (its
        threads), a client without a ``concurrent_calls`` quota may go past its share while
        the door still has a share's worth free for the others (work-conserving: a client
        alone is not held back). Pair with :meth:`leave`."""
        with self._lock:
            quota = self._limits_locked(client).concurrent_calls
            limit = share if quota is None else min(share, quota)
            books = self._books_locked(client)
            held = books.in_flight.get(door, 0)
            spare = (quota is None and capacity is not None
                     and sum(b.in_flight.get(door, 0) for b in self._books.values()) + share < capacity)
            if held < limit or spare:
                books.in_flight[door] = held + 1
                return
        metrics.record_quota_refusal(client, "concurrent_calls", door)
        raise QuotaExceeded(client=client, quota="concurrent_calls", limit=limit, used=held, door=door,
                            frees_in_s=None, retry_after_s=CALL_RETRY_S,
                            message=f"client {client!r} has {held} requests in flight at the {door} door (quota "
                                    f"concurrent_calls = {limit}: one client's share of the door, so that other "
                                    "clients are served too); it frees up when one of them ends")

    def leave(self, client: str, *, door: str) -> None:
        """A request that :meth:`enter` let in has ended."""
        with self._lock:
            books = self._books_locked(client)
            held = books.in_flight.get(door, 0) - 1
            if held > 0:
                books.in_flight[door] = held
            else:
                books.in_flight.pop(door, None)

    @contextlib.contextmanager
    def in_flight(self, client: str, *, door: str, share: int) -> Iterator[None]:
        """``enter`` ... ``leave`` around a block."""
        self.enter(client, door=door, share=share)
        try:
            yield
        finally:
            self.leave(client, door=door)

    # ---- reading ----------------------------------------------------------------------------------

    def usage(self, client: str) -> Usage:
        with self._lock:
            books = self._books_locked(client)
            now = self._clock()
            _prune(books.created, now, HOUR_S)
            _prune(books.calls, now, MINUTE_S)
            return Usage(live_sandboxes=books.live, cpus=books.millicpus / 1000, memory=books.memory,
                         sandboxes_last_hour=len(books.created), calls_last_minute=len(books.calls),
                         in_flight=dict(books.in_flight))
