"""The console's sandboxes page (the live sandboxes, the warm pool, each client's quota use)
the confirmation a kill asks for first, and a desktop sandbox's live view.

A kill is two steps with no script: the sandboxes page links to ``/sandboxes/ID/kill``, a page
saying what a kill does to that sandbox, whose form posts ``confirm=ID``; a ``POST`` without
it is refused (a script or ``curl`` sends the field itself).
"""

from __future__ import annotations

import time
from string import Template
from urllib.parse import quote

from harness.doors.http.console import ClientQuota, LiveSandbox, PoolStatus
from harness.doors.http.pages import Html, csrf_field, fill, join, size, span, text, when

__all__ = ["kill_confirm_page", "live_view_page", "sandboxes_page"]

_ROW = Template("""<tr id="sandbox-$id">
<td><a href="/runs/$href"><code>$id</code></a><br><span class="muted">$container</span></td><td>$client</td>
<td>$state</td><td>$age</td><td>$expires</td><td>$cpu</td><td>$memory</td><td>$pids</td>
<td>$kill</td>
</tr>
""")
_KILL_LINK = Template('<a class="button danger" href="/sandboxes/$href/kill" aria-label="Kill $id">Kill…</a>')
_VIEW_LINK = Template('<a class="button" href="/sandboxes/$href/view" aria-label="Live view of $id">View</a> ')


def _cpu(box: LiveSandbox) -> str:
    if box.cpu_seconds is None:
        return ""
    percent = f"{box.cpu_percent:.1f}% of {box.cpus:g}, " if box.cpu_percent is not None else ""
    return f"{percent}{box.cpu_seconds:.2f} s in all"


def _state(box: LiveSandbox, now: float) -> str:
    if box.state == "paused" and box.paused_at is not None:
        return f"paused for {span(now - box.paused_at)}"
    return box.state


def _pool(pool: PoolStatus | None) -> Html:
    if pool is None:
        return Html('<p class="muted">Warm pool: none (<code>[pool] size = 0</code>): every sandbox starts cold.</p>\n')
    grows = f", growing to {pool.ceiling} when creates find it empty" if pool.ceiling > pool.size else ""
    return fill(Template('<p>Warm pool: <b>$ready of $size</b> ready$grows. A create claims a warm sandbox '
                         "instead of starting one.</p>\n"), ready=pool.ready, size=pool.size, grows=grows)


def _limit(used: str, limit: object) -> str:
    return f"{used} of {limit}" if limit is not None else f"{used} (no limit)"


def _quotas(quotas: list[ClientQuota]) -> Html:
    if not quotas:
        return Html("")
    rows = join(
        fill(Template("<tr><td>$client</td><td>$live</td><td>$cpus</td><td>$memory</td><td>$hour</td><td>$minute</td>"
                      "</tr>\n"),
             client=q.client, live=_limit(str(q.usage.live_sandboxes), q.limits.live_sandboxes),
             cpus=_limit(f"{q.usage.cpus:g}", q.limits.cpus),
             memory=_limit(size(q.usage.memory), size(int(q.limits.memory)) if q.limits.memory is not None else None),
             hour=_limit(str(q.usage.sandboxes_last_hour), q.limits.sandboxes_per_hour),
             minute=_limit(str(q.usage.calls_last_minute), q.limits.calls_per_minute))
        for q in quotas
    )
    return fill(Template("""<h2>Quota use per client</h2>
<div class="scroll"><table class="quotas"><thead><tr><th>Client</th><th>Live sandboxes</th><th>CPUs</th>
<th>Memory</th><th>Sandboxes this hour</th><th>Calls this minute</th></tr></thead>
<tbody>
$rows</tbody></table></div>
"""), rows=rows)


def sandboxes_page(boxes: list[LiveSandbox] | None, *, pool: PoolStatus | None, quotas: list[ClientQuota],
                   actions: bool = True) -> Html:
    """The live sandboxes, the warm pool (an operator's page: ``actions``; the pool is the
    server's, not a client's) and the quota use of ``quotas``' clients."""
    if boxes is None:
        return Html('<p class="empty">This server runs no gRPC or E2B door, so it holds no live sandboxes; '
                    "runs, approvals and egress come from the audit store.</p>")
    now = time.time()
    rows = join(
        fill(_ROW, id=b.sandbox_id, href=quote(b.sandbox_id, safe=""), container=b.container or "",
             client=b.client, state=_state(b, now), age=span(now - b.created),
             expires=f"in {span(b.expires - now)}" if b.expires > now else "now",
             cpu=_cpu(b), memory=f"{size(b.memory_bytes)} of {size(b.memory_limit)}" if b.memory_bytes is not None
             else "", pids=f"{b.pids} of {b.pids_limit}" if b.pids is not None else "",
             kill=join([fill(_VIEW_LINK, href=quote(b.sandbox_id, safe=""), id=b.sandbox_id),
                        fill(_KILL_LINK, href=quote(b.sandbox_id, safe=""), id=b.sandbox_id) if actions else Html("")]))
        for b in boxes
    )
    table = fill(Template("""<div class="scroll"><table class="sandboxes"><thead><tr><th>Sandbox (its run)</th>
<th>Owner (client)</th><th>State</th><th>Age</th><th>Expires</th><th>CPU</th><th>Memory</th>
<th title="processes and threads in the sandbox, of its pids limit (which counts both)">Processes</th><th></th>
</tr></thead>
<tbody>
$rows</tbody></table></div>
<p class="muted">Processes: processes and threads in the sandbox, of its <code>pids</code> limit, which counts both.
A paused sandbox's expiry clock stands still.</p>
"""), rows=rows) if boxes else Html('<p class="empty">No live sandbox.</p>\n')
    return join([_pool(pool) if actions else Html(""), table, _quotas(quotas)])


_CONFIRM = Template("""<section class="confirm" aria-label="kill $id">
<p>Killing sandbox <code>$id</code> of client <b>$client</b> ($state, started $created, $pids processes)
cancels its running calls, destroys its container and its files, and ends its run
(<code>killed_by_console</code>). It cannot be undone.</p>
<form method="post" action="/sandboxes/$href/kill">
$csrf<input type="hidden" name="confirm" value="$id">
<button type="submit" class="danger">Kill $id</button> <a href="/sandboxes">Cancel</a>
</form>
</section>
""")


def kill_confirm_page(box: LiveSandbox, *, csrf: str | None) -> Html:
    return fill(_CONFIRM, id=box.sandbox_id, href=quote(box.sandbox_id, safe=""), client=box.client,
                state=box.state, created=when(box.created), pids=text(box.pids) or "?", csrf=csrf_field(csrf))


_LIVE_VIEW = Template("""<p>Sandbox <code>$id</code> of client <b>$client</b> ($state): its desktop, live.
Status: <span id="live-status" role="status">connecting…</span>.</p>
$control
<div id="live-screen" class="live-screen" data-socket="/sandboxes/$href/vnc" data-novnc="/sandboxes/$href/novnc/"
 data-control="$in_control" aria-label="the desktop of sandbox $id"></div>
<script type="module" src="/static/liveview.js"></script>
""")
_TAKE = Template("""<form method="post" action="/sandboxes/$href/control" class="inline">
$csrf<input type="hidden" name="control" value="take">
<button type="submit">Take over mouse and keyboard</button> <span class="muted">$who The take-over is recorded in the
sandbox's run.</span>
</form>
""")
_GIVE = Template("""<form method="post" action="/sandboxes/$href/control" class="inline">
$csrf<input type="hidden" name="control" value="give">
<b>You control the mouse and keyboard.</b> <button type="submit">Give back</button>
</form>
""")


def live_view_page(box: LiveSandbox, *, holder: str | None, in_control: bool, operator: bool,
                   csrf: str | None) -> Html:
    """A desktop sandbox's live view: noVNC drawing it, view-only unless this operator took
    over (``in_control``); ``holder`` names who controls it (None: nobody)."""
    href = quote(box.sandbox_id, safe="")
    if in_control:
        control = fill(_GIVE, href=href, csrf=csrf_field(csrf))
    elif operator:
        who = f"console:{holder} controls it now." if holder is not None else "View-only now."
        control = fill(_TAKE, href=href, csrf=csrf_field(csrf), who=who)
    else:
        control = Html('<p class="muted">View-only: only an operator may take over the mouse and keyboard.</p>\n')
    return fill(_LIVE_VIEW, id=box.sandbox_id, href=href, client=box.client, state=box.state, control=control,
                in_control="1" if in_control else "0")
