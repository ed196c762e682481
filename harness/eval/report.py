"""What an eval reports: the results table on the terminal, ``report.json`` and ``report.html``.

The table has a row per task (its trials' pass count, and their mean turns, tool calls,
tokens, cost and wall time) and the totals: pass@1, and pass@k when each task ran k > 1
trials (:mod:`harness.eval.scoring`).

The HTML report is one self-contained file, readable offline: the console's stylesheet
inline, no script, no request anywhere. It holds the totals, two inline SVG charts drawn
by the console's chart code (:mod:`harness.doors.http.charts`: pass rate per task, and the
mean wall time per task, passing and failing trials apart), the results table, and per task
each trial's trajectory: how its run ended, the model's last answer, and the run's calls as
the console's run page shows them (:func:`harness.doors.http.pages.run_page`), read from the
audit store with ``AuditStore.calls_for_run``, as ``callbox audit --run`` reads them. A
run the audit store no longer holds is said, not drawn. Pictures in results are left out of
the report (the text of their result names them); the console shows them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from harness.audit.store import AuditError, AuditStore
from harness.doors.http.charts import Series, bar_chart
from harness.doors.http.pages import Html, fill, join, run_page
from harness.eval.scoring import Summary, TrialResult

__all__ = ["html_report", "json_report", "table", "write_reports"]


def _cost(value: float | None) -> str:
    return "—" if value is None else f"${value:.4f}"


def _rate(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:.1f}%"


def table(summary: Summary) -> str:
    """The results as plain text, a row per task and the totals under them."""
    head = ("TASK", "PASS", "TURNS", "TOOL CALLS", "TOKENS IN/OUT", "COST", "TIME")
    rows = [(s.task, f"{s.passes}/{s.trials}" if s.trials else "not run", f"{s.turns:.1f}".removesuffix(".0"),
             f"{s.tool_calls:.1f}".removesuffix(".0"), f"{s.input_tokens:.0f}/{s.output_tokens:.0f}",
             _cost(s.cost_usd), f"{s.seconds:.1f} s") for s in summary.tasks]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in [head, *rows]]
    lines.append("")
    lines.append(f"pass@1 {_rate(summary.pass_at_1)} ({summary.passes} of {summary.trials} trials passed)")
    if summary.k > 1:
        short = f"; {summary.short} task(s) with fewer than {summary.k} trials left out" if summary.short else ""
        lines.append(f"pass@{summary.k} {_rate(summary.pass_at_k)}{short}")
    lines.append(f"time {summary.seconds:.1f} s in trials · cost {_cost(summary.cost_usd)}")
    return "\n".join(lines)


def json_report(summary: Summary, results: Sequence[TrialResult], identity: dict[str, Any]) -> dict[str, Any]:
    """``report.json``: the eval, its totals, each task's score and every trial."""
    totals = {"pass_at_1": summary.pass_at_1, "k": summary.k, "pass_at_k": summary.pass_at_k,
              "tasks_short_of_k": summary.short, "trials": summary.trials, "passes": summary.passes,
              "seconds": round(summary.seconds, 3), "cost_usd": summary.cost_usd}
    return {"eval": identity, "summary": totals,
            "tasks": [{**asdict(s), "pass_rate": s.rate} for s in summary.tasks],
            "trials": [r.model_dump() for r in sorted(results, key=lambda r: (r.task, r.trial))]}


_PAGE = Template("""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
$css
.verdict.pass { color: var(--ok); font-weight: 600; } .verdict.fail { color: var(--danger); font-weight: 600; }
section.task { border-top: 2px solid var(--line); margin-top: 1.5rem; padding-top: .5rem; }
section.trial { margin: .6rem 0 1.2rem; }
</style>
</head>
<body>
<header><span class="brand">callbox</span><span class="muted">eval report</span></header>
<main>
<h1>$title</h1>
<dl>
<dt>Tasks</dt><dd>$tasks</dd><dt>Model</dt><dd>$model</dd><dt>Trials</dt><dd>$trials</dd>
<dt>pass@1</dt><dd>$pass1</dd>$passk<dt>Time</dt><dd>$time</dd><dt>Cost</dt><dd>$cost</dd>
</dl>
<div class="charts">
$charts</div>
<h2>Results</h2>
<div class="scroll"><table><thead><tr><th>Task</th><th>Passed</th><th>Turns</th><th>Tool calls</th>
<th>Tokens in/out</th><th>Cost</th><th>Time</th></tr></thead>
<tbody>
$rows</tbody></table></div>
$sections</main>
</body>
</html>
""")
_ROW = Template('<tr><td><a href="#task-$task">$task</a></td><td class="verdict $css">$passed</td><td>$turns</td>'
                "<td>$calls</td><td>$tokens</td><td>$cost</td><td>$time</td></tr>\n")
_TRIAL = Template("""<section class="trial">
<h3>Trial $trial: <span class="verdict $css">$verdict</span> <span class="muted">$reason · run <code>$run_id</code>
 · $turns turns · $time</span></h3>
$message$final$calls</section>
""")


def _trajectory(audit: AuditStore | None, run_id: str) -> Html:
    if audit is None:
        return Html('<p class="empty">No audit store to draw the trajectory from.</p>\n')
    try:
        run = audit.get_run(run_id)
    except AuditError:
        return fill(Template('<p class="empty">The audit store holds no run $run_id any more.</p>\n'), run_id=run_id)
    calls = [{**call, "images": []} for call in audit.calls_for_run(run_id)]  # pictures: in the console only
    return run_page(run, calls, [], live=False)


def html_report(summary: Summary, results: Sequence[TrialResult], identity: dict[str, Any],
                audit: AuditStore | None) -> str:
    """The HTML report (see the module docstring), as one string."""
    css = resources.files("harness.data").joinpath("console.css").read_text(encoding="utf-8")
    labels = [s.task for s in summary.tasks]
    charts = [bar_chart("pass-rate", "Pass rate per task (%)", [
        Series("passed", "series-ok", [s.rate * 100 for s in summary.tasks]),
        Series("failed", "series-bad", [(1 - s.rate) * 100 if s.trials else 0.0 for s in summary.tasks]),
    ], x_labels=labels, caption="share of each task's trials")]
    by_task: dict[str, list[TrialResult]] = {}
    for result in sorted(results, key=lambda r: r.trial):
        by_task.setdefault(result.task, []).append(result)

    def mean_time(task: str, passing: bool) -> float:
        times = [r.seconds for r in by_task.get(task, []) if r.passed == passing]
        return sum(times) / len(times) if times else 0.0

    charts.append(bar_chart("time", "Wall time per task (s, mean per trial)", [
        Series("passing trials", "series-ok", [mean_time(t, True) for t in labels]),
        Series("failing trials", "series-bad", [mean_time(t, False) for t in labels]),
    ], x_labels=labels, caption="sandbox start, project copy, model turns, tool calls and checks"))
    rows = join(fill(_ROW, task=s.task, css="pass" if s.trials and s.passes == s.trials else "fail",
                     passed=f"{s.passes}/{s.trials}" if s.trials else "not run", turns=f"{s.turns:.1f}",
                     calls=f"{s.tool_calls:.1f}", tokens=f"{s.input_tokens:.0f}/{s.output_tokens:.0f}",
                     cost=_cost(s.cost_usd), time=f"{s.seconds:.1f} s") for s in summary.tasks)
    sections = []
    for score in summary.tasks:
        trials = [fill(_TRIAL, trial=r.trial, css="pass" if r.passed else "fail",
                       verdict="pass" if r.passed else "fail",
                       reason=r.reason, run_id=r.run_id, turns=r.turns, time=f"{r.seconds:.1f} s",
                       message=fill(Template('<p class="note">$m</p>\n'), m=r.message) if r.message else Html(""),
                       final=fill(Template("<h3>Last answer</h3>\n<pre>$t</pre>\n"), t=r.final_text)
                       if r.final_text else Html(""),
                       calls=_trajectory(audit, r.run_id)) for r in by_task.get(score.task, [])]
        body = join(trials) if trials else Html('<p class="empty">Not run yet.</p>\n')
        sections.append(join([fill(Template('<section class="task" id="task-$task">\n<h2>$task</h2>\n'),
                                   task=score.task), body, Html("</section>\n")]))
    passk = (fill(Template("<dt>pass@$k</dt><dd>$value</dd>"), k=summary.k, value=_rate(summary.pass_at_k))
             if summary.k > 1 else Html(""))
    model = identity.get("model") or f"transcripts in {identity.get('transcripts')}"
    return fill(_PAGE, title=f"callbox eval: {Path(str(identity.get('tasks', ''))).name}", css=Html(css),
                tasks=str(identity.get("tasks", "")), model=model,
                trials=f"{summary.passes} of {summary.trials} passed",
                pass1=_rate(summary.pass_at_1), passk=passk, time=f"{summary.seconds:.1f} s",
                cost=_cost(summary.cost_usd), charts=join(charts), rows=rows, sections=join(sections))


def write_reports(out: Path, summary: Summary, results: Sequence[TrialResult], identity: dict[str, Any],
                  audit: AuditStore | None) -> tuple[Path, Path]:
    """``report.json`` and ``report.html`` in ``out``; their paths."""
    as_json, as_html = out / "report.json", out / "report.html"
    as_json.write_text(json.dumps(json_report(summary, results, identity), indent=2, default=str) + "\n")
    as_html.write_text(html_report(summary, results, identity, audit), encoding="utf-8")
    return as_json, as_html

