"""The shell tool's result text, as Codex formats it (harness/tools/shell.py; no sandbox needed).

Codex's shape (openai/codex ``format_exec_output_for_model_freeform``): ``Exit code: N``,
``Wall time: S seconds``, ``Total output lines: N`` only when the output was cut, ``Output:``,
then the output with ``…N chars truncated…`` between the kept head and tail.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.tools.shell import (
    agent_output_cap,
    count_lines,
    format_exec_output,
    truncation_marker,
    wall_time,
)

NUMBERS = "".join(f"{i}\n" for i in range(1, 101))  # 292 bytes, 100 lines


def test_short_output_is_returned_whole():
    formatted = format_exec_output(exit_code=0, duration_ms=234.0, output="hello\nworld\n", budget=1000)
    assert formatted.text == "Exit code: 0\nWall time: 0.2 seconds\nOutput:\nhello\nworld\n"
    assert not formatted.truncated
    assert formatted.total_lines == 2


def test_nonzero_exit_and_empty_output():
    formatted = format_exec_output(exit_code=2, duration_ms=1500.0, output="", budget=1000)
    assert formatted.text == "Exit code: 2\nWall time: 1.5 seconds\nOutput:\n"


def test_output_without_final_newline_is_kept_as_is():
    formatted = format_exec_output(exit_code=0, duration_ms=0.0, output="no newline", budget=1000)
    assert formatted.text == "Exit code: 0\nWall time: 0 seconds\nOutput:\nno newline"


@pytest.mark.parametrize(
    ("duration_ms", "expected"),
    [
        (0.0, "0"),
        (49.9, "0"),
        (50.0, "0.1"),
        (234.0, "0.2"),
        (999.0, "1"),
        (1000.0, "1"),
        (1049.0, "1"),
        (1050.0, "1.1"),
        (12_345.0, "12.3"),
        (59_999.0, "60"),
        (600_000.0, "600"),
    ],
)
def test_wall_time_prints_like_rust_f32_rounded_to_tenths(duration_ms: float, expected: str):
    assert wall_time(duration_ms) == expected


def test_timeout_says_so_with_codex_wording_and_exit_code_124():
    formatted = format_exec_output(exit_code=124, duration_ms=1003.7, output="partial\n", budget=1000,
                                   timed_out=True)
    assert formatted.text == (
        "Exit code: 124\n"
        "Wall time: 1 seconds\n"
        "Output:\n"
        "command timed out after 1003 milliseconds\n"
        "partial\n"
    )


def test_oom_kill_says_so():
    formatted = format_exec_output(exit_code=137, duration_ms=300.0, output="", budget=1000, oom_killed=True)
    assert formatted.text == (
        "Exit code: 137\n"
        "Wall time: 0.3 seconds\n"
        "Output:\n"
        "command was killed by the out-of-memory killer (sandbox memory limit)\n"
    )


def test_long_output_keeps_head_and_tail_with_codex_marker_within_the_budget():
    formatted = format_exec_output(exit_code=0, duration_ms=12.0, output=NUMBERS, budget=120)
    assert formatted.text == (
        "Exit code: 0\n"
        "Wall time: 0 seconds\n"
        "Total output lines: 100\n"
        "Output:\n"
        "1\n2\n3\n4\n5\n6\n7\n"
        "…263 chars truncated…"
        "6\n97\n98\n99\n100\n"
    )
    assert len(formatted.text.encode()) == 120
    assert formatted.truncated and formatted.total_lines == 100 and formatted.removed_chars == 263


def test_exactly_fitting_output_is_not_truncated():
    header = "Exit code: 0\nWall time: 0 seconds\nOutput:\n"
    budget = len(header) + len(NUMBERS)
    assert format_exec_output(exit_code=0, duration_ms=0, output=NUMBERS, budget=budget).text == header + NUMBERS
    cut = format_exec_output(exit_code=0, duration_ms=0, output=NUMBERS, budget=budget - 1)
    assert cut.truncated and "Total output lines: 100\n" in cut.text


def test_marker_counts_characters_not_bytes_and_cuts_keep_utf8_whole():
    formatted = format_exec_output(exit_code=0, duration_ms=0, output="é" * 100 + "\n", budget=100)
    assert formatted.text == (
        "Exit code: 0\n"
        "Wall time: 0 seconds\n"
        "Total output lines: 1\n"
        "Output:\n"
        "éé…96 chars truncated…éé\n"
    )


def test_bytes_the_sandbox_dropped_are_counted_in_the_marker():
    formatted = format_exec_output(exit_code=0, duration_ms=0, output=NUMBERS, budget=120, unseen_bytes=5000)
    assert formatted.removed_chars > 5000
    body = formatted.text.split("Output:\n", 1)[1]
    head, tail = body.split(truncation_marker(formatted.removed_chars))
    assert len(head) + len(tail) + formatted.removed_chars - 5000 == len(NUMBERS)
    assert len(formatted.text.encode()) <= 120


def test_terminal_codes_are_stripped_before_measuring():
    formatted = format_exec_output(exit_code=0, duration_ms=0, output="\x1b[31mred\x1b[0m\r\nok\n", budget=1000)
    assert formatted.text == "Exit code: 0\nWall time: 0 seconds\nOutput:\nred\nok\n"


def test_the_timeout_line_counts_as_an_output_line_as_in_codex():
    formatted = format_exec_output(exit_code=124, duration_ms=5000, output=NUMBERS, budget=250, timed_out=True)
    assert "Total output lines: 101\n" in formatted.text
    assert formatted.text.split("Output:\n", 1)[1].startswith("command timed out after 5000 milliseconds\n")


def test_helpers():
    assert count_lines("") == 0
    assert count_lines("a") == 1
    assert count_lines("a\n") == 1
    assert count_lines("a\nb") == 2
    assert count_lines("\n\n") == 2
    assert truncation_marker(7) == "…7 chars truncated…"
    assert agent_output_cap(30_000) == 8 << 20
    assert agent_output_cap(16 << 20) == 16 << 20
    assert agent_output_cap(1 << 30) == 32 << 20


@settings(max_examples=300, deadline=None)
@given(
    output=st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.just("\n"), max_size=600),
    budget=st.integers(min_value=100, max_value=700),
)
def test_any_output_fits_the_budget_and_keeps_a_true_head_and_tail(output: str, budget: int):
    formatted = format_exec_output(exit_code=0, duration_ms=0, output=output, budget=budget)
    assert len(formatted.text.encode()) <= budget
    body = formatted.text.split("Output:\n", 1)[1]
    if not formatted.truncated:
        assert body == output
        return
    marker = truncation_marker(formatted.removed_chars)
    head, tail = body.split(marker)
    assert output.startswith(head) and output.endswith(tail)
    assert len(head) + formatted.removed_chars + len(tail) == len(output)
