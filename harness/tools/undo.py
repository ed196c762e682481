"""``undo``: the model puts the sandbox's files back as they were before one of its own calls.

Served only to a policy that names it (``allowed_tools``, or a ``[tools.undo]`` table) and
records changes (``[checkpoints] mode = "changes"``; a policy that names ``undo`` without it
is refused when it loads): an undo rewrites every writable place, a read-write mount holding
the user's project included, so no policy written before the tool existed offers it.

The arguments take one of two shapes: ``{"to_call": ID}`` (every writable place as it was
just before that call of this run ran, the calls after it undone too) or ``{"steps": N}``
(the last N calls that changed files and are not undone yet). Only the run's own recorded
calls can be named: another run's call id is not in its records. The revert goes through the
sandbox's agent, as the tool user, while no other call of the run runs (one that does makes
it a ``conflict`` error; one that arrives meanwhile is refused); it is recorded as a revert
record, and the ``undo`` call itself takes no change record, so the history stays what the
calls did. A later undo counts only the calls not undone yet.

The result lists what was put back (each list bounded; the counts are whole).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.audit.change_store import RunChanges
from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.undo import RevertRefused, RevertReport, UndoError, call_records

__all__ = ["MAX_LISTED", "UNDO", "UndoArgs", "undoable_calls"]

MAX_LISTED = 50
"""Paths listed per kind of change in the result (the counts cover them all)."""
MAX_STEPS = 1000


class UndoArgs(BaseModel):
    """Undo file changes made by earlier tool calls of this run: give to_call or steps, not both."""

    model_config = ConfigDict(extra="forbid")

    to_call: str | None = Field(default=None, min_length=1, max_length=128, description=(
        "The id of one of your earlier tool calls: every file is put back as it was just before that call "
        "ran (the calls after it are undone too)."))
    steps: int | None = Field(default=None, ge=1, le=MAX_STEPS, description=(
        "Undo the last N tool calls that changed files (and are not undone already)."))

    @model_validator(mode="after")
    def _one_of(self) -> UndoArgs:
        if (self.to_call is None) == (self.steps is None):
            raise ValueError("give exactly one of to_call (a call id) or steps (how many changing calls to undo)")
        return self


def undoable_calls(changes: RunChanges) -> list[str]:
    """The run's calls that changed files and are not undone yet, oldest first (a revert to a
    call undoes it and every call recorded after it)."""
    return [call for _, call in _undoable(changes)]


def _undoable(changes: RunChanges) -> list[tuple[int, str]]:
    order = {r.call_id: r.seq for r in call_records(changes)}
    stack: list[tuple[int, str]] = []
    for record in changes.records():
        if record.kind == "call" and record.entries and record.call_id is not None:
            stack.append((record.seq, record.call_id))
        elif record.kind == "revert" and record.call_id in order:
            cut = order[record.call_id]
            stack = [(seq, call) for seq, call in stack if seq < cut]
    return stack


def run_undo(ctx: ToolContext, args: UndoArgs) -> ToolOutput:
    live = ctx.undo
    if live is None:
        return _failed("this run records no file changes ([checkpoints] mode is off): there is nothing to undo",
                       ErrorCode.TOOL_FAILED)
    pending = _undoable(live.changes)
    undoable = [call for _, call in pending]
    listed = f"the calls that can be undone: {', '.join(undoable)}" if undoable else "no call can be undone"
    if args.steps is not None:
        if args.steps > len(undoable):
            return _failed(f"steps={args.steps}, but only {len(undoable)} calls of this run changed files and are "
                           f"not undone yet; {listed}", ErrorCode.INVALID_ARGUMENTS)
        to_call = undoable[-args.steps]
    else:
        to_call = str(args.to_call)
        if live.changes.call_record(to_call) is None:
            return _failed(f"call {to_call!r} is not a recorded call of this run (a call that could change files); "
                           f"{listed}", ErrorCode.INVALID_ARGUMENTS)
    try:
        report = live.revert(to_call, own_call=ctx.call_id)
    except RevertRefused as refused:
        return _failed(refused.message, ErrorCode.CONFLICT)
    except UndoError as error:
        return _failed(error.message, ErrorCode.TOOL_FAILED)
    target = live.changes.call_record(to_call)
    undone = [call for seq, call in pending if target is not None and seq >= target.seq]
    return _result(to_call, undone, report)


def _failed(text: str, code: ErrorCode) -> ToolOutput:
    return ToolOutput(text=text, is_error=True, error=code)


def _result(to_call: str, undone: list[str], report: RevertReport) -> ToolOutput:
    lines = [f"The files are back as they were just before call {to_call}"
             + (f" (undone: {', '.join(undone)})" if undone else "")
             + f"; {report.count} {'path' if report.count == 1 else 'paths'} put back."]
    structured: dict[str, object] = {"to_call": to_call, "undone": undone, "count": report.count}
    for name, paths in report.as_dict().items():
        structured[name] = paths[:MAX_LISTED]
        if len(paths) > MAX_LISTED:
            structured[f"{name}_more"] = len(paths) - MAX_LISTED
        if paths:
            more = f" and {len(paths) - MAX_LISTED} more" if len(paths) > MAX_LISTED else ""
            lines.append(f"{name.replace('_', ' ')}: {', '.join(paths[:MAX_LISTED])}{more}")
    return ToolOutput(text="\n".join(lines), structured=structured, is_error=bool(report.not_restored),
                      error=ErrorCode.TOOL_FAILED if report.not_restored else None)


UNDO = Tool(
    ToolDefinition(
        name="undo",
        description=(
            "Undo file changes made by your earlier tool calls in this sandbox: every file (workspace, /tmp, home, "
            "mounted project) goes back to how it was just before call to_call, or before the last `steps` calls "
            "that changed files. Running processes are not touched. Returns what was put back."
        ),
        input_model=UndoArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Undo file changes"),
        records_changes=False,
    ),
    run_undo,
)
