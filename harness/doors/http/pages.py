"""The console's pages: server-rendered HTML, no script, one local stylesheet.

Every value goes into a page through :func:`fill`, which HTML-escapes anything that is not
already :class:`Html` (markup made here), so text from the audit store (arguments, results,
rules, run ids, a denial's reason) can never become markup. Long text is cut for display
(:func:`clip`), saying how much was left out; the audit store keeps all of it.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import Iterable, Mapping
from string import Template
from typing import Any
from urllib.parse import quote

from harness.audit.records import EGRESS_TOOL, Approval, RunRecord
from harness.core.times import stamp
from harness.doors.http.console import LiveSandbox, PendingApproval

__all__ = [
    "Html",
    "approvals_page",
    "egress_page",
    "esc",
    "fill",
    "join",
    "login_page",
    "not_found_page",
    "page",
    "run_page",
    "runs_page",
    "sandboxes_page",
]

ARGUMENTS_SHOWN = 8000
RESULT_SHOWN = 4000
CELL_SHOWN = 120


class Html(str):
    """Markup that is safe as it is (made by this module, every value in it escaped)."""


def esc(value: object) -> Html:
    """``value`` as HTML text: escaped unless it is already :class:`Html`; None is empty."""
    if isinstance(value, Html):
        return value
    return Html(html.escape("" if value is None else str(value), quote=True))


def fill(template: Template, **values: object) -> Html:
    """``template`` with each value escaped (see :func:`esc`)."""
    return Html(template.substitute({key: esc(value) for key, value in values.items()}))


def join(parts: Iterable[Html]) -> Html:
    return Html("".join(parts))


def clip(text: str | None, limit: int) -> str:
    """``text`` cut at ``limit`` characters, saying how many were left out."""
    value = text or ""
    if len(value) <= limit:
        return value
    return f"{value[:limit]}\n… ({len(value) - limit} more characters; the audit store has them all)"


def when(ts: float | None) -> str:
    """A moment with its zone (``2026-12-06 14:03:10 UTC``); empty when there is none."""
    return "" if not ts else stamp(ts)


def span(seconds: float) -> str:
    """A duration as ``1h 2m``, ``3m 4s`` or ``5s``."""
    s = max(0, int(seconds))
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60}m"
    if s >= 60:
        return f"{s // 60}m {s % 60}s"
    return f"{s}s"


def size(n: int | None) -> str:
    if n is None:
        return ""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def pretty_arguments(text: str) -> str:
    """JSON arguments indented for reading (as sent, when they are not JSON)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def run_link(run_id: str) -> Html:
    return fill(Template('<a href="/runs/$href">$run_id</a>'), href=quote(run_id, safe=""), run_id=run_id)


def _s(value: object) -> str:
    return "" if value is None else str(value)


# ---- the frame of every page ---------------------------------------------------------------------

_LAYOUT = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · callbox console</title>
<link rel="stylesheet" href="/static/console.css">
</head>
<body>
<header>
<span class="brand">callbox</span>
<nav>$nav</nav>
$who
</header>
<main>
$notes<h1>$title</h1>
$body
</main>
</body>
</html>
""")
_NAV = (("approvals", "/", "Approvals"), ("sandboxes", "/sandboxes", "Sandboxes"), ("runs", "/runs", "Runs"),
        ("egress", "/egress", "Egress"))
_WHO_SESSION = Template("""<form class="who" method="post" action="/logout">
<input type="hidden" name="csrf" value="$csrf">
<span>$role: $client</span> <button type="submit">Log out</button>
</form>""")
_WHO_BEARER = Template('<span class="who">$role: $client (bearer token)</span>')


def page(title: str, body: Html, *, active: str, client: str, csrf: str | None,
         notes: Iterable[tuple[str, str]] = (), operator: bool = True) -> Html:
    """A console page: navigation, who is logged in (a log-out form for a browser session),
    the messages left for it, and ``body``."""
    nav = join(
        fill(Template('<a href="$href"$current>$label</a>'), href=href, label=label,
             current=Html(' aria-current="page"') if key == active else Html(""))
        for key, href, label in _NAV
    )
    role = "operator" if operator else "client (read-only)"
    who = (fill(_WHO_SESSION, csrf=csrf, client=client, role=role) if csrf is not None
           else fill(_WHO_BEARER, client=client, role=role))
    shown = join(fill(Template('<p class="note $kind" role="status">$text</p>\n'), kind=kind, text=text)
                 for kind, text in notes)
    return fill(_LAYOUT, title=title, nav=nav, who=who, notes=shown, body=body)


def _csrf_field(csrf: str | None) -> Html:
    if csrf is None:
        return Html("")
    return fill(Template('<input type="hidden" name="csrf" value="$csrf">'), csrf=csrf)


# ---- login ---------------------------------------------------------------------------------------------

_LOGIN = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · callbox console</title>
<link rel="stylesheet" href="/static/console.css">
</head>
<body class="login">
<main>
<h1>callbox console</h1>
$error<form method="post" action="/login">
<input type="hidden" name="next" value="$next">
<label for="token">Token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Log in</button>
</form>
<p class="muted">A token of this server's token file (one <code>NAME:TOKEN</code> line per client). An
operator's token (a line ending in <code>operator</code>) sees every client's work and acts on it; a client's
token sees its own, read-only.</p>
</main>
</body>
</html>
""")


def login_page(*, error: str | None = None, next_path: str = "/") -> Html:
    shown = fill(Template('<p class="note error" role="alert">$error</p>\n'), error=error) if error else Html("")
    return fill(_LOGIN, error=shown, next=next_path)


# ---- approvals -----------------------------------------------------------------------------------------

_APPROVAL = Template("""<section class="approval" id="approval-$id" aria-label="approval $id">
<h2>$tool <span class="muted">approval $id</span></h2>
<dl>
<dt>Rule</dt><dd class="rule">$rule</dd>
<dt>Why it asks</dt><dd>$reason</dd>
<dt>Run</dt><dd>$run · door <b>$door</b> · client <b>$client</b></dd>
<dt>Call</dt><dd><code>$call_id</code> · waiting since $created ($waiting)</dd>
</dl>
<h3>Arguments$cut</h3>
<pre class="arguments">$arguments</pre>
<h3>Earlier calls of this run ($earlier_total)</h3>
$earlier
$resolve</section>
""")
_RESOLVE = Template("""<form class="resolve" method="post" action="/approvals/$id/resolve">
$csrf
<label for="reason-$id">Reason (shown to the model when denied)</label>
<input id="reason-$id" name="reason" maxlength="2000">
$buttons
</form>
""")
_READ_ONLY = Html('<p class="muted">An operator resolves this approval.</p>\n')


def _call_rows(calls: Iterable[Mapping[str, Any]]) -> Html:
    rows = join(
        fill(Template("<tr><td><code>$call_id</code></td><td>$tool</td><td>$decision</td><td>$state</td>"
                      "<td>$exit</td><td><code>$args</code></td></tr>\n"),
             call_id=c.get("call_id"), tool=c.get("tool"), decision=c.get("decision"), state=c.get("state"),
             exit=c.get("exit_code"), args=clip(_s(c.get("arguments")), CELL_SHOWN))
        for c in calls
    )
    return fill(Template("<table><thead><tr><th>Call</th><th>Tool</th><th>Decision</th><th>State</th><th>Exit</th>"
                         "<th>Arguments</th></tr></thead>\n<tbody>\n$rows</tbody></table>"), rows=rows)


_CALL_BUTTONS = Html("""<button type="submit" name="decision" value="approve">Approve</button>
<button type="submit" name="decision" value="deny" class="danger">Deny</button>""")
_EGRESS_BUTTONS = Html("""<button type="submit" name="decision" value="approve">Allow once</button>
<button type="submit" name="decision" value="approve-sandbox">Allow for this sandbox</button>
<button type="submit" name="decision" value="deny" class="danger">Deny</button>""")
"""A held egress connection's answers: this connection, the destination for the sandbox, or no."""


def _approval(item: PendingApproval, csrf: str | None, now: float, actions: bool) -> Html:
    a = item.approval
    earlier = _call_rows(item.earlier) if item.earlier else Html('<p class="muted">none: this is its first call</p>')
    return fill(
        _APPROVAL, id=a.id, tool=a.tool, rule=a.rule, reason=a.reason or "(none given)", run=run_link(a.run_id),
        door=item.door, client=item.client, call_id=a.call_id, created=when(a.created), waiting=span(now - a.created),
        cut=" (cut at 64 KiB when stored)" if a.arguments_truncated else "",
        arguments=clip(pretty_arguments(a.arguments), ARGUMENTS_SHOWN), earlier_total=item.earlier_total,
        earlier=earlier, resolve=fill(_RESOLVE, id=a.id, csrf=_csrf_field(csrf),
                                      buttons=_EGRESS_BUTTONS if a.tool == EGRESS_TOOL else _CALL_BUTTONS)
        if actions else _READ_ONLY,
    )


def approvals_page(items: list[PendingApproval], total: int, *, csrf: str | None, actions: bool = True) -> Html:
    if not items:
        return Html('<p class="empty">No call is waiting for approval.</p>')
    now = time.time()
    shown = f"{total} pending, oldest first" + (f"; the first {len(items)} shown" if total > len(items) else "")
    count = fill(Template('<p class="muted">$shown.</p>\n'), shown=shown)
    return join([count, *(_approval(item, csrf, now, actions) for item in items)])


# ---- sandboxes -----------------------------------------------------------------------------------------

_SANDBOX_ROW = Template("""<tr id="sandbox-$id">
<td><code>$id</code><br><span class="muted">$container</span></td><td>$client</td><td>$state</td><td>$age</td>
<td>$expires</td><td>$cpu</td><td>$memory</td><td>$pids</td>
<td>$kill</td>
</tr>
""")
_KILL = Template("""<form method="post" action="/sandboxes/$href/kill">$csrf<button type="submit" class="danger"
aria-label="Kill $id">Kill</button></form>""")


def _cpu(box: LiveSandbox) -> str:
    if box.cpu_seconds is None:
        return ""
    percent = f"{box.cpu_percent:.1f}% of {box.cpus:g}, " if box.cpu_percent is not None else ""
    return f"{percent}{box.cpu_seconds:.2f} s in all"


def sandboxes_page(boxes: list[LiveSandbox] | None, *, csrf: str | None, actions: bool = True) -> Html:
    if boxes is None:
        return Html('<p class="empty">This server runs no gRPC or E2B door, so it holds no live sandboxes; '
                    "runs, approvals and egress come from the audit store.</p>")
    if not boxes:
        return Html('<p class="empty">No live sandbox.</p>')
    now = time.time()
    rows = join(
        fill(_SANDBOX_ROW, id=b.sandbox_id, href=quote(b.sandbox_id, safe=""), container=b.container or "",
             client=b.client, state=b.state, age=span(now - b.created),
             expires=f"in {span(b.expires - now)}" if b.expires > now else "now",
             cpu=_cpu(b), memory=f"{size(b.memory_bytes)} of {size(b.memory_limit)}" if b.memory_bytes is not None
             else "", pids=_s(b.pids),
             kill=fill(_KILL, href=quote(b.sandbox_id, safe=""), id=b.sandbox_id, csrf=_csrf_field(csrf)) if actions
             else Html(""))
        for b in boxes
    )
    return fill(Template("""<table class="sandboxes"><thead><tr><th>Sandbox</th><th>Owner (client)</th><th>State</th>
<th>Age</th><th>Expires</th><th>CPU</th><th>Memory</th>
<th title="processes and threads, as the pids limit counts them">Tasks</th><th></th></tr></thead>
<tbody>
$rows</tbody></table>"""), rows=rows)


# ---- runs and calls ------------------------------------------------------------------------------------


def runs_page(runs: list[RunRecord], live: set[str]) -> Html:
    if not runs:
        return Html('<p class="empty">The audit store has no run yet.</p>')
    rows = join(
        fill(Template("<tr><td>$link</td><td>$door</td><td>$client</td><td>$created</td><td>$calls</td>"
                      "<td>$end</td></tr>\n"),
             link=run_link(r.id), door=_s(r.meta.get("door")), client=_s(r.meta.get("client")),
             created=when(r.created), calls=r.calls,
             end="live" if r.id in live else (r.end_reason or "") + (f" ({when(r.ended)})" if r.ended else ""))
        for r in runs
    )
    return fill(Template("""<p class="muted">The latest $n runs, newest first.</p>
<table><thead><tr><th>Run</th><th>Door</th><th>Client</th><th>Started</th><th>Calls</th><th>Ended</th></tr></thead>
<tbody>
$rows</tbody></table>"""), n=len(runs), rows=rows)


_CALL = Template("""<section class="call" id="call-$anchor">
<h2>$n. $tool <span class="muted"><code>$call_id</code></span></h2>
<dl>
<dt>Decision</dt><dd>$decision · $rule</dd>
<dt>State</dt><dd>$state$outcome</dd>
<dt>Started</dt><dd>$started</dd>
</dl>
<h3>Arguments</h3>
<pre class="arguments">$arguments</pre>
<h3>Result</h3>
<pre class="result$error">$result</pre>
</section>
""")


def _outcome(call: Mapping[str, Any]) -> str:
    parts = []
    if call.get("exit_code") is not None:
        parts.append(f"exit {call['exit_code']}")
    if call.get("error_code"):
        parts.append(str(call["error_code"]))
    if isinstance(call.get("duration_ms"), int | float):
        parts.append(f"{call['duration_ms']:.1f} ms")
    if (call.get("attempts") or 1) > 1:
        parts.append(f"{call['attempts']} attempts")
    return f" · {', '.join(parts)}" if parts else ""


def run_page(run: RunRecord, calls: list[dict[str, Any]], approvals: list[Approval], *, live: bool) -> Html:
    summary = fill(Template("""<dl class="run">
<dt>Door</dt><dd>$door</dd><dt>Client</dt><dd>$client</dd><dt>Started</dt><dd>$created</dd>
<dt>Ended</dt><dd>$ended</dd><dt>Calls</dt><dd>$count</dd>
</dl>
"""), door=_s(run.meta.get("door")), client=_s(run.meta.get("client")), created=when(run.created),
        ended="no: live" if live else (f"{when(run.ended)}: {run.end_reason or ''}" if run.ended else "no"),
        count=run.calls)
    shown = join(
        fill(_CALL, anchor=quote(_s(c.get("call_id")), safe=""), n=i, tool=c.get("tool"), call_id=c.get("call_id"),
             decision=c.get("decision") or "none yet", rule=c.get("rule") or "", state=c.get("state"),
             outcome=_outcome(c), started=when(c.get("started")),
             arguments=clip(pretty_arguments(_s(c.get("arguments"))), ARGUMENTS_SHOWN),
             error=" error" if c.get("is_error") else "",
             result=clip(c.get("result_text"), RESULT_SHOWN) if c.get("state") == "done" else "(no result yet)")
        for i, c in enumerate(calls, start=1)
    )
    approval_rows = join(
        fill(Template("<tr><td><code>$id</code></td><td><code>$call_id</code></td><td>$tool</td><td>$state</td>"
                      "<td>$by</td><td>$why</td></tr>\n"),
             id=a.id, call_id=a.call_id, tool=a.tool, state=a.state, by=a.resolved_by or "",
             why=a.resolution_reason or "")
        for a in approvals
    )
    approvals_table = fill(Template("""<h2>Approvals</h2>
<table><thead><tr><th>Approval</th><th>Call</th><th>Tool</th><th>State</th><th>By</th><th>Reason</th></tr></thead>
<tbody>
$rows</tbody></table>
"""), rows=approval_rows) if approvals else Html("")
    calls_part = shown if calls else Html('<p class="empty">No call in this run yet.</p>')
    return join([summary, approvals_table, calls_part])


# ---- egress --------------------------------------------------------------------------------------------


def egress_page(records: list[dict[str, Any]]) -> Html:
    if not records:
        return Html('<p class="empty">No egress recorded: only sandboxes with an <code>allowlist</code> network '
                    "go out, through the egress proxy, and each connection it allows or refuses shows here.</p>")
    rows = join(
        fill(Template("<tr><td>$ts</td><td>$run</td><td><code>$call</code></td><td class=\"$decision\">$decision</td>"
                      "<td>$method</td><td>$host</td><td>$port</td><td>$address</td><td>$reason</td></tr>\n"),
             ts=when(r.get("ts")), run=run_link(_s(r.get("run_id"))), call=r.get("call_id"),
             decision=r.get("decision"), method=r.get("method"), host=r.get("host"), port=r.get("port"),
             address=r.get("address"), reason=clip(_s(r.get("reason")), CELL_SHOWN))
        for r in records
    )
    return fill(Template("""<p class="muted">The latest $n decisions of the egress proxies, newest first.</p>
<table><thead><tr><th>When</th><th>Run</th><th>Call</th><th>Decision</th><th>Method</th><th>Host</th><th>Port</th>
<th>Address</th><th>Reason</th></tr></thead>
<tbody>
$rows</tbody></table>"""), n=len(records), rows=rows)


def not_found_page(message: str) -> Html:
    return fill(Template('<p class="note error" role="alert">$message</p>'), message=message)
