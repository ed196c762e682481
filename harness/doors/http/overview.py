"""The console's overview: what needs a person now, and the last hour in charts.

Where the numbers come from (a choice made for the charts to be right per client and to
survive a restart):

* **calls, refusals and call latency** per minute: the calls the audit store holds, by their
  start time (``calls.started``, ``duration_ms``); a client's overview counts its own runs only;
* **egress decisions** per minute: the audit store's egress records (``egress.ts``);
* **live and pooled sandboxes**: the metrics registry's gauges, sampled every few seconds
  into a ring buffer (:mod:`harness.telemetry.samples`), as nothing else remembers them; a
  client sees its own live sandboxes only, and no pool (the pool is the server's).

The page reloads itself every :data:`REFRESH_S` seconds (a ``<meta http-equiv="refresh">``:
no script), so an operator who keeps it open sees a new approval waiting within that time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from statistics import quantiles
from string import Template

from harness.audit.browse import CallPoint, EgressPoint
from harness.doors.http.charts import Series, bar_chart, line_chart
from harness.doors.http.pages import Html, fill, join
from harness.telemetry.samples import GaugeSample

__all__ = ["MINUTES", "REFRESH_S", "overview_page"]

REFRESH_S = 15
"""Seconds between two reloads of the overview."""
MINUTES = 60
"""The charts' span, in one-minute buckets."""
REFUSALS = frozenset({"denied", "approval_denied", "tool_not_allowed", "unknown_tool", "budget_exceeded",
                      "limit_reached", "permission_denied", "action_denied"})
"""The error codes of a call that the policy, a person or a limit refused (it never ran)."""
_X_LABELS = ("-60 min", "-45", "-30", "-15", "now")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _bucket(ts: float, start: float) -> int:
    return min(max(int((ts - start) // 60), 0), MINUTES - 1)


def _kind(call: CallPoint) -> str:
    if call.decision == "deny" or call.error_code in REFUSALS:
        return "refused"
    if call.error_code == "approval_pending":
        return "asked"
    return "failed" if call.error_code else "ok"


def _calls_chart(calls: Sequence[CallPoint], start: float) -> Html:
    kinds = {"ok": [0.0] * MINUTES, "failed": [0.0] * MINUTES, "refused": [0.0] * MINUTES, "asked": [0.0] * MINUTES}
    for call in calls:
        kinds[_kind(call)][_bucket(call.started, start)] += 1
    refused = int(sum(kinds["refused"]))
    series = [Series("ran", "series-ok", kinds["ok"]), Series("failed", "series-warn", kinds["failed"]),
              Series("refused", "series-bad", kinds["refused"]),
              Series("waiting for a person", "series-ask", kinds["asked"])]
    return bar_chart("chart-calls", "Calls and refusals per minute", series, x_labels=_X_LABELS,
                     caption=f"{_count(len(calls), 'call')} in the last hour, {refused} refused.")


def _latency_chart(calls: Sequence[CallPoint], start: float) -> Html:
    per_minute: list[list[float]] = [[] for _ in range(MINUTES)]
    for call in calls:
        if call.duration_ms is not None:
            per_minute[_bucket(call.started, start)].append(float(call.duration_ms))
    median: list[tuple[float, float]] = []
    p95: list[tuple[float, float]] = []
    for i, values in enumerate(per_minute):
        if not values:
            continue
        t = start + 60 * i + 30
        cuts = quantiles(values, n=20, method="inclusive") if len(values) > 1 else [values[0]] * 19
        median.append((t, cuts[9]))
        p95.append((t, cuts[18]))
    timed = sum(len(v) for v in per_minute)
    return line_chart("chart-latency", "Call latency per minute, in ms",
                      [Series("median", "series-ok", points=median), Series("95th percentile", "series-warn",
                                                                            points=p95)],
                      start=start, end=start + 60 * MINUTES, x_labels=_X_LABELS,
                      caption=f"{_count(timed, 'call')} with a duration (the whole call, as the audit store "
                              "records it).")


def _sandboxes_chart(samples: Sequence[GaugeSample], start: float, viewer: str | None) -> Html:
    kept = [s for s in samples if s.ts >= start]
    if viewer is None:
        series = [Series("live", "series-ok", points=[(s.ts, s.live) for s in kept if s.live is not None]),
                  Series("paused", "series-ask", points=[(s.ts, s.paused) for s in kept if s.paused is not None]),
                  Series("pooled (warm)", "series-pool",
                         points=[(s.ts, s.pooled) for s in kept if s.pooled is not None])]
        caption = ("The Docker engine's callbox sandboxes (every door's, and other servers' on the same engine), "
                   "sampled from the metrics' gauges.")
    else:
        series = [Series("your live sandboxes", "series-ok",
                         points=[(s.ts, float(s.live_by_client.get(viewer, 0))) for s in kept])]
        caption = "Your live sandboxes on this server's doors, sampled."
    caption += f" {_count(len(kept), 'sample')} in the last hour (since this server started, if later)."
    return line_chart("chart-sandboxes", "Live and pooled sandboxes", series, start=start,
                      end=start + 60 * MINUTES, x_labels=_X_LABELS, caption=caption)


def _egress_chart(records: Sequence[EgressPoint], start: float) -> Html:
    allow, deny, other = [0.0] * MINUTES, [0.0] * MINUTES, [0.0] * MINUTES
    for record in records:
        target = allow if record.decision == "allow" else deny if record.decision == "deny" else other
        target[_bucket(record.ts, start)] += 1
    series = [Series("allowed", "series-ok", allow), Series("refused", "series-bad", deny)]
    if any(other):
        series.append(Series("other", "series-ask", other))
    return bar_chart("chart-egress", "Egress decisions per minute", series, x_labels=_X_LABELS,
                     caption=f"{_count(len(records), 'connection')} through the egress proxies in the last hour, "
                             f"{int(sum(deny))} refused.")


_TILES = Template("""<section class="tiles" aria-label="now">
<a class="tile$waiting_css" href="/"><b>$pending</b> approvals waiting</a>
<a class="tile" href="/sandboxes"><b>$live</b> live sandboxes</a>
$pool<a class="tile" href="/runs"><b>$calls</b> calls in the last hour</a>
<a class="tile$refused_css" href="/runs"><b>$refused</b> calls refused in the last hour</a>
</section>
<p class="muted">This page reloads every $refresh s. Charts: the last hour, per minute.</p>
""")


def overview_page(*, pending: int, live: int | None, pooled: float | None, calls: Sequence[CallPoint],
                  egress: Sequence[EgressPoint], samples: Sequence[GaugeSample], viewer: str | None,
                  now: float | None = None) -> Html:
    """The overview of ``viewer``'s work (None: every client's): tiles, then four charts."""
    end = time.time() if now is None else now
    start = end - 60 * MINUTES
    refused = sum(1 for c in calls if _kind(c) == "refused")
    tiles = fill(_TILES, pending=pending, waiting_css=" attention" if pending else "", refused_css="",
                 live="—" if live is None else live, calls=len(calls), refused=refused, refresh=REFRESH_S,
                 pool=fill(Template('<a class="tile" href="/sandboxes"><b>$n</b> warm in the pool</a>\n'),
                           n=f"{pooled:g}") if pooled is not None and viewer is None else Html(""))
    charts = join([_calls_chart(calls, start), _latency_chart(calls, start), _sandboxes_chart(samples, start, viewer),
                   _egress_chart(egress, start)])
    return join([tiles, Html('<div class="charts">\n'), charts, Html("</div>\n")])
