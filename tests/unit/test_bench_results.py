"""bench-results.json: the fields of every row, a row with no baseline, and JSON without NaN."""

from __future__ import annotations

import json
import math
from pathlib import Path

from tests.bench.bench_results import MIB, Row, finite, p50, results, row_keys, write_results

FIELDS = {"key", "what", "p50", "p90", "unit", "baseline", "baseline_p50", "ratio", "target", "met"}


def _rows() -> list[Row]:
    return [
        Row("1b. exec round trip of `true`, back to back", "time", [1.0, 2.0, 3.0], "docker-py `exec_run`",
            [10.0, 20.0, 30.0], "p50 ≤ 1.2 ms", lambda r: r.cb(p50) <= 1.2),
        Row("17. destroy latency to the caller", "time", [4.0, 6.0], "—", None, "p50 ≤ 5 ms",
            lambda r: r.cb(p50) <= 5.0),
        Row("4b. memory per idle sandbox", "mem", [30.0 * MIB, 32.0 * MIB], "bare container", [1.0 * MIB],
            "≤ 25 MiB", lambda r: r.cb(p50) <= 25 * MIB),
        Row("18d. gRPC door: calls per second", "ops", [100.0, 200.0, 300.0], "bare exec", [400.0], "— (info)",
            unit="calls/s", extra={"p99": math.nan}),
        Row("3. stream", "rate", [1000.0], "docker", [2000.0], "— (info)", rate_bytes=64 * 1_000_000),
    ]


def test_every_row_has_the_fields() -> None:
    out = results(_rows())
    assert [r["key"] for r in out] == ["1b", "17", "4b", "18d", "3"]
    for record in out:
        assert set(record) >= FIELDS
    first = out[0]
    assert (first["p50"], first["unit"], first["baseline"], first["baseline_p50"]) == (2.0, "ms",
                                                                                       "docker-py `exec_run`", 20.0)
    assert first["ratio"] == 10.0 and first["met"] is False and first["target"] == "p50 ≤ 1.2 ms"


def test_units_and_values() -> None:
    by_key = {r["key"]: r for r in results(_rows())}
    assert by_key["4b"]["unit"] == "MiB" and by_key["4b"]["p50"] == 31.0 and by_key["4b"]["baseline_p50"] == 1.0
    assert by_key["18d"]["unit"] == "calls/s" and by_key["18d"]["p50"] == 200.0
    assert by_key["18d"]["p90"] < by_key["18d"]["p50"]  # a throughput's p90 is its slow tail
    assert by_key["18d"]["met"] is None  # an information row
    assert by_key["3"]["unit"] == "MB/s" and by_key["3"]["p50"] == 64.0


def test_a_row_with_no_baseline() -> None:
    record = results(_rows())[1]
    assert record["baseline"] is None and record["baseline_p50"] is None and record["ratio"] is None
    assert record["p50"] == 5.0 and record["met"] is True and record["baseline_samples"] == 0


def test_keys_are_unique() -> None:
    assert row_keys(["1. a", "1. b", "no number here", "14c. x"]) == ["1", "1-2", "no-number-here", "14c"]


def test_the_file_is_json_without_nan(tmp_path: Path) -> None:
    samples = {"x": [1.0, math.nan, math.inf]}
    path = write_results(tmp_path / "bench-results.json", _rows(), machine={"loadavg": (0.5, math.nan, 1.0)},
                         args={"json": tmp_path}, samples=samples, markdown="| table |")
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    payload = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert len(payload["rows"]) == 5 and payload["rows"][3]["extra"] == {"p99": None}
    assert payload["samples"]["x"] == [1.0, None, None] and payload["machine"]["loadavg"] == [0.5, None, 1.0]
    assert payload["markdown"] == "| table |" and path.is_absolute()


def test_finite_leaves_other_values_alone() -> None:
    assert finite({"a": [1, "s", None, True, 2.5], "b": -math.inf}) == {"a": [1, "s", None, True, 2.5], "b": None}
