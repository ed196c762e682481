"""``callbox eval`` for real: the examples' tasks (and one slow task put first) with the
scripted model, two at a time from the warm pool; Ctrl-C in the middle leaves no sandbox
behind, and ``--resume`` runs only what had not finished. The acceptance checks run in the
sandboxes; two example tasks pass and two fail, as their transcripts are written to.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.engine.docker import labels

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "eval"
SLOW = '{"text": "Waiting.", "tool_calls": [{"name": "shell", "arguments": {"command": "sleep 25"}}]}\n'
QUICK = ('{"text": "Done.", "tool_calls": [{"name": "write_file", '
         '"arguments": {"path": "done.txt", "content": "ok"}}]}\n{"text": "done.txt is written."}\n')


def _default_sigint() -> None:
    # A background job of a shell without job control starts with SIGINT ignored; callbox's
    # own handling of Ctrl-C is what is tested.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _eval(*args: str) -> list[str]:
    return [sys.executable, "-m", "harness.cli.main", "eval", *args]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _wait_until(what: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"callbox eval ended ({proc.returncode}) first: {out!r} {err!r}")
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _sandboxes_of(engine: Any, pid: int) -> list[str]:
    found = []
    for container in engine.client.containers.list(all=True, filters={"label": labels.MANAGED}, ignore_removed=True):
        owner = labels.Owner.parse(container.labels.get(labels.OWNER, ""))
        if owner is not None and owner.pid == pid and labels.SANDBOX_ID in container.labels:
            found.append(container.labels[labels.SANDBOX_ID])
    return found


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """The examples' eval with a slow task first (its transcript sleeps until interrupted)."""
    shutil.copytree(EXAMPLE, tmp_path / "eval")
    tasks = tmp_path / "eval" / "tasks.toml"
    tasks.write_text('[[task]]\nid = "slow"\ninstruction = "Write done.txt."\n'
                     'acceptance = [{ command = "test -f done.txt", timeout_s = 10 }]\n\n' + tasks.read_text())
    (tmp_path / "eval" / "transcripts" / "slow.jsonl").write_text(SLOW)
    return tmp_path / "eval"


@pytest.fixture
def started(engine: Any) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
            for sandbox_id in _sandboxes_of(engine, proc.pid):
                engine.destroy(sandbox_id)
        engine.drain(30)


def test_an_eval_interrupted_and_resumed_runs_each_trial_once(workdir: Path, tmp_path: Path, engine: Any,
                                                               started: list[subprocess.Popen[bytes]]) -> None:
    out = tmp_path / "out"
    args = [str(workdir / "tasks.toml"), "--transcripts", str(workdir / "transcripts"), "--concurrency", "2",
            "--out", str(out)]
    proc = subprocess.Popen(_eval(*args), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_sigint)
    started.append(proc)
    # "slow" holds one of the two workers; once the other has finished two tasks, interrupt.
    _wait_until(lambda: len(_lines(out / "results.jsonl")) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, stderr)
    err = stderr.decode()
    assert "Traceback" not in err
    assert "continue with: callbox eval" in err and "--resume" in err
    assert _sandboxes_of(engine, proc.pid) == []  # the trials' and the pool's sandboxes are gone
    before = _lines(out / "results.jsonl")
    assert "slow" not in {r["task"] for r in before} and 2 <= len(before) < 5
    assert b"TASK" in stdout and (out / "report.html").is_file()  # what finished is reported

    (workdir / "transcripts" / "slow.jsonl").write_text(QUICK)  # the interrupted trial now finishes
    resumed = subprocess.run(_eval(*args, "--resume"), stdin=subprocess.DEVNULL, capture_output=True, timeout=180)
    assert resumed.returncode == 0, (resumed.stdout, resumed.stderr)
    assert f"resuming: {len(before)} of 5 trials already finished".encode() in resumed.stderr
    after = _lines(out / "results.jsonl")
    assert after[:len(before)] == before  # nothing finished ran again
    assert sorted((r["task"], r["trial"]) for r in after) == sorted(
        (t, 1) for t in ("slow", "fix-add", "write-greeting", "count-notes", "sort-notes"))
    ends = {r["task"]: (r["passed"], r["reason"]) for r in after}
    assert ends == {"slow": (True, "final:accepted"), "fix-add": (True, "final:accepted"),
                    "write-greeting": (True, "final:accepted"), "count-notes": (False, "rejected:acceptance"),
                    "sort-notes": (False, "max_turns")}
    table = resumed.stdout.decode()
    assert "pass@1 60.0% (3 of 5 trials passed)" in table
    report = json.loads((out / "report.json").read_text())
    assert report["summary"]["passes"] == 3 and report["summary"]["trials"] == 5

    with AuditStore(out / "audit.db", create=False) as audit:
        runs = [r for r in audit.list_runs(limit=100) if r.meta.get("eval", {}).get("task") == "slow"]
        assert sorted(r.end_reason or "" for r in runs) == ["error:interrupted", "final:accepted"]
        passed_run = next(r for r in after if r["task"] == "fix-add")["run_id"]
        calls = audit.calls_for_run(passed_run)
        assert [c["exit_code"] for c in calls if str(c["call_id"]).startswith("accept-")] == [0]
    page = (out / "report.html").read_text()
    assert passed_run in page and "python3 -m unittest -q test_calc" in page
    assert os.path.getsize(out / "report.html") > 10_000
