"""A trial's result, whether it passed, and the eval's totals: pass@1 and pass@k.

A trial passes when its run ends ``final:accepted`` (every acceptance check passed), or
``final`` for a task without checks. Every other end fails it: ``rejected:acceptance``
(the checks rejected ``max_rejections`` final answers), a limit (``max_turns``,
``budget:*``, ``loop_detected``), a pause for an approval (``approval_pending``: nobody
answers it during an eval) or an error (``error:*``, e.g. a transcript that ran out).

pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large Language Models
Trained on Code"): for a task with ``n`` trials of which ``c`` passed,
``1 - C(n - c, k) / C(n, k)``, the chance that at least one of ``k`` trials drawn from the
``n`` passes; the eval's pass@k is its mean over the tasks. pass@1 is then the mean pass
rate. A task with fewer than ``k`` finished trials is left out of pass@k (and counted).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

__all__ = ["PASSING", "Summary", "TaskScore", "TrialResult", "pass_at_k", "passed", "summarize"]

PASSING = ("final:accepted",)
"""End reasons that pass a task with acceptance checks."""


def passed(reason: str, *, has_checks: bool) -> bool:
    """Whether a run that ended ``reason`` passes its task."""
    return reason in PASSING if has_checks else reason in (*PASSING, "final")


class TrialResult(BaseModel):
    """One finished trial of one task: a line of ``results.jsonl``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    """The task's id."""
    trial: int
    """Which trial of the task, from 1."""
    run_id: str
    """The run in the audit store (its calls are the trajectory)."""
    reason: str
    """How the run ended (``final:accepted``, ``rejected:acceptance``, ``max_turns``, ...)."""
    passed: bool
    """Whether the task passed (see the module docstring)."""
    turns: int
    """Model turns."""
    tool_calls: int
    """Tool calls the model made."""
    input_tokens: int
    """Input tokens the model reported."""
    output_tokens: int
    """Output tokens the model reported."""
    cost_usd: float | None
    """Cost the model reported (None: it reports none)."""
    seconds: float
    """Wall time of the trial: its sandbox's start, the project's copy and the run."""
    final_text: str = ""
    """The model's last answer."""
    message: str = ""
    """Why the run stopped, for a person (empty when it simply ended)."""
    finished: float = 0.0
    """When the trial ended (Unix time)."""


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of a task with ``n`` trials, ``c`` of them passing (``k <= n``)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@dataclass(frozen=True)
class TaskScore:
    """A task's trials, summed."""

    task: str
    trials: int
    passes: int
    turns: float
    """Mean turns per trial (likewise tool calls, tokens, cost and seconds)."""
    tool_calls: float
    input_tokens: float
    output_tokens: float
    cost_usd: float | None
    seconds: float

    @property
    def rate(self) -> float:
        return self.passes / self.trials if self.trials else 0.0


@dataclass(frozen=True)
class Summary:
    """The eval's totals."""

    tasks: tuple[TaskScore, ...]
    k: int
    """The trials asked per task."""
    pass_at_1: float
    pass_at_k: float | None
    """None when k is 1 or no task has k finished trials."""
    short: int
    """Tasks left out of pass@k for having fewer than k finished trials."""
    trials: int
    passes: int
    seconds: float
    """Sum of the trials' wall times."""
    cost_usd: float | None


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(task_ids: Iterable[str], results: Iterable[TrialResult], k: int) -> Summary:
    """Per task (in ``task_ids``' order, tasks without a finished trial included) and in total."""
    by_task: dict[str, list[TrialResult]] = {task: [] for task in task_ids}
    for result in results:
        by_task.setdefault(result.task, []).append(result)
    scores = []
    for task, trials in by_task.items():
        costs = [t.cost_usd for t in trials if t.cost_usd is not None]
        scores.append(TaskScore(
            task=task, trials=len(trials), passes=sum(t.passed for t in trials),
            turns=_mean([t.turns for t in trials]), tool_calls=_mean([t.tool_calls for t in trials]),
            input_tokens=_mean([t.input_tokens for t in trials]),
            output_tokens=_mean([t.output_tokens for t in trials]),
            cost_usd=_mean(costs) if costs else None, seconds=_mean([t.seconds for t in trials])))
    ran = [s for s in scores if s.trials]
    full = [s for s in ran if s.trials >= k]
    at_k = _mean([pass_at_k(s.trials, s.passes, k) for s in full]) if k > 1 and full else None
    every = [t for trials in by_task.values() for t in trials]
    costs = [t.cost_usd for t in every if t.cost_usd is not None]
    return Summary(tasks=tuple(scores), k=k, pass_at_1=_mean([s.rate for s in ran]), pass_at_k=at_k,
                   short=len(ran) - len(full) if k > 1 else 0, trials=len(every), passes=sum(t.passed for t in every),
                   seconds=sum(t.seconds for t in every), cost_usd=sum(costs) if costs else None)
