"""Charts as inline SVG, drawn on the server: the console's pages carry no script and its CSP
allows no inline style, so a chart is plain SVG elements whose colours come from classes of
the console's stylesheet (``.series-N``). Two kinds: stacked bars per time bucket, and lines
through timed points. Every label goes through :func:`~harness.doors.http.pages.fill`, so
text from the audit store cannot become markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from string import Template

from harness.doors.http.pages import Html, fill, join

__all__ = ["HEIGHT", "WIDTH", "Series", "bar_chart", "line_chart"]

WIDTH = 480
HEIGHT = 160
_LEFT, _RIGHT, _TOP, _BOTTOM = 40, 10, 8, 20
_PLOT_W = WIDTH - _LEFT - _RIGHT
_PLOT_H = HEIGHT - _TOP - _BOTTOM


@dataclass(frozen=True)
class Series:
    """One series: its name (the legend), the class that colours it, and its values: per
    bucket for bars, ``(t, value)`` points for lines."""

    name: str
    css: str
    values: Sequence[float] = ()
    points: Sequence[tuple[float, float]] = ()


def _nice_top(value: float) -> float:
    """The axis top: ``value`` rounded up to 1, 2 or 5 times a power of ten (at least 1)."""
    if value <= 1:
        return 1.0
    step = 1.0
    while True:
        for factor in (1, 2, 5):
            if value <= factor * step:
                return factor * step
        step *= 10


def _number(value: float) -> str:
    return f"{value:g}" if value < 1000 else f"{value / 1000:g}k"


_FRAME = Template("""<figure class="chart" id="$id">
<h2>$title</h2>
<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 $width $height" role="img" aria-label="$title">
$axes$body</svg>
<figcaption><div class="legend">$legend</div><span class="muted">$caption</span></figcaption>
</figure>
""")


def _axes(top: float, x_labels: Sequence[str]) -> Html:
    parts = []
    for fraction in (0.0, 0.5, 1.0):
        y = _TOP + _PLOT_H * (1 - fraction)
        parts.append(fill(Template('<line class="grid" x1="$x1" y1="$y" x2="$x2" y2="$y"/>\n'
                                   '<text class="axis" x="$tx" y="$ty" text-anchor="end">$label</text>\n'),
                          x1=_LEFT, x2=WIDTH - _RIGHT, y=f"{y:.1f}", tx=_LEFT - 4, ty=f"{y + 4:.1f}",
                          label=_number(top * fraction)))
    for i, label in enumerate(x_labels):
        x = _LEFT + _PLOT_W * i / max(len(x_labels) - 1, 1)
        anchor = "start" if i == 0 else "end" if i == len(x_labels) - 1 else "middle"
        parts.append(fill(Template('<text class="axis" x="$x" y="$y" text-anchor="$anchor">$label</text>\n'),
                          x=f"{x:.1f}", y=HEIGHT - 6, anchor=anchor, label=label))
    return join(parts)


def _legend(series: Sequence[Series]) -> Html:
    return join(fill(Template('<span class="key"><svg viewBox="0 0 10 10" aria-hidden="true"><rect class="$css" '
                              'width="10" height="10"/></svg>$name</span> '), css=s.css, name=s.name)
                for s in series)


def bar_chart(chart_id: str, title: str, series: Sequence[Series], *, x_labels: Sequence[str],
              caption: str = "") -> Html:
    """Bars stacked per bucket (every series has one value per bucket, in the same order)."""
    buckets = max((len(s.values) for s in series), default=0)
    totals = [sum(s.values[i] for s in series if i < len(s.values)) for i in range(buckets)]
    top = _nice_top(max(totals, default=0.0))
    slot = _PLOT_W / max(buckets, 1)
    width = max(slot * 0.8, 1.0)
    bars = []
    for i in range(buckets):
        base = 0.0
        for s in series:
            value = s.values[i] if i < len(s.values) else 0.0
            if value <= 0:
                continue
            height = _PLOT_H * value / top
            y = _TOP + _PLOT_H * (1 - (base + value) / top)
            bars.append(fill(Template('<rect class="$css" x="$x" y="$y" width="$w" height="$h">'
                                      '<title>$name: $value</title></rect>\n'),
                             css=s.css, x=f"{_LEFT + slot * i + (slot - width) / 2:.1f}", y=f"{y:.1f}",
                             w=f"{width:.1f}", h=f"{height:.1f}", name=s.name, value=_number(value)))
            base += value
    return fill(_FRAME, width=WIDTH, height=HEIGHT, id=chart_id, title=title, axes=_axes(top, x_labels),
                body=join(bars), legend=_legend(series), caption=caption)


def line_chart(chart_id: str, title: str, series: Sequence[Series], *, start: float, end: float,
               x_labels: Sequence[str], caption: str = "") -> Html:
    """Lines through each series' ``(t, value)`` points, ``t`` from ``start`` to ``end``,
    with a dot on the latest point."""
    top = _nice_top(max((v for s in series for _, v in s.points), default=0.0))
    span = max(end - start, 1e-9)
    lines = []
    for s in series:
        coords = [(_LEFT + _PLOT_W * min(max((t - start) / span, 0.0), 1.0), _TOP + _PLOT_H * (1 - v / top))
                  for t, v in s.points]
        if len(coords) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in coords)
            lines.append(fill(Template('<polyline class="line $css" points="$points"><title>$name</title>'
                                       '</polyline>\n'), css=s.css, points=path, name=s.name))
        if coords:  # the latest value, also when the points are too close together to make a line
            lines.append(fill(Template('<circle class="$css" cx="$x" cy="$y" r="3"><title>$name: $value'
                                       '</title></circle>\n'), css=s.css, x=f"{coords[-1][0]:.1f}",
                              y=f"{coords[-1][1]:.1f}", name=s.name, value=_number(s.points[-1][1])))
    return fill(_FRAME, width=WIDTH, height=HEIGHT, id=chart_id, title=title, axes=_axes(top, x_labels),
                body=join(lines), legend=_legend(series), caption=caption)
