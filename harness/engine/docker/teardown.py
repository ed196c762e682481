"""Destroying a sandbox without making the caller wait for Docker (``DockerEngine.destroy``).

``destroy`` does the cheap, file-only part in the caller and hands the rest to a bounded pool
of background workers owned by the engine:

* in the caller (well under a millisecond): the sandbox's expiry file (and its egress proxy's)
  is set to now, so its agent and proxy stop on their own and ``gc`` in any process removes
  whatever a crash leaves behind; the egress proxy's decisions so far are read (they are what
  ``destroy`` returns); its keep record and lifetime record are removed, which frees its name
  at once; the sandbox joins this process's set of removals, which ``list_sandboxes`` leaves
  out;
* in the background: the container, then (unless it has none) the egress proxy, network and
  proxy log (:meth:`SandboxNetworks.detach`, which also logs every decision), then the socket
  directory and the memory image of a pause to disk. A removal that fails is retried with
  backoff for ``RETRY_FOR_S`` and each failure logged; one that still fails is logged as an
  error and left to ``gc`` (its expiry has passed, so any gc removes it).

Nothing is lost at exit: ``drain`` waits (bounded) until the pending removals are done,
``close`` drains and then makes later destroys synchronous, and an ``atexit`` hook closes
every engine's teardown before the interpreter exits (short-lived CLI processes too). The
workers are daemon threads that end after ``IDLE_S`` without work, and at most
``MAX_PENDING`` removals wait at a time (a destroy beyond that waits for room).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import shutil
import socket
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker
import requests
import tenacity

from harness.core.errors import short_reason
from harness.engine.docker import disk_pause
from harness.engine.docker.client import remove_container
from harness.engine.docker.kept import kept_path, write_expiry
from harness.engine.docker.lifetime import remove_record
from harness.engine.docker.networks import EgressEvent

if TYPE_CHECKING:
    from harness.engine.docker.engine import DockerEngine

log = logging.getLogger("callbox.engine")

WORKERS = 4
"""Removals run at once (Docker does the work; the threads mostly wait on it)."""
MAX_PENDING = 256
IDLE_S = 2.0
"""A worker with nothing to do for this long ends (the next destroy starts one again)."""
RETRY_FOR_S = 60.0
"""How long a failing removal is retried before it is left to gc."""
EXIT_DRAIN_S = 60.0
"""At interpreter exit, how long the pending removals of all engines may take in total (a
removal still retrying then gives up: its expiry has passed, so gc removes it)."""


@dataclass(frozen=True)
class Removal:
    """What the background removes for one destroyed sandbox."""

    sandbox_id: str
    network: str | None
    """The sandbox's network mode (``none``: no proxy or network to remove; None: unknown)."""


class Teardown:
    """The background remover of one engine."""

    def __init__(self, engine: DockerEngine, *, workers: int = WORKERS, max_pending: int = MAX_PENDING,
                 retry_for_s: float = RETRY_FOR_S) -> None:
        self.engine = engine
        self.max_workers = max(1, workers)
        self.max_pending = max(1, max_pending)
        self.retry_for_s = retry_for_s
        self._cond = threading.Condition()
        self._queued: OrderedDict[str, Removal] = OrderedDict()
        self._running: set[str] = set()
        self._failed: set[str] = set()
        """Removals given up on (left to gc); still never listed as live here."""
        self._workers = 0
        self._idle = 0
        self._closed = False
        self._closing = threading.Event()
        """Set by ``close``: a removal still retrying then gives up (gc removes it)."""
        _LIVE.add(self)

    # ---- the caller's side --------------------------------------------------------------------

    def destroy(self, sandbox_id: str, network: str | None) -> list[EgressEvent]:
        """The cheap part now, the rest queued; the egress proxy's decisions so far. An engine
        that is not there at all (its socket refuses) is an error now, as a removal would be:
        requests' ConnectionError, which ``engine_calls`` turns into EngineUnavailable."""
        engine = self.engine
        _check_listening(engine.client)
        now = float(math.floor(time.time()))  # written as whole seconds: never rounded up into the future
        with contextlib.suppress(OSError):  # no socket directory: nothing listens there anyway
            write_expiry(engine.run_root / sandbox_id, now)
        events: list[EgressEvent] = []
        if network != "none":
            engine.networks.set_expiry(sandbox_id, now)
            events, _ = engine.networks.egress_events(sandbox_id)
        kept_path(engine.run_root, sandbox_id).unlink(missing_ok=True)
        remove_record(engine.run_root, sandbox_id)
        self.submit(Removal(sandbox_id, network))
        return events

    def submit(self, removal: Removal) -> None:
        """Queue ``removal`` (a sandbox already queued or being removed is not queued twice);
        after ``close``, or when no worker can be started, it runs here and now."""
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self._pending_count() < self.max_pending)
            if removal.sandbox_id in self._queued or removal.sandbox_id in self._running:
                return
            inline = self._closed
            if not inline:
                self._failed.discard(removal.sandbox_id)
                self._queued[removal.sandbox_id] = removal
                if len(self._queued) > self._idle and self._workers < self.max_workers:
                    inline = not self._start_worker()
                    if inline:
                        del self._queued[removal.sandbox_id]
                self._cond.notify()
        if inline:
            self._remove(removal)

    # ---- state --------------------------------------------------------------------------------

    def removing(self) -> set[str]:
        """The sandboxes destroyed here and not (yet) gone: queued, being removed, or given up."""
        with self._cond:
            return {*self._queued, *self._running, *self._failed}

    def pending(self) -> int:
        """Removals queued or under way."""
        with self._cond:
            return self._pending_count()

    def _pending_count(self) -> int:
        return len(self._queued) + len(self._running)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until every removal queued so far is done (or given up); False if ``timeout``
        (seconds) passed first."""
        with self._cond:
            return self._cond.wait_for(lambda: self._pending_count() == 0, timeout)

    def wait(self, sandbox_id: str, timeout: float | None = None) -> bool:
        """Wait until the removal of ``sandbox_id`` (if any is pending) is done; False on timeout."""
        with self._cond:
            return self._cond.wait_for(
                lambda: sandbox_id not in self._queued and sandbox_id not in self._running, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Drain (bounded by ``timeout``), then stop the workers; a destroy after this removes
        synchronously. Whether everything pending was done. Idempotent."""
        done = self.drain(timeout)
        self._closing.set()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            left = sorted({*self._queued, *self._running})
        if left:
            log.warning("%d sandbox removals were not finished in time (gc removes them: their expiry has "
                        "passed): %s", len(left), ", ".join(left))
        return done

    # ---- the workers --------------------------------------------------------------------------

    def _start_worker(self) -> bool:
        """(Under the lock.) Start one more worker; False if no thread can be started now."""
        thread = threading.Thread(target=self._work, name="callbox-teardown", daemon=True)
        try:
            thread.start()
        except RuntimeError:  # interpreter shutting down
            return False
        self._workers += 1
        return True

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                self._cond.wait_for(lambda: bool(self._queued) or self._closed, IDLE_S)
                self._idle -= 1
                if not self._queued:
                    self._workers -= 1
                    return
                sandbox_id, removal = self._queued.popitem(last=False)
                self._running.add(sandbox_id)
            try:
                self._remove(removal)
            finally:
                with self._cond:
                    self._running.discard(sandbox_id)
                    self._cond.notify_all()

    def _remove(self, removal: Removal) -> None:
        """Remove what ``removal`` names, retrying failures; one that keeps failing is logged
        and left to gc."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_any(tenacity.stop_after_delay(self.retry_for_s),
                                   tenacity.stop_when_event_set(self._closing)),
            wait=tenacity.wait_exponential(multiplier=0.05, max=5.0),
            retry=tenacity.retry_if_exception_type(Exception),
            before_sleep=lambda state: log.warning(
                "removing sandbox %s failed (attempt %d, retrying): %s", removal.sandbox_id, state.attempt_number,
                _reason(state.outcome.exception() if state.outcome else None)),
            reraise=True,
        )
        try:
            retrying(self.remove_now, removal)
        except Exception as exc:
            with self._cond:
                self._failed.add(removal.sandbox_id)
            log.error("gave up removing sandbox %s (gc removes it, its expiry has passed): %s",
                      removal.sandbox_id, _reason(exc))

    def remove_now(self, removal: Removal) -> None:
        """One attempt: the container, its proxy and network, its socket directory (each step
        is a no-op for what is already gone, so an attempt after a failure starts over)."""
        engine = self.engine
        remove_container(engine.client, f"callbox-{removal.sandbox_id}")
        if removal.network != "none":
            engine.networks.detach(removal.sandbox_id)
        remove_tree(engine.run_root / removal.sandbox_id)
        remove_tree(disk_pause.image_dir(engine.run_root, removal.sandbox_id))


def remove_tree(path: Path) -> None:
    """Remove the directory ``path`` and everything in it; a missing one is no error, any other
    failure raises (so the removal is retried). A second destroy of the same sandbox may write its
    expiry file while the first removal empties the directory: that rmdir fails with ENOTEMPTY,
    and the retry removes what was written."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        if path.exists():  # something inside vanished under us: the retry finishes the job
            raise


def _check_listening(client: docker.DockerClient) -> None:
    """Connect to a unix-socket engine and hang up, without blocking (tens of microseconds, no
    request: a ping costs milliseconds under load); ConnectionError if nothing listens there.
    A full backlog (EAGAIN) means dockerd is there, only busy. An engine reached otherwise is
    not checked. The path is the one docker-py's own unix adapter connects to."""
    path = getattr(getattr(client.api, "_custom_adapter", None), "socket_path", None)
    if not isinstance(path, str):
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.setblocking(False)
        try:
            probe.connect(path)
        except BlockingIOError:
            return
        except OSError as exc:
            raise requests.exceptions.ConnectionError(f"{path}: {exc.strerror or exc}") from None


def _reason(exc: BaseException | None) -> str:
    return "?" if exc is None else short_reason(exc)


_LIVE: weakref.WeakSet[Teardown] = weakref.WeakSet()
"""Every engine's teardown in this process (the exit hook closes them; listings consult them)."""


def removing_anywhere() -> set[str]:
    """The sandboxes any engine of this process destroyed and has not finished removing."""
    found: set[str] = set()
    for teardown in list(_LIVE):
        found |= teardown.removing()
    return found


def drain_all(timeout: float = EXIT_DRAIN_S) -> bool:
    """Wait until every engine of this process has removed what it destroyed (a server that
    stops, before it says it has); False if ``timeout`` passed first."""
    deadline = time.monotonic() + timeout
    return all([teardown.drain(max(0.0, deadline - time.monotonic())) for teardown in list(_LIVE)])


@atexit.register
def _close_all() -> None:
    deadline = time.monotonic() + EXIT_DRAIN_S
    for teardown in list(_LIVE):
        teardown.close(max(0.0, deadline - time.monotonic()))
