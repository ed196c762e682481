"""``callbox run``: the agent loop from the command line, shown live.

``callbox run TRANSCRIPT.jsonl`` replays a scripted model (demos, tests);
``callbox run --model openai:NAME|openai-chat:NAME|anthropic:NAME --task "..."`` talks to a
real one. Tools run for real in the run's sandbox. The terminal shows each model turn,
each tool call with its arguments and the policy's decision, tool output as it streams,
and a summary; ``--json`` prints one JSON event per line instead. ``--resume RUN_ID``
continues a run that paused for an approval, also in a new process.

Exit status: 0 when the model gave its final answer; 3 when the run paused for an
approval; 1 when a limit ended it (max_turns, budget:*, loop_detected); 125 for
``error:*``; 2 for bad usage.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from harness.errors import UsageError

DEFAULT_SYSTEM = (
    "You are a careful software engineer working in an isolated Linux sandbox. Use the tools "
    "to inspect files, change them and run commands; verify your work before you answer."
)
SCRIPTED_TASK = "(scripted run: the transcript holds the model's turns)"


def add_parser(sub: Any) -> None:
    from harness.cli import sandbox_options

    run = sub.add_parser("run", help="run the agent loop (a scripted transcript or a real model)")
    run.add_argument("transcript", nargs="?", type=Path, help="JSONL transcript of model turns (scripted model)")
    run.add_argument("--model", help="PROVIDER:NAME, e.g. openai:gpt-5, openai-chat:NAME, anthropic:NAME")
    run.add_argument("--task", help="what the model should do (required with --model)")
    run.add_argument("--system", default=DEFAULT_SYSTEM, help="system prompt")
    run.add_argument("--base-url", help="API base URL (OpenAI-compatible servers: vLLM, llama.cpp, Ollama)")
    run.add_argument("--max-turns", type=int, default=50, help="model turns at most (default 50)")
    run.add_argument("--tool-choice", default="auto", choices=["auto", "required", "none"],
                     help="tool_choice of the first turn (default auto)")
    run.add_argument("--resume", metavar="RUN_ID", help="continue a run that paused for an approval")
    run.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    run.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")
    run.add_argument("--json", action="store_true", help="print one JSON event per line")
    sandbox_options(run, defaults=False)


def run(args: argparse.Namespace) -> int:
    from harness.audit import AuditStore
    from harness.loop import LoopConfig, RunOutcome

    if args.transcript is None and args.model is None and args.resume is None:
        raise UsageError("give a TRANSCRIPT.jsonl, or --model PROVIDER:NAME --task TEXT, or --resume RUN_ID")
    if args.transcript is not None and args.model is not None:
        raise UsageError("give either a TRANSCRIPT or --model, not both")
    if args.model is not None and args.task is None and args.resume is None:
        raise UsageError("--model needs --task TEXT (what the model should do)")
    config = LoopConfig(max_turns=args.max_turns, tool_choice=args.tool_choice)
    show = _json_printer() if args.json else _LiveView().show
    with AuditStore(args.audit_db) as audit:
        outcome: RunOutcome = _resume(args, audit, config, show) if args.resume else _start(args, audit, config, show)
        if not args.json:
            print(f"audit record: run {outcome.run_id} in {audit.path} (`callbox audit --run {outcome.run_id}`)")
    return _exit_status(outcome.reason)


def _model(args: argparse.Namespace, *, turns_done: int = 0) -> Any:
    from harness.models.factory import make_model

    if args.transcript is not None:
        model = make_model(f"scripted:{args.transcript}")
        model.position = turns_done  # type: ignore[attr-defined]  # resume where the transcript left off
        return model
    if args.model is None:
        raise UsageError("--resume needs the model again: give the TRANSCRIPT or --model of the run")
    return make_model(args.model, base_url=args.base_url)


def _start(args: argparse.Namespace, audit: Any, config: Any, show: Any) -> Any:
    from harness.cli import spec_from_args
    from harness.dispatch import Harness
    from harness.loop import run_agent
    from harness.policy import load_policy
    from harness.tools import builtin_registry

    policy = load_policy(args.policy)
    spec = spec_from_args(args, policy.sandbox_spec())
    model = _model(args)
    task = args.task or SCRIPTED_TASK
    with Harness(builtin_registry(), policy, audit, spec=spec) as harness:
        return run_agent(model, harness, task=task, system=args.system, config=config, on_event=show)


def _resume(args: argparse.Namespace, audit: Any, config: Any, show: Any) -> Any:
    from harness import checkpoint
    from harness.dispatch import Harness
    from harness.loop import resume
    from harness.tools import builtin_registry

    saved = checkpoint.load(audit, args.resume)
    if saved is None:
        raise UsageError(f"run {args.resume} has no checkpoint: it never paused for an approval")
    model = _model(args, turns_done=saved.turn)
    with Harness(builtin_registry(), saved.policy_model(), audit, run_id=args.resume,
                 spec=saved.spec_model()) as harness:
        return resume(args.resume, model, harness, config=config, on_event=show)


def _exit_status(reason: str) -> int:
    if reason == "final":
        return 0
    if reason == "approval_pending":
        return 3
    if reason.startswith("error:"):
        return 125
    return 1


def _json_printer() -> Any:
    def show(event: Any) -> None:
        print(json.dumps(event.to_dict(), default=str), flush=True)

    return show


class _LiveView:
    """Renders loop events on the terminal with rich."""

    MAX_RESULT_LINES = 12

    def __init__(self) -> None:
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.streamed: set[str] = set()

    def show(self, event: Any) -> None:
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)

    def _on_run_started(self, e: Any) -> None:
        verb = "resuming" if e.resumed else "run"
        self.console.rule(f"[bold]callbox {verb} {e.run_id}[/] · {_esc(e.model)}")

    def _on_turn_started(self, e: Any) -> None:
        self.console.print(f"[dim]turn {e.turn} · tool_choice {_esc(e.tool_choice)} · "
                           f"{len(e.tools)} tools offered[/]")

    def _on_model_retry(self, e: Any) -> None:
        self.console.print(f"[yellow]model error (attempt {e.attempt}), retrying: {_esc(e.error)}[/]")

    def _on_model_turn(self, e: Any) -> None:
        if e.text:
            self.console.print(f"[bold cyan]model:[/] {_esc(e.text)}")

    def _on_tool_call_started(self, e: Any) -> None:
        arguments = e.arguments if isinstance(e.arguments, str) else json.dumps(e.arguments, ensure_ascii=False)
        if len(arguments) > 400:
            arguments = arguments[:400] + " …"
        colour = {"allow": "green", "approved": "green", "ask": "yellow"}.get(e.decision, "red")
        self.console.print(f"[bold]→ {_esc(e.name)}[/] [dim]{_esc(arguments)}[/] [{colour}]({e.decision})[/]")

    def _on_tool_output(self, e: Any) -> None:
        self.streamed.add(e.call_id)
        self.console.out(e.data.decode("utf-8", errors="replace"), end="", style="dim", highlight=False)

    def _on_tool_result(self, e: Any) -> None:
        result = e.result
        mark = "[red]✗[/]" if result.is_error else "[green]✓[/]"
        code = f" [red]{result.error}[/]" if result.error else ""
        self.console.print(f"{mark} {_esc(e.name)} {e.call_id}{code}")
        if e.call_id in self.streamed:
            return
        lines = result.text.splitlines()
        shown = lines[: self.MAX_RESULT_LINES]
        for line in shown:
            self.console.print(f"  [dim]{_esc(line)}[/]")
        if len(lines) > len(shown):
            self.console.print(f"  [dim]… {len(lines) - len(shown)} more lines[/]")

    def _on_context_elided(self, e: Any) -> None:
        self.console.print(f"[dim]context budget: elided {len(e.call_ids)} old tool outputs "
                           f"({e.bytes_before} → {e.bytes_after} bytes)[/]")

    def _on_run_ended(self, e: Any) -> None:
        from rich.table import Table

        self.console.rule("[bold]summary[/]")
        if e.final_text:
            self.console.print(f"[bold]final answer:[/] {_esc(e.final_text)}")
        table = Table(show_header=False, box=None)
        table.add_row("reason", e.reason)
        table.add_row("turns", str(e.turns))
        table.add_row("tool calls", str(e.tool_calls))
        table.add_row("time", f"{e.seconds:.1f} s")
        table.add_row("tokens in/out", f"{e.input_tokens}/{e.output_tokens}")
        if e.message:
            table.add_row("note", e.message)
        self.console.print(table)


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
