"""The host's record of which driver (Ray job) created each sandbox of its node."""

from __future__ import annotations

from pathlib import Path

from harness.engine.ray.drivers import DriverLedger, ended_jobs


def test_records_survive_a_new_ledger_on_the_same_directory(tmp_path: Path) -> None:
    ledger = DriverLedger(tmp_path / "drivers")
    ledger.record("sb-1", "01000000")
    ledger.record("sb-2", "02000000")
    assert DriverLedger(tmp_path / "drivers").entries() == {"sb-1": "01000000", "sb-2": "02000000"}
    ledger.forget("sb-1")
    ledger.forget("sb-1")  # twice is fine
    assert ledger.entries() == {"sb-2": "02000000"}
    assert (tmp_path / "drivers").stat().st_mode & 0o777 == 0o700


def test_nothing_is_recorded_without_a_driver_or_with_a_bad_id(tmp_path: Path) -> None:
    ledger = DriverLedger(tmp_path)
    ledger.record("sb-1", None)  # the warm pool's, or a caller that is no driver: never judged an orphan
    ledger.record("sb-2", "not hex")
    ledger.record("../escape", "01000000")
    assert ledger.entries() == {}
    assert not (tmp_path.parent / "escape").exists()


def test_without_a_cluster_the_job_table_is_unknown_and_nothing_is_judged() -> None:
    assert ended_jobs() is None
