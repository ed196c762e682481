"""The run page's changes part: a long diff is cut with a line saying what was left out, every
line is text (never markup), a client gets no revert form, and only the latest calls' diffs are
worked out."""

from __future__ import annotations

from pathlib import Path

from harness.audit.change_store import ChangeRecord, Entry, RunChanges
from harness.core.undo import CallChanges, call_changes
from harness.doors.http.console_undo import CALLS_DIFFED, RunChangesView
from harness.doors.http.undo_pages import DIFF_SHOWN, changes_part


def _view(lines: tuple[str, ...], *, live: bool = False) -> RunChangesView:
    return RunChangesView(recorded=True, calls=[CallChanges("c1", "shell", "0 created, 1 changed, 0 removed", 1,
                                                            lines)], reverts=[], live=live)


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


def test_only_the_latest_calls_diffs_are_worked_out_and_the_older_ones_say_how_to_see_theirs(tmp_path: Path) -> None:
    store = RunChanges(tmp_path, "run-1")
    store.append(ChangeRecord(seq=1, kind="baseline", at=0.0))
    text = store.put_blob([b"new\n"])[0]
    for n in range(CALLS_DIFFED + 2):
        entry = Entry(path=f"/workspace/f{n}.txt", type="file", mode=0o644, sha256=text, size=4)
        store.append(ChangeRecord(seq=n + 2, kind="call", at=0.0, call_id=f"c{n}", tool="shell", entries=(entry,),
                                  before={entry.path: None}))
    calls = call_changes(store, diffs=CALLS_DIFFED)
    assert [c.lines is None for c in calls] == [True, True] + [False] * CALLS_DIFFED
    assert all(c.entries == 1 for c in calls) and "+new" in (calls[-1].lines or ())
    html = changes_part("run-1", RunChangesView(recorded=True, calls=calls, reverts=[], live=False),
                        operator=True, csrf="tok")
    assert "<code>callbox diff run-1 --call c0</code> prints it" in html
    assert "Revert to before c0" in html  # the revert does not need the diff drawn
    assert html.count('<pre class="diff">') == CALLS_DIFFED
