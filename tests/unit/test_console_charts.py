"""The console's SVG charts and the gauge sampler behind the sandboxes chart."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from harness.doors.http.charts import HEIGHT, Series, _nice_top, bar_chart, line_chart
from harness.doors.http.overview import MINUTES, overview_page
from harness.telemetry.samples import GaugeSampler

SVG = "{http://www.w3.org/2000/svg}"


def _svg(html: str) -> ET.Element:
    start, end = html.index("<svg xmlns="), html.index("</svg>", html.index("<svg xmlns=")) + len("</svg>")
    return ET.fromstring(html[start:end])


def test_bars_stack_per_bucket_within_the_plot_and_escape_their_names():
    chart = bar_chart("c", "Calls <per> minute", [Series("ran <ok>", "series-ok", [1, 0, 3]),
                                                   Series("refused", "series-bad", [1, 0, 0])],
                      x_labels=("a", "b"))
    svg = _svg(chart)
    assert svg.get("aria-label") == "Calls <per> minute"  # escaped in the markup, the text intact
    bars = svg.findall(f"{SVG}rect")
    assert len(bars) == 3  # empty values draw nothing
    for bar in bars:
        assert float(bar.get("y", "-1")) >= 0 and float(bar.get("y", "0")) + float(bar.get("height", "0")) <= HEIGHT
    first_bucket = [b for b in bars if b.get("x") == bars[0].get("x")]
    assert {b.get("class") for b in first_bucket} == {"series-ok", "series-bad"}  # stacked in one column
    assert "<ok>" not in chart and "ran &lt;ok&gt;" in chart


def test_lines_mark_their_latest_point_and_clamp_points_outside_the_span():
    svg = _svg(line_chart("l", "Latency", [Series("median", "series-ok", points=[(-50, 1.0), (50, 4.0), (500, 2.0)])],
                          start=0, end=100, x_labels=("0", "100")))
    line = svg.find(f"{SVG}polyline")
    assert line is not None
    xs = [float(point.split(",")[0]) for point in (line.get("points") or "").split()]
    assert xs == [40.0, 255.0, 470.0]  # the plot's left edge, its middle, its right edge
    dot = svg.find(f"{SVG}circle")
    assert dot is not None and float(dot.get("cx", "0")) == xs[-1]


def test_the_axis_top_is_a_round_number_at_least_the_largest_value():
    assert [_nice_top(v) for v in (0, 0.4, 3, 7, 10, 11, 240, 4100)] == [1, 1, 5, 10, 10, 20, 500, 5000]


def test_an_empty_overview_still_draws_four_well_formed_charts():
    page = overview_page(pending=0, live=None, pooled=None, calls=[], egress=[], samples=[], viewer=None, now=1e9)
    assert page.count('<figure class="chart"') == 4
    assert "0 calls in the last hour, 0 refused" in page
    assert MINUTES == 60


def test_the_sampler_keeps_a_bounded_history_and_survives_a_failing_source():
    values = iter([{"live": 2.0, "pooled": 1.0}, RuntimeError("engine gone"), {"live": 3.0}])

    def read() -> dict[str, float]:
        value = next(values)
        if isinstance(value, Exception):
            raise value
        return value

    sampler = GaugeSampler(lambda: {"a": "alice", "b": "alice", "c": "bob"}, kept=2, read=read)
    first = sampler.sample()
    assert (first.live, first.pooled, dict(first.live_by_client)) == (2.0, 1.0, {"alice": 2, "bob": 1})
    assert sampler.sample().live is None  # the failed read is a gap, not a crash
    sampler.sample()
    kept = sampler.samples()
    assert [s.live for s in kept] == [None, 3.0]  # the oldest dropped
