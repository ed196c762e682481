"""``callbox eval``'s pure parts: the task file and its errors, pass@k, the results log that
``--resume`` relies on, the table and the HTML report."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from harness.audit.store import AuditStore
from harness.cli.main import main
from harness.core.calls import ToolResult
from harness.core.errors import UsageError
from harness.eval.report import html_report, json_report, table
from harness.eval.results import ResultsLog
from harness.eval.scoring import TrialResult, pass_at_k, passed, summarize
from harness.eval.tasks import TaskFileError, load_tasks

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval"


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _result(task: str, trial: int, ok: bool, **extra: object) -> TrialResult:
    fields: dict[str, object] = dict(task=task, trial=trial, run_id=f"run-{task}-{trial}",
                                     reason="final:accepted" if ok else "rejected:acceptance", passed=ok, turns=2,
                                     tool_calls=1, input_tokens=100, output_tokens=10, cost_usd=None, seconds=1.5)
    fields.update(extra)
    return TrialResult.model_validate(fields)


# ---- the task file ----------------------------------------------------------------------------


def test_the_examples_task_file_loads_with_absolute_project_dirs() -> None:
    tasks = load_tasks(EXAMPLE / "tasks.toml")
    assert [t.id for t in tasks] == ["fix-add", "write-greeting", "count-notes", "sort-notes"]
    assert tasks[0].project.dir == EXAMPLE / "projects" / "calc"
    assert tasks[1].project.dir is None
    assert tasks[0].loop_settings() == {"acceptance": [{"command": "python3 -m unittest -q test_calc",
                                                        "workdir": None, "timeout_s": 60.0, "expect_exit": 0}],
                                        "max_turns": 6}
    assert tasks[2].loop_settings()["max_rejections"] == 0
    for task in tasks:  # every task has its transcript
        assert (EXAMPLE / "transcripts" / f"{task.id}.jsonl").is_file()


def test_jsonl_and_toml_read_into_the_same_tasks(tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    toml = _write(tmp_path / "t.toml", '[[task]]\nid = "a"\ninstruction = "do it"\nproject = "proj"\n'
                  'acceptance = [{ command = "true", expect_exit = 0 }]\ntimeout_s = 30\n'
                  '[[task]]\nid = "b"\ninstruction = "x"\nproject = { image = "other:1" }\n')
    jsonl = _write(tmp_path / "t.jsonl", "# a comment\n\n"
                   + json.dumps({"id": "a", "instruction": "do it", "project": {"dir": "proj"},
                                 "acceptance": [{"command": "true"}], "timeout_s": 30}) + "\n"
                   + json.dumps({"id": "b", "instruction": "x", "project": {"image": "other:1"}}) + "\n")
    assert load_tasks(toml) == load_tasks(jsonl)
    assert load_tasks(toml)[0].project.dir == tmp_path / "proj"


@pytest.mark.parametrize(("name", "text", "message"), [
    ("t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nmax_turns = 0\n',
     "task 'a' (task 1): key 'max_turns': 0 is below the minimum of 1"),
    ("t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nacceptance = [{ command = "true", timeout = 5 }]\n',
     "task 'a' (task 1): unexpected key 'acceptance[0].timeout' (allowed: command, workdir, timeout_s"),
    ("t.toml", '[[task]]\nid = "a"\n', "task 'a' (task 1): missing required key 'instruction'"),
    ("t.toml", '[[task]]\nid = "a b"\ninstruction = "x"\n', "is not a task id"),
    ("t.toml", '[[task]]\nid = "a"\ninstruction = "x"\n[[task]]\nid = "a"\ninstruction = "y"\n',
     "task 'a' (task 2): id 'a' is already the id of task 'a' (task 1)"),
    ("t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nproject = { image = "i", template = "t" }\n',
     "give image or template, not both"),
    ("t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nproject = "nowhere"\n',
     "task 'a' (task 1): key 'project.dir':"),
    ("t.toml", '[task]\nid = "a"\n', "write [[task]] above each task"),
    ("t.toml", 'tasks = 1\n', "unexpected key 'tasks' at the top level"),
    ("t.toml", '[[task]\n', "not valid TOML"),
    ("t.jsonl", '{"id": "a", "instruction": "x"}\n{"id": \n', "line 2: not valid JSON"),
    ("t.jsonl", '[1]\n', "line 1: a task is an object"),
    ("t.jsonl", '\n# nothing\n', "holds no task"),
    ("t.json", '{}', "a task file is .jsonl"),
])
def test_a_bad_task_file_names_the_task_and_the_key(tmp_path: Path, name: str, text: str, message: str) -> None:
    path = _write(tmp_path / name, text)
    with pytest.raises(TaskFileError) as caught:
        load_tasks(path)
    assert str(path) in caught.value.message
    assert message in caught.value.message, caught.value.message


def test_a_task_file_error_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(tmp_path / "t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nmax_turns = "many"\n')
    assert main(["eval", str(path), "--transcripts", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("callbox: ") and "\n" not in err and "task 'a'" in err and "max_turns" in err


def test_a_task_without_a_transcript_is_refused_before_anything_runs(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "tr").mkdir()
    _write(tmp_path / "tr" / "a.jsonl", '{"text": "done"}\n')
    path = _write(tmp_path / "t.toml", '[[task]]\nid = "a"\ninstruction = "x"\n[[task]]\nid = "b"\ninstruction = "y"\n')
    assert main(["eval", str(path), "--transcripts", str(tmp_path / "tr"), "--out", str(tmp_path / "out")]) == 2
    assert "no transcript for task 'b'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# ---- scoring ----------------------------------------------------------------------------------


def _brute_pass_at_k(n: int, c: int, k: int) -> float:
    """The share of the k-subsets of n trials (c passing) holding at least one pass."""
    trials = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(trials[i] for i in s) for s in subsets) / len(subsets)


@pytest.mark.parametrize(("n", "c", "k"), [(n, c, k) for n in range(1, 7) for c in range(n + 1)
                                           for k in range(1, n + 1)])
def test_pass_at_k_is_the_unbiased_estimator(n: int, c: int, k: int) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(_brute_pass_at_k(n, c, k))


def test_pass_at_k_known_values_and_bad_input() -> None:
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    assert pass_at_k(5, 0, 3) == 0.0
    assert pass_at_k(5, 3, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_what_passes() -> None:
    assert passed("final:accepted", has_checks=True)
    assert not passed("final", has_checks=True)
    assert passed("final", has_checks=False)
    for reason in ("rejected:acceptance", "max_turns", "budget:cost", "approval_pending", "error:model"):
        assert not passed(reason, has_checks=True) and not passed(reason, has_checks=False)


def test_summary_pass_at_1_and_k() -> None:
    results = [_result("a", 1, True), _result("a", 2, False), _result("b", 1, False), _result("b", 2, False),
               _result("c", 1, True)]
    summary = summarize(["a", "b", "c", "d"], results, 2)
    assert [(s.task, s.trials, s.passes) for s in summary.tasks] == [("a", 2, 1), ("b", 2, 0), ("c", 1, 1),
                                                                      ("d", 0, 0)]
    assert summary.pass_at_1 == pytest.approx((0.5 + 0 + 1) / 3)  # tasks that ran
    assert summary.pass_at_k == pytest.approx((1.0 + 0.0) / 2)  # a and b: c has 1 of 2 trials
    assert summary.short == 1 and summary.trials == 5 and summary.passes == 2
    assert summarize(["a"], [_result("a", 1, True)], 1).pass_at_k is None


# ---- the results log (--resume) ---------------------------------------------------------------


def test_results_are_kept_as_they_finish_and_read_back_on_resume(tmp_path: Path) -> None:
    out = tmp_path / "out"
    identity = {"model": None, "transcripts": "/t", "tasks": "/x.toml"}
    log = ResultsLog(out, identity, resume=False)
    log.add(_result("a", 1, True))
    log.add(_result("b", 1, False))
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    again = ResultsLog(out, identity, resume=True)
    assert again.done() == {("a", 1), ("b", 1)}
    assert again.results == log.results


def test_a_line_cut_short_is_dropped_and_its_trial_runs_again(tmp_path: Path) -> None:
    out = tmp_path / "out"
    identity = {"model": "openai:x", "transcripts": None}
    log = ResultsLog(out, identity, resume=False)
    log.add(_result("a", 1, True))
    with (out / "results.jsonl").open("a") as handle:
        handle.write(_result("b", 1, True).model_dump_json()[:40])  # killed while writing
    again = ResultsLog(out, identity, resume=True)
    assert again.done() == {("a", 1)}
    again.add(_result("b", 1, True))
    assert ResultsLog(out, identity, resume=True).done() == {("a", 1), ("b", 1)}


def test_a_broken_line_before_the_last_is_an_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    identity = {"model": "openai:x", "transcripts": None}
    ResultsLog(out, identity, resume=False).add(_result("a", 1, True))
    text = (out / "results.jsonl").read_text()
    (out / "results.jsonl").write_text("garbage\n" + text)
    with pytest.raises(UsageError, match="line 1 is not a trial's result"):
        ResultsLog(out, identity, resume=True)


def test_resume_refuses_another_model_and_a_new_eval_refuses_old_results(tmp_path: Path) -> None:
    out = tmp_path / "out"
    ResultsLog(out, {"model": "openai:x", "transcripts": None}, resume=False).add(_result("a", 1, True))
    with pytest.raises(UsageError, match="used model 'openai:x', not 'openai:y'"):
        ResultsLog(out, {"model": "openai:y", "transcripts": None}, resume=True)
    with pytest.raises(UsageError, match="continue it with --resume"):
        ResultsLog(out, {"model": "openai:x", "transcripts": None}, resume=False)
    with pytest.raises(UsageError, match="holds no eval to continue"):
        ResultsLog(tmp_path / "empty", {"model": "openai:x"}, resume=True)


# ---- reports ----------------------------------------------------------------------------------


def test_the_table_has_a_row_per_task_and_the_totals() -> None:
    results = [_result("fix-add", 1, True, cost_usd=0.01), _result("fix-add", 2, True, cost_usd=0.03),
               _result("count", 1, False), _result("count", 2, True)]
    text = table(summarize(["fix-add", "count", "later"], results, 2))
    lines = text.splitlines()
    assert lines[0].split() == ["TASK", "PASS", "TURNS", "TOOL", "CALLS", "TOKENS", "IN/OUT", "COST", "TIME"]
    assert lines[1].split() == ["fix-add", "2/2", "2", "1", "100/10", "$0.0200", "1.5", "s"]
    assert lines[2].split()[:2] == ["count", "1/2"] and lines[3].split()[:2] == ["later", "not", "run"][:2]
    assert "pass@1 75.0% (3 of 4 trials passed)" in text
    assert "pass@2 100.0%" in text


def test_the_json_report(tmp_path: Path) -> None:
    results = [_result("a", 1, True), _result("b", 1, False)]
    report = json_report(summarize(["a", "b"], results, 1), results, {"tasks": "/t.toml"})
    assert report["summary"]["pass_at_1"] == 0.5 and report["summary"]["pass_at_k"] is None
    assert [t["task"] for t in report["tasks"]] == ["a", "b"] and report["tasks"][0]["pass_rate"] == 1.0
    assert report["trials"][1]["reason"] == "rejected:acceptance"
    json.dumps(report)


def test_the_html_report_is_self_contained_and_draws_the_trajectory(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "audit.db") as audit:
        run_id = audit.start_run()
        audit.claim_call(run_id, "call_1", "shell", {"command": "echo <b>hi</b>"})
        audit.finish_call(run_id, "call_1", ToolResult("call_1", "Exit code: 0\n<script>alert(1)</script>"),
                          decision=None, exit_code=0, duration_ms=12.0, bytes_out=10, truncated=False)
        audit.end_run(run_id, "final:accepted")
        results = [_result("a&b", 1, True, run_id=run_id, final_text="done <i>now</i>"),
                   _result("c", 1, False, run_id="gone-run", message="the checks said no")]
        page = html_report(summarize(["a&b", "c", "d"], results, 1), results,
                           {"tasks": "/x/tasks.toml", "transcripts": "/x/tr"}, audit)
    assert page.startswith("<!doctype html>") and "<style>" in page
    assert "<script" not in page and "<link" not in page  # no script, no stylesheet from elsewhere
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing from the network
    assert page.count("<svg") >= 2 and "Pass rate per task" in page and "Wall time per task" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page  # the audit's text is escaped
    assert "done &lt;i&gt;now&lt;/i&gt;" in page and "a&amp;b" in page
    assert "call_1" in page and "echo &lt;b&gt;hi&lt;/b&gt;" in page
    assert "no run gone-run any more" in page and "the checks said no" in page
    assert "Not run yet." in page  # task d


# ---- a task's sandbox, the progress lines ------------------------------------------------------


def test_a_tasks_spec_takes_its_image_or_mounts_its_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.engine.spec import SandboxSpec
    from harness.eval.runner import task_spec, template_of

    (tmp_path / "proj").mkdir()
    (tmp_path / "proj").chmod(0o777)  # writable by the tool user, as a rw mount must be
    base = SandboxSpec(image="callbox-sandbox:latest")
    toml = _write(tmp_path / "t.toml", '[[task]]\nid = "a"\ninstruction = "x"\nproject = "proj"\n'
                  '[[task]]\nid = "b"\ninstruction = "x"\n'
                  'project = { dir = "proj", how = "mount", image = "other:1" }\n'
                  '[[task]]\nid = "c"\ninstruction = "x"\nproject = { template = "no-such-template" }\n')
    copied, mounted, templated = load_tasks(toml)
    monkeypatch.setenv("CALLBOX_TEMPLATE_DIR", str(tmp_path / "templates"))
    assert task_spec(copied, base) == base  # copied after the claim: the pooled spec
    spec = task_spec(mounted, base)
    assert spec.image == "other:1"
    assert [(m.source, m.target, m.read_only) for m in spec.mounts] == [(tmp_path / "proj", base.workdir, False)]
    with pytest.raises(Exception, match="no built template 'no-such-template'"):
        template_of(templated)


def test_progress_without_a_terminal_prints_a_line_per_trial() -> None:
    import io

    from harness.eval.progress import Progress

    stream = io.StringIO()
    with Progress(3, done=1, passes=1, stream=stream) as progress:
        progress.started("b", 1)
        progress.finished(_result("b", 1, False))
        progress.finished(_result("c", 1, True))
    assert stream.getvalue().splitlines() == [
        "eval: 2/3 · 1 pass · 1 fail · b #1 fail (rejected:acceptance, 2 turns, 1.5 s)",
        "eval: 3/3 · 2 pass · 1 fail · c #1 pass (final:accepted, 2 turns, 1.5 s)"]


def test_progress_on_a_terminal_draws_a_bar_with_the_counts() -> None:
    import io

    from harness.eval.progress import Progress

    stream = io.StringIO()
    with Progress(2, stream=stream, live=True) as progress:
        progress.finished(_result("a", 1, True))
        progress.finished(_result("b", 1, False))
    drawn = stream.getvalue()
    assert "2/2" in drawn and "1 pass" in drawn and "1 fail" in drawn


def test_trial_k_replays_its_own_transcript_when_there_is_one(tmp_path: Path) -> None:
    import argparse

    from harness.cli.eval import _model_factory

    folder = tmp_path / "tr"
    folder.mkdir()
    _write(folder / "a.jsonl", '{"text": "every trial"}\n')
    _write(folder / "a.2.jsonl", '{"text": "trial 2"}\n')
    tasks = load_tasks(_write(tmp_path / "t.toml", '[[task]]\nid = "a"\ninstruction = "x"\n'))
    args = argparse.Namespace(model=None, transcripts=folder, trials=3, base_url=None)
    model_for = _model_factory(args, tasks)
    assert [model_for(tasks[0], k).turns[0].text for k in (1, 2, 3)] == ["every trial", "trial 2", "every trial"]
    _write(folder / "a.3.jsonl", '{"text": "broken"\n')
    with pytest.raises(UsageError, match=r"--transcripts: .*a\.3\.jsonl"):
        _model_factory(args, tasks)
