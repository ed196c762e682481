"""Wall-clock times as callbox shows them: always with their zone.

Every time callbox prints or returns as text goes through here, so one moment reads the
same way everywhere:

* :func:`iso` for machines (JSON text, logs read by programs): ISO 8601 in UTC with ``Z``,
  to the millisecond, ``2026-12-06T14:03:10.250Z``;
* :func:`stamp` for people (tables, messages, the console pages): the local time to the
  second and its zone, ``2026-12-06 14:03:10 UTC`` where the local zone is UTC, else its
  offset, ``2026-12-06 15:03:10 +01:00`` (an offset, not a name: ``CST`` means several);
* :func:`clock`, the short form of a moment close to now (``expires in 5m at ...``):
  ``14:03:10 UTC`` on the same local day, else the whole :func:`stamp`.

Times are Unix epoch seconds (what ``time.time()`` returns and the audit store keeps).
JSON outputs that carry a moment as a number keep it so: a Unix time names one instant
whatever the reader's zone.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

__all__ = ["clock", "iso", "stamp", "zone_label"]


def iso(ts: float) -> str:
    """``ts`` as ISO 8601 in UTC with ``Z``, milliseconds: ``2026-12-06T14:03:10.250Z``."""
    moment = datetime.fromtimestamp(ts, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def zone_label(offset: timedelta | None) -> str:
    """``UTC`` for a zero offset, else ``+01:00`` / ``-05:30``."""
    if not offset:
        return "UTC"
    minutes = int(offset.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    hours, rest = divmod(abs(minutes), 60)
    return f"{sign}{hours:02d}:{rest:02d}"


def _local(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC).astimezone()


def stamp(ts: float) -> str:
    """``ts`` in local time with its zone: ``2026-12-06 14:03:10 UTC``, ``2026-12-06 15:03:10 +01:00``."""
    moment = _local(ts)
    return f"{moment:%Y-%m-%d %H:%M:%S} {zone_label(moment.utcoffset())}"


def clock(ts: float, *, now: float | None = None) -> str:
    """``ts`` as ``14:03:10 UTC`` when it falls on the local day of ``now`` (default: now),
    else as the whole :func:`stamp`."""
    moment = _local(ts)
    today = _local(time.time() if now is None else now)
    if moment.date() != today.date():
        return stamp(ts)
    return f"{moment:%H:%M:%S} {zone_label(moment.utcoffset())}"
