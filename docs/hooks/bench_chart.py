"""The Benchmarks page's chart: callbox against its baseline, drawn as inline SVG.

One horizontal bar per row that has a baseline: how many times better callbox's p50 is than
the baseline's (:attr:`BenchRow.advantage`), on a log scale around 1 (the baseline's own
figure), so ten times better and ten times worse are bars of one length on either side. A bar is green
when its row met its target, red when it did not, grey for an information row. When the row's
target is about its p50 and can be read as a ratio (``p50 ≤ 1.2 ms``, ``≥ 1.5x baseline``),
a tick marks it. Text and lines are drawn in ``currentColor``, so the chart follows the page's
light or dark scheme; the bar colours read on both.
"""

from __future__ import annotations

import math
import re
from html import escape
from pathlib import Path

from docs.hooks.bench_reference import LOWER_IS_BETTER, RESULTS, BenchResults, BenchRow, load

WIDTH = 760
LABEL_W = 330
VALUE_W = 64
ROW_H = 24
BAR_H = 14
TOP = 34
BOTTOM = 44
LABEL_CHARS = 48

MET, MISSED, INFO = "#3fa34d", "#e0523f", "#8c939d"

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_TIMES = "\N{MULTIPLICATION SIGN}"


def target_advantage(row: BenchRow) -> float | None:
    """The advantage (see :attr:`BenchRow.advantage`) the row's target asks for, when the
    target is about the p50 and says it as a number; None otherwise."""
    base = row.baseline_p50
    if base is None or base <= 0:
        return None
    lower = row.unit in LOWER_IS_BETTER
    text = row.target.strip()
    match = re.match(rf"p50 ≤ {_NUMBER}{_TIMES} baseline", text)
    if match and lower:
        return 1 / float(match[1])
    match = re.match(rf"≥ {_NUMBER}{_TIMES} baseline", text)
    if match and not lower:
        return float(match[1])
    match = re.match(rf"p50 ≤ baseline p50 \+ {_NUMBER} ms", text)
    if match and row.unit == "ms":
        return base / (base + float(match[1]))
    match = re.match(rf"(?:p50 )?≤ {_NUMBER} ([^\s,;()]+)", text)
    if match and lower and match[2] == row.unit and float(match[1]) > 0:
        return base / float(match[1])
    match = re.match(rf"≥ {_NUMBER} ([^\s,;()]+)", text)
    if match and not lower and match[2] == row.unit:
        return float(match[1]) / base
    return None


def _ticks(low: float, high: float, width: float) -> list[float]:
    """Ticks between ``low`` and ``high`` on a log axis ``width`` pixels wide: 1-2-5 when a
    decade is wide enough for their labels, else the powers of ten alone."""
    decade = width / (math.log10(high) - math.log10(low))
    mantissas = (1, 2, 5) if decade * math.log10(2) >= 34 else (1,)
    ticks = []
    for exponent in range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1):
        for mantissa in mantissas:
            value = mantissa * 10.0**exponent
            if low <= value <= high:
                ticks.append(value)
    return ticks


def _factor(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}{_TIMES}"
    if value >= 10:
        return f"{value:.1f}{_TIMES}"
    return f"{value:.2g}{_TIMES}" if value < 1 else f"{value:.2f}{_TIMES}"


def _plain(text: str) -> str:
    """A label without its Markdown code marks."""
    return text.replace("`", "")


def _short(text: str) -> str:
    return text if len(text) <= LABEL_CHARS else text[: LABEL_CHARS - 1].rstrip() + "…"


def render(results: BenchResults) -> str:
    """The chart as one ``<figure>`` holding an ``<svg>``, for the page's Markdown."""
    rows = [(row, adv) for row in results.rows if (adv := row.advantage) is not None]
    if not rows:
        return "*No row of the results has a baseline to compare with.*\n"
    marks = {row.key: target_advantage(row) for row, _ in rows}
    values = [adv for _, adv in rows] + [m for m in marks.values() if m is not None] + [1.0]
    low, high = min(values) / 1.4, max(values) * 1.4
    plot_x0, plot_x1 = LABEL_W, WIDTH - VALUE_W
    span = math.log10(high) - math.log10(low)

    def x(value: float) -> float:
        return plot_x0 + (math.log10(value) - math.log10(low)) / span * (plot_x1 - plot_x0)

    height = TOP + ROW_H * len(rows) + BOTTOM
    out = [
        f'<svg class="bench-chart" role="img" aria-labelledby="bench-chart-title" viewBox="0 0 {WIDTH} {height}" '
        f'width="100%" xmlns="http://www.w3.org/2000/svg" font-size="12" fill="currentColor">',
        '<title id="bench-chart-title">callbox p50 against its baseline p50, per row: how many times better '
        f"(log scale; right of 1{_TIMES} callbox is better)</title>",
    ]
    bottom = TOP + ROW_H * len(rows)
    for tick in _ticks(low, high, plot_x1 - plot_x0):
        tx = x(tick)
        strong = tick == 1
        out.append(f'<line x1="{tx:.1f}" y1="{TOP - 6}" x2="{tx:.1f}" y2="{bottom}" stroke="currentColor" '
                   f'stroke-opacity="{0.7 if strong else 0.18}" stroke-width="{1.5 if strong else 1}"/>')
        out.append(f'<text x="{tx:.1f}" y="{TOP - 12}" text-anchor="middle" fill-opacity="0.8">'
                   f"{tick:g}{_TIMES}</text>")
    for index, (row, adv) in enumerate(rows):
        top = TOP + ROW_H * index
        mid = top + ROW_H / 2
        colour = INFO if row.met is None else MET if row.met else MISSED
        state = "information" if row.met is None else "target met" if row.met else "target NOT met"
        left, right = sorted((x(1.0), x(adv)))
        tip = (f"{row.key}. {_plain(row.label)}: callbox p50 {row.p50:g} {row.unit}, {_plain(row.baseline or '')} "
               f"p50 {row.baseline_p50:g} {row.unit}; {_factor(adv)} better; target {_plain(row.target)} ({state})")
        out.append(f'<g class="bench-row"><title>{escape(tip)}</title>')
        out.append(f'<text x="{LABEL_W - 8}" y="{mid + 4:.1f}" text-anchor="end">'
                   f"{escape(_short(f'{row.key}. {_plain(row.label)}'))}</text>")
        out.append(f'<rect x="{left:.1f}" y="{mid - BAR_H / 2:.1f}" width="{max(right - left, 1.5):.1f}" '
                   f'height="{BAR_H}" rx="2" fill="{colour}"/>')
        mark = marks[row.key]
        if mark is not None:
            mx = x(mark)
            out.append(f'<line class="bench-target" x1="{mx:.1f}" y1="{mid - BAR_H / 2 - 3:.1f}" x2="{mx:.1f}" '
                       f'y2="{mid + BAR_H / 2 + 3:.1f}" stroke="currentColor" stroke-width="2.5"/>')
        out.append(f'<text x="{plot_x1 + 6}" y="{mid + 4:.1f}">{escape(_factor(adv))}</text></g>')
    legend_y = bottom + 26
    out.append(f'<text x="{x(1.0) - 8:.1f}" y="{bottom + 14}" text-anchor="end" fill-opacity="0.8">'
               "← baseline better</text>")
    out.append(f'<text x="{x(1.0) + 8:.1f}" y="{bottom + 14}" fill-opacity="0.8">callbox better →</text>')
    legend = [(MET, "target met"), (MISSED, "target not met"), (INFO, "information")]
    lx = 8.0
    for colour, label in legend:
        out.append(f'<rect x="{lx:.0f}" y="{legend_y - 10}" width="12" height="12" rx="2" fill="{colour}"/>')
        out.append(f'<text x="{lx + 17:.0f}" y="{legend_y}">{label}</text>')
        lx += 26 + 7 * len(label)
    out.append(f'<line x1="{lx + 6:.0f}" y1="{legend_y - 11}" x2="{lx + 6:.0f}" y2="{legend_y + 3}" '
               'stroke="currentColor" stroke-width="2.5"/>')
    out.append(f'<text x="{lx + 14:.0f}" y="{legend_y}">the target, where it reads as a ratio</text>')
    out.append("</svg>")
    return '<figure class="bench-chart">\n' + "\n".join(out) + "\n</figure>\n"


def generate(docs_dir: Path) -> str:
    if not (docs_dir / RESULTS).exists():
        return ""  # the table's section says that there are no results yet
    return render(load(docs_dir))
