"""`callbox doctor`'s text report fits a terminal: wrapped to its width (80 when not a terminal,
never wider than 100), continuation lines under the check's text, the status and id columns kept
clear; `--json` is not wrapped."""

from __future__ import annotations

import json
import os
import re

import pytest

from harness.cli.main import main
from harness.doctor.report import MAX_WIDTH, CheckResult, render_text, report_width, summary, wrap_result

LONG = CheckResult("daemon.runc", "runc has the container-escape fixes", "WARN",
                   "runc 1.1.5+ds1 (1.1.5+ds1-1+deb12u1): CVE-2024-21626 fixed by the distribution (its package "
                   "changelog), but it lacks the fixes for CVE-2025-31133, CVE-2025-52565, CVE-2025-52881 (fixed in "
                   "1.2.8, 1.3.3, 1.4.0-rc.3): escapes through runc's mounts over /dev/null and /dev/console and its "
                   "writes to /proc while it sets a container up. Upgrade runc", "daemon")
SHORT = CheckResult("5.4", "privileged containers not used", "PASS", "not privileged", "container")
PATHY = CheckResult("config.tls-cert", "the TLS certificate is valid", "FAIL",
                    "[tls] cert = '/etc/callbox/tls/a-very-long-directory-name-that-no-terminal-line-can-hold/"
                    "server.crt' expired 3 days ago", "config")
HEAD = re.compile(r"^(PASS|WARN|FAIL|SKIP)  (\S+) +")


@pytest.mark.parametrize("width", [70, 80, 100])
def test_lines_fit_the_width_and_continue_under_the_text(width: int) -> None:
    id_width = len("daemon.no-new-privileges")
    lines = wrap_result(LONG, id_width, width)
    assert len(lines) > 1 and all(len(line) <= width for line in lines)
    head = HEAD.match(lines[0])
    assert head and head.end() == 4 + 2 + id_width + 2
    assert all(line.startswith(" " * head.end()) and line[head.end()] != " " for line in lines[1:])
    assert " ".join(line[head.end():] for line in lines) == LONG.text


def test_a_word_longer_than_the_text_column_is_kept_whole() -> None:
    lines = wrap_result(PATHY, 15, 80)
    path = "'/etc/callbox/tls/a-very-long-directory-name-that-no-terminal-line-can-hold/server.crt'"
    assert any(line.strip() == path for line in lines)
    assert all(len(line) <= 80 for line in lines if path not in line)


def test_a_narrow_terminal_keeps_a_readable_text_column() -> None:
    lines = wrap_result(LONG, 24, 40)
    assert all(len(line) <= 32 + 30 for line in lines)  # the text column keeps 30 characters


def test_the_report_aligns_the_ids_and_ends_with_the_summary() -> None:
    results = [SHORT, LONG, PATHY]
    lines = render_text(results, width=80).splitlines()
    firsts = [line for line in lines if HEAD.match(line)]
    assert [HEAD.match(line).end() for line in firsts] == [len("PASS  config.tls-cert  ")] * 3  # type: ignore[union-attr]
    assert firsts[0] == "PASS  5.4              privileged containers not used: not privileged"
    assert lines[-2:] == ["callbox doctor: 3 checks, 1 pass, 1 warn, 1 fail (container items: CIS Docker",
                          "  Benchmark v1.2.0 section 5 numbering)"]


def test_the_summary_counts_skipped_checks() -> None:
    skipped = CheckResult("5.1", "AppArmor profile enabled", "SKIP", "not applicable under gVisor: ...", "container")
    assert summary([SHORT, skipped, LONG]) == ("callbox doctor: 3 checks, 1 pass, 1 warn, 0 fail, 1 skipped "
                                               "(container items: CIS Docker Benchmark v1.2.0 section 5 numbering)")


def test_the_width_is_the_terminals_capped_at_100_and_80_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    assert report_width(300) == MAX_WIDTH == 100
    assert report_width(72) == 72
    monkeypatch.setenv("COLUMNS", "90")
    assert report_width() == 90
    monkeypatch.setenv("COLUMNS", "250")
    assert report_width() == 100
    monkeypatch.delenv("COLUMNS")

    def not_a_terminal(fd: int = 1) -> os.terminal_size:
        raise OSError("not a terminal")

    monkeypatch.setattr(os, "get_terminal_size", not_a_terminal)
    assert report_width() == 80


def test_json_is_not_wrapped(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/none.sock")  # a full report, without an engine
    monkeypatch.setenv("COLUMNS", "40")
    assert main(["doctor", "--json"]) == 1
    results = json.loads(capsys.readouterr().out)
    reachable = next(r for r in results if r["id"] == "engine.reachable")
    assert len(reachable["reason"]) > 100 and "\n" not in reachable["reason"] and "  " not in reachable["reason"]
    assert reachable["reason"].startswith(f"there is no socket at {tmp_path}/none.sock")
