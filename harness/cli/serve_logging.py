"""Where ``callbox serve --config FILE`` writes its log, and in which format (``[log]``).

Standard error by default, which journald captures under systemd; ``file`` writes to a file
rotated by size instead (``max_bytes``, ``backups``). ``format = "json"`` writes one JSON
object a line: ``time`` (UTC, ISO 8601 with milliseconds and ``Z``), ``level``, ``logger``,
``message``, ``exception`` when there is one, and every extra field the record carries
(``log.info("...", extra={"client": name})`` adds ``"client"``). ``level`` applies to
callbox's own loggers; other libraries log their warnings and errors only. The text format
of a log file starts each line with the local time and its zone.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import sys
from typing import TYPE_CHECKING

from harness.core.times import iso, stamp

if TYPE_CHECKING:
    from harness.cli.server_schema import Log

__all__ = ["JsonFormatter", "ZonedTextFormatter", "configure_logging"]

TEXT_FORMAT = "callbox: %(message)s"
FILE_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime"}
"""Attributes every record has; the others are the extra fields a caller added."""


class ZonedTextFormatter(logging.Formatter):
    """The text format, its times with their zone (``2026-12-06 14:03:10 UTC``, or the local
    offset), never a bare local time."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return stamp(record.created)


class JsonFormatter(logging.Formatter):
    """One JSON object a line (see the module docstring)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": iso(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


def configure_logging(settings: Log) -> logging.Handler:
    """Send every log record to the place and format ``settings`` name; the handler installed.

    Replaces the root logger's handlers (the command line's plain set-up), so a record is
    written once."""
    handler: logging.Handler
    if settings.file is not None:
        handler = logging.handlers.RotatingFileHandler(
            settings.file, maxBytes=settings.max_bytes, backupCount=settings.backups, encoding="utf-8")
        text = FILE_TEXT_FORMAT
    else:
        handler = logging.StreamHandler(sys.stderr)
        text = TEXT_FORMAT
    handler.setFormatter(JsonFormatter() if settings.format == "json" else ZonedTextFormatter(text))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger("callbox").setLevel(settings.level.upper())
    return handler
