"""A short memory of the metrics: the gauges of :data:`harness.telemetry.metrics.REGISTRY`
(sandboxes live, paused and pooled, approvals pending) read every :data:`INTERVAL_S` seconds
into a bounded ring buffer, for the console's overview charts.

Gauges are facts at a moment, so only sampling gives them a history; the events (calls, their
latency, egress decisions) have their own timestamps in the audit store, which the console
reads instead (per client, and surviving a restart). The buffer holds :data:`KEPT` samples
(an hour at the default interval) and nothing is written anywhere: a restarted server starts
a new history. Each sample also counts the live sandboxes per client (from ``live``, the
executor's sandboxes), so a client's chart shows only its own.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from harness.telemetry.metrics import REGISTRY

__all__ = ["INTERVAL_S", "KEPT", "GaugeSample", "GaugeSampler"]

log = logging.getLogger("callbox.telemetry")

INTERVAL_S = 10.0
"""Seconds between two samples."""
KEPT = 360
"""Samples kept (the oldest dropped first): an hour at :data:`INTERVAL_S`."""
_GAUGES = {
    "callbox_sandboxes_live": "live",
    "callbox_sandboxes_paused": "paused",
    "callbox_sandboxes_pooled": "pooled",
    "callbox_approvals_pending": "pending",
}


@dataclass(frozen=True)
class GaugeSample:
    """The gauges at one moment (None: the registry had no value, e.g. no engine answered)."""

    ts: float
    live: float | None = None
    paused: float | None = None
    pooled: float | None = None
    pending: float | None = None
    live_by_client: Mapping[str, int] = field(default_factory=dict)


def read_gauges() -> dict[str, float]:
    """The current values of the sampled gauges (one collection of the registry)."""
    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        key = _GAUGES.get(family.name)
        if key is not None and family.samples:
            found[key] = float(family.samples[0].value)
    return found


class GaugeSampler:
    """Samples the gauges on a daemon thread until ``stop``; ``samples()`` gives them, oldest first."""

    def __init__(self, live: Callable[[], Mapping[str, str]] | None = None, *, interval_s: float = INTERVAL_S,
                 kept: int = KEPT, read: Callable[[], Mapping[str, float]] = read_gauges) -> None:
        self._live = live
        self._interval_s = interval_s
        self._read = read
        self._buffer: deque[GaugeSample] = deque(maxlen=kept)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> GaugeSampler:
        """Sample now and every ``interval_s`` on a daemon thread (the first sample too: reading
        the engine's gauges asks Docker, which a server's start does not wait for)."""
        self._thread = threading.Thread(target=self._loop, name="callbox-gauge-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def sample(self) -> GaugeSample:
        """Take one sample now (a source that fails leaves its values out) and keep it."""
        try:
            values = dict(self._read())
        except Exception as exc:  # a scrape that fails leaves a gap in the chart, not a dead thread
            log.debug("gauge sample failed: %s", exc)
            values = {}
        by_client: dict[str, int] = {}
        if self._live is not None:
            try:
                for client in self._live().values():
                    by_client[client] = by_client.get(client, 0) + 1
            except Exception as exc:
                log.debug("live sandboxes not sampled: %s", exc)
        taken = GaugeSample(ts=time.time(), live=values.get("live"), paused=values.get("paused"),
                            pooled=values.get("pooled"), pending=values.get("pending"), live_by_client=by_client)
        with self._lock:
            self._buffer.append(taken)
        return taken

    def samples(self) -> list[GaugeSample]:
        with self._lock:
            return list(self._buffer)

    def _loop(self) -> None:
        self.sample()
        while not self._stop.wait(self._interval_s):
            self.sample()
