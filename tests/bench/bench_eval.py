"""``callbox eval``'s throughput: tasks per minute with the warm pool and N trials at a time,
against the same tasks one by one with every sandbox started cold, in one run (row 29). The row
also gives how many of the pooled eval's sandboxes were claims (the others started cold, the pool
being empty at that moment).

Each sample is a whole eval (:func:`harness.eval.runner.run_eval`, as ``callbox eval`` runs
it) of ``TASKS`` small tasks with the scripted model: a project of one file copied into the
sandbox, one shell call, a final answer and one acceptance check, so each task is a sandbox
start, a copy, two model turns, two calls and the audit. The pooled eval is timed from its
start, its pool filling while the first trials claim (as a real eval's does), to the end
of its last trial; removals and the pool's close are not timed (waited for between
samples). The two sides alternate. Everything started is removed before it returns.

Run as section ``eval`` of ``python -m tests.bench.bench_exec --only eval --json X``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.audit.store import AuditStore
from harness.core.policy import load_policy
from harness.engine.docker.engine import DockerEngine
from harness.eval.results import ResultsLog
from harness.eval.runner import EvalRun, run_eval
from harness.eval.tasks import EvalTask, load_tasks
from harness.models.factory import make_model
from tests.bench.bench_living import Resources, Toolkit, heavy_samples
from tests.bench.bench_results import p50
from tests.conftest import IMAGE

TASKS = 12
CONCURRENCY = 2
"""Trials at once: this machine's CPUs (2); more only queue for them."""
DRAIN_S = 120.0
TRANSCRIPT = ('{"text": "Copying.", "tool_calls": [{"name": "shell", "arguments": {"command": '
              '"tr a-z A-Z < in.txt > out.txt"}}]}\n{"text": "out.txt holds it in capitals."}\n')


def _task_file(root: Path, count: int) -> Path:
    (root / "project").mkdir()
    (root / "project" / "in.txt").write_text("hello\n")
    (root / "transcripts").mkdir()
    lines = []
    for n in range(count):
        lines.append(f'[[task]]\nid = "t{n}"\ninstruction = "Write in.txt in capitals into out.txt."\n'
                     'project = "project"\nacceptance = [{ command = "grep -qx HELLO out.txt", timeout_s = 10 }]\n')
        (root / "transcripts" / f"t{n}.jsonl").write_text(TRANSCRIPT)
    (root / "tasks.toml").write_text("\n".join(lines))
    return root / "tasks.toml"


def one_eval(client: Any, root: Path, tasks: list[EvalTask], *, pool: bool, concurrency: int) -> tuple[float, int]:
    """Tasks per minute of one eval of ``tasks`` (all must pass), and how many of its sandboxes
    were claims from the pool (the others started cold); its sandboxes removed after."""
    work = Path(tempfile.mkdtemp(prefix="cbx-beval-", dir="/tmp"))
    engine = DockerEngine(client, run_root=work / "run", reap_on_start=False)
    policy = load_policy(None)
    policy = policy.model_copy(update={"sandbox": policy.sandbox.model_copy(update={"image": IMAGE})})
    try:
        with AuditStore(work / "audit.db") as audit:
            results = ResultsLog(work / "out", {"transcripts": str(root / "transcripts")}, resume=False)
            settings = EvalRun(tasks=tasks, model_for=lambda task, _trial: make_model(
                f"scripted:{root / 'transcripts' / (task.id + '.jsonl')}"), policy=policy, audit=audit,
                results=results, connect=lambda: engine, concurrency=concurrency, pool=pool)
            began = time.perf_counter()
            run_eval(settings)  # its end closes the pool (the removals run in the background)
            elapsed = time.perf_counter() - began
            warm = getattr(engine, "pool", None)
            claims = warm.claims if warm is not None else 0
            failed = [r for r in results.results if not r.passed]
            if len(results.results) != len(tasks) or failed:
                raise RuntimeError(f"the eval did not pass every task: {failed or results.results}")
        return len(tasks) / elapsed * 60, claims
    finally:
        engine.drain(DRAIN_S)
        shutil.rmtree(work, ignore_errors=True)


def measure(client: Any, samples: int, progress: Callable[[str], None], *, tasks: int = TASKS,
            concurrency: int = CONCURRENCY) -> dict[str, list[float]]:
    """``eval_pooled`` (warm pool, ``concurrency`` at a time) and ``eval_serial`` (one by one,
    cold), tasks per minute, alternating which goes first."""
    root = Path(tempfile.mkdtemp(prefix="cbx-bevaltasks-", dir="/tmp"))
    try:
        task_list = load_tasks(_task_file(root, tasks))
        pooled: list[float] = []
        serial: list[float] = []
        claims: list[float] = []
        progress(f"eval: {tasks} tasks, warm pool and {concurrency} at a time vs one by one cold, "
                 f"{samples} evals each")
        for index in range(samples + 1):  # the first pair warms up
            sides = [(pooled, True, concurrency), (serial, False, 1)]
            for into, pool, n in sides if index % 2 == 0 else reversed(sides):
                rate, claimed = one_eval(client, root, task_list, pool=pool, concurrency=n)
                if index:
                    into.append(rate)
                    if pool:
                        claims.append(float(claimed))
        return {"eval_pooled": pooled, "eval_serial": serial, "eval_claims": claims}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_eval(res: Resources, samples: int, kit: Toolkit, *, quick: bool = False) -> dict[str, list[float]]:
    """Row 29 of ``make bench`` (section ``eval``)."""
    return measure(res.engine.client, 2 if quick else heavy_samples(samples), kit.progress)


def add_eval_rows(data: dict[str, list[float]], add: Callable[..., None]) -> None:
    """Row 29 (``add`` takes ``Row``'s arguments)."""
    if "eval_pooled" not in data:
        return
    pooled, serial = data["eval_pooled"], data["eval_serial"]
    claimed = p50(data["eval_claims"]) if data.get("eval_claims") else 0.0
    add(f"29. `callbox eval`: {TASKS} tasks (copy a project, 2 turns, 1 call, 1 acceptance check), warm pool, "
        f"{CONCURRENCY} at a time ({len(pooled)} evals; p50 {claimed:.0f} of {TASKS} sandboxes claimed)", "ops",
        pooled, f"the same tasks one by one, every sandbox cold (p50 {p50(serial):.0f} tasks/min)", serial,
        "— (info)", unit="tasks/min", extra={"claimed_p50": claimed, "tasks": TASKS, "concurrency": CONCURRENCY})
