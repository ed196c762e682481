"""The Benchmarks page's table, read from ``docs/bench-results.json``.

``make bench`` writes ``bench-results.json`` (its format: ``tests/bench/README.md``);
``make bench-docs`` runs it and keeps a copy as ``docs/bench-results.json`` without the raw
samples, the file this page is drawn from, and writes the rows that have a target into the
README between its ``bench-summary`` lines (run as ``python -m docs.hooks.bench_reference SRC
DEST README``). A row of the table is a row of that file, in its order.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from docs.hooks.text import cell, table

TIMES = "\N{MULTIPLICATION SIGN}"
RESULTS = "bench-results.json"
"""The results' name, in the docs directory."""

LOWER_IS_BETTER = frozenset({"ms", "MiB"})
"""Units where a smaller figure is the better one (times, memory); throughputs are the rest."""


class BenchResultsError(Exception):
    """``bench-results.json`` is missing or not in the format ``make bench`` writes."""


@dataclass(frozen=True)
class BenchRow:
    """One row of ``bench-results.json``: the fields the page shows."""

    key: str
    what: str
    p50: float | None
    p90: float | None
    unit: str
    baseline: str | None
    baseline_p50: float | None
    ratio: float | None
    target: str
    met: bool | None

    @property
    def label(self) -> str:
        """``what`` without the row's number in front (the table shows it in a column of its own)."""
        return self.what.removeprefix(f"{self.key}. ")

    @property
    def advantage(self) -> float | None:
        """How many times better callbox's p50 is than the baseline's (above 1: better), for
        every unit alike: the baseline over callbox for times and memory, callbox over the
        baseline for throughputs. None without both figures."""
        if self.p50 is None or self.baseline_p50 is None or self.p50 <= 0 or self.baseline_p50 <= 0:
            return None
        if self.unit in LOWER_IS_BETTER:
            return self.baseline_p50 / self.p50
        return self.p50 / self.baseline_p50


@dataclass(frozen=True)
class BenchResults:
    rows: tuple[BenchRow, ...]
    machine: Mapping[str, Any]


def _number(row: Mapping[str, Any], name: str, where: str) -> float | None:
    value = row.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise BenchResultsError(f"{where}: {name} is {value!r}, not a number or null")
    return float(value)


def parse(data: Any, source: str) -> BenchResults:
    """``bench-results.json``'s content, checked: an object whose ``rows`` are row objects."""
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise BenchResultsError(f"{source}: not an object with a list under 'rows' (see tests/bench/README.md)")
    rows = []
    for index, row in enumerate(data["rows"]):
        where = f"{source}: rows[{index}]"
        if not isinstance(row, dict):
            raise BenchResultsError(f"{where} is not an object")
        for name in ("key", "what", "unit", "target"):
            if not isinstance(row.get(name), str):
                raise BenchResultsError(f"{where}: {name} is missing or not a string")
        met = row.get("met")
        if met is not None and not isinstance(met, bool):
            raise BenchResultsError(f"{where}: met is {met!r}, not true, false or null")
        baseline = row.get("baseline")
        if baseline is not None and not isinstance(baseline, str):
            raise BenchResultsError(f"{where}: baseline is {baseline!r}, not a string or null")
        rows.append(BenchRow(
            key=row["key"], what=row["what"], p50=_number(row, "p50", where), p90=_number(row, "p90", where),
            unit=row["unit"], baseline=baseline, baseline_p50=_number(row, "baseline_p50", where),
            ratio=_number(row, "ratio", where), target=row["target"], met=met))
    machine = data.get("machine")
    return BenchResults(tuple(rows), machine if isinstance(machine, dict) else {})


def load(docs_dir: Path) -> BenchResults:
    path = docs_dir / RESULTS
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BenchResultsError(f"{path} is missing: run `make bench-docs` and commit it") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchResultsError(f"{path}: not JSON ({exc})") from None
    return parse(data, str(path))


def figure(value: float | None, unit: str) -> str:
    """A figure with its unit, to about three significant digits."""
    if value is None:
        return "—"
    digits = 2 if abs(value) < 10 else 1 if abs(value) < 100 else 0
    return f"{value:.{digits}f} {unit}".strip()


def _met(row: BenchRow) -> str:
    return "—" if row.met is None else "yes" if row.met else "**no**"


def machine_line(machine: Mapping[str, Any]) -> str:
    """Where and when the figures were measured, in a sentence (what the file says of it)."""
    parts = []
    if machine.get("date"):
        parts.append(f"measured {machine['date']}")
    if machine.get("nproc"):
        memory = machine.get("memory_total_bytes")
        size = f", {memory / (1 << 30):.0f} GiB" if isinstance(memory, int | float) else ""
        parts.append(f"on {machine['nproc']} CPUs{size}")
    if machine.get("docker_server"):
        parts.append(f"Docker {machine['docker_server']}")
    return ("*" + ", ".join(parts) + ".*") if parts else ""


def render_table(results: BenchResults) -> str:
    rows = [(cell(f"{r.key}. {r.label}"), f"{figure(r.p50, r.unit)} / {figure(r.p90, r.unit)}",
             "—" if r.baseline is None else cell(f"{r.baseline}: {figure(r.baseline_p50, r.unit)}"),
             "—" if r.ratio is None else f"{r.ratio:.2f}{TIMES}", cell(r.target), _met(r)) for r in results.rows]
    body = table(("row", "callbox p50 / p90", "baseline: its p50", "ratio", "target", "met"), rows)
    line = machine_line(results.machine)
    return f"{line}\n\n{body}\n" if line else body + "\n"


MISSING = (f'!!! warning "No measurements yet"\n\n    `docs/{RESULTS}` is not in this tree: `make bench-docs` '
           "measures and writes it (then commit it).\n")
"""What the page shows in place of the table and the chart while there are no results to show."""


def generate_table(docs_dir: Path) -> str:
    if not (docs_dir / RESULTS).exists():
        return MISSING
    return render_table(load(docs_dir))


SUMMARY_START, SUMMARY_END = "<!-- bench-summary start -->", "<!-- bench-summary end -->"
"""The README's lines between which ``make bench-docs`` writes the headline rows."""


def render_summary(results: BenchResults) -> str:
    """The README's headline rows: every row with a target (met or not), in a short table."""
    rows = [(cell(f"{r.key}. {r.label}"), figure(r.p50, r.unit),
             "—" if r.baseline is None else figure(r.baseline_p50, r.unit), cell(r.target), _met(r))
            for r in results.rows if r.met is not None]
    if not rows:
        return ""
    return "| row | callbox p50 | baseline p50 | target | met |\n|---|---|---|---|---|\n" + "\n".join(
        "| " + " | ".join(row) + " |" for row in rows) + "\n"


def with_summary(readme: str, summary: str) -> str:
    """``readme`` with ``summary`` between its bench-summary lines (they must be there)."""
    if SUMMARY_START not in readme or SUMMARY_END not in readme.split(SUMMARY_START, 1)[1]:
        raise BenchResultsError(f"README.md has no {SUMMARY_START} ... {SUMMARY_END} lines to write the summary in")
    head, rest = readme.split(SUMMARY_START, 1)
    tail = rest.split(SUMMARY_END, 1)[1]
    return f"{head}{SUMMARY_START}\n{summary}{SUMMARY_END}{tail}"


def for_docs(data: Mapping[str, Any]) -> dict[str, Any]:
    """What the docs keep of ``make bench``'s results: the rows and the machine, not the raw
    samples (a few hundred kilobytes that change every run)."""
    return {"rows": data["rows"], "machine": data.get("machine", {})}


def main(argv: list[str]) -> int:
    """``SRC DEST [README]``: check ``make bench``'s SRC, write what the docs keep of it to
    DEST, and the headline rows into README's bench-summary lines."""
    if len(argv) not in (2, 3):
        print("usage: python -m docs.hooks.bench_reference SRC DEST [README]", file=sys.stderr)
        return 2
    source, dest = Path(argv[0]), Path(argv[1])
    try:
        data = json.loads(source.read_text())
        results = parse(data, str(source))
        readme = Path(argv[2]) if len(argv) == 3 else None
        updated = with_summary(readme.read_text(), render_summary(results)) if readme is not None else None
    except (OSError, json.JSONDecodeError, BenchResultsError) as exc:
        print(f"bench-docs: {exc}", file=sys.stderr)
        return 1
    dest.write_text(json.dumps(for_docs(data), indent=1, ensure_ascii=False) + "\n")
    print(f"bench-docs: wrote {dest} ({len(data['rows'])} rows); commit it")
    if readme is not None and updated is not None:
        readme.write_text(updated)
        print(f"bench-docs: wrote the headline rows into {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
