"""The run page's part on what its calls changed (:mod:`harness.doors.http.console_undo`):
per call with a change record, its counts and its diff (escaped, cut at :data:`DIFF_SHOWN`
characters, saying how much was left out and how to see it all), an operator's revert form,
and the console's earlier reverts of the run with what they put back."""

from __future__ import annotations

from collections.abc import Mapping
from string import Template
from typing import Any
from urllib.parse import quote

from harness.core.undo import CallChanges
from harness.doors.http.console_undo import CALLS_DIFFED, RunChangesView
from harness.doors.http.pages import Html, csrf_field, fill, join, text, when

__all__ = ["DIFF_SHOWN", "changes_part", "revert_path"]

DIFF_SHOWN = 20_000
"""Characters of one call's diff shown on the page."""

_NOT_RECORDED = Html("""<h2 id="changes">Changes</h2>
<p class="empty">No change records for this run: checkpoints were off for it (or its records were
removed, <code>keep_days</code> after it ended). With <code>[checkpoints] mode = "changes"</code> in the policy,
every call of a tool that may change files records what it changed, shown here with a revert to before it
(see the undo page of the docs).</p>
""")
_HEAD = Template("""<h2 id="changes">Changes</h2>
<p class="muted">$what</p>
""")
_CALL = Template("""<section class="changes" id="changes-$anchor" aria-label="changes of call $call_id">
<h3><code>$call_id</code> $tool: <span class="summary">$summary</span></h3>
$diff$revert</section>
""")
_REVERT = Template("""<form class="revert" method="post" action="$action">
$csrf
<input type="hidden" name="to" value="$call_id">
$mounts_only<button type="submit" class="danger">Revert to before $call_id</button>
</form>
""")
_MOUNTS_ONLY = Template("""<label for="mounts-only-$anchor"><input type="checkbox" id="mounts-only-$anchor"
name="mounts_only" value="yes"> mounts only: leave the scratch places (<code>/workspace</code>, <code>/tmp</code>,
home), which went with the run's sandbox, as they are</label>
""")
_REVERTED = Template("""<li><b>$by</b> reverted to just before call <code>$to_call</code> ($where), $at:
$put_back paths put back$not_restored
<pre class="revert-report">$lines</pre></li>
""")


def revert_path(run_id: str) -> str:
    """Where the revert form of ``run_id``'s page posts."""
    return f"/runs/{quote(run_id, safe='')}/revert"


def changes_part(run_id: str, view: RunChangesView, *, operator: bool, csrf: str | None) -> Html:
    """The run page's "Changes" part."""
    if not view.recorded:
        return _NOT_RECORDED
    if operator and view.live:
        what = ("A revert puts every writable place of the run's live sandbox back as it was just before the "
                "call (refused while a call of the run is running).")
    elif operator:
        what = ("A revert puts the run's read-write mounts back as they were just before the call, as "
                "callbox revert does (refused while a call runs or while the run is open elsewhere).")
    else:
        what = "What each call changed. An operator can revert the run to just before a call."
    calls = join(_call(run_id, c, operator=operator, csrf=csrf, live=view.live) for c in view.calls) \
        if view.calls else Html('<p class="empty">No recorded call changed anything yet.</p>\n')
    return join([fill(_HEAD, what=what), calls, _reverts(view.reverts)])


def _call(run_id: str, changes: CallChanges, *, operator: bool, csrf: str | None, live: bool) -> Html:
    anchor = quote(changes.call_id, safe="")
    if changes.lines is None:
        diff = fill(Template('<p class="muted">Its diff is not drawn here (the page shows the latest $latest '
                             'calls\' diffs): <code>callbox diff $run --call $call</code> prints it.</p>\n'),
                    latest=CALLS_DIFFED, run=run_id, call=changes.call_id)
    elif changes.lines:
        diff = fill(Template('<pre class="diff">$diff</pre>\n'), diff=_diff(changes.lines, run_id, changes.call_id))
    else:
        diff = Html("")
    revert = Html("")
    if operator and changes.entries:
        revert = fill(_REVERT, action=revert_path(run_id), csrf=csrf_field(csrf), call_id=changes.call_id,
                      mounts_only=Html("") if live else fill(_MOUNTS_ONLY, anchor=anchor))
    return fill(_CALL, anchor=anchor, call_id=changes.call_id, tool=changes.tool or "", summary=changes.summary,
                diff=diff, revert=revert)


def _diff(lines: tuple[str, ...], run_id: str, call_id: str) -> Html:
    """The lines, each escaped and marked (added, removed, a hunk's head), cut at
    :data:`DIFF_SHOWN` characters with a line saying how much was left out."""
    shown: list[Html] = []
    used = 0
    for line in lines:
        used += len(line) + 1
        if used > DIFF_SHOWN and shown:
            left = len(lines) - len(shown)
            shown.append(fill(Template('<span class="cut">… ($left more lines, $chars more characters; '
                                       '<code>callbox diff $run --call $call</code> prints them all)</span>'),
                              left=left, chars=sum(len(x) + 1 for x in lines[len(shown):]), run=run_id,
                              call=call_id))
            break
        kind = ("add" if line.startswith("+") and not line.startswith("+++") else
                "del" if line.startswith("-") and not line.startswith("---") else
                "hunk" if line.startswith("@@") else "")
        shown.append(fill(Template('<span class="$kind">$line</span>'), kind=kind, line=line) if kind
                     else fill(Template("$line"), line=line))
    return Html("\n".join(shown))


def _reverts(reverts: list[dict[str, Any]]) -> Html:
    if not reverts:
        return Html("")
    items = join(_reverted(r) for r in reversed(reverts))
    return join([Html('<h3 id="reverts">Reverts from the console (latest first)</h3>\n<ul class="reverts">\n'), items,
                 Html("</ul>\n")])


def _reverted(entry: Mapping[str, Any]) -> Html:
    not_restored = entry.get("not_restored") or []
    lines = [*(text(line) for line in entry.get("lines") or []),
             *(f"not restored: {text(why)}" for why in not_restored)]
    put_back = entry.get("put_back") or 0
    if isinstance(put_back, int) and put_back > len(entry.get("lines") or []):
        lines.append(f"… and {put_back - len(entry.get('lines') or [])} more paths")
    at = entry.get("at")
    return fill(_REVERTED, by=text(entry.get("by")), to_call=text(entry.get("to_call")),
                where="every writable place of its live sandbox" if entry.get("where") == "sandbox"
                else "its read-write mounts", at=when(at if isinstance(at, int | float) else None),
                put_back=put_back, not_restored=f", {len(not_restored)} not restored" if not_restored else "",
                lines="\n".join(lines) or "nothing differed")
