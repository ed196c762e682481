"""What ``callbox doctor`` prints: one result per check, the text report and its summary.

A result's status is PASS, WARN, FAIL or SKIP (the check was not made: the reason says why,
e.g. the engine does not answer, or it does not apply under gVisor). The text report is
wrapped to the terminal's width (``shutil.get_terminal_size``: ``COLUMNS``, else the
terminal, else 80; never wider than :data:`MAX_WIDTH`), each check's continuation lines
indented under its text so the status and id columns stay clear; ``--json`` is not wrapped.
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal

from harness.doctor.catalog import Scope, info

Status = Literal["PASS", "WARN", "FAIL", "SKIP"]
STATUSES: tuple[Status, ...] = ("PASS", "WARN", "FAIL", "SKIP")

CIS_VERSION = "CIS Docker Benchmark v1.2.0"
MAX_WIDTH = 100
"""The widest report, however wide the terminal: long lines are hard to read."""
MIN_TEXT = 30
"""The narrowest text column; a narrower terminal gets lines wider than itself."""


@dataclass(frozen=True)
class CheckResult:
    id: str
    title: str
    status: Status
    reason: str
    scope: Scope

    def to_json(self) -> dict[str, str]:
        return {"id": self.id, "title": self.title, "status": self.status, "reason": self.reason,
                "scope": self.scope}

    def line(self, id_width: int = 0) -> str:
        """The result on one line, unwrapped."""
        return f"{self.status}  {self.id:<{id_width}}  {self.text}"

    @property
    def text(self) -> str:
        return f"{self.title}: {self.reason}"


def result_maker(check_id: str, title: str | None = None) -> Callable[[Status, str], CheckResult]:
    """A constructor of one check's result: only the status and the reason vary. The title
    and scope are the catalog's (``title`` replaces the title where it names a setting)."""
    entry = info(check_id)
    shown = title if title is not None else entry.title

    def make(status: Status, reason: str) -> CheckResult:
        return CheckResult(check_id, shown, status, reason, entry.scope)

    return make


def summary(results: Iterable[CheckResult]) -> str:
    items = list(results)
    counts = {s: sum(r.status == s for r in items) for s in STATUSES}
    skipped = f", {counts['SKIP']} skipped" if counts["SKIP"] else ""
    numbering = f" (container items: {CIS_VERSION} section 5 numbering)" if any(
        r.scope == "container" and r.status != "SKIP" for r in items) else ""
    return (f"callbox doctor: {len(items)} checks, {counts['PASS']} pass, {counts['WARN']} warn, "
            f"{counts['FAIL']} fail{skipped}{numbering}")


def report_width(columns: int | None = None) -> int:
    """The width to wrap to: ``columns``, else the terminal's (80 when not a terminal),
    at most :data:`MAX_WIDTH`."""
    if columns is None:
        columns = shutil.get_terminal_size((80, 24)).columns
    return min(max(columns, 1), MAX_WIDTH)


def wrap_result(result: CheckResult, id_width: int, width: int) -> list[str]:
    """``result`` as lines of at most ``width`` characters (a word longer than the text
    column, a path or a URL, is kept whole), continuations indented under its text."""
    head = f"{result.status}  {result.id:<{id_width}}  "
    wrapper = textwrap.TextWrapper(width=max(width, len(head) + MIN_TEXT), initial_indent=head,
                                   subsequent_indent=" " * len(head), break_long_words=False,
                                   break_on_hyphens=False)
    return wrapper.wrap(result.text) or [head.rstrip()]


def render_text(results: Iterable[CheckResult], width: int | None = None) -> str:
    """The report: each result wrapped to ``width`` (default :func:`report_width`), then the summary."""
    items = list(results)
    width = report_width(width)
    id_width = max((len(r.id) for r in items), default=0)
    lines = [line for r in items for line in wrap_result(r, id_width, width)]
    lines += textwrap.wrap(summary(items), width=max(width, MIN_TEXT), subsequent_indent="  ",
                           break_long_words=False, break_on_hyphens=False)
    return "\n".join(lines)
