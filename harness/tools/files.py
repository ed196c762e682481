"""File tools: ``read_file``, ``write_file``, ``list_dir`` and ``search``, all inside the sandbox.

Every path is resolved by the sandbox agent's Filesystem service, which walks it one
directory fd at a time inside the allowed roots with ``O_NOFOLLOW`` and refuses any
escape (``..`` above a root, absolute paths elsewhere, symlinks leading out, a final
component swapped for a symlink mid-call) with PATH_ESCAPE; the harness never checks a
path string and then opens it. Relative paths are taken from the workspace. Failures are
error results (``ToolOutput(is_error=True, error=ErrorCode.TOOL_FAILED)``) whose text says
what went wrong in words (:func:`harness.tools.file_support.agent_failure`, one mapping shared
by the four tools),
with the agent's reason in ``structured["reason"]``.

``read_file``
    Plain text, exactly as stored (no line numbers), optionally a line range
    ``start_line``..``end_line`` (1-indexed, inclusive). At most ``max_bytes`` bytes of
    file content are returned (default 256 KiB, never more than the policy's output budget
    minus room for a note). A longer file is not refused: its first part is returned, cut
    at a line end, followed by a note naming the ``start_line`` to continue from, e.g.::

        [... read_file stopped after line 812 to stay within 29700 bytes; the file has 104857 bytes.
        Call read_file with start_line=813 to read on.]

    Directories, FIFOs, sockets and devices are refused without blocking (the agent opens
    with ``O_NONBLOCK`` and reads regular files only); a file with a NUL byte or invalid
    UTF-8 is refused as binary. An empty file gives ``[empty file]``.
``write_file``
    Replaces the file's content atomically (or creates it and missing parent directories);
    ``create_only`` refuses an existing file. Result: ``Wrote 12 bytes to notes/a.txt (new file).``
    or ``... (replaced the previous content).``
``list_dir``, ``search``
    See :mod:`harness.tools.file_search`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.calls import ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.shaping import head_cut
from harness.tools.file_search import LIST_DIR, SEARCH
from harness.tools.file_support import Refused, after, agent_failure, file_tool, note_budget, refuse, show_path

DEFAULT_READ_BYTES = 256 * 1024
READ_CHUNK = 1 << 20
MAX_SCAN_BYTES = 64 << 20
"""read_file reads at most this far into a file looking for ``start_line``."""


# ---- read_file ---------------------------------------------------------------------------------


class ReadFileArgs(BaseModel):
    """Read a text file in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="The file: an absolute path, or relative to the workspace.")
    start_line: int = Field(default=1, ge=1, description="First line to return (1-indexed).")
    end_line: int | None = Field(
        default=None, ge=1,
        description="Last line to return (inclusive). Default: through the end of the file, as far as fits.",
    )
    max_bytes: int | None = Field(
        default=None, ge=1,
        description=f"Most bytes of file content to return. Default: {DEFAULT_READ_BYTES} (256 KiB); "
                    "never more than the harness's output budget allows.",
    )

    @model_validator(mode="after")
    def _range(self) -> ReadFileArgs:
        if self.end_line is not None and self.end_line < self.start_line:
            raise ValueError(f"end_line ({self.end_line}) is before start_line ({self.start_line})")
        return self


@dataclass
class _LineWindow:
    """Collects lines ``start``..``end`` from text fed in pieces, within ``cap`` bytes."""

    start: int
    end: int | None
    cap: int
    line: int = 1
    """Number of the line being read."""
    parts: list[str] = field(default_factory=list)
    used: int = 0
    line_parts: int = 0
    """Index in ``parts`` where the current line begins."""
    last_full: int = 0
    """Number of the last line included whole."""
    mid_line: bool = False
    """The text fed so far ends inside a line (no newline yet)."""
    stop: str = ""
    """Why collection ended early: "range" (past end_line), "budget", "long_line"."""

    def feed(self, text: str) -> None:
        pos = 0
        while pos < len(text) and not self.stop:
            newline = text.find("\n", pos)
            stop_at = len(text) if newline < 0 else newline + 1
            self._take(text[pos:stop_at], complete=newline >= 0)
            self.mid_line = newline < 0
            pos = stop_at

    def finish(self) -> None:
        """End of file: a last line without a newline is a line too."""
        if self.stop or not self.mid_line:
            return
        if self.line_parts < len(self.parts):
            self.last_full = self.line
            self.line_parts = len(self.parts)
        self.line += 1
        self.mid_line = False

    @property
    def lines_seen(self) -> int:
        return self.line - 1

    def _take(self, piece: str, *, complete: bool) -> None:
        if self.line < self.start:
            if complete:
                self.line += 1
            return
        if self.end is not None and self.line > self.end:
            self.stop = "range"
            return
        size = len(piece.encode())
        if self.used + size <= self.cap:
            self.parts.append(piece)
            self.used += size
            if complete:
                self.last_full = self.line
                self.line += 1
                self.line_parts = len(self.parts)
                if self.end is not None and self.last_full >= self.end:
                    self.stop = "range"
            return
        if self.last_full >= self.start:  # whole lines already shown: stop before this one
            del self.parts[self.line_parts :]
            self.stop = "budget"
            return
        data = piece.encode()  # the first line of the range is longer than the cap: its head
        head = data[: head_cut(data, self.cap - self.used)].decode()
        self.parts.append(head)
        self.used += len(head.encode())
        self.stop = "long_line"


def _binary(path: str, offset: int, why: str) -> Refused:
    return refuse(
        f"{show_path(path)} is not a UTF-8 text file ({why} at byte {offset}); read_file returns text only. "
        f"Use the shell tool to inspect it, for example `file` or `xxd | head`.",
        path=path, reason="BINARY",
    )


def run_read_file(ctx: ToolContext, args: ReadFileArgs) -> ToolOutput:
    """Read lines of a UTF-8 text file through the agent, within the byte cap."""
    cap = min(args.max_bytes or DEFAULT_READ_BYTES, note_budget(ctx))
    window = _LineWindow(args.start_line, args.end_line, cap)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    agent = ctx.runtime().agent
    offset, size, at_eof = 0, 0, False
    while not window.stop:
        if offset >= MAX_SCAN_BYTES and window.line < args.start_line:
            raise refuse(
                f"start_line {args.start_line} is beyond the first {MAX_SCAN_BYTES >> 20} MiB of "
                f"{show_path(args.path)} (line {window.line} starts there); use the search or shell tool "
                "to look further into this file.",
                path=args.path,
            )
        try:
            response = agent.read_file(args.path, offset=offset, limit=READ_CHUNK)
        except AgentCallError as error:
            hint = ""
            if error.reason == "WRONG_TYPE":
                hint = ("Use list_dir to see what it contains." if "directory" in error.message
                        else "read_file reads regular files only, not FIFOs, sockets or devices.")
            return agent_failure(error, args.path, hint=hint)
        data, size = bytes(response.data), response.size
        nul = data.find(b"\0")
        if nul >= 0:
            raise _binary(args.path, offset + nul, "a NUL byte")
        at_eof = not response.truncated or not data
        try:
            text = decoder.decode(data, final=at_eof)
        except UnicodeDecodeError as exc:
            raise _binary(args.path, offset + exc.start, "invalid UTF-8") from None
        offset += len(data)
        window.feed(text)
        if at_eof:
            window.finish()
            break
    return _read_result(args, window, size=size, total_lines=window.lines_seen if at_eof and not window.stop else None)


def _read_result(args: ReadFileArgs, window: _LineWindow, *, size: int, total_lines: int | None) -> ToolOutput:
    content = "".join(window.parts)
    structured: dict[str, Any] = {
        "path": args.path, "size": size, "start_line": args.start_line,
        "end_line": window.last_full or None, "total_lines": total_lines,
        "truncated": window.stop in ("budget", "long_line"),
    }
    if size == 0 and total_lines == 0:
        return ToolOutput(text="[empty file]", structured=structured, raw_bytes=0)
    if total_lines is not None and args.start_line > total_lines:
        raise refuse(
            f"start_line {args.start_line} is past the end of {show_path(args.path)}, which has "
            f"{total_lines} line{'s' if total_lines != 1 else ''}.",
            **structured,
        )
    lines_known = f", {total_lines} lines" if total_lines is not None else ""
    if window.stop == "budget":
        content = after(content, (
            f"[... read_file stopped after line {window.last_full} to stay within {window.cap} bytes; "
            f"the file has {size} bytes{lines_known}. Call read_file with start_line={window.last_full + 1} "
            "to read on.]"
        ))
    elif window.stop == "long_line":
        content = after(content, (
            f"[... line {window.line} is longer than {window.cap} bytes; only its first {window.used} bytes "
            f"are shown. Use the shell tool to see the rest of it, or call read_file with "
            f"start_line={window.line + 1} for the lines after it.]"
        ))
    return ToolOutput(text=content, structured=structured, raw_bytes=window.used)


READ_FILE = file_tool(
    "read_file",
    (
        "Read a UTF-8 text file in the sandbox and return its content as plain text (no line numbers). "
        "The path is absolute or relative to the workspace. Give start_line and end_line (1-indexed, "
        "inclusive) to read part of a file. A file longer than max_bytes returns its first part and a "
        "note with the start_line to continue from. Directories, binary files, FIFOs and devices are "
        "refused."
    ),
    ReadFileArgs, run_read_file, title="Read file",
)


# ---- write_file --------------------------------------------------------------------------------


class WriteFileArgs(BaseModel):
    """Write a text file in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(min_length=1, description="The file: an absolute path, or relative to the workspace.")
    content: str = Field(description="The complete new content of the file (UTF-8 text).")
    create_only: bool = Field(
        default=False, description="Refuse to write if the file already exists (instead of replacing it).",
    )


def run_write_file(ctx: ToolContext, args: WriteFileArgs) -> ToolOutput:
    """Create or replace a file (parents created) through the agent."""
    data = args.content.encode("utf-8")  # pydantic refused lone surrogates already
    agent = ctx.runtime().agent
    existed = True
    try:
        agent.stat(args.path)
    except AgentCallError as error:
        existed = error.reason != "NOT_FOUND"
    try:
        written = agent.write_file(args.path, data, make_parents=True, no_overwrite=args.create_only)
    except AgentCallError as error:
        hint = ""
        if error.reason == "ALREADY_EXISTS":
            hint = "create_only is set: read the file first, or write it without create_only to replace it."
        return agent_failure(error, args.path, hint=hint)
    how = "replaced the previous content" if existed else "new file"
    return ToolOutput(
        text=f"Wrote {written} bytes to {show_path(args.path)} ({how}).",
        structured={"path": args.path, "bytes_written": written, "created": not existed},
        raw_bytes=written,
    )


WRITE_FILE = file_tool(
    "write_file",
    (
        "Write a text file in the sandbox: create it (and any missing parent directories) or replace its "
        "whole content. The path is absolute or relative to the workspace. Set create_only to refuse when "
        "the file already exists. Returns the number of bytes written."
    ),
    WriteFileArgs, run_write_file, title="Write file", read_only=False,
)

FILE_TOOLS = (READ_FILE, WRITE_FILE, LIST_DIR, SEARCH)
