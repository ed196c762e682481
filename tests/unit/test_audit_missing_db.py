"""Commands that read the audit store refuse one that does not exist; those that record create it."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.audit.store import AuditError, AuditStore
from harness.cli import main as cli

DEFAULTS = ("$CALLBOX_AUDIT_DB, else $XDG_STATE_HOME/callbox/audit.sqlite3, else "
            "~/.local/state/callbox/audit.sqlite3")


@pytest.fixture(autouse=True)
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("CALLBOX_AUDIT_DB", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    return tmp_path / "state"


def refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert cli.main(argv) == 4  # not found
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.splitlines()) == 1, captured
    return captured.err.removeprefix("callbox: ").rstrip("\n")


@pytest.mark.parametrize("argv", [
    ["audit", "--audit-db", "{db}"],
    ["audit", "--run", "r1", "--audit-db", "{db}"],
    ["approvals", "--audit-db", "{db}", "list"],
    ["approvals", "list", "--all", "--audit-db", "{db}"],
    ["approvals", "approve", "abc", "--audit-db", "{db}"],
])
@pytest.mark.parametrize("where", ["mistyped/dir/audit.sqlite3", "audit.sqllite3"])
def test_a_mistyped_path_is_refused_naming_it_and_the_default(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, state_home: Path, argv: list[str], where: str) -> None:
    db = tmp_path / where
    line = refused(capsys, [word.format(db=db) for word in argv])
    assert line == (f"the audit database {db} does not exist; check the path, or leave --audit-db out for the "
                    f"default, {DEFAULTS} (here {state_home}/callbox/audit.sqlite3); reading never creates one "
                    "(call, run and serve do)")
    assert not db.exists() and not (tmp_path / "mistyped").exists()  # nothing made on the way


def test_the_default_that_does_not_exist_yet_says_nothing_was_recorded(
        capsys: pytest.CaptureFixture[str], state_home: Path) -> None:
    line = refused(capsys, ["audit"])
    assert line == (f"the audit database {state_home}/callbox/audit.sqlite3 (the default: {DEFAULTS}) does not "
                    "exist: nothing has been recorded there yet; call, run and serve create it as they record; "
                    "pass --audit-db FILE to read another one")
    assert not state_home.exists()


def test_callbox_audit_db_is_named_when_it_points_nowhere(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALLBOX_AUDIT_DB", str(tmp_path / "elsewhere.sqlite3"))
    line = refused(capsys, ["approvals", "list"])
    assert line.startswith(f"the audit database {tmp_path}/elsewhere.sqlite3 ($CALLBOX_AUDIT_DB) does not exist")


def test_recording_creates_it_and_reading_then_works(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = tmp_path / "new" / "audit.sqlite3"
    with pytest.raises(AuditError):
        AuditStore(db, create=False)
    AuditStore(db).close()  # what call, run and serve open
    assert cli.main(["audit", "--audit-db", str(db)]) == 0
    assert cli.main(["approvals", "list", "--audit-db", str(db)]) == 0
    assert capsys.readouterr().err == ""
