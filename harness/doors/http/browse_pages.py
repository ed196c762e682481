"""The console's paged lists: runs, resolved approvals (the history) and the egress log, each
with a filter form (a plain ``GET`` form: the filters are the page's query, so a filtered
page can be bookmarked or shared) and links to the pages before and after.

A client's token gets no client filter: it sees its own work only, whatever the query says
(:class:`~harness.doors.http.console.Console` narrows every read to it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from string import Template
from typing import Any
from urllib.parse import urlencode

from harness.audit.browse import RUN_STATES, Filters
from harness.audit.records import Approval, RunRecord
from harness.core.errors import ErrorCode
from harness.doors.http.console import ConsoleError
from harness.doors.http.pages import CELL_SHOWN, Html, clip, esc, fill, join, run_link, text, when

__all__ = ["DECISIONS", "RUN_STATES", "Listing", "egress_page", "filters_of", "history_page", "runs_page"]

FIELD_MAX = 200
"""A filter's value is cut at this many characters."""
EGRESS_DECISIONS = ("allow", "deny")
"""The egress decisions offered in the filter (any other the store holds can be asked for by address)."""
DECISIONS = ("approved", "denied")
"""The resolved approvals' decisions to filter by."""


@dataclass(frozen=True)
class Listing:
    """One page of a list: its rows' total, the page (from 1) and its size, and the filters."""

    total: int
    page: int
    page_size: int
    filters: Filters

    def query(self, page: int) -> str:
        """This list's query string for ``page``, with the same filters."""
        fields = {name: value for name, value in vars(self.filters).items() if value}
        if page > 1:
            fields["page"] = str(page)
        return "?" + urlencode(fields) if fields else "?"


def filters_of(query: Mapping[str, str], *, states: Sequence[str] | None = None) -> tuple[Filters, int]:
    """The filters and the page number in a list's query (fields the list has no filter for
    are left out). ConsoleError 400 for a ``state`` not in ``states`` or a page that is no
    number, rather than a list that silently ignores what was asked."""

    def value(name: str) -> str | None:
        found = (query.get(name) or "").strip()[:FIELD_MAX]
        return found or None

    try:
        page = max(1, min(int(query.get("page") or 1), 1_000_000))
    except ValueError:
        raise ConsoleError(f"page must be a number from 1, not {query.get('page')!r}", ErrorCode.INVALID_REQUEST
                           ) from None
    state = value("state")
    if state is not None and states is not None and state not in states:
        raise ConsoleError(f"no state {state!r} to filter by here; use one of {', '.join(states)}",
                           ErrorCode.INVALID_REQUEST)
    return Filters(client=value("client"), tool=value("tool"), state=state, host=value("host"), by=value("by")), page


# ---- the filter form and the pager ---------------------------------------------------------------------

def _text_field(name: str, label: str, value: str | None) -> Html:
    return fill(Template('<label>$label <input name="$name" value="$value" size="14"></label>\n'),
                name=name, label=label, value=value or "")


def _select(name: str, label: str, choices: Sequence[str], value: str | None) -> Html:
    options = join(fill(Template('<option value="$v"$selected>$v</option>'), v=choice,
                        selected=Html(" selected") if choice == value else Html(""))
                   for choice in choices)
    return fill(Template('<label>$label <select name="$name"><option value="">any</option>$options</select>'
                         '</label>\n'), name=name, label=label, options=options)


def _filter_form(action: str, fields: Iterable[Html]) -> Html:
    return fill(Template("""<form class="filters" method="get" action="$action" role="search">
$fields<button type="submit">Filter</button> <a href="$action">clear</a>
</form>
"""), action=action, fields=join(fields))


def _pager(path: str, listing: Listing, shown: int, what: str) -> Html:
    """Which rows these are, of how many, and links to the pages before and after."""
    if listing.total == 0:
        return Html("")
    first = (listing.page - 1) * listing.page_size + 1
    last = first + shown - 1
    links = []
    if listing.page > 1:
        links.append(fill(Template('<a rel="prev" href="$href">← newer</a>'),
                          href=path + listing.query(listing.page - 1)))
    if last < listing.total:
        links.append(fill(Template('<a rel="next" href="$href">older →</a>'),
                          href=path + listing.query(listing.page + 1)))
    where = f"{first} to {last} of {listing.total}" if shown else f"none on page {listing.page} of {listing.total}"
    return fill(Template('<nav class="pager" aria-label="pages"><span class="muted">$what $where, newest first'
                         '</span> $links</nav>\n'), what=what, where=where, links=Html(" · ".join(links)))


def _table(head: str, rows: Html) -> Html:
    cells = join(fill(Template("<th>$h</th>"), h=h) for h in head.split("|"))
    return fill(Template('<div class="scroll"><table><thead><tr>$cells</tr></thead>\n<tbody>\n$rows</tbody></table>'
                         "</div>\n"), cells=cells, rows=rows)


# ---- runs ----------------------------------------------------------------------------------------------


def runs_page(runs: list[RunRecord], listing: Listing, live: set[str], *, operator_view: bool) -> Html:
    f = listing.filters
    form = _filter_form("/runs", [
        *([_text_field("client", "Client", f.client)] if operator_view else []),
        _text_field("tool", "Tool", f.tool),
        _select("state", "State", RUN_STATES, f.state),
    ])
    pager = _pager("/runs", listing, len(runs), "runs")
    if not runs:
        empty = "No run matches these filters." if any(vars(f).values()) else "The audit store has no run yet."
        return join([form, fill(Template('<p class="empty">$empty</p>'), empty=empty), pager])
    rows = join(
        fill(Template("<tr><td>$link</td><td>$door</td><td>$client</td><td>$created</td><td>$calls</td>"
                      "<td>$end</td></tr>\n"),
             link=run_link(r.id), door=text(r.meta.get("door")), client=text(r.meta.get("client")),
             created=when(r.created), calls=r.calls,
             end="live" if r.id in live else (r.end_reason or "") + (f" ({when(r.ended)})" if r.ended else ""))
        for r in runs
    )
    return join([form, pager, _table("Run|Door|Client|Started|Calls|Ended", rows), pager])


# ---- resolved approvals --------------------------------------------------------------------------------


def _decision(approval: Approval) -> str:
    if approval.scope is not None:  # a held egress connection's answer
        return "allowed for the sandbox" if approval.scope == "sandbox" else "allowed once"
    return {"consumed": "approved (ran)", "approved": "approved"}.get(approval.state, approval.state)


def history_page(items: list[tuple[Approval, str]], listing: Listing, *, operator_view: bool) -> Html:
    f = listing.filters
    form = _filter_form("/history", [
        *([_text_field("client", "Client", f.client)] if operator_view else []),
        _text_field("tool", "Tool", f.tool),
        _select("state", "Decision", DECISIONS, f.state),
        _text_field("by", "By", f.by),
    ])
    pager = _pager("/history", listing, len(items), "resolved approvals")
    if not items:
        return join([form, Html('<p class="empty">No resolved approval matches.</p>' if any(vars(f).values())
                                else '<p class="empty">No approval has been resolved yet.</p>'), pager])
    rows = join(
        fill(Template("<tr id=\"history-$id\"><td>$resolved</td><td>$by</td><td class=\"$css\">$decision</td>"
                      "<td>$tool<br><code class=\"muted\">$id</code></td><td>$client</td><td>$run</td>"
                      "<td><code>$args</code></td><td>$why</td><td>$asked</td></tr>\n"),
             id=a.id, resolved=when(a.resolved), by=a.resolved_by or "", decision=_decision(a),
             css="deny" if a.state == "denied" else "allow", tool=a.tool, client=client, run=run_link(a.run_id),
             args=clip(a.arguments, CELL_SHOWN), why=a.resolution_reason or "",
             asked=fill(Template("$created<br><span class=\"muted\">$rule</span>"), created=when(a.created),
                        rule=a.rule))
        for a, client in items
    )
    return join([form, pager, _table("Resolved|By|Decision|Tool|Client|Run|Arguments|Reason given|Asked (rule)", rows),
                 pager])


# ---- egress --------------------------------------------------------------------------------------------


def egress_page(records: list[dict[str, Any]], listing: Listing, *, operator_view: bool) -> Html:
    f = listing.filters
    form = _filter_form("/egress", [
        *([_text_field("client", "Client", f.client)] if operator_view else []),
        _text_field("host", "Host contains", f.host),
        _select("state", "Decision", (*EGRESS_DECISIONS, *([f.state] if f.state and f.state not in EGRESS_DECISIONS
                                                           else [])), f.state),
    ])
    pager = _pager("/egress", listing, len(records), "egress decisions")
    if not records:
        if any(vars(f).values()):
            return join([form, Html('<p class="empty">No egress decision matches these filters.</p>'), pager])
        return join([form, Html('<p class="empty">No egress recorded: only sandboxes with an <code>allowlist</code> '
                                "network go out, through the egress proxy, and each connection it allows or refuses "
                                "shows here.</p>")])
    rows = join(
        fill(Template("<tr><td>$ts</td><td>$client</td><td>$run</td><td><code>$call</code></td>"
                      "<td class=\"$decision\">$decision</td><td>$method</td><td>$host</td><td>$port</td>"
                      "<td>$address</td><td>$reason</td></tr>\n"),
             ts=when(r.get("ts")), client=text(r.get("client")), run=run_link(text(r.get("run_id"))),
             call=r.get("call_id"), decision=esc(r.get("decision")), method=r.get("method"), host=r.get("host"),
             port=r.get("port"), address=r.get("address"), reason=clip(text(r.get("reason")), CELL_SHOWN))
        for r in records
    )
    return join([form, pager, _table("When|Client|Run|Call|Decision|Method|Host|Port|Address|Reason", rows), pager])
