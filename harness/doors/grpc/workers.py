"""Threads that run the door's tool calls, kept between calls.

Each ``CallTool`` runs its call beside the RPC's own thread (which streams the output chunks
while the call runs). Starting a thread per call costs more than the whole audit record of a
short command, so :class:`Workers` keeps the threads: a finished job's thread waits for the
next one (up to ``idle_s``, then it ends), and a new thread starts only when none is idle.
There is no upper bound: every call gets a thread at once, as it did with one thread per call
(the gRPC server's own pool already bounds how many calls run together). The threads are
daemons, so a call stuck in the engine never holds up the process's exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable

__all__ = ["IDLE_S", "Workers"]

IDLE_S = 60.0
"""How long a thread with nothing to do waits for a job before it ends."""

Job = Callable[[], None]


class Workers:
    """Daemon threads named ``name-N`` running submitted jobs; see the module docstring."""

    def __init__(self, name: str, *, idle_s: float = IDLE_S) -> None:
        self.name = name
        self.idle_s = idle_s
        self._jobs: queue.SimpleQueue[Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        """Threads waiting for a job, less the jobs already queued for them."""
        self._started = 0

    @property
    def idle(self) -> int:
        """How many threads wait for a job now."""
        with self._lock:
            return self._idle

    def submit(self, job: Job) -> None:
        """Run ``job`` on an idle thread, or on a new one if none is idle. ``job`` must not
        raise (what it raises is lost with the thread's log line)."""
        with self._lock:
            # The job goes in under the lock that counts it against an idle thread, so a
            # thread giving up (``_next``) either finds it or was never counted on.
            if self._idle > 0:
                self._idle -= 1
                self._jobs.put(job)
                return
            self._started += 1
            number = self._started
        threading.Thread(target=self._run, args=(job,), name=f"{self.name}-{number}", daemon=True).start()

    def _run(self, job: Job) -> None:
        while True:
            job()
            next_job = self._next()
            if next_job is None:
                return
            job = next_job

    def _next(self) -> Job | None:
        """The next job for this thread, or None once it waited ``idle_s`` for one."""
        with self._lock:
            self._idle += 1
        try:
            return self._jobs.get(timeout=self.idle_s)
        except queue.Empty:
            with self._lock:
                try:
                    return self._jobs.get_nowait()  # queued for this thread as it gave up
                except queue.Empty:
                    self._idle -= 1
                    return None
