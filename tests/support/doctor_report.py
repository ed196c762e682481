"""Reading ``callbox doctor``'s wrapped text report back, for the tests of its lines."""

from __future__ import annotations


def report_entries(text: str) -> list[str]:
    """The report's results and summary, each continuation line joined to the line it continues."""
    entries: list[str] = []
    for line in text.splitlines():
        if line.startswith(" ") and entries:
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return entries
