"""The generators behind the site's reference pages (docs/hooks/), each on a small stand-in
of what it reads and on the real thing: markers, CLI, policy and server configuration,
errors, benchmarks table and chart."""

from __future__ import annotations

import argparse
import json
import types
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from docs.hooks import bench_chart, bench_reference, cli_reference, errors_reference, model_reference
from docs.hooks.markers import MarkerError, expand, markers
from docs.hooks.text import cell, escape
from harness.core.units import ByteSize

FIXTURE = Path(__file__).parent / "bench-results.fixture.json"
TIMES = "\N{MULTIPLICATION SIGN}"

# --- markers ----------------------------------------------------------------------------------


def test_a_marker_line_is_replaced_by_its_generator() -> None:
    page = "# Title\n\nIntro.\n\n<!-- generated: cli -->\n\nAfter.\n"
    assert expand(page, {"cli": lambda: "GENERATED\n"}, page="p.md") == "# Title\n\nIntro.\n\nGENERATED\n\nAfter.\n"
    assert markers(page) == [(5, "cli")]


def test_an_unknown_marker_fails_naming_the_page_and_line() -> None:
    with pytest.raises(MarkerError, match=r"p\.md:3: no generator is named 'clii'"):
        expand("x\n\n<!-- generated: clii -->\n", {"cli": lambda: ""}, page="p.md")


@pytest.mark.parametrize("line", ["<!-- generated:cli-->", "<!-- generated: cli --> after", "<!--generated: cli -->"])
def test_a_malformed_marker_fails(line: str) -> None:
    with pytest.raises(MarkerError, match=r"line 2: .* is not a marker line"):
        expand(f"x\n{line}\n", {"cli": lambda: ""}, page="p.md")


# --- CLI reference ----------------------------------------------------------------------------


def _small_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="callbox", description="Top.")
    parser.add_argument("-v", "--verbose", action="store_true", help="say more")
    sub = parser.add_subparsers(dest="command")
    box = sub.add_parser("box", help="boxes", description="Boxes that live.")
    boxes = box.add_subparsers(dest="what")
    new = boxes.add_parser("new", help="make a box", aliases=["create"])
    new.add_argument("name", help="its name")
    new.add_argument("--memory", default="512m", help="memory (default %(default)s)")
    new.add_argument("--network", choices=["none", "open"], default="none", help="the | network")
    new.add_argument("--mount", action="append", default=[], metavar="HOST:CONTAINER[:ro|rw]", help="*.x <y>")
    new.add_argument("--secret", help=argparse.SUPPRESS)
    return parser


def test_cli_reference_gives_each_command_an_anchor_usage_and_options() -> None:
    page = cli_reference.render(_small_parser())
    assert "## callbox {#callbox}" in page
    assert "### callbox box {#callbox-box}" in page
    assert "#### callbox box new {#callbox-box-new}" in page
    assert "Also spelled: `callbox box create`" in page
    assert "usage: callbox box new [-h] [--memory MEMORY]" in page
    assert "| `--memory MEMORY` | memory (default 512m) |  | `512m` |" in page
    assert "| `--network {none,open}` | the \\| network | `none`, `open` | `none` |" in page
    assert "| `--mount HOST:CONTAINER[:ro|rw]` | \\*.x \\<y\\> |  |  |" in page
    assert "| `name` | its name |  |  |" in page
    assert "--secret" not in page.split("```text")[-1].split("```")[-1]  # suppressed: not in the tables
    assert "[`callbox box new`](#callbox-box-new)" in page
    assert page.count("show this help message and exit") == 1  # -h is listed once, at the top


def test_cli_reference_covers_every_real_command() -> None:
    from harness.cli.main import build_parser

    parser = build_parser()
    page = cli_reference.render(parser)
    every = list(cli_reference.commands(parser))
    assert len(every) > 30
    names = {c.name for c in every}
    assert {"callbox sandbox new", "callbox exec", "callbox config check", "callbox approvals approve"} <= names
    for command in every:
        assert f"{command.name} {{#{command.anchor}}}" in page
        assert f"usage: {command.parser.prog}" in page


# --- policy and server configuration references -----------------------------------------------


class _Rule(BaseModel):
    action: str
    """allow, ask or deny."""


class _Tool(BaseModel):
    decision: str | None = None
    """The tool's decision."""
    rules: tuple[_Rule, ...] = ()
    """Its rules."""


class _Sandbox(BaseModel):
    model_config = ConfigDict(extra="forbid")

    memory: ByteSize = Field(default=512 << 20)
    """Memory; ``512m`` or bytes."""
    network: str = "none"
    """A :class:`~x.y.Network` name | or not."""


class _Policy(BaseModel):
    sandbox: _Sandbox = Field(default_factory=_Sandbox)
    """``[sandbox]``: the sandbox."""
    tools: dict[str, _Tool] = Field(default_factory=dict)
    """``[tools.NAME]``: per tool."""
    allowed: tuple[str, ...] | None = None
    """Exposed tools."""


def test_model_reference_lists_tables_and_keys_with_types_defaults_and_docs() -> None:
    tables = list(model_reference.walk(_Policy))
    assert [t.header for t in tables] == ["top level", "[sandbox]", "[tools.NAME]", "[[tools.NAME.rules]]"]
    keys = {k.dotted: k for t in tables for k in t.keys}
    assert set(keys) == {"allowed", "sandbox.memory", "sandbox.network", "tools.NAME.decision",
                         "tools.NAME.rules.action"}
    assert keys["sandbox.memory"].type.startswith("size")
    assert keys["sandbox.memory"].default == '`"512m"`'
    assert keys["allowed"].default == "absent" and keys["allowed"].type == "array of string"
    assert keys["tools.NAME.rules.action"].default == "required"
    page = model_reference.render(tables)
    assert "## `[sandbox]` {#sandbox}" in page
    assert '<a id="sandbox.network"></a>`network`' in page
    assert "A `Network` name \\| or not." in page  # the role is code, the pipe stays in its cell


def test_a_field_without_a_docstring_fails_naming_it() -> None:
    class Bare(BaseModel):
        documented: int = 1
        """Yes."""
        forgotten: int = 2

    with pytest.raises(model_reference.MissingDocstrings, match=r"Bare\.forgotten \(forgotten\)"):
        list(model_reference.walk(Bare))


def test_the_policy_and_config_references_document_every_key() -> None:
    for tables in (model_reference.policy_tables(), model_reference.config_tables()):
        assert all(k.doc for t in tables for k in t.keys)
    policy = {k.dotted for t in model_reference.policy_tables() for k in t.keys}
    assert {"sandbox.memory", "sandbox.mounts.source", "tools.NAME.rules.command", "budgets.max_tool_calls",
            "actions.NAME.rules.ports", "tool.arguments.NAME.type", "ray.address"} <= policy
    config = {k.dotted for t in model_reference.config_tables() for k in t.keys}
    assert {"doors.grpc.listen", "http.listen", "tls.cert", "service.keep_sandboxes", "pool.size",
            "quotas.memory", "profiles.NAME.quotas.live_sandboxes", "clients.NAME.profile", "log.format",
            "telemetry.otlp_endpoint"} <= config


# --- errors ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _ErrorKind:
    code: str
    meaning: str
    retry: bool
    fix: str
    exit_status: int
    grpc_status: str
    grpc_reason: str
    http_status: int
    mcp: str


@dataclass(frozen=True)
class _ExitStatus:
    status: int
    meaning: str


def _errors_module() -> types.ModuleType:
    module = types.ModuleType("stand_in_errors")
    module.ERRORS = (  # type: ignore[attr-defined]
        _ErrorKind("sandbox_not_found", "No sandbox has that id or name.", False, "List them with `callbox ps`.",
                   3, "NOT_FOUND", "SANDBOX_NOT_FOUND", 404, "isError result"),
        _ErrorKind("engine_unavailable", "No engine answers | at all.", True, "Start Docker.", 125, "UNAVAILABLE",
                   "ENGINE_UNAVAILABLE", 503, "JSON-RPC error"),
    )
    module.EXIT_STATUSES = (_ExitStatus(2, "usage error"), _ExitStatus(125, "callbox failed"))  # type: ignore[attr-defined]
    return module


def test_errors_table_anchors_each_code() -> None:
    module = _errors_module()
    page = errors_reference.render_errors(errors_reference.errors_of(module))
    assert ('| <a id="sandbox_not_found"></a>`sandbox_not_found` | No sandbox has that id or name. | no | '
            "List them with `callbox ps`. |") in page
    assert "| No engine answers \\| at all. | yes |" in page


def test_error_mapping_links_each_code_to_the_errors_table() -> None:
    errors = errors_reference.errors_of(_errors_module())
    page = errors_reference.render_mapping(errors, errors_page="../troubleshooting.md")
    assert ("| [`sandbox_not_found`](../troubleshooting.md#sandbox_not_found) | 3 | `NOT_FOUND` / "
            "`SANDBOX_NOT_FOUND` | 404 | isError result |") in page
    results_only = errors_reference.render_mapping((_ErrorKind("denied", "m", False, "f", 1, "", "", 200, "r"),
                                                    _ErrorKind("timed_out", "m", True, "f", 124, "DEADLINE_EXCEEDED",
                                                               "", 504, "r")), errors_page="")
    assert "| [`denied`](#denied) | 1 | none: in the call's result | 200 |" in results_only
    assert "| 124 | `DEADLINE_EXCEEDED` | 504 |" in results_only
    statuses = errors_reference.render_exit_statuses(errors_reference.exit_statuses_of(_errors_module()))
    assert '| <a id="exit-125"></a>`125` | callbox failed |' in statuses


def test_a_module_without_the_tables_fails() -> None:
    with pytest.raises(errors_reference.ErrorTableMissing, match="has no ERRORS table"):
        errors_reference.errors_of(types.ModuleType("empty"))


# --- benchmarks ------------------------------------------------------------------------------


def _fixture() -> bench_reference.BenchResults:
    return bench_reference.parse(json.loads(FIXTURE.read_text()), str(FIXTURE))


def test_bench_table_has_a_row_per_result() -> None:
    results = _fixture()
    page = bench_reference.render_table(results)
    body = [line for line in page.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(body) == len(results.rows) + 1
    assert "| 1b. command round trip (`true`), back to back | 1.12 ms / 1.40 ms |" in page
    assert "4b. host memory per idle sandbox \\| agent included" in page  # a pipe in a label stays in its cell
    assert "*measured 2026-12-06T10:00:00+00:00, on 2 CPUs, 24 GiB, Docker 20.10.24.*" in page


def test_bench_chart_is_svg_with_a_bar_per_row_with_a_baseline() -> None:
    results = _fixture()
    figure = bench_chart.render(results)
    svg = ET.fromstring(figure.split("\n", 1)[1].rsplit("</figure>", 1)[0])
    ns = {"s": "http://www.w3.org/2000/svg"}
    rows = svg.findall("s:g[@class='bench-row']", ns)
    compared = [r for r in results.rows if r.advantage is not None]
    assert len(rows) == len(compared) == len(results.rows) - 1  # row 6 has no baseline
    fills = [g.find("s:rect", ns).get("fill") for g in rows]  # type: ignore[union-attr]
    expected = [bench_chart.INFO if r.met is None else bench_chart.MET if r.met else bench_chart.MISSED
                for r in compared]
    assert fills == expected
    ticks = [g for g in rows if g.find("s:line[@class='bench-target']", ns) is not None]
    assert len(ticks) == sum(bench_chart.target_advantage(r) is not None for r in compared) == 8
    assert "currentColor" in figure and "http://" not in figure.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.parametrize(("target", "unit", "p50", "base", "want"), [
    ("p50 ≤ 1.2 ms", "ms", 2.0, 12.0, 10.0),
    (f"p50 ≤ 1.15{TIMES} baseline", "ms", 400.0, 300.0, 1 / 1.15),
    (f"≥ 1.5{TIMES} baseline", "MB/s", 800.0, 500.0, 1.5),
    ("p50 ≤ baseline p50 + 0.5 ms (bare 2 ms)", "ms", 2.4, 2.0, 2.0 / 2.5),
    ("≤ 20 MiB", "MiB", 29.0, 4.0, 0.2),
    ("≥ 600 calls/s", "calls/s", 610.0, 1200.0, 0.5),
    ("p99 ≤ 50 ms", "ms", 2.0, 3.0, None),
    ("— (info)", "ms", 2.0, 3.0, None),
])
def test_bench_chart_reads_p50_targets_as_ratios(target: str, unit: str, p50: float, base: float,
                                                 want: float | None) -> None:
    row = bench_reference.BenchRow("1", "1. x", p50, p50, unit, "b", base, None, target, None)
    got = bench_chart.target_advantage(row)
    assert got == pytest.approx(want) if want is not None else got is None


def test_bench_sections_say_when_there_are_no_results(tmp_path: Path) -> None:
    assert "make bench-docs" in bench_reference.generate_table(tmp_path)
    assert bench_chart.generate(tmp_path) == ""
    (tmp_path / "bench-results.json").write_text('{"rows": [{"key": "1"}]}')
    with pytest.raises(bench_reference.BenchResultsError, match=r"rows\[0\]: what is missing"):
        bench_reference.generate_table(tmp_path)


def test_bench_docs_keeps_the_rows_and_machine_without_the_samples(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    source = json.loads(FIXTURE.read_text()) | {"samples": {"x": [1.0] * 1000}, "markdown": "| table |"}
    (tmp_path / "in.json").write_text(json.dumps(source))
    assert bench_reference.main([str(tmp_path / "in.json"), str(tmp_path / "out.json")]) == 0
    kept = json.loads((tmp_path / "out.json").read_text())
    assert set(kept) == {"rows", "machine"} and kept["rows"] == source["rows"]
    assert "wrote" in capsys.readouterr().out
    (tmp_path / "bad.json").write_text("{}")
    assert bench_reference.main([str(tmp_path / "bad.json"), str(tmp_path / "out2.json")]) == 1
    assert not (tmp_path / "out2.json").exists()


# --- text -------------------------------------------------------------------------------------


def test_cells_keep_code_and_escape_the_rest() -> None:
    assert escape("a*b <c> `x*y`") == "a\\*b \\<c\\> `x*y`"
    assert cell("one\ntwo\n\nthree | `a|b`") == "one two<br>three \\| `a|b`"


def test_the_real_error_table_renders() -> None:
    import harness.core.errors as errors

    rows = errors_reference.errors_of(errors)
    assert len(rows) == len(errors.ERRORS)
    page = errors_reference.render_errors(rows)
    assert all(f'<a id="{row.code}"></a>' in page for row in rows)
    mapping = errors_reference.render_mapping(rows, errors_page="../troubleshooting.md")
    assert mapping.count("](../troubleshooting.md#") == len(rows)
    assert errors_reference.render_exit_statuses(errors_reference.exit_statuses_of(errors)).count("exit-") == len(
        errors.EXIT_STATUSES)


def test_bench_docs_writes_the_headline_rows_into_the_readme(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    start, end = bench_reference.SUMMARY_START, bench_reference.SUMMARY_END
    readme.write_text(f"# x\n\nHeadline rows:\n\n{start}\nSTALE-SUMMARY\n{end}\n\nend\n")
    (tmp_path / "in.json").write_text(FIXTURE.read_text())
    assert bench_reference.main([str(tmp_path / "in.json"), str(tmp_path / "out.json"), str(readme)]) == 0
    text = readme.read_text()
    summary = text.split(bench_reference.SUMMARY_START + "\n", 1)[1].split(bench_reference.SUMMARY_END, 1)[0]
    assert summary == bench_reference.render_summary(_fixture())
    assert "STALE-SUMMARY" not in text and text.endswith("\n\nend\n")
    assert len(summary.strip().splitlines()) == 2 + sum(r.met is not None for r in _fixture().rows)


def test_the_readme_summary_is_the_committed_results() -> None:
    """README.md's bench-summary lines hold what ``make bench-docs`` writes from the committed
    docs/bench-results.json (nothing while there is none)."""
    from tests.docs.test_site import ROOT

    readme = (ROOT / "README.md").read_text()
    if bench_reference.SUMMARY_START not in readme:
        pytest.skip("the README has no bench-summary lines")
    summary = readme.split(bench_reference.SUMMARY_START + "\n", 1)[1].split(bench_reference.SUMMARY_END, 1)[0]
    committed = ROOT / "docs" / bench_reference.RESULTS
    want = bench_reference.render_summary(bench_reference.load(ROOT / "docs")) if committed.exists() else ""
    assert summary == want, "README.md's bench summary is not docs/bench-results.json's: run make bench-docs"
