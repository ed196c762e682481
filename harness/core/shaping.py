"""Bound and clean tool output before a model reads it.

The output budget (bytes returned to the model per call) keeps a head and a tail and
says how much was dropped between them; cuts never split a UTF-8 character. Terminal
escape sequences (colours, cursor moves, window titles) and other control characters
are removed unless a tool asks for them: they cost tokens and can smuggle text past a
human reading the log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# CSI (ESC [ ... final), OSC (ESC ] ... BEL or ESC \), other two-byte ESC sequences, and
# C0/C1 controls other than tab and newline.
_ANSI = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]"
    r"|[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]"
)


def strip_terminal_codes(text: str) -> str:
    """Remove escape sequences and control characters (tab and newline stay)."""
    return _ANSI.sub("", text.replace("\r\n", "\n"))


def head_cut(data: bytes, size: int) -> int:
    """Largest cut <= size that does not split a UTF-8 sequence at the end of data[:cut]."""
    cut = min(size, len(data))
    while 0 < cut < len(data) and (data[cut] & 0xC0) == 0x80:
        cut -= 1
    return cut


def tail_cut(data: bytes, size: int) -> int:
    """Smallest start >= len(data) - size that begins on a UTF-8 character boundary."""
    start = max(0, len(data) - size)
    while start < len(data) and (data[start] & 0xC0) == 0x80:
        start += 1
    return start


def dropped_marker(dropped: int) -> str:
    return f"\n[... {dropped} bytes of output dropped ...]\n"


@dataclass(frozen=True)
class Shaped:
    text: str
    truncated: bool
    dropped_bytes: int
    """Bytes removed by this budget (not counting what the sandbox dropped before)."""


def bound_text(text: str, budget: int, *, keep_terminal_codes: bool = False) -> Shaped:
    """Clean ``text`` and keep at most ``budget`` bytes of it: head, marker, tail."""
    if not keep_terminal_codes:
        text = strip_terminal_codes(text)
    data = text.encode("utf-8", errors="replace")
    if len(data) <= budget:
        return Shaped(text, False, 0)
    # The marker's own bytes count against the budget too, so the result fits it.
    reserve = len(dropped_marker(len(data)).encode())
    room = max(0, budget - reserve)
    head_end = head_cut(data, room - room // 2)
    tail_start = tail_cut(data, room // 2)
    tail_start = max(tail_start, head_end)
    dropped = tail_start - head_end
    shaped = data[:head_end].decode() + dropped_marker(dropped) + data[tail_start:].decode()
    return Shaped(shaped, True, dropped)
