"""The line sandbox starts wait in when the host is already starting as many as it can.

Every door's create goes through the executor's one :class:`StartQueue` (the gRPC door's
CreateSandbox and the E2B door's ``Sandbox.create`` alike): at most ``slots`` sandboxes are
being started at once on this host; a create beyond that waits in line instead of being
refused, and starts as soon as a slot frees.

The line is fair between clients and work-conserving:

* a free slot always goes to someone waiting (a client alone may use every slot; nothing
  holds it back while nobody else waits);
* when several clients wait, the slot goes to the one with the fewest starts in progress,
  then the one served least since the line was last empty (round robin), then who came
  first; so one client's burst of fifty creates does not make another client's single
  create wait behind all fifty: it waits for one start at most;
* a client past its share of live sandboxes (``over_share``: the executor's default
  per-client share, when no hard limit or quota of its own bounds it) is held back only
  while a client within its share waits: its creates wait behind every such create, and
  are started as soon as none is waiting. Alone, it may go on up to the host's total.
  Its sandboxes already running are never touched.

A wait is bounded (``max_wait_s``): a create still in line then is refused with
:class:`~harness.doors.quota_ledger.QuotaExceeded` (``start_queue``, HTTP 429 with
``Retry-After``, gRPC RESOURCE_EXHAUSTED) naming the host's slots, the bound and how many
were ahead of it. A create whose client went away (``still_wanted()`` false) leaves the line.

Thread-safe: one condition guards the line; waiting threads sleep on it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from harness.doors.quota_ledger import QuotaExceeded
from harness.telemetry import metrics

__all__ = ["DEFAULT_MAX_WAIT_S", "StartQueue", "default_slots"]

DEFAULT_MAX_WAIT_S = 45.0
"""How long a create waits in line at most: under the E2B SDK's default request timeout
(60 s), so the client reads the refusal rather than timing out itself."""
_POLL_S = 1.0
"""How often a waiting create asks whether its client is still there."""


def default_slots() -> int:
    """Sandbox starts the host runs at once by default: twice its CPUs, at least 4 (a start
    mostly waits on the engine, not on a CPU)."""
    return max(4, 2 * (os.cpu_count() or 1))


@dataclass(eq=False)
class _Waiter:
    client: str
    order: int
    admitted: bool = False


class StartQueue:
    """At most ``slots()`` sandbox starts at once; the rest wait in line (module docstring).
    ``slots`` is read at each admission, so a new limit applies to the next start."""

    def __init__(self, slots: Callable[[], int] = default_slots, *, max_wait_s: float = DEFAULT_MAX_WAIT_S,
                 clock: Callable[[], float] = time.monotonic,
                 over_share: Callable[[str, int], bool] = lambda _client, _starting: False) -> None:
        self._slots = slots
        self._over_share = over_share
        """(client, its starts in progress) -> whether it is past its share (module docstring)."""
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._cond = threading.Condition()
        self._starting: dict[str, int] = {}
        self._served: dict[str, int] = {}
        """Admissions per client since the line was last empty (the round robin's count)."""
        self._waiting: list[_Waiter] = []
        self._order = itertools.count()

    # ---- reading ------------------------------------------------------------------------------

    def starting(self, client: str | None = None) -> int:
        """Starts in progress (of ``client``, or in all)."""
        with self._cond:
            return self._starting.get(client, 0) if client is not None else sum(self._starting.values())

    def waiting(self, client: str | None = None) -> int:
        """Creates waiting in line (of ``client``, or in all)."""
        with self._cond:
            return sum(1 for w in self._waiting if client is None or w.client == client)

    def wait_until(self, predicate: Callable[[StartQueue], bool], timeout: float) -> bool:
        """Block until ``predicate(self)`` holds (checked whenever the line changes), at most
        ``timeout`` seconds; whether it held (for observers: tests, a console)."""
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self), timeout)

    # ---- the line -----------------------------------------------------------------------------

    @contextlib.contextmanager
    def slot(self, client: str, *, door: str, still_wanted: Callable[[], bool] = lambda: True) -> Iterator[None]:
        """Hold one of the host's start slots for ``client`` around a sandbox start; waits
        in line for one (see the module docstring), QuotaExceeded after ``max_wait_s``."""
        self._enter(client, door, still_wanted)
        try:
            yield
        finally:
            self._leave(client)

    def _enter(self, client: str, door: str, still_wanted: Callable[[], bool]) -> None:
        with self._cond:
            waiter = _Waiter(client, next(self._order))
            self._waiting.append(waiter)
            self._cond.notify_all()
            self._admit_locked()
            deadline = self._clock() + self.max_wait_s
            while not waiter.admitted:
                left = deadline - self._clock()
                if left <= 0 or not still_wanted():
                    self._waiting.remove(waiter)
                    self._admit_locked()  # whoever is next may fit now
                    ahead = sum(1 for w in self._waiting if w.order < waiter.order)
                    busy = sum(self._starting.values())
                    break
                self._cond.wait(min(left, _POLL_S))
            else:
                return
        metrics.record_quota_refusal(client, "start_queue", door)
        raise QuotaExceeded(
            client=client, quota="start_queue", limit=self._slots(), used=busy, door=door, frees_in_s=None,
            retry_after_s=_POLL_S * 5,
            message=f"this host starts at most {self._slots()} sandboxes at once and {busy} were starting; this "
                    f"create waited in line for the bound of {self.max_wait_s:g} s ({ahead} still ahead of it) "
                    "and was not started; retry it")

    def _leave(self, client: str) -> None:
        with self._cond:
            left = self._starting.get(client, 0) - 1
            if left > 0:
                self._starting[client] = left
            else:
                self._starting.pop(client, None)
            self._admit_locked()
            self._cond.notify_all()

    def _admit_locked(self) -> None:
        """Give free slots to the waiting: the client with the fewest starts in progress
        first, then the one served least, then who came first."""
        slots = max(1, self._slots())
        admitted = False
        while self._waiting and sum(self._starting.values()) < slots:
            over = {c: self._over_share(c, self._starting.get(c, 0)) for c in {w.client for w in self._waiting}}
            within = [w for w in self._waiting if not over[w.client]]
            best = min(within or self._waiting, key=lambda w: (self._starting.get(w.client, 0),
                                                               self._served.get(w.client, 0), w.order))
            self._waiting.remove(best)
            best.admitted = True
            self._starting[best.client] = self._starting.get(best.client, 0) + 1
            self._served[best.client] = self._served.get(best.client, 0) + 1
            admitted = True
        if not self._waiting and not self._starting:
            self._served.clear()
        if admitted:
            self._cond.notify_all()
