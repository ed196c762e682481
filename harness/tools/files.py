"""File tools: ``read_file``, ``write_file``, ``list_dir`` and ``search``, all inside the sandbox.

Every path is resolved by the sandbox agent's Filesystem service, which walks it one
directory fd at a time inside the allowed roots with ``O_NOFOLLOW`` and refuses any
escape (``..`` above a root, absolute paths elsewhere, symlinks leading out, a final
component swapped for a symlink mid-call) with PATH_ESCAPE; the harness never checks a
path string and then opens it. Relative paths are taken from the workspace. Failures are
error results (``ToolOutput(is_error=True, error=ErrorCode.TOOL_FAILED)``) whose text says
what went wrong in words (:func:`agent_failure`, one mapping shared by the four tools),
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
``list_dir``
    One entry per line, relative to the listed directory, sorted component-wise (a
    directory is followed by its contents); directories end with ``/``, symlinks read
    ``name -> target`` and are never descended into. ``depth`` 1-5; names starting with
    ``.`` are left out unless ``include_hidden``. At most 1000 entries, and no more than the
    output budget holds, with a note when cut. An empty directory gives ``[empty directory]``.
``search``
    ripgrep run in the sandbox as an argv (never a shell string): ``--no-config``, line
    numbers, ``path:line:text`` lines sorted by path, long lines shortened to 300 columns,
    at most ``max_results`` lines (and the output budget) with a note when more matched.
    rg's exit code 1 is ``No matches found.``; a bad regex is an error result with rg's
    message. Like rg, hidden and git-ignored files are skipped and symlinks inside the tree
    are not followed. The search root itself is checked through the Filesystem service
    first (it must resolve inside the roots and be a regular file or a directory); rg then
    opens it by name, so unlike the other three tools this check is check-then-use: a
    process in the sandbox that swaps the root for a symlink in between could redirect the
    search, to files the same sandbox user could read with ``shell`` anyway.
"""

from __future__ import annotations

import codecs
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.core.shaping import head_cut
from harness.engine.agent_client import AgentClient
from harness.engine.exec_result import collect
from sandbox.v1 import filesystem_pb2

DEFAULT_READ_BYTES = 256 * 1024
READ_CHUNK = 1 << 20
MAX_SCAN_BYTES = 64 << 20
"""read_file reads at most this far into a file looking for ``start_line``."""
NOTE_ROOM = 300
"""Bytes of the output budget kept free for a trailing note."""
MAX_LIST_DEPTH = 5
MAX_LIST_ENTRIES = 1000
DEFAULT_SEARCH_RESULTS = 100
MAX_SEARCH_RESULTS = 1000
SEARCH_MAX_COLUMNS = 300
SEARCH_OUTPUT_CAP = 4 << 20
MAX_SHOWN_PATH = 160
_UNREACHABLE_CODES = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"})


# ---- errors ------------------------------------------------------------------------------------


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
    elif error.reason == "UNSPECIFIED" and error.code in _UNREACHABLE_CODES:
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


class _Refused(Exception):
    """Ends a handler early with an error result (raised inside the handlers only)."""

    def __init__(self, output: ToolOutput) -> None:
        super().__init__(output.text)
        self.output = output


def _refuse(text: str, **structured: Any) -> _Refused:
    return _Refused(ToolOutput(text=text, is_error=True, error=ErrorCode.TOOL_FAILED, structured=structured or None))


def _handler(run: Callable[[ToolContext, Any], ToolOutput]) -> Callable[[ToolContext, Any], ToolOutput]:
    def handle(ctx: ToolContext, args: Any) -> ToolOutput:
        try:
            return run(ctx, args)
        except _Refused as refused:
            return refused.output

    handle.__name__ = run.__name__
    handle.__doc__ = run.__doc__
    return handle


def _agent(ctx: ToolContext) -> AgentClient:
    return ctx.sandbox().agent


def _note_budget(ctx: ToolContext) -> int:
    """Bytes of tool output that leave room for a note within the output budget."""
    return max(64, ctx.output_budget - NOTE_ROOM)


def _after(content: str, note: str) -> str:
    if not content:
        return note
    return f"{content}{'' if content.endswith(chr(10)) else chr(10)}{note}"


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


def _binary(path: str, offset: int, why: str) -> _Refused:
    return _refuse(
        f"{show_path(path)} is not a UTF-8 text file ({why} at byte {offset}); read_file returns text only. "
        f"Use the shell tool to inspect it, for example `file` or `xxd | head`.",
        path=path, reason="BINARY",
    )


def run_read_file(ctx: ToolContext, args: ReadFileArgs) -> ToolOutput:
    """Read lines of a UTF-8 text file through the agent, within the byte cap."""
    cap = min(args.max_bytes or DEFAULT_READ_BYTES, _note_budget(ctx))
    window = _LineWindow(args.start_line, args.end_line, cap)
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    agent = _agent(ctx)
    offset, size, at_eof = 0, 0, False
    while not window.stop:
        if offset >= MAX_SCAN_BYTES and window.line < args.start_line:
            raise _refuse(
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
        raise _refuse(
            f"start_line {args.start_line} is past the end of {show_path(args.path)}, which has "
            f"{total_lines} line{'s' if total_lines != 1 else ''}.",
            **structured,
        )
    lines_known = f", {total_lines} lines" if total_lines is not None else ""
    if window.stop == "budget":
        content = _after(content, (
            f"[... read_file stopped after line {window.last_full} to stay within {window.cap} bytes; "
            f"the file has {size} bytes{lines_known}. Call read_file with start_line={window.last_full + 1} "
            "to read on.]"
        ))
    elif window.stop == "long_line":
        content = _after(content, (
            f"[... line {window.line} is longer than {window.cap} bytes; only its first {window.used} bytes "
            f"are shown. Use the shell tool to see the rest of it, or call read_file with "
            f"start_line={window.line + 1} for the lines after it.]"
        ))
    return ToolOutput(text=content, structured=structured, raw_bytes=window.used)


READ_FILE = Tool(
    ToolDefinition(
        name="read_file",
        description=(
            "Read a UTF-8 text file in the sandbox and return its content as plain text (no line numbers). "
            "The path is absolute or relative to the workspace. Give start_line and end_line (1-indexed, "
            "inclusive) to read part of a file. A file longer than max_bytes returns its first part and a "
            "note with the start_line to continue from. Directories, binary files, FIFOs and devices are "
            "refused."
        ),
        input_model=ReadFileArgs,
        annotations=ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False,
                                    title="Read file"),
        path_fields=("path",),
    ),
    _handler(run_read_file),
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
    agent = _agent(ctx)
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


WRITE_FILE = Tool(
    ToolDefinition(
        name="write_file",
        description=(
            "Write a text file in the sandbox: create it (and any missing parent directories) or replace its "
            "whole content. The path is absolute or relative to the workspace. Set create_only to refuse when "
            "the file already exists. Returns the number of bytes written."
        ),
        input_model=WriteFileArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=True, open_world=False,
                                    title="Write file"),
        path_fields=("path",),
    ),
    _handler(run_write_file),
)


# ---- list_dir ----------------------------------------------------------------------------------


class ListDirArgs(BaseModel):
    """List a directory in the sandbox."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field(default=".", min_length=1,
                      description="The directory: an absolute path, or relative to the workspace.")
    depth: int = Field(default=1, ge=1, le=MAX_LIST_DEPTH,
                       description=f"1 lists the directory itself; up to {MAX_LIST_DEPTH} also lists subdirectories.")
    include_hidden: bool = Field(default=False, description="Include entries whose names start with '.'.")


def _entry_line(entry: filesystem_pb2.FileInfo) -> str:
    if entry.type == filesystem_pb2.FILE_TYPE_DIRECTORY:
        return f"{entry.path}/"
    if entry.type == filesystem_pb2.FILE_TYPE_SYMLINK:
        return f"{entry.path} -> {entry.link_target}"
    return entry.path


def run_list_dir(ctx: ToolContext, args: ListDirArgs) -> ToolOutput:
    """List entries through the agent (which never follows a symlink while descending)."""
    try:
        listing = _agent(ctx).list_dir(args.path, depth=args.depth, include_hidden=args.include_hidden,
                                       limit=MAX_LIST_ENTRIES)
    except AgentCallError as error:
        hint = "list_dir lists directories; use read_file for a file." if error.reason == "WRONG_TYPE" else ""
        return agent_failure(error, args.path, hint=hint)
    lines = [_entry_line(entry) for entry in listing.entries]
    room = _note_budget(ctx)
    shown: list[str] = []
    used = 0
    for line in lines:
        used += len(line.encode()) + 1
        if used > room:
            break
        shown.append(line)
    text = "\n".join(shown)
    structured = {"path": args.path, "entries": len(lines), "shown": len(shown), "truncated": listing.truncated}
    if len(shown) < len(lines):
        more = len(lines) - len(shown)
        extra = "at least " if listing.truncated else ""
        text = _after(text, f"[... {extra}{more} more entries not shown; list a subdirectory or use a smaller depth.]")
    elif listing.truncated:
        text = _after(text, (f"[... the listing stops after {MAX_LIST_ENTRIES} entries; list a subdirectory or "
                             "use a smaller depth to see the rest.]"))
    elif not lines:
        text = "[empty directory]"
    return ToolOutput(text=text, structured=structured)


LIST_DIR = Tool(
    ToolDefinition(
        name="list_dir",
        description=(
            "List a directory in the sandbox: one entry per line, relative to the directory, sorted; "
            "directories end with '/', symbolic links show as 'name -> target' (never followed). "
            f"depth (1-{MAX_LIST_DEPTH}) also lists subdirectories. Names starting with '.' are left out "
            f"unless include_hidden is true. At most {MAX_LIST_ENTRIES} entries."
        ),
        input_model=ListDirArgs,
        annotations=ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False,
                                    title="List directory"),
        path_fields=("path",),
    ),
    _handler(run_list_dir),
)


# ---- search ------------------------------------------------------------------------------------


class SearchArgs(BaseModel):
    """Search file contents in the sandbox with ripgrep."""

    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(min_length=1, description="A regular expression (Rust regex syntax), or a plain "
                                                   "string when literal is true.")
    path: str = Field(default=".", min_length=1,
                      description="File or directory to search: absolute, or relative to the workspace.")
    literal: bool = Field(default=False, description="Match pattern as a plain string, not a regex.")
    glob: str | None = Field(default=None, min_length=1,
                             description="Only search files whose paths match this glob, e.g. '*.py' "
                                         "(a leading '!' excludes instead).")
    max_results: int = Field(default=DEFAULT_SEARCH_RESULTS, ge=1, le=MAX_SEARCH_RESULTS,
                             description="Most matching lines to return.")


def _check_search_root(agent: AgentClient, path: str) -> None:
    """The search root must resolve inside the roots and be a regular file or a directory."""
    try:
        info = agent.stat(path)
        if info.type == filesystem_pb2.FILE_TYPE_SYMLINK:  # resolve it the confined way too
            try:
                agent.list_dir(path, depth=1, limit=1)
            except AgentCallError as error:
                if error.reason != "WRONG_TYPE":
                    raise
                agent.read_file(path, limit=1)
        elif info.type not in (filesystem_pb2.FILE_TYPE_FILE, filesystem_pb2.FILE_TYPE_DIRECTORY):
            raise _refuse(f"{show_path(path)} is not a regular file or a directory; search reads files and "
                          "directories only.", path=path, reason="WRONG_TYPE")
    except AgentCallError as error:
        raise _Refused(agent_failure(error, path)) from None


def search_argv(args: SearchArgs) -> list[str]:
    """The rg command line: options first, the pattern and the path as values (no shell)."""
    argv = ["rg", "--no-config", "--line-number", "--no-heading", "--with-filename", "--color", "never",
            "--max-columns", str(SEARCH_MAX_COLUMNS), "--max-columns-preview", "--sort", "path"]
    if args.literal:
        argv.append("--fixed-strings")
    if args.glob is not None:
        argv += ["--glob", args.glob]
    return [*argv, "--regexp", args.pattern, "--", args.path]


def run_search(ctx: ToolContext, args: SearchArgs) -> ToolOutput:
    """Run ripgrep in the sandbox and return ``path:line:text`` lines, capped."""
    agent = _agent(ctx)
    _check_search_root(agent, args.path)
    timeout_s = ctx.timeout_for(None)
    try:
        result = collect(agent.exec(search_argv(args), timeout_ms=max(1, int(timeout_s * 1000)),
                                    output_cap_bytes=SEARCH_OUTPUT_CAP))
    except AgentCallError as error:
        return agent_failure(error, args.path)
    complete = not result.stdout.truncated
    raw = bytes(result.stdout.data() if complete else result.stdout.head)
    lines = raw.decode("utf-8", errors="replace").split("\n")
    lines.pop()  # after the last newline: empty, or a line the output cap cut short
    if args.path.rstrip("/") == ".":
        lines = [line.removeprefix("./") for line in lines]
    stderr = result.stderr.data().decode("utf-8", errors="replace").strip()
    structured: dict[str, Any] = {"exit_code": result.shell_exit_code, "matches": len(lines) if complete else None,
                                  "timed_out": result.timed_out}
    if result.timed_out:
        text = _search_text(lines, args, ctx, complete=False)
        return ToolOutput(text=_after(text, f"[... search timed out after {timeout_s:g} seconds; narrow the path "
                                            "or the glob.]"), is_error=True, error=ErrorCode.TIMED_OUT,
                          structured=structured)
    code = result.shell_exit_code
    if code == 1 and not lines:
        return ToolOutput(text="No matches found.", structured=structured)
    if code not in (0, 1) and not lines:
        return ToolOutput(text=f"search failed (rg exit code {result.shell_exit_code}): {stderr[:2000]}",
                          is_error=True, error=ErrorCode.TOOL_FAILED, structured=structured)
    text = _search_text(lines, args, ctx, complete=complete)
    if code == 2 and stderr:  # matches, and some files could not be read
        text = _after(text, f"[rg also reported: {stderr.splitlines()[0][:300]}]")
    return ToolOutput(text=text, structured=structured, raw_bytes=result.stdout.total_bytes)


def _search_text(lines: list[str], args: SearchArgs, ctx: ToolContext, *, complete: bool) -> str:
    room = _note_budget(ctx)
    shown: list[str] = []
    used = 0
    for line in lines[: args.max_results]:
        used += len(line.encode()) + 1
        if used > room:
            break
        shown.append(line)
    text = "\n".join(shown)
    if len(shown) == len(lines) and complete:
        return text
    total = f"{len(lines)}" if complete else "more"
    return _after(text, f"[... showing the first {len(shown)} of {total} matching lines; narrow the pattern, "
                        "the path or the glob to see the rest.]")


SEARCH = Tool(
    ToolDefinition(
        name="search",
        description=(
            "Search file contents in the sandbox with ripgrep. pattern is a regular expression (Rust regex "
            "syntax), or a plain string when literal is true; path is a file or a directory (default: the "
            "workspace); glob filters file names (e.g. '*.py'). Like rg, hidden and .gitignore'd files are "
            "skipped. Results are 'path:line:text' lines sorted by path, at most max_results of them."
        ),
        input_model=SearchArgs,
        annotations=ToolAnnotations(read_only=True, destructive=False, idempotent=True, open_world=False,
                                    title="Search files"),
        path_fields=("path",),
    ),
    _handler(run_search),
)

FILE_TOOLS = (READ_FILE, WRITE_FILE, LIST_DIR, SEARCH)
