"""Output budget and terminal-code stripping (harness/core/shaping.py)."""

from __future__ import annotations

import pytest

from harness.core.shaping import bound_text, dropped_marker, strip_terminal_codes


def test_short_text_is_untouched():
    shaped = bound_text("hello\nworld\n", 100)
    assert (shaped.text, shaped.truncated, shaped.dropped_bytes) == ("hello\nworld\n", False, 0)


def test_long_text_keeps_head_and_tail_within_the_budget():
    text = "".join(f"line {i:05d}\n" for i in range(10_000))
    shaped = bound_text(text, 1000)
    assert shaped.truncated
    assert len(shaped.text.encode()) <= 1000
    assert shaped.text.startswith("line 00000\n")
    assert shaped.text.endswith("line 09999\n")
    head, tail = shaped.text.split(dropped_marker(shaped.dropped_bytes))
    assert text.startswith(head) and text.endswith(tail)
    assert shaped.dropped_bytes == len(text.encode()) - len(head.encode()) - len(tail.encode())


@pytest.mark.parametrize("budget", range(200, 260))
def test_cuts_never_split_a_utf8_character(budget: int):
    text = "é漢🙂" * 400  # 2-, 3- and 4-byte characters
    shaped = bound_text(text, budget)
    assert "\ufffd" not in shaped.text
    assert len(shaped.text.encode()) <= budget
    head, _, _ = shaped.text.partition("\n[...")
    assert text.startswith(head)


def test_terminal_codes_and_controls_are_stripped_by_default():
    raw = "\x1b[31mred\x1b[0m \x1b]0;title\x07ok\r\n\x07bell\ttab\x1b[2K\n"
    assert strip_terminal_codes(raw) == "red ok\nbell\ttab\n"
    assert bound_text(raw, 1000).text == "red ok\nbell\ttab\n"


def test_terminal_codes_kept_when_asked():
    raw = "\x1b[31mred\x1b[0m"
    assert bound_text(raw, 1000, keep_terminal_codes=True).text == raw
