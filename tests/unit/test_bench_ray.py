"""The Ray rows of ``make bench``: their plan, numbering and rows from measured data (no cluster)."""

from __future__ import annotations

import math

from tests.bench.bench_ray import (
    CLUSTER_ROWS,
    TRANSPORT_ROWS,
    RayPlan,
    add_ray_rows,
    rate_per_s,
    renumber,
    spread_text,
    worst,
)
from tests.bench.bench_results import MB, Row, markdown_table, results


def _rows(data: dict[str, list[float]], skipped: dict[str, str] | None = None) -> list[Row]:
    rows: list[Row] = []
    add_ray_rows(data, lambda *a, **k: rows.append(Row(*a, **k)), skipped or {})
    return rows


def _measured() -> dict[str, list[float]]:
    return {
        "ray_create_remote": [900.0, 1000.0, 1100.0], "ray_create_local": [400.0, 500.0, 600.0],
        "ray_exec_remote": [2.0, 3.0, 4.0], "ray_exec_local": [1.0, 1.5, 2.0],
        "ray_stream_remote": [1000.0, 1000.0], "ray_stream_local": [500.0, 500.0], "ray_stream_bytes": [100e6],
        "ray_burst": [8.0], "ray_rate_2nodes": [4.0, 5.0], "ray_rate_1node": [2.0, 2.5],
        "ray_burst_ms_2nodes": [800.0, 900.0], "ray_burst_ms_1node": [1500.0], "ray_burst_w1_share": [0.5, 0.5],
        "ray_dead_directory": [3500.0, 3600.0, 4000.0], "ray_dead_gcs": [3400.0, 3500.0, 3900.0],
        "ray_dead_call": [1200.0, 3700.0, 12000.0], "ray_node_back_s": [20.0, 25.0, 30.0],
        "ray_image_load": [50_000.0, 55_000.0], "ray_image_bytes": [555e6], "ray_seconds_connect": [60.0],
        "rt_unix": [1.0], "rt_relay": [2.0], "rt_proxy": [3.0], "rt_actor_noop": [0.5], "rt_relay_health": [1.0],
        "stream_unix": [100.0], "stream_relay": [200.0], "stream_proxy": [400.0], "stream_bytes": [100e6],
    }


def test_the_plan_takes_fewer_samples_of_the_slow_figures() -> None:
    full = RayPlan.for_run(30, 5, quick=False)
    assert (full.create_samples, full.exec_samples, full.stream_bytes) == (10, 200, 100 * MB)
    assert full.burst <= 8 and full.kills == 3  # K fits one node's capacity (8)
    assert RayPlan.for_run(90, 5, quick=False).create_samples == 30
    quick = RayPlan.for_run(5, 1, quick=True)
    assert quick.kills == 1 and quick.burst_rounds == 1 and quick.stream_bytes < full.stream_bytes


def test_renumber_replaces_only_the_rows_number() -> None:
    assert renumber("22e. stream 100 MB out through the relay", "23") == "23e. stream 100 MB out through the relay"
    assert renumber("5. floor 22a. mentioned", "9") == "9. floor 22a. mentioned"
    assert renumber("no number here", "23") == "no number here"


def test_spread_and_rate() -> None:
    assert spread_text(["w2", "w1", "w1", "w2", "w1"]) == "w1 3 + w2 2"
    assert rate_per_s(8, 2.0) == 4.0
    assert math.isnan(rate_per_s(8, 0.0))


def test_measured_rows_in_order_with_their_baselines() -> None:
    out = results(_rows(_measured()))
    keys = [r["key"] for r in out]
    assert keys == ["22a", "22b", "22c", "22d", "22e", "22f", "22g", "23a", "23b", "23c", "23d", "23e", "23f"]
    by = {r["key"]: r for r in out}
    assert by["22a"]["ratio"] == 0.5 and by["22a"]["baseline_p50"] == 500.0  # local is twice as fast
    assert by["22b"]["extra"]["p95"] > by["22b"]["p50"]
    assert by["22c"]["p50"] == 100.0 and by["22c"]["baseline_p50"] == 200.0  # MB/s of 100 MB in 1 s / 0.5 s
    assert by["22d"]["unit"] == "sandboxes/s" and by["22d"]["ratio"] == 2.0
    assert by["22e"]["baseline_p50"] == 3500.0
    assert by["22f"]["met"] is False  # one call took 12 s: over the 10 s the issue allows
    assert by["22g"]["baseline"] is None and round(by["22g"]["p50"]) == round(555 / 52.5)
    assert all(r["baseline"] is not None for r in out if r["key"] in {"22a", "22b", "22c", "22d", "22e", "22f"})


def test_a_group_not_measured_is_a_row_that_says_why() -> None:
    rows = _rows({}, {CLUSTER_ROWS: "the Ray test cluster needs root", TRANSPORT_ROWS: "ray is not installed"})
    out = results(rows)
    assert [r["key"] for r in out] == ["22", "23"]
    assert out[0]["extra"]["skipped"] == "the Ray test cluster needs root" and out[0]["p50"] is None
    table = markdown_table(rows)
    assert "skipped: the Ray test cluster needs root" in table and "skipped: ray is not installed" in table


def test_nothing_measured_and_nothing_skipped_adds_no_row() -> None:
    assert _rows({}) == []


def test_a_node_never_seen_dead_is_a_miss_not_a_time() -> None:
    data = _measured()
    data["ray_dead_directory"] = [3500.0, math.inf, 3600.0]
    assert worst(data["ray_dead_directory"]) == "not within 30 s" and worst([1.0, 2.4]) == "2 ms"
    by = {r["key"]: r for r in results(_rows(data))}
    assert by["22e"]["met"] is False and "worst: not within 30 s" in by["22e"]["target"]
    assert by["22e"]["p50"] == 3600.0
    data["ray_dead_directory"] = [math.inf]
    assert {r["key"]: r for r in results(_rows(data))}["22e"]["p50"] is None  # no NaN or infinity in the JSON
