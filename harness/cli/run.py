"""``callbox run``: the agent loop from the command line, shown live.

``callbox run TRANSCRIPT.jsonl`` replays a scripted model (demos, tests);
``callbox run --model openai:NAME|openai-chat:NAME|anthropic:NAME --task "..."`` talks to a
real one. Tools run for real in the run's sandbox. The terminal shows each model turn,
each tool call with its arguments and the policy's decision, tool output as it streams,
and a summary; ``--json`` prints one JSON event per line instead. ``--resume RUN_ID``
continues a run that paused for an approval, also in a new process.

Tool output on the terminal is what the model reads: it streams live up to a quarter of
the policy's ``max_output_bytes`` (whole lines), then the rest of the model's result text
(its head, the truncation marker and its tail) follows when the call ends, so a huge output
shows as the model sees it, never in full. Escape sequences and control characters are
removed from it as from the model's text.

A setting that loosens a hardened default (a read-write mount, a network) is said once on
stderr before the run starts: ``callbox: this policy loosens a hardened default: ...`` for
the sandbox options; the policy file's own loosenings are said, naming their keys, when it
is loaded. The engine does not repeat them when the run's sandbox starts.

The run's sandbox starts cold even when the policy has a ``[pool]``: this process ends with
its one sandbox, so a pool would only start a second container to throw away (see
:mod:`harness.core.shared_engine`).

A paused run prints the command that continues it, exactly runnable (shell-quoted, absolute
paths): the transcript or ``--model``/``--base-url``, ``--policy`` and ``--audit-db`` of the
run. A resumed run keeps the policy, sandbox and loop settings it was checkpointed with;
loop options given again (``--max-turns``) replace the checkpointed ones. ``--resume`` of a
run the audit store does not hold, or of one that never paused, is a usage error saying
which (naming the store, or how the run ended).

Ctrl-C or SIGTERM ends the run ``error:interrupted`` (exit 130 or 143); the call in flight
records itself as interrupted first (:mod:`harness.core.call_path`), so the audit shows
neither open.

Acceptance checks (:mod:`harness.loop.acceptance`): ``--accept CMD`` (repeatable) runs CMD in
the run's sandbox on each final answer, in the order given, in ``--accept-workdir DIR`` (one
for all of them; default the sandbox's workdir); ``--max-rejections N`` bounds the rejected
answers the model may try again after. A check's own timeout or expected exit code is set in
a run config's ``[[acceptance]]`` tables. Checks from the command line replace the run
config's, which replace the policy's ``[acceptance]``. The terminal shows each check and
its result, and a rejected answer with what the model is told.

Exit status: 0 when the model gave its final answer (``final``, or ``final:accepted`` when
every acceptance check passed); 3 when the run paused for an approval; 1 when a limit ended
it (max_turns, budget:*, loop_detected, rejected:acceptance); 125 for ``error:*``; 2 for bad
usage.
"""

from __future__ import annotations

import argparse
import codecs
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.cli.notices import loosened_said_once
from harness.cli.options import engine_options, policy_engine, sandbox_options, spec_from_args
from harness.core.errors import CallboxError, ErrorCode, UsageError

DEFAULT_SYSTEM = (
    "You are a careful software engineer working in an isolated Linux sandbox. Use the tools "
    "to inspect files, change them and run commands; verify your work before you answer."
)
SCRIPTED_TASK = "(scripted run: the transcript holds the model's turns)"


COMMANDS = ("run",)


def add_parsers(sub: Any) -> None:
    run = sub.add_parser(
        "run", help="run the agent loop (a scripted transcript or a real model)",
        epilog="exit status: 0 final answer (final, final:accepted), 3 paused for approval, 1 another limit "
               "(max_turns, budget:*, loop_detected, rejected:acceptance), 125 an error (error:*, e.g. "
               "error:sandbox_unavailable), 2 bad usage",
    )
    run.add_argument("transcript", nargs="?", type=Path, help="JSONL transcript of model turns (scripted model)")
    run.add_argument("--model", help="PROVIDER:NAME, e.g. openai:gpt-5, openai-chat:NAME, anthropic:NAME")
    run.add_argument("--task", help="what the model should do (required with --model)")
    run.add_argument("--system", default=DEFAULT_SYSTEM, help="system prompt")
    run.add_argument("--base-url", help="API base URL (OpenAI-compatible servers: vLLM, llama.cpp, Ollama)")
    run.add_argument("--max-turns", type=int, help="model turns at most (default 50)")
    run.add_argument("--tool-choice", choices=["auto", "required", "none"],
                     help="tool_choice of the first turn (default auto)")
    run.add_argument("--accept", action="append", metavar="CMD",
                     help="acceptance check: run CMD in the sandbox on each final answer; the answer is accepted "
                          "when every check exits 0 (repeatable, run in order; replaces the checks of --config "
                          "and the policy)")
    run.add_argument("--accept-workdir", metavar="DIR", help="directory in the sandbox the --accept checks run in")
    run.add_argument("--max-rejections", type=int, metavar="N",
                     help="rejected answers the model may try again after; the next ends the run "
                          "rejected:acceptance (default 3)")
    run.add_argument("--config", type=Path, metavar="RUN.toml",
                     help="run config: the loop's settings as TOML (max_turns, stages, budgets, ...); "
                          "flags given beside it win")
    run.add_argument("--resume", metavar="RUN_ID", help="continue a run that paused for an approval")
    run.add_argument("--policy", type=Path, help="policy file (default: the packaged default policy)")
    run.add_argument("--audit-db", type=Path, help="audit store (default $CALLBOX_AUDIT_DB or the state dir)")
    run.add_argument("--json", action="store_true", help="print one JSON event per line")
    run.add_argument("--images-dir", type=Path, metavar="DIR",
                     help="save the pictures in results under DIR/RUN_ID/ (default: the state dir's images/)")
    sandbox_options(run, defaults=False)
    engine_options(run)


LOOP_OPTIONS = {"max_turns": "--max-turns", "tool_choice": "--tool-choice", "max_rejections": "--max-rejections"}
"""LoopConfig fields set from the command line, and their flags."""


def run(args: argparse.Namespace) -> int:
    from harness.audit.store import AuditStore
    from harness.loop.agent_loop import RunOutcome

    if args.transcript is None and args.model is None and args.resume is None:
        raise UsageError("give a TRANSCRIPT.jsonl, or --model PROVIDER:NAME --task TEXT, or --resume RUN_ID")
    if args.transcript is not None and args.model is not None:
        raise UsageError("give either a TRANSCRIPT or --model, not both")
    if args.model is not None and args.task is None and args.resume is None:
        raise UsageError("--model needs --task TEXT (what the model should do)")
    if args.config is not None and args.resume is not None:
        raise UsageError("--config cannot change a paused run: its config is in its checkpoint")
    options = {name: getattr(args, name) for name in LOOP_OPTIONS if getattr(args, name) is not None}
    if args.accept_workdir is not None and not args.accept:
        raise UsageError("--accept-workdir is the directory of the --accept checks: give --accept CMD too")
    if args.accept:
        options["acceptance"] = [{"command": command, "workdir": args.accept_workdir} for command in args.accept]
    if args.config is not None:
        from_file = read_run_config(args.config)
        try:
            loop_config(from_file, flags=False)
        except UsageError as exc:
            raise UsageError(f"--config {args.config}: {exc}") from None
        options = {**from_file, **options}
    loop_config(options)  # bad values are usage errors before anything starts
    with AuditStore(args.audit_db) as audit:
        outcome: RunOutcome = _resume(args, audit, options) if args.resume else _start(args, audit, options)
        if not args.json:
            print(f"audit record: run {outcome.run_id} in {audit.path} (`callbox audit --run {outcome.run_id}`)")
    return _exit_status(outcome.reason)


def read_run_config(path: Path) -> dict[str, Any]:
    """The run config file's settings (LoopConfig fields as TOML); a file that cannot be read
    or parsed is a UsageError naming it."""
    import tomllib

    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"--config {path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"--config {path}: not valid TOML: {exc}") from None


def loop_config(options: dict[str, Any], base: dict[str, Any] | None = None, *, flags: bool = True) -> Any:
    """A LoopConfig of ``base`` (a checkpointed one; None: the defaults) with the command
    line's ``options`` over it; a value the config refuses is a UsageError naming its flag
    (its key when ``flags`` is false: the options are a run config file's)."""
    from pydantic import ValidationError

    from harness.core.problems import describe_validation_error
    from harness.loop.agent_loop import LoopConfig

    def flag(path: str) -> str:
        if not flags:
            return path
        if path.startswith("acceptance") and "acceptance" in options:  # from --accept
            return "--accept-workdir" if path.endswith("workdir") else "--accept"
        return LOOP_OPTIONS.get(path, path)

    try:
        return LoopConfig.model_validate({**(base or {}), **options})
    except ValidationError as exc:
        raise UsageError(describe_validation_error(exc, LoopConfig, name=flag)[0]) from None


def resume_command(args: argparse.Namespace, run_id: str, audit_path: Path) -> str:
    """The command that continues ``run_id`` as this one was started, shell-quoted and with
    absolute paths, so it runs as printed from any directory and any environment."""
    words = ["callbox", "run"]
    if args.transcript is not None:
        words.append(str(Path(args.transcript).resolve()))
    elif args.model is not None:
        words += ["--model", args.model]
        if args.base_url:
            words += ["--base-url", args.base_url]
    words += ["--resume", run_id]
    if args.policy is not None:
        words += ["--policy", str(Path(args.policy).resolve())]
    words += ["--audit-db", str(Path(audit_path).resolve())]
    if args.images_dir is not None:
        words += ["--images-dir", str(Path(args.images_dir).resolve())]
    if args.json:
        words.append("--json")
    return shlex.join(words)


def _model(args: argparse.Namespace, *, turns_done: int = 0) -> Any:
    from harness.models.factory import make_model

    if args.transcript is not None:
        model = make_model(f"scripted:{args.transcript}")
        model.position = turns_done  # type: ignore[attr-defined]  # resume where the transcript left off
        return model
    if args.model is None:
        raise UsageError("--resume needs the model again: give the TRANSCRIPT or --model of the run")
    return make_model(args.model, base_url=args.base_url)


def _start(args: argparse.Namespace, audit: Any, options: dict[str, Any]) -> Any:
    from harness.core.policy import load_policy
    from harness.core.session import Session
    from harness.loop.agent_loop import run_agent
    from harness.tools import registry_for

    policy = load_policy(args.policy)
    spec = spec_from_args(args, policy.sandbox_spec())
    policy, engine_factory = policy_engine(args, policy)
    model = _model(args)
    task = args.task or SCRIPTED_TASK
    show = _show(args, policy)
    announced = policy.sandbox_spec().loosened()  # load_policy said these, naming their keys
    with loosened_said_once(spec, announced), Session(registry_for(policy), policy, audit, spec=spec,
                                                      engine_factory=engine_factory) as harness:
        return run_agent(model, harness, task=task, system=args.system, config=loop_config(options),
                         on_event=show, resume_command=resume_command(args, harness.run_id, audit.path))


def _resume(args: argparse.Namespace, audit: Any, options: dict[str, Any]) -> Any:
    from harness.core.session import Session
    from harness.loop import checkpoint
    from harness.loop.agent_loop import resume
    from harness.tools import registry_for

    saved = checkpoint.load(audit, args.resume)
    if saved is None:
        raise _not_resumable(audit, args.resume)
    model = _model(args, turns_done=saved.turn)
    config = loop_config(options, saved.config) if options else None
    policy, spec = saved.policy_model(), saved.spec_model()
    policy, engine_factory = policy_engine(args, policy)  # the run's engine, unless --engine says another
    show = _show(args, policy)
    with loosened_said_once(spec, []), Session(registry_for(policy), policy, audit, run_id=args.resume,
                                                spec=spec, engine_factory=engine_factory) as harness:
        return resume(args.resume, model, harness, config=config, on_event=show,
                      resume_command=resume_command(args, args.resume, audit.path))


def _not_resumable(audit: Any, run_id: str) -> CallboxError:
    """Why ``run_id``, which has no checkpoint, cannot be resumed: the store has no such run
    (not found), or the run never paused (and how it ended, if it did)."""
    from harness.audit.store import AuditError

    try:
        run = audit.get_run(run_id)
    except AuditError:
        return CallboxError(f"no run {run_id} in the audit store {audit.path} (`callbox audit` lists its runs; "
                            "a run of another store needs --audit-db)", code=ErrorCode.NOT_FOUND)
    ended = f"it ended: {run.end_reason}" if run.end_reason else "it has not ended"
    return CallboxError(f"run {run_id} never paused for an approval ({ended}): there is nothing to resume",
                        code=ErrorCode.CONFLICT)


def _show(args: argparse.Namespace, policy: Any) -> Any:
    if args.json:
        return _json_printer()
    return _LiveView(live_bytes=max(1024, policy.budgets.max_output_bytes // 4), images_dir=args.images_dir).show


def _exit_status(reason: str) -> int:
    if reason in ("final", "final:accepted"):
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


@dataclass
class _Live:
    """What the terminal showed of one call's streamed output."""

    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(
        errors="replace"))
    shown: list[str] = field(default_factory=list)
    size: int = 0
    pending: str = ""
    """The last, incomplete line (shown once it is complete, or at the end)."""
    cut: bool = False
    """The live part is used up: the rest comes from the model's result text."""


class _LiveView:
    """Renders loop events on the terminal with rich."""

    def __init__(self, live_bytes: int = 7500, images_dir: Path | None = None) -> None:
        from rich.console import Console

        self.console = Console(highlight=False, soft_wrap=True)
        self.live_bytes = live_bytes
        self.images_dir = images_dir
        """Where pictures in results are saved (None: the state dir's ``images``)."""
        self.streams: dict[str, _Live] = {}
        self.run_id = "run"
        """The run's id (from its first event): where its pictures are saved."""

    def show(self, event: Any) -> None:
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)

    def _on_run_started(self, e: Any) -> None:
        self.run_id = e.run_id
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
        """Whole lines, cleaned as the model's text is, up to ``live_bytes`` per call."""
        from harness.core.shaping import strip_terminal_codes

        live = self.streams.setdefault(e.call_id, _Live())
        if live.cut:
            return
        text = live.pending + strip_terminal_codes(live.decoder.decode(e.data))
        complete, newline, pending = text.rpartition("\n")
        lines = complete + newline
        if live.size + len((lines + pending).encode()) > self.live_bytes:
            room = lines.encode()[: self.live_bytes - live.size].decode(errors="ignore")
            lines, pending = room[: room.rfind("\n") + 1], ""
            live.cut = True
        live.pending = pending
        live.shown.append(lines)
        live.size += len(lines.encode())
        self._out(lines)

    def _on_tool_result(self, e: Any) -> None:
        result = e.result
        live = self.streams.pop(e.call_id, None)
        if live is not None:
            shown = "".join(live.shown)
            if live.cut:
                # the rest of what the model reads: its head past the live part, marker, tail
                at = result.text.find(shown) if shown else -1
                rest = result.text[at + len(shown):] if at >= 0 else result.text
                if at < 0:
                    self.console.print("[dim]  (what the model reads of this output:)[/]")
                self._out(rest if rest.endswith("\n") or not rest else rest + "\n")
            elif live.pending:
                self._out(live.pending + "\n")
        mark = "[red]✗[/]" if result.is_error else "[green]✓[/]"
        code = f" [red]{result.error}[/]" if result.error else ""
        self.console.print(f"{mark} {_esc(e.name)} {e.call_id}{code}")
        if live is None:
            for line in result.text.splitlines():  # the model's text, already bounded by its budget
                self.console.print(f"  [dim]{_esc(line)}[/]")
        if result.images:
            from harness.cli.pictures import picture_lines

            for line in picture_lines(result, self.run_id, self.images_dir):
                self.console.print(f"  {_esc(line)}")

    def _out(self, text: str) -> None:
        if text:
            self.console.out(text, end="", style="dim", highlight=False)

    def _on_acceptance_check_started(self, e: Any) -> None:
        where = f" [dim](in {_esc(e.workdir)})[/]" if e.workdir else ""
        self.console.print(f"[bold]⚖ acceptance check {e.index}/{e.total}:[/] {_esc(e.command)}{where}")

    def _on_acceptance_check_finished(self, e: Any) -> None:
        if e.passed:
            self.console.print(f"[green]✓ passed[/] [dim](exit {e.exit_code}) {e.call_id}[/]")
            return
        why = f"exit {e.exit_code}, expected {e.expect_exit}" if e.exit_code is not None else str(e.result.error)
        self.console.print(f"[red]✗ failed[/] [dim]({_esc(why)}) {e.call_id}[/]")
        for line in e.result.text.splitlines():  # bounded like every result
            self.console.print(f"  [dim]{_esc(line)}[/]")

    def _on_answer_rejected(self, e: Any) -> None:
        counted = f"rejection {e.rejections}, max_rejections {e.max_rejections}"
        if e.ends_run:
            self.console.print(f"[red]answer rejected ({counted}): the run ends rejected:acceptance[/]")
        else:
            self.console.print(f"[yellow]answer rejected ({counted}): the model is told which check failed "
                               "and goes on[/]")

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
        if e.rejections or e.reason in ("final:accepted", "rejected:acceptance"):
            table.add_row("rejected answers", str(e.rejections))
        table.add_row("time", f"{e.seconds:.1f} s")
        table.add_row("tokens in/out", f"{e.input_tokens}/{e.output_tokens}")
        self.console.print(table)
        message = e.message
        if e.resume_command:
            message = message.replace(f": {e.resume_command}", " the command below")
        if message:
            self.console.print(f"[bold]note:[/] {_esc(message)}")
        if e.resume_command:
            self.console.print("to continue once the approval is resolved:")
            self.console.out(f"  {e.resume_command}", highlight=False)


def _esc(text: str) -> str:
    from rich.markup import escape

    return escape(text)
