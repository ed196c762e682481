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
from harness.doors.http.console import PendingApproval

__all__ = [
    "Html",
    "approvals_page",
    "clip",
    "csrf_field",
    "duration",
    "esc",
    "fill",
    "join",
    "login_page",
    "not_found_page",
    "page",
    "run_link",
    "run_page",
    "size",
    "span",
    "text",
    "when",
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


def text(value: object) -> str:
    """``value`` as text (None: empty)."""
    return "" if value is None else str(value)


def _s(value: object) -> str:
    return "" if value is None else str(value)


# ---- the frame of every page ---------------------------------------------------------------------

_LAYOUT = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title · callbox console</title>
$refresh<link rel="stylesheet" href="/static/console.css">
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
_NAV = (("overview", "/overview", "Overview"), ("approvals", "/", "Approvals"), ("history", "/history", "History"),
        ("sandboxes", "/sandboxes", "Sandboxes"), ("runs", "/runs", "Runs"), ("egress", "/egress", "Egress"))
_WHO_SESSION = Template("""<form class="who" method="post" action="/logout">
<input type="hidden" name="csrf" value="$csrf">
<span>$role: $client</span> <button type="submit">Log out</button>
</form>""")
_WHO_BEARER = Template('<span class="who">$role: $client (bearer token)</span>')


def page(title: str, body: Html, *, active: str, client: str, csrf: str | None,
         notes: Iterable[tuple[str, str]] = (), operator: bool = True, pending: int | None = None,
         refresh_s: int | None = None) -> Html:
    """A console page: navigation (with ``pending``, the approvals waiting, as a badge), who is
    logged in (a log-out form for a browser session), the messages left for it, and ``body``;
    with ``refresh_s``, the browser reloads it that often (a page without a form to fill)."""
    nav = join(
        fill(Template('<a href="$href"$current>$label$badge</a>'), href=href, label=label,
             current=Html(' aria-current="page"') if key == active else Html(""),
             badge=_badge(pending) if key == "approvals" else Html(""))
        for key, href, label in _NAV
    )
    role = "operator" if operator else "client (read-only)"
    who = (fill(_WHO_SESSION, csrf=csrf, client=client, role=role) if csrf is not None
           else fill(_WHO_BEARER, client=client, role=role))
    shown = join(fill(Template('<p class="note $kind" role="status">$text</p>\n'), kind=kind, text=text)
                 for kind, text in notes)
    refresh = (fill(Template('<meta http-equiv="refresh" content="$s">\n'), s=refresh_s) if refresh_s
               else Html(""))
    return fill(_LAYOUT, title=title, nav=nav, who=who, notes=shown, body=body, refresh=refresh)


def _badge(pending: int | None) -> Html:
    """The count of approvals waiting, beside the navigation's Approvals (nothing when none)."""
    if not pending:
        return Html("")
    return fill(Template(' <span class="badge" title="$n waiting for a person">$n<span class="visually-hidden"> '
                         'waiting</span></span>'), n=pending)


def csrf_field(csrf: str | None) -> Html:
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
    return fill(Template('<div class="scroll"><table><thead><tr><th>Call</th><th>Tool</th><th>Decision</th>'
                         "<th>State</th><th>Exit</th><th>Arguments</th></tr></thead>\n<tbody>\n$rows</tbody></table>"
                         "</div>"), rows=rows)


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
        earlier=earlier, resolve=fill(_RESOLVE, id=a.id, csrf=csrf_field(csrf),
                                      buttons=_EGRESS_BUTTONS if a.tool == EGRESS_TOOL else _CALL_BUTTONS)
        if actions else _READ_ONLY,
    )


_TO_HISTORY = Html('<a href="/history">resolved approvals: who, what, when, why</a>')


def approvals_page(items: list[PendingApproval], total: int, *, csrf: str | None, actions: bool = True) -> Html:
    if not items:
        return fill(Template('<p class="empty">No call is waiting for approval. The $overview reloads by itself and '
                             'every page counts the approvals waiting beside Approvals; see also the $history.</p>'),
                    overview=Html('<a href="/overview">overview</a>'), history=_TO_HISTORY)
    now = time.time()
    shown = f"{total} pending, oldest first" + (f"; the first {len(items)} shown" if total > len(items) else "")
    count = fill(Template('<p class="muted">$shown. This page does not reload by itself (it would lose a reason '
                          'being typed): reload it, or watch the count beside Approvals. See also the $history.</p>\n'),
                 shown=shown, history=_TO_HISTORY)
    return join([count, *(_approval(item, csrf, now, actions) for item in items)])


# ---- a run and its calls --------------------------------------------------------------------------------

_CALL = Template("""<details class="call" id="call-$anchor">
<summary><span class="n">$n</span><code class="id">$call_id</code><span class="tool">$tool</span>
<span class="$decision_css">$decision</span><span>$state</span><span class="exit">$exit</span>
<span class="ms">$duration</span>
<code class="args">$short_args</code></summary>
<section class="call">
<dl>
<dt>Decision</dt><dd>$decision · $rule</dd>
<dt>State</dt><dd>$state$outcome</dd>
<dt>Started</dt><dd>$started</dd>
</dl>
<h3>Arguments</h3>
<pre class="arguments">$arguments</pre>
<h3>Result</h3>
<pre class="result$error">$result</pre>
$images</section>
</details>
""")
_CALLS_HEAD = Html("""<div class="calls">
<div class="calls-head"><span class="n">#</span><span class="id">Call</span><span class="tool">Tool</span>
<span>Decision</span><span>State</span><span class="exit">Exit</span><span class="ms">Duration</span>
<span class="args">Arguments (open a row for the whole call)</span></div>
""")
SHORT_ARGUMENTS = 80


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


def duration(ms: object) -> str:
    """A call's duration as ``850 ms`` or ``2.4 s``; empty when it has none."""
    if not isinstance(ms, int | float):
        return ""
    return f"{ms:.0f} ms" if ms < 1000 else f"{ms / 1000:.1f} s"


def _one_line(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def _sandbox_of(run: RunRecord, live: bool) -> Html:
    """Where the run's sandbox is: a link to it on the sandboxes page while it lives."""
    container = _s(run.meta.get("container"))[:12]
    named = f" (container {container})" if container else ""
    if live:
        return fill(Template('<a href="/sandboxes#sandbox-$anchor">live on the Sandboxes page</a>$named'),
                    anchor=quote(run.id, safe=""), named=named)
    return fill(Template("not live$named"), named=named)


_PICTURE = Template('<figure class="picture"><img src="$src" alt="$label" width="$width" height="$height" '
                    'loading="lazy"><figcaption>$media_type $width&times;$height, $size bytes $label</figcaption>'
                    '</figure>\n')


def _pictures(run_id: str, images: list[dict[str, Any]]) -> Html:
    """The pictures a call returned, each from the console's route serving it by digest."""
    return join(
        fill(_PICTURE, src=f"/runs/{quote(run_id, safe='')}/images/{quote(_s(entry.get('sha256')), safe='')}",
             label=_s(entry.get("label")), width=_s(entry.get("width")), height=_s(entry.get("height")),
             media_type=_s(entry.get("media_type")), size=_s(entry.get("bytes")))
        for entry in images if isinstance(entry, dict) and entry.get("sha256")
    )


def run_page(run: RunRecord, calls: list[dict[str, Any]], approvals: list[Approval], *, live: bool) -> Html:
    summary = fill(Template("""<dl class="run">
<dt>Door</dt><dd>$door</dd><dt>Client</dt><dd>$client</dd><dt>Started</dt><dd>$created</dd>
<dt>Ended</dt><dd>$ended</dd><dt>Sandbox</dt><dd>$sandbox</dd><dt>Calls</dt><dd>$count</dd>
</dl>
"""), door=_s(run.meta.get("door")), client=_s(run.meta.get("client")), created=when(run.created),
        ended="no: live" if live else (f"{when(run.ended)}: {run.end_reason or ''}" if run.ended else "no"),
        sandbox=_sandbox_of(run, live), count=run.calls)
    shown = join(
        fill(_CALL, anchor=quote(_s(c.get("call_id")), safe=""), n=i, call_id=c.get("call_id"),
             tool=f"{_s(c.get('tool'))} [{c['origin']}]" if c.get("origin") else c.get("tool"),
             decision=c.get("decision") or "none yet", decision_css=f"decision {_s(c.get('decision'))}",
             rule=c.get("rule") or "", state=c.get("state"), exit=_s(c.get("exit_code")),
             duration=duration(c.get("duration_ms")), short_args=_one_line(_s(c.get("arguments")), SHORT_ARGUMENTS),
             outcome=_outcome(c), started=when(c.get("started")),
             arguments=clip(pretty_arguments(_s(c.get("arguments"))), ARGUMENTS_SHOWN),
             error=" error" if c.get("is_error") else "",
             result=clip(c.get("result_text"), RESULT_SHOWN) if c.get("state") == "done" else "(no result yet)",
             images=_pictures(run.id, c.get("images") or []))
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
<div class="scroll"><table><thead><tr><th>Approval</th><th>Call</th><th>Tool</th><th>State</th><th>By</th>
<th>Reason</th></tr></thead>
<tbody>
$rows</tbody></table></div>
"""), rows=approval_rows) if approvals else Html("")
    calls_part = (join([Html("<h2>Calls</h2>\n"), _CALLS_HEAD, shown, Html("</div>\n")]) if calls
                  else Html('<p class="empty">No call in this run yet.</p>'))
    return join([summary, approvals_table, _acceptance(run), calls_part])


_CHECK_ROW = Template('<tr><td>$turn</td><td>$index</td><td><code>$command</code></td><td>$workdir</td>'
                      '<td class="$css">$verdict</td><td>$exit</td><td>$duration</td>'
                      '<td><a href="#call-$anchor"><code>$call_id</code></a></td></tr>\n')


def _acceptance(run: RunRecord) -> Html:
    """The acceptance checks run on the run's final answers (its meta's ``acceptance``, kept
    by the agent loop): the verdict, then one row per check run, linked to its call."""
    kept = run.meta.get("acceptance")
    if not isinstance(kept, dict):
        return Html("")
    rows = join(
        fill(_CHECK_ROW, turn=_s(round_.get("turn")), index=_s(check.get("index")), command=_s(check.get("command")),
             workdir=_s(check.get("workdir")), css="decision allow" if check.get("passed") else "decision deny",
             verdict="passed" if check.get("passed") else "failed",
             exit=_s(check.get("exit_code") if check.get("exit_code") is not None else check.get("error")),
             duration=duration(check.get("duration_ms")), anchor=quote(_s(check.get("call_id")), safe=""),
             call_id=_s(check.get("call_id")))
        for round_ in kept.get("rounds") or () if isinstance(round_, dict)
        for check in round_.get("checks") or () if isinstance(check, dict)
    )
    return fill(Template("""<h2>Acceptance checks</h2>
<p>$verdict: $rejections rejected answer(s), max_rejections $most. Each check is the harness's own call
(origin <code>acceptance</code>), run on the model's final answer.</p>
<div class="scroll"><table><thead><tr><th>Turn</th><th>Check</th><th>Command</th><th>Workdir</th><th>Verdict</th>
<th>Exit</th><th>Duration</th><th>Call</th></tr></thead>
<tbody>
$rows</tbody></table></div>
"""), verdict=_s(kept.get("verdict")), rejections=_s(kept.get("rejections")), most=_s(kept.get("max_rejections")),
        rows=rows)


def not_found_page(message: str) -> Html:
    return fill(Template('<p class="note error" role="alert">$message</p>'), message=message)
