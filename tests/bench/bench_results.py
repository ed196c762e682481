"""The report's rows, its Markdown table and ``bench-results.json``: shared by every bench section.

``bench-results.json`` holds one object per row of the table::

    {"key": "1b", "what": "...", "p50": 3.94, "p90": 4.46, "unit": "ms",
     "baseline": "docker-py `exec_run`, back to back", "baseline_p50": 53.0,
     "ratio": 13.45, "target": "p50 ≤ 1.2 ms", "met": false, ...}

``key`` is the row's number (the label up to its first dot: ``"1b"``, ``"16e"``); ``baseline``
and ``baseline_p50`` are null for a row with no baseline, and so is ``ratio``; ``met`` is
true, false, or null for an information row. A few rows add figures the table shows in its
target column (``p95``, ``p99``, ``per_s``, ...) under ``extra``. The JSON never holds NaN
or infinity: a value that is not a finite number is written as null.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MIB = 1 << 20
MB = 1_000_000
TIMES = "\N{MULTIPLICATION SIGN}"
DEFAULT_RESULTS = "bench-results.json"


# ---- statistics ---------------------------------------------------------------------------


def p50(values: list[float]) -> float:
    return statistics.median(values)


def _quantile(values: list[float], n: int, i: int) -> float:
    if len(values) < 2:
        return values[0]
    return statistics.quantiles(values, n=n, method="inclusive")[i]


def p90(values: list[float]) -> float:
    return _quantile(values, 10, 8)


def p10(values: list[float]) -> float:
    return _quantile(values, 10, 0)


def p95(values: list[float]) -> float:
    return _quantile(values, 20, 18)


def p99(values: list[float]) -> float:
    return _quantile(values, 100, 98)


# ---- rows ---------------------------------------------------------------------------------

UNITS = {"time": "ms", "rate": "MB/s", "mem": "MiB"}


@dataclass
class Row:
    """One line of the report.

    ``kind`` is ``time`` (ms), ``rate`` (``rate_bytes`` per sample time, MB/s), ``mem``
    (bytes, shown and written in MiB) or ``ops`` (samples already per second, in ``unit``:
    calls/s, sandboxes/s). For the two throughputs the "p90" is the slow tail, as for
    every other row: the size over the p90 time for ``rate``, the 10th percentile for ``ops``.
    ``extra`` holds further figures of the row for the JSON (p95, p99, counts).
    """

    what: str
    kind: str
    callbox: list[float]
    baseline_name: str
    baseline: list[float] | None
    target: str
    check: Callable[[Row], bool] | None = None
    rate_bytes: int = 0
    note: str = ""
    unit: str = ""
    extra: dict[str, float | int | str | None] = field(default_factory=dict)

    def cb(self, stat: Callable[[list[float]], float]) -> float:
        return self._value(self.callbox, stat)

    def base(self, stat: Callable[[list[float]], float]) -> float | None:
        return None if self.baseline is None else self._value(self.baseline, stat)

    def _value(self, values: list[float], stat: Callable[[list[float]], float]) -> float:
        if self.kind == "rate":
            return self.rate_bytes / MB / (stat(values) / 1000)
        if self.kind == "ops" and stat is p90:
            return p10(values)  # the slow tail of a throughput
        return stat(values)

    def ratio(self) -> float | None:
        base = self.base(p50)
        if base is None:
            return None
        cb = self.cb(p50)
        if self.kind == "time":
            return base / cb if cb else None  # how many times faster callbox is
        return cb / base if base else None  # throughput: how many times more; memory: how many times bigger

    def met(self) -> str:
        if self.check is None:
            return "—"
        return "yes" if self.check(self) else "**NO**"

    def unit_name(self) -> str:
        return self.unit or UNITS.get(self.kind, "")

    def fmt(self, value: float | None) -> str:
        if value is None or not math.isfinite(value):
            return "—"
        if self.kind == "time":
            return f"{value:.2f} ms" if value < 100 else f"{value:.0f} ms"
        if self.kind == "rate":
            return f"{value:.0f} MB/s"
        if self.kind == "ops":
            return f"{value:.1f} {self.unit_name()}" if value < 100 else f"{value:.0f} {self.unit_name()}"
        return f"{value / MIB:.1f} MiB"

    def _json_value(self, value: float | None) -> float | None:
        if value is None:
            return None
        return value / MIB if self.kind == "mem" else value

    def to_result(self, key: str) -> dict[str, Any]:
        """The row's object in ``bench-results.json``."""
        met = None if self.check is None else bool(self.check(self))
        return result_record(
            key=key, what=self.what, p50=self._json_value(self.cb(p50)), p90=self._json_value(self.cb(p90)),
            unit=self.unit_name(), baseline=None if self.baseline is None else self.baseline_name,
            baseline_p50=self._json_value(self.base(p50)), ratio=self.ratio(), target=self.target, met=met,
            samples=len(self.callbox), baseline_samples=len(self.baseline or []), extra=self.extra)


def finite(value: Any) -> Any:
    """``value`` with every float that is NaN or infinite replaced by None (in lists and dicts too)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def result_record(*, key: str, what: str, p50: float | None, p90: float | None, unit: str,
                  baseline: str | None, baseline_p50: float | None, ratio: float | None, target: str,
                  met: bool | None, samples: int = 0, baseline_samples: int = 0,
                  extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One row's object: the ten fields every row has, then its sample counts and extras."""
    record: dict[str, Any] = {
        "key": key, "what": what, "p50": p50, "p90": p90, "unit": unit, "baseline": baseline,
        "baseline_p50": baseline_p50 if baseline is not None else None,
        "ratio": ratio if baseline is not None else None, "target": target, "met": met,
        "samples": samples, "baseline_samples": baseline_samples,
    }
    if extra:
        record["extra"] = dict(extra)
    clean: dict[str, Any] = finite(record)
    return clean


_KEY = re.compile(r"^\s*([0-9]+[a-z]*)\.")


def row_keys(whats: list[str]) -> list[str]:
    """Each row's key: its number (``"14c"`` of ``"14c. E2B SDK: ..."``), else a slug of its label;
    a key seen before gets ``-2``, ``-3``, ..."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for what in whats:
        match = _KEY.match(what)
        key = match[1] if match else (re.sub(r"[^a-z0-9]+", "-", what.lower()).strip("-")[:40] or "row")
        seen[key] = seen.get(key, 0) + 1
        keys.append(key if seen[key] == 1 else f"{key}-{seen[key]}")
    return keys


def results(rows: list[Row]) -> list[dict[str, Any]]:
    return [row.to_result(key) for row, key in zip(rows, row_keys([r.what for r in rows]), strict=True)]


def write_results(path: Path, rows: list[Row], *, machine: Mapping[str, Any] | None = None,
                  args: Mapping[str, Any] | None = None, samples: Mapping[str, list[float]] | None = None,
                  markdown: str = "") -> Path:
    """Write ``{"rows": [...], "machine": ..., "args": ..., "samples": ..., "markdown": ...}``: valid
    JSON (no NaN), ``rows`` one object per row of the table. Returns the absolute path."""
    payload = finite({"rows": results(rows), "machine": dict(machine or {}), "args": dict(args or {}),
                      "samples": dict(samples or {}), "markdown": markdown})
    path = path.expanduser().resolve()
    path.write_text(json.dumps(payload, indent=1, default=str, allow_nan=False, ensure_ascii=False) + "\n")
    return path


def markdown_table(rows: list[Row]) -> str:
    lines = [
        "| what | callbox p50 | callbox p90 | baseline | baseline p50 | baseline p90 | ratio | target | met? |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = row.ratio()
        lines.append(" | ".join([
            f"| {row.what}", row.fmt(row.cb(p50)), row.fmt(row.cb(p90)), row.baseline_name,
            row.fmt(row.base(p50)), row.fmt(row.base(p90)),
            "—" if ratio is None else f"{ratio:.2f}{TIMES}", row.target, f"{row.met()} |",
        ]))
    return "\n".join(lines)
