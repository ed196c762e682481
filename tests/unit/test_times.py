"""Moments as callbox shows them: always with their zone, in one format per reader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from harness.cli import main as cli
from harness.cli.sandbox_common import until
from harness.core.times import clock, iso, stamp
from harness.doors.http.pages import when
from harness.engine.docker.kept import when as engine_when

MOMENT = 1_000_000_000.25  # 2001-09-09 01:46:40.250 UTC


def test_iso_is_utc_with_z_to_the_millisecond(local_zone: Callable[[str], None]) -> None:
    local_zone("CET-1")  # the local zone never changes the machine form
    assert iso(MOMENT) == "2001-09-09T01:46:40.250Z"


@pytest.mark.parametrize(("zone", "shown"), [
    ("UTC", "2001-09-09 01:46:40 UTC"),
    ("CET-1", "2001-09-09 02:46:40 +01:00"),
    ("EST+5", "2001-09-08 20:46:40 -05:00"),
    ("IST-5:30", "2001-09-09 07:16:40 +05:30"),
])
def test_stamp_is_local_time_with_its_zone(local_zone: Callable[[str], None], zone: str, shown: str) -> None:
    local_zone(zone)
    assert stamp(MOMENT) == shown
    assert when(MOMENT) == engine_when(MOMENT) == shown  # the console and the engine's messages


def test_clock_is_short_today_and_whole_on_another_day(local_zone: Callable[[str], None]) -> None:
    local_zone("CET-1")
    assert clock(MOMENT, now=MOMENT - 3600) == "02:46:40 +01:00"
    assert clock(MOMENT, now=MOMENT - 86400) == "2001-09-09 02:46:40 +01:00"


def test_expiry_labels_name_the_zone(local_zone: Callable[[str], None]) -> None:
    local_zone("UTC")
    assert until(MOMENT, now=MOMENT - 60) == "in 1m 00s at 01:46:40 UTC"
    assert until(MOMENT, now=MOMENT + 5) == "5s ago"


def test_audit_runs_show_when_they_were_created_with_the_zone(
        tmp_path: Path, local_zone: Callable[[str], None], capsys: pytest.CaptureFixture[str]) -> None:
    local_zone("CET-1")
    db = tmp_path / "audit.sqlite3"
    with AuditStore(db) as audit:
        audit.start_run("run-1")
    assert cli.main(["audit", "--audit-db", str(db)]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split() == ["RUN", "CREATED", "CALLS", "END"]
    created = row.split(maxsplit=1)[1].rsplit(maxsplit=1)[0]
    assert created.endswith(" +01:00") and len(created) == len("2001-09-09 02:46:40 +01:00")
