"""The run page's changes part: a long diff is cut with a line saying what was left out, every
line is text (never markup), and a client gets no revert form."""

from __future__ import annotations

from harness.core.undo import CallChanges
from harness.doors.http.console_undo import RunChangesView
from harness.doors.http.undo_pages import DIFF_SHOWN, changes_part


def _view(lines: tuple[str, ...], *, live: bool = False) -> RunChangesView:
    return RunChangesView(recorded=True, calls=[CallChanges("c1", "shell", "0 created, 1 changed, 0 removed", lines)],
                          reverts=[], live=live)


def test_a_long_diff_is_cut_saying_how_much_and_how_to_see_it_all() -> None:
    lines = ("changed /data/big.txt:", *(f"+line {i} <tag>" for i in range(5000)))
    html = changes_part("run-1", _view(lines), operator=True, csrf="tok")
    shown = html.count('<span class="add">')
    assert 0 < shown < 5000 and sum(len(line) + 1 for line in lines[:shown + 1]) <= DIFF_SHOWN
    assert f"({5001 - shown - 1} more lines," in html and "<code>callbox diff run-1 --call c1</code>" in html
    assert "&lt;tag&gt;" in html and "<tag>" not in html
    assert 'name="csrf" value="tok"' in html and 'name="mounts_only"' in html


def test_a_client_sees_no_revert_form_and_a_live_run_no_mounts_only() -> None:
    lines = ("+one",)
    assert "Revert to before" not in changes_part("run-1", _view(lines), operator=False, csrf=None)
    live = changes_part("run-1", _view(lines, live=True), operator=True, csrf=None)
    assert "Revert to before c1" in live and 'name="mounts_only"' not in live
