"""What the file tools (``read_file``, ``write_file``, ``list_dir``, ``search``) share: how an
agent failure reads, how a handler ends early with an error result, the room kept for a
trailing note, and how each of them is declared."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine.agent_errors import sandbox_gone

NOTE_ROOM = 300
"""Bytes of the output budget kept free for a trailing note."""
MAX_SHOWN_PATH = 160

FileHandler = Callable[[ToolContext, Any], ToolOutput]


def show_path(path: str) -> str:
    """``path`` as it goes into a message: control characters escaped, very long ones shortened."""
    shown = path if path.isprintable() else repr(path)[1:-1]
    if len(shown) > MAX_SHOWN_PATH:
        shown = f"{shown[:100]}…{shown[-40:]} ({len(path)} characters)"
    return shown


_BASE_TEXT: dict[str, str] = {
    "PATH_ESCAPE": "path {path} is outside the sandbox's allowed directories",
    "NOT_FOUND": "no such file or directory: {path}",
    "PERMISSION_DENIED": "permission denied: {path}",
    "ALREADY_EXISTS": "file already exists: {path}",
    "INVALID_ARGUMENT": "invalid path {path}",
    "TOO_LARGE": "too large: {path}",
}


def agent_failure(error: AgentCallError, path: str, *, hint: str = "") -> ToolOutput:
    """The error result for a refused or failed agent call on ``path``.

    The first sentence is fixed per reason (``path X is outside the sandbox's allowed
    directories``, ``no such file or directory: X``, ...); the agent's own sentence follows
    when it adds something (which root, which symlink, which component); then ``hint``.
    """
    shown = show_path(path)
    detail = error.message.replace(path, shown) if path and shown != path else error.message
    code = ErrorCode.TOOL_FAILED
    template = _BASE_TEXT.get(error.reason)
    if error.reason == "WRONG_TYPE":
        text, detail = detail, ""  # the agent's sentence says which type is wrong
    elif sandbox_gone(error):
        text, code = "the sandbox did not answer", ErrorCode.SANDBOX_UNAVAILABLE
    elif template is not None:
        text = template.replace("{path}", shown)
    else:
        text = f"the operation on {shown} failed ({error.reason.lower()})"
    if error.reason == "ALREADY_EXISTS" or detail.rstrip(".") == f"{shown} does not exist":
        detail = ""  # nothing the first sentence did not say (or only the agent's option names)
    for more in (detail, hint):
        if more:
            text = f"{text}{'' if text.endswith('.') else '.'} {more}"
    return ToolOutput(text=text, is_error=True, error=code, structured={"reason": error.reason, "path": path})


class Refused(Exception):
    """Ends a handler early with an error result (raised inside the file tools' handlers only)."""

    def __init__(self, output: ToolOutput) -> None:
        super().__init__(output.text)
        self.output = output


def refuse(text: str, **structured: Any) -> Refused:
    return Refused(ToolOutput(text=text, is_error=True, error=ErrorCode.TOOL_FAILED, structured=structured or None))


def _handler(run: FileHandler) -> FileHandler:
    def handle(ctx: ToolContext, args: Any) -> ToolOutput:
        try:
            return run(ctx, args)
        except Refused as refused:
            return refused.output

    handle.__name__ = run.__name__
    handle.__doc__ = run.__doc__
    return handle


def file_tool(name: str, description: str, input_model: type[BaseModel], run: FileHandler, *, title: str,
              read_only: bool = True) -> Tool:
    """One file tool: its ``path`` argument is a path in the sandbox, calls with the same
    arguments have the same effect, and a handler may end early by raising :class:`Refused`."""
    return Tool(
        ToolDefinition(
            name=name,
            description=description,
            input_model=input_model,
            annotations=ToolAnnotations(read_only=read_only, destructive=not read_only, idempotent=True,
                                        open_world=False, title=title),
            path_fields=("path",),
        ),
        _handler(run),
    )


def note_budget(ctx: ToolContext) -> int:
    """Bytes of tool output that leave room for a note within the output budget."""
    return max(64, ctx.output_budget - NOTE_ROOM)


def fit_lines(lines: list[str], room: int) -> list[str]:
    """The first of ``lines`` that fit in ``room`` bytes, each with its newline."""
    shown: list[str] = []
    used = 0
    for line in lines:
        used += len(line.encode()) + 1
        if used > room:
            break
        shown.append(line)
    return shown


def after(content: str, note: str) -> str:
    """``content`` with ``note`` on a line of its own after it."""
    if not content:
        return note
    return f"{content}{'' if content.endswith(chr(10)) else chr(10)}{note}"
