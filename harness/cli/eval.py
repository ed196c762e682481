"""``callbox eval TASKS``: every task of a task file run by the agent loop in a sandbox of
its own, scored by its acceptance checks (:mod:`harness.eval`).

``--model PROVIDER:NAME`` asks a real model; ``--transcripts DIR`` replays a scripted one:
trial K of task ID replays ``DIR/ID.K.jsonl`` when that file exists, else ``DIR/ID.jsonl``
(so one transcript serves every trial, and a trial can have its own). A task without a
transcript is a usage error before anything starts.

Progress goes to stderr; the results table to stdout; ``OUT/report.json`` and
``OUT/report.html`` are written at the end (also after Ctrl-C, with what had finished).
Ctrl-C stops the eval (no sandbox is left behind) and prints the command that continues it
(``--resume``: the trials already finished do not run again).

Exit status: 0 when every trial ran to its end (passing or failing: the table says which);
130 or 143 when interrupted; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

from harness.cli.options import engine_options, policy_engine, say
from harness.cli.run import DEFAULT_SYSTEM, loop_config
from harness.core.errors import CallboxError, UsageError

COMMANDS = ("eval",)


def add_parsers(sub: Any) -> None:
    ev = sub.add_parser(
        "eval", help="run a task file's tasks, each in its own sandbox, and score them by their checks",
        epilog="exit status: 0 every trial ran (see the table for pass or fail), 130 interrupted (continue with "
               "--resume), 2 bad usage",
    )
    ev.add_argument("tasks", type=Path, metavar="TASKS", help="task file: .jsonl (a task per line) or .toml ([[task]])")
    source = ev.add_mutually_exclusive_group(required=True)
    source.add_argument("--model", help="PROVIDER:NAME, e.g. openai:gpt-5, openai-chat:NAME, anthropic:NAME")
    source.add_argument("--transcripts", type=Path, metavar="DIR",
                        help="replay a scripted model: DIR/<task id>.jsonl (or DIR/<task id>.<trial>.jsonl)")
    ev.add_argument("--base-url", help="API base URL (OpenAI-compatible servers: vLLM, llama.cpp, Ollama)")
    ev.add_argument("--concurrency", type=int, default=1, metavar="N", help="trials running at once (default 1)")
    ev.add_argument("--trials", type=int, default=1, metavar="K",
                    help="trials per task (default 1); with K > 1 the table gives pass@K")
    ev.add_argument("--out", type=Path, metavar="DIR",
                    help="where results and reports go (default ./eval-<task file name>)")
    ev.add_argument("--resume", action="store_true",
                    help="continue the eval in --out: the trials it finished do not run again")
    ev.add_argument("--no-pool", action="store_true",
                    help="start every sandbox cold (default: claim them from a warm pool of --concurrency "
                         "sandboxes, or the policy's [pool])")
    ev.add_argument("--max-turns", type=int, help="model turns at most, for tasks that set none (default 50)")
    ev.add_argument("--system", default=DEFAULT_SYSTEM, help="system prompt")
    ev.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    ev.add_argument("--audit-db", type=Path, help="audit store of the runs (default OUT/audit.db)")
    engine_options(ev)


def run(args: argparse.Namespace) -> int:
    from harness.audit.store import AuditStore
    from harness.core.policy import load_policy
    from harness.eval.progress import Progress
    from harness.eval.report import table, write_reports
    from harness.eval.results import ResultsLog
    from harness.eval.runner import EvalRun, run_eval
    from harness.eval.scoring import summarize
    from harness.eval.tasks import load_tasks

    if args.concurrency < 1:
        raise UsageError(f"--concurrency {args.concurrency}: run at least 1 trial at a time")
    if args.trials < 1:
        raise UsageError(f"--trials {args.trials}: give at least 1 trial per task")
    if args.base_url is not None and args.model is None:
        raise UsageError("--base-url is for --model (an OpenAI-compatible server); the transcripts need none")
    options = {"max_turns": args.max_turns} if args.max_turns is not None else {}
    loop_config(options)  # a bad value is a usage error before anything starts
    tasks = load_tasks(args.tasks)
    model_for = _model_factory(args, tasks)
    out = args.out if args.out is not None else Path(f"eval-{args.tasks.stem}")
    identity = {"tasks": str(args.tasks.resolve()), "model": args.model,
                "transcripts": str(args.transcripts.resolve()) if args.transcripts else None, "trials": args.trials}
    policy, connect = policy_engine(args, load_policy(args.policy))  # bad engine flags fail before --out is made
    results = ResultsLog(out, identity, resume=args.resume)
    task_ids = [task.id for task in tasks]
    total = len(tasks) * args.trials
    done_before = [r for r in results.results if r.task in task_ids and r.trial <= args.trials]
    with AuditStore(args.audit_db or out / "audit.db") as audit:
        settings = EvalRun(tasks=tasks, model_for=model_for, policy=policy, audit=audit, results=results,
                           connect=connect, trials=args.trials, concurrency=args.concurrency, pool=not args.no_pool,
                           system=args.system, loop_options=options)
        if args.resume:
            say(f"resuming: {len(done_before)} of {total} trials already finished in {out}")
        interrupted: BaseException | None = None
        try:
            with Progress(total, done=len(done_before), passes=sum(r.passed for r in done_before)) as progress:
                settings.watcher = progress
                run_eval(settings)
        except (KeyboardInterrupt, SystemExit) as exc:
            interrupted = exc
        finished = [r for r in results.results if r.task in task_ids and r.trial <= args.trials]
        summary = summarize(task_ids, finished, args.trials)
        as_json, as_html = write_reports(out, summary, finished, identity, audit)
        print(table(summary))
        print(f"report: {as_html} (JSON: {as_json}); runs in the audit store {audit.path}")
        if interrupted is not None:
            sys.stdout.flush()
            say(f"interrupted: {len(finished)} of {total} trials finished; continue with: {_resume_command(args, out)}")
            raise interrupted
    return 0


def _model_factory(args: argparse.Namespace, tasks: list[Any]) -> Any:
    """The model of a task's trial; every transcript (or the model spec) is checked now."""
    from harness.models.factory import make_model

    if args.model is not None:
        make_model(args.model, base_url=args.base_url)  # a bad spec or a missing API key fails before anything runs
        return lambda _task, _trial: make_model(args.model, base_url=args.base_url)
    folder: Path = args.transcripts
    if not folder.is_dir():
        raise UsageError(f"--transcripts {folder}: not a directory; give the directory of the tasks' transcripts")
    missing = [task.id for task in tasks if not (folder / f"{task.id}.jsonl").is_file()
               and not all((folder / f"{task.id}.{k}.jsonl").is_file() for k in range(1, args.trials + 1))]
    if missing:
        raise UsageError(f"--transcripts {folder}: no transcript for task {missing[0]!r}: write {folder}/"
                         f"{missing[0]}.jsonl (every trial) or {missing[0]}.<trial>.jsonl (one trial)")

    def transcript(task: Any, trial: int) -> Path:
        own = folder / f"{task.id}.{trial}.jsonl"
        return own if own.is_file() else folder / f"{task.id}.jsonl"

    for path in sorted({transcript(task, k) for task in tasks for k in range(1, args.trials + 1)}):
        try:
            make_model(f"scripted:{path}")  # a transcript that cannot be read fails before anything runs
        except CallboxError as exc:
            raise UsageError(f"--transcripts: {exc.message}") from None
    return lambda task, trial: make_model(f"scripted:{transcript(task, trial)}")


def _resume_command(args: argparse.Namespace, out: Path) -> str:
    """The command that continues this eval, shell-quoted, with absolute paths."""
    words = ["callbox", "eval", str(args.tasks.resolve())]
    words += ["--model", args.model] if args.model else ["--transcripts", str(args.transcripts.resolve())]
    if args.base_url:
        words += ["--base-url", args.base_url]
    words += ["--concurrency", str(args.concurrency), "--trials", str(args.trials), "--out", str(out.resolve())]
    for flag, value in (("--policy", args.policy), ("--audit-db", args.audit_db)):
        if value is not None:
            words += [flag, str(Path(value).resolve())]
    if args.no_pool:
        words.append("--no-pool")
    if args.max_turns is not None:
        words += ["--max-turns", str(args.max_turns)]
    if args.system != DEFAULT_SYSTEM:
        words += ["--system", args.system]
    if args.engine:
        words += ["--engine", args.engine]
    return shlex.join([*words, "--resume"])
