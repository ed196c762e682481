"""callbox's Prometheus metrics, in one registry of their own (not the process-wide default).

Every metric is named ``callbox_...`` and lives in :data:`REGISTRY`, which ``/metrics`` serves
(:func:`exposition`). What reports what:

* the call path (:mod:`harness.core.session`) reports each call once it has its result:
  :func:`record_call`, into ``callbox_calls_total`` (tool, door, decision, outcome) and the
  two latency histograms, ``callbox_call_harness_seconds`` (validate, authorize, audit,
  shaping: the time the call spent in the harness) and ``callbox_call_sandbox_seconds`` (the
  tool's handler: starting or claiming the sandbox, the agent's exec); a call that never ran
  has no sandbox time;
* the Docker engine reports creates (``callbox_sandboxes_created_total`` by source, ``pool``
  or ``cold``, and ``callbox_sandbox_create_seconds``) and its errors
  (``callbox_engine_errors_total`` by kind);
* the session reports the egress proxy's decisions as it records them in the audit store
  (``callbox_egress_decisions_total``);
* quotas report refusals (:func:`record_quota_refusal`);
* gauges that are facts about the world rather than events are read when scraped: the
  sandboxes live, paused and pooled (from the engines that :func:`watch_engine` was given)
  and the approvals pending (from the audit stores :func:`watch_approvals` was given). A
  source that fails while scraped (the engine went away) is left out of that scrape.

The hot path is :func:`record_call`: its label children are bound once per label set and kept,
so a call costs two dictionary lookups, a counter increment and one or two histogram observes.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Iterable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.registry import Collector

__all__ = [
    "REGISTRY",
    "ApprovalSource",
    "EngineCensus",
    "exposition",
    "record_call",
    "record_egress",
    "record_engine_error",
    "record_quota_refusal",
    "record_sandbox_created",
    "watch_approvals",
    "watch_engine",
]

log = logging.getLogger("callbox.telemetry")

REGISTRY = CollectorRegistry(auto_describe=True)
"""Every callbox metric is registered here; ``/metrics`` serves this registry."""

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_CREATE = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

CALLS = Counter("callbox_calls", "Tool calls by tool, door, decision and outcome (ok, or the result's error code).",
                ("tool", "door", "decision", "outcome"), registry=REGISTRY)
CALL_HARNESS_SECONDS = Histogram(
    "callbox_call_harness_seconds", "Time a call spent in the harness itself (validate, authorize, audit, shape).",
    ("tool", "door"), buckets=_FAST, registry=REGISTRY)
CALL_SANDBOX_SECONDS = Histogram(
    "callbox_call_sandbox_seconds",
    "Time a call spent in its tool's handler: sandbox start or claim, the agent's exec (calls that ran).",
    ("tool", "door"), buckets=_SLOW, registry=REGISTRY)
SANDBOXES_CREATED = Counter("callbox_sandboxes_created", "Sandboxes created, by source (pool: a warm one claimed).",
                            ("source",), registry=REGISTRY)
SANDBOX_CREATE_SECONDS = Histogram("callbox_sandbox_create_seconds", "Time to create a sandbox, by source.",
                                   ("source",), buckets=_CREATE, registry=REGISTRY)
EGRESS_DECISIONS = Counter("callbox_egress_decisions", "Egress proxy decisions recorded, by decision.",
                           ("decision",), registry=REGISTRY)
ENGINE_ERRORS = Counter("callbox_engine_errors", "Errors of the sandbox engine, by kind.", ("kind",),
                        registry=REGISTRY)
QUOTA_REFUSALS = Counter("callbox_quota_refusals", "Requests refused by a client's quota, by client, quota and door.",
                         ("client", "quota", "door"), registry=REGISTRY)


class _CallSeries:
    """The label children of one (tool, door): bound once, used by every call."""

    __slots__ = ("counts", "door", "harness", "sandbox", "tool")

    def __init__(self, tool: str, door: str) -> None:
        self.tool = tool
        self.door = door
        self.harness = CALL_HARNESS_SECONDS.labels(tool, door)
        self.sandbox = CALL_SANDBOX_SECONDS.labels(tool, door)
        self.counts: dict[tuple[str, str], Counter] = {}


_series: dict[tuple[str, str], _CallSeries] = {}
_series_lock = threading.Lock()


def _series_of(tool: str, door: str) -> _CallSeries:
    series = _series.get((tool, door))
    if series is None:
        with _series_lock:
            series = _series.setdefault((tool, door), _CallSeries(tool, door))
    return series


def record_call(tool: str, door: str, decision: str, outcome: str, harness_s: float, sandbox_s: float | None) -> None:
    """One call with its result: ``tool`` (a registered tool's name, else ``unknown``: the
    label set stays bounded whatever a model sends), ``door``, ``decision`` (``allow``,
    ``ask``, ``deny``, ``approved``, ``rejected``), ``outcome`` (``ok`` or the error code),
    the seconds it spent in the harness and, if its handler ran, in the sandbox."""
    series = _series_of(tool, door)
    child = series.counts.get((decision, outcome))
    if child is None:
        child = series.counts.setdefault((decision, outcome), CALLS.labels(tool, door, decision, outcome))
    child.inc()
    series.harness.observe(harness_s)
    if sandbox_s is not None:
        series.sandbox.observe(sandbox_s)


def record_sandbox_created(source: str, seconds: float) -> None:
    """A sandbox was created (``source``: ``pool`` for a warm one claimed, else ``cold``)."""
    SANDBOXES_CREATED.labels(source).inc()
    SANDBOX_CREATE_SECONDS.labels(source).observe(seconds)


def record_engine_error(kind: str) -> None:
    """The engine failed (``kind``: ``engine_unavailable``, ``sandbox_start``, ...)."""
    ENGINE_ERRORS.labels(kind).inc()


def record_egress(decisions: Iterable[str]) -> None:
    """Egress proxy decisions (``allow``, ``deny``, ...), one per connection it saw."""
    for decision in decisions:
        EGRESS_DECISIONS.labels(decision).inc()


def record_quota_refusal(client: str, quota: str, door: str) -> None:
    """A request of ``client`` was refused by its ``quota`` (e.g. ``live_sandboxes``,
    ``calls_per_minute``) at ``door`` (``grpc``, ``mcp``, ``e2b``)."""
    QUOTA_REFUSALS.labels(client, quota, door).inc()


# ---- gauges read when scraped --------------------------------------------------------------


class EngineCensus(Protocol):
    """An engine whose sandboxes can be counted when ``/metrics`` is scraped."""

    def sandbox_census(self) -> tuple[int, int]:
        """The sandboxes live (running or paused, pooled ones left out) and, of them, paused."""

    def pooled_count(self) -> int:
        """The warm sandboxes in this engine's pool."""


class ApprovalSource(Protocol):
    """An audit store whose pending approvals can be counted when scraped."""

    def list_approvals(self, state: str | None = ...) -> Sequence[object]: ...


_engines: weakref.WeakSet[EngineCensus] = weakref.WeakSet()
_approval_sources: weakref.WeakValueDictionary[str, ApprovalSource] = weakref.WeakValueDictionary()


def watch_engine(engine: EngineCensus) -> None:
    """Count ``engine``'s sandboxes in the gauges while it lives (held weakly)."""
    _engines.add(engine)


def watch_approvals(key: str, store: ApprovalSource) -> None:
    """Count the approvals pending in ``store`` (one per ``key``, e.g. its database path:
    two handles on one database count once) while it lives (held weakly)."""
    _approval_sources[key] = store


_GAUGES = {
    "callbox_sandboxes_live": "Sandboxes on the engine, running or paused (pooled ones left out).",
    "callbox_sandboxes_paused": "Sandboxes on the engine that are paused.",
    "callbox_sandboxes_pooled": "Warm sandboxes in this process's pools.",
    "callbox_approvals_pending": "Approvals waiting for a person.",
}


def _gauge(name: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, _GAUGES[name], value=value)


class _ScrapedGauges(Collector):
    """The gauges read from their sources at scrape time."""

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(name, text) for name, text in _GAUGES.items()]

    def collect(self) -> Iterable[Metric]:
        engines = list(_engines)
        census: tuple[int, int] | None = None
        for engine in engines:  # every engine of a process sees the same Docker: ask the first that answers
            try:
                census = engine.sandbox_census()
                break
            except Exception as exc:
                log.debug("no sandbox census for /metrics: %s", exc)
        pooled = 0
        for engine in engines:
            try:
                pooled += engine.pooled_count()
            except Exception as exc:
                log.debug("no pool count for /metrics: %s", exc)
        metrics = []
        if census is not None:
            metrics += [_gauge("callbox_sandboxes_live", max(0, census[0] - pooled)),
                        _gauge("callbox_sandboxes_paused", census[1])]
        metrics.append(_gauge("callbox_sandboxes_pooled", pooled))
        stores = list(_approval_sources.values())
        pending = 0
        for store in stores:
            try:
                pending += len(store.list_approvals("pending"))
            except Exception as exc:  # a closed store: nothing of it is pending here any more
                log.debug("no approval count for /metrics: %s", exc)
        metrics.append(_gauge("callbox_approvals_pending", pending))
        return metrics


REGISTRY.register(_ScrapedGauges())


def exposition() -> tuple[bytes, str]:
    """The registry in the Prometheus text format, and its content type."""
    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST
