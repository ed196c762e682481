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
  source that fails while scraped (the engine went away) is left out of that scrape;
* the audit chain's head (:mod:`harness.audit.chain`) of each store :func:`watch_audit_chain`
  was given, read when scraped: ``callbox_audit_chain_seq`` (a gauge) and
  ``callbox_audit_chain_head_info`` (its ``seq`` and ``hash`` as labels), so that an
  operator can anchor it elsewhere.

The hot path is :func:`record_call`: one lock and a few plain number updates per call; its
counter and histograms are made from those numbers when scraped.
"""

from __future__ import annotations

import logging
import threading
import weakref
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate
from typing import Protocol, cast

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = [
    "REGISTRY",
    "ApprovalSource",
    "ChainSource",
    "EngineCensus",
    "audit_chain_heads",
    "exposition",
    "record_call",
    "record_egress",
    "record_engine_error",
    "record_quota_refusal",
    "record_sandbox_created",
    "watch_approvals",
    "watch_audit_chain",
    "watch_engine",
]

log = logging.getLogger("callbox.telemetry")

REGISTRY = CollectorRegistry(auto_describe=True)
"""Every callbox metric is registered here; ``/metrics`` serves this registry."""

_FAST = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_CREATE = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

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

# ---- the call metrics: plain numbers under one lock, made into metric families when scraped ----

_CALL_DOCS = {
    "callbox_calls": "Tool calls by tool, door, decision and outcome (ok, or the result's error code).",
    "callbox_call_harness_seconds": "Time a call spent in the harness itself (validate, authorize, audit, shape).",
    "callbox_call_sandbox_seconds":
        "Time a call spent in its tool's handler: sandbox start or claim, the agent's exec (calls that ran).",
}


class _CallSeries:
    """The calls of one (tool, door): counts by (decision, outcome), and the two latency
    histograms as counts per bucket (not cumulative; the last is +Inf) and sums."""

    __slots__ = ("counts", "harness", "harness_sum", "sandbox", "sandbox_sum")

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.harness = [0] * (len(_FAST) + 1)
        self.harness_sum = 0.0
        self.sandbox = [0] * (len(_SLOW) + 1)
        self.sandbox_sum = 0.0


_le = cast(Callable[[float], str], floatToGoString)  # a bucket bound as prometheus_client writes it
_calls_lock = threading.Lock()
_series: dict[tuple[str, str], _CallSeries] = {}


def record_call(tool: str, door: str, decision: str, outcome: str, harness_s: float, sandbox_s: float | None) -> None:
    """One call with its result: ``tool`` (a registered tool's name, else ``unknown``: the
    label set stays bounded whatever a model sends), ``door``, ``decision`` (``allow``,
    ``ask``, ``deny``, ``approved``, ``rejected``), ``outcome`` (``ok`` or the error code),
    the seconds it spent in the harness and, if its handler ran, in the sandbox.

    This runs once per call, so it is kept to one lock and a few dictionary and list
    operations (prometheus_client's own Counter and Histogram take a lock per value and
    per bucket, several times the cost); the families are made when scraped."""
    with _calls_lock:
        series = _series.get((tool, door))
        if series is None:
            series = _series[(tool, door)] = _CallSeries()
        key = (decision, outcome)
        series.counts[key] = series.counts.get(key, 0) + 1
        series.harness[bisect_left(_FAST, harness_s)] += 1
        series.harness_sum += harness_s
        if sandbox_s is not None:
            series.sandbox[bisect_left(_SLOW, sandbox_s)] += 1
            series.sandbox_sum += sandbox_s


def _histogram(family: HistogramMetricFamily, labels: list[str], bounds: tuple[float, ...], counts: list[int],
               total: float) -> None:
    cumulative = list(accumulate(counts))
    buckets = [(_le(b), float(c)) for b, c in zip(bounds, cumulative, strict=False)]
    family.add_metric(labels, [*buckets, ("+Inf", float(cumulative[-1]))], sum_value=total)


class _CallMetrics(Collector):
    """``callbox_calls_total`` and the two call latency histograms, from ``record_call``'s numbers."""

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, HistogramMetricFamily, HistogramMetricFamily]:
        return (CounterMetricFamily("callbox_calls", _CALL_DOCS["callbox_calls"],
                                    labels=("tool", "door", "decision", "outcome")),
                HistogramMetricFamily("callbox_call_harness_seconds", _CALL_DOCS["callbox_call_harness_seconds"],
                                      labels=("tool", "door")),
                HistogramMetricFamily("callbox_call_sandbox_seconds", _CALL_DOCS["callbox_call_sandbox_seconds"],
                                      labels=("tool", "door")))

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        calls, harness, sandbox = self._families()
        with _calls_lock:
            snapshot = [(tool, door, dict(s.counts), list(s.harness), s.harness_sum, list(s.sandbox), s.sandbox_sum)
                        for (tool, door), s in _series.items()]
        for tool, door, counts, harness_counts, harness_sum, sandbox_counts, sandbox_sum in snapshot:
            for (decision, outcome), n in counts.items():
                calls.add_metric([tool, door, decision, outcome], float(n))
            _histogram(harness, [tool, door], _FAST, harness_counts, harness_sum)
            _histogram(sandbox, [tool, door], _SLOW, sandbox_counts, sandbox_sum)
        return [calls, harness, sandbox]


REGISTRY.register(_CallMetrics())


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


class ChainSource(Protocol):
    """An audit store whose chain head can be read when scraped."""

    def chain_head(self) -> object:
        """The head: ``.seq`` and ``.hash``."""


_engines: weakref.WeakSet[EngineCensus] = weakref.WeakSet()
_chain_sources: weakref.WeakValueDictionary[str, ChainSource] = weakref.WeakValueDictionary()
_approval_sources: weakref.WeakValueDictionary[str, ApprovalSource] = weakref.WeakValueDictionary()


def watch_engine(engine: EngineCensus) -> None:
    """Count ``engine``'s sandboxes in the gauges while it lives (held weakly)."""
    _engines.add(engine)


def watch_approvals(key: str, store: ApprovalSource) -> None:
    """Count the approvals pending in ``store`` (one per ``key``, e.g. its database path:
    two handles on one database count once) while it lives (held weakly)."""
    _approval_sources[key] = store


def watch_audit_chain(key: str, store: ChainSource) -> None:
    """Report the chain head of ``store`` (one per ``key``, its database path) while it lives
    (held weakly)."""
    _chain_sources[key] = store


def audit_chain_heads() -> dict[str, tuple[int, str]]:
    """The chain head (seq, hash) of each watched store, by its key; a store that cannot be
    read now is left out."""
    heads: dict[str, tuple[int, str]] = {}
    for key, store in list(_chain_sources.items()):
        try:
            head = store.chain_head()
            heads[key] = (int(getattr(head, "seq")), str(getattr(head, "hash")))  # noqa: B009
        except Exception as exc:  # a closed store
            log.debug("no audit chain head of %s: %s", key, exc)
    return heads


class _ChainHead(Collector):
    """The audit chain's head of each watched store, read when scraped."""

    _SEQ = ("callbox_audit_chain_seq", "The audit chain's last entry (seq), by audit database.")
    _INFO = ("callbox_audit_chain_head", "The audit chain's head (seq and hash), by audit database, to anchor it.")

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(*self._SEQ, labels=("db",)), InfoMetricFamily(*self._INFO, labels=("db",))]

    def collect(self) -> Iterable[Metric]:
        seq = GaugeMetricFamily(*self._SEQ, labels=("db",))
        info = InfoMetricFamily(*self._INFO, labels=("db",))
        for key, (number, digest) in sorted(audit_chain_heads().items()):
            seq.add_metric([key], number)
            info.add_metric([key], {"seq": str(number), "hash": digest})
        return [seq, info]


REGISTRY.register(_ChainHead())


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
    """The registry in the Prometheus text format, and its content type: format 0.0.4, which
    every Prometheus accepts (callbox's metric names need none of 1.0.0's escaping)."""
    return generate_latest(REGISTRY), CONTENT_TYPE_PLAIN_0_0_4
