"""``[log]``: JSON lines with the record's extra fields, text lines, a rotated file, levels."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.cli.serve_logging import configure_logging
from harness.cli.server_config import Log


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    callbox_level = logging.getLogger("callbox").level
    serve = logging.getLogger("callbox.serve")
    serve_level = serve.level  # `callbox serve` without a file sets it (in-process CLI tests ran before)
    serve.setLevel(logging.NOTSET)
    try:
        yield
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
        logging.getLogger("callbox").setLevel(callbox_level)
        serve.setLevel(serve_level)


def test_json_lines_carry_level_logger_message_extras_and_exceptions(tmp_path: Path, restore_logging: None) -> None:
    path = tmp_path / "callbox.log"
    configure_logging(Log(format="json", file=path))
    log = logging.getLogger("callbox.test")
    log.info("sandbox %s created", "abc", extra={"client": "alice"})
    log.debug("not written at info")
    logging.getLogger("urllib3").info("other libraries: warnings only")
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["message"] for line in lines] == ["sandbox abc created", "failed"]
    first = lines[0]
    assert (first["level"], first["logger"], first["client"]) == ("info", "callbox.test", "alice")
    assert first["time"].endswith("Z") and "T" in first["time"]  # ISO 8601, UTC
    assert "ValueError: boom" in lines[1]["exception"]


def test_a_file_is_rotated_at_its_size_keeping_the_backups(tmp_path: Path, restore_logging: None) -> None:
    path = tmp_path / "callbox.log"
    configure_logging(Log(format="text", file=path, max_bytes=4096, backups=2))
    log = logging.getLogger("callbox.test")
    for n in range(400):
        log.warning("line %04d %s", n, "x" * 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["callbox.log", "callbox.log.1", "callbox.log.2"]
    assert all(p.stat().st_size <= 4096 for p in tmp_path.iterdir())
    assert "line 0399" in path.read_text()  # the newest lines are in the live file
    assert " WARNING callbox.test: line" in path.read_text()


def test_standard_error_by_default_in_the_plain_format(capsys: pytest.CaptureFixture[str],
                                                       restore_logging: None) -> None:
    configure_logging(Log(level="warning"))
    logging.getLogger("callbox.serve").info("hidden below warning")
    logging.getLogger("callbox.serve").warning("shown")
    assert capsys.readouterr().err == "callbox: shown\n"


def test_a_text_log_line_starts_with_the_time_and_its_zone() -> None:
    import re

    from harness.cli.serve_logging import FILE_TEXT_FORMAT, ZonedTextFormatter

    record = logging.LogRecord("callbox.serve", logging.INFO, __file__, 1, "listening", None, None)
    record.created = 1_765_000_000.0
    line = ZonedTextFormatter(FILE_TEXT_FORMAT).format(record)
    assert re.fullmatch(r"2025-12-\d\d \d\d:\d\d:\d\d (UTC|[+-]\d\d:\d\d) INFO callbox\.serve: listening", line), line
