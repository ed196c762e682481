"""The agent's RPC worker threads: a small core started up front, more on demand, the extras
retired once idle.

Every thread is a pid, counted against the container's pids limit, which tool processes
share: an idle sandbox should hold few. But a fork bomb in the sandbox can use up every pid,
and then no thread can start. So:

* ``core`` workers are started before the first RPC and never end: even with no pid left,
  that many calls (health, Signal, WriteStdin, file operations, a few commands) are served.
* Beyond those, a call that finds no idle worker starts a new one, up to ``maximum``; a
  worker that has waited ``idle_s`` for work ends while more than ``core`` are left, so an
  idle sandbox returns to the core.
* When a worker cannot be started (no pid left: ``RuntimeError`` from ``_thread``), the call
  stays queued and the next worker to become free runs it; starting is tried again on every
  new call and on every :meth:`WorkerPool.top_up` (the agent's main loop calls it while calls
  wait). ``submit`` never raises for it: gRPC's request loop calls ``submit`` and would stop
  serving if it raised.

gRPC's server only submits calls and watches their futures. Workers are started with
``_thread`` rather than as ``threading.Thread`` objects, which start one at a time, each
waiting for the new thread to run; here the core is started back to back and one barrier
waits for all of it.
"""

from __future__ import annotations

import _thread
import logging
import queue
import threading
from collections.abc import Callable
from concurrent import futures
from typing import Any, TypeVar

log = logging.getLogger("callbox.agent")

CORE_WORKERS = 8
"""RPC threads an idle agent keeps: health, Signal, WriteStdin, file operations and a few
commands are served by them even when a fork bomb holds every pid."""
AGENT_OTHER_THREADS = 9
"""The idle agent's threads besides its workers: the main thread, the spawner's reader, gRPC's
server loop, and gRPC core's six (4 event engine, timer, lifeguard). The jobs' I/O loop starts
with the first Jobs call."""
IDLE_RETIRE_S = 20.0
"""A worker beyond the core ends after waiting this long for a call."""
_T = TypeVar("_T")


def _start_thread(target: Callable[[], None]) -> None:
    _thread.start_new_thread(target, ())


class WorkerPool(futures.Executor):
    """``core`` pre-started workers, up to ``maximum`` in all; see the module's docstring.

    ``start`` starts a thread running its argument (``_thread`` by default; tests pass one
    that fails, as the kernel does when no pid is left)."""

    def __init__(self, core: int, maximum: int, *, idle_s: float = IDLE_RETIRE_S,
                 start: Callable[[Callable[[], None]], None] = _start_thread) -> None:
        if not 0 < core <= maximum:
            raise ValueError(f"need 0 < core <= maximum, got core {core}, maximum {maximum}")
        self._queue: queue.SimpleQueue[_WorkItem | None] = queue.SimpleQueue()
        self._core, self._maximum, self._idle_s, self._start = core, maximum, idle_s, start
        self._lock = threading.Lock()
        self._idle = threading.Semaphore(core)
        """One token per worker waiting for a call that no queued call has claimed yet."""
        self._threads = 0
        self._owed = 0
        """Queued calls for which no worker was idle and none could be started."""
        self._shutdown = False
        self._starved = False
        """Whether the last start failed (logged once until one succeeds again)."""
        barrier = threading.Barrier(core + 1)
        for _ in range(core):
            self._threads += 1
            start(lambda: self._work(barrier))
        barrier.wait()

    @property
    def threads(self) -> int:
        """Workers alive now."""
        return self._threads

    @property
    def waiting(self) -> int:
        """Calls queued with no worker for them (none idle, none could be started)."""
        return self._owed

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> futures.Future[_T]:
        future: futures.Future[_T] = futures.Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put(_WorkItem(future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False):
                self._owed += 1
                self._grow()
        return future

    def top_up(self) -> None:
        """Start workers for calls still waiting for one (when a pid has come free since)."""
        with self._lock:
            if self._owed and not self._shutdown:
                self._grow()

    def _grow(self) -> None:
        """Start workers for owed calls while under ``maximum``; stop at the first failure."""
        while self._owed and self._threads < self._maximum:
            self._threads += 1
            try:
                self._start(lambda: self._work(None))
            except RuntimeError as error:  # EAGAIN: the pids limit is reached
                self._threads -= 1
                if not self._starved:
                    self._starved = True
                    log.warning("cannot start an RPC worker (%s): the sandbox's pids limit is reached; %d "
                                "call(s) wait for one of the %d busy workers", error, self._owed, self._threads)
                return
            self._owed -= 1
            if self._starved:
                self._starved = False
                log.info("RPC workers start again (%d now)", self._threads)

    def _work(self, barrier: threading.Barrier | None) -> None:
        if barrier is not None:
            barrier.wait()
        while True:
            try:
                item = self._queue.get(timeout=self._idle_s)
            except queue.Empty:
                with self._lock:
                    # Retire only with an unclaimed idle token: a claimed one means a call is on its way.
                    if self._threads > self._core and self._idle.acquire(blocking=False):
                        self._threads -= 1
                        return
                continue
            if item is None:
                with self._lock:
                    self._threads -= 1
                return
            item.run()
            del item  # the finished call's arguments and result are not kept alive
            with self._lock:
                if self._owed:
                    self._owed -= 1  # this worker takes a call that is waiting for one
                else:
                    self._idle.release()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop the workers once the queued calls are done (``wait`` is not supported:
        workers busy in a long-lived call are daemon threads the process may exit over)."""
        with self._lock:
            if self._shutdown:
                return
            self._shutdown = True
            for _ in range(self._maximum):
                self._queue.put(None)


class _WorkItem:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, future: futures.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any]) -> None:
        self.future, self.fn, self.args, self.kwargs = future, fn, args, kwargs

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as exc:  # handed to the future, as ThreadPoolExecutor does
            self.future.set_exception(exc)
        else:
            self.future.set_result(result)
