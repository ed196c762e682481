"""``list_dir`` and ``search``: what is in a directory of the sandbox, and where a pattern occurs.

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
    opens it by name, so unlike the other file tools this check is check-then-use: a
    process in the sandbox that swaps the root for a symlink in between could redirect the
    search, to files the same sandbox user could read with ``shell`` anyway.

Paths and failures are handled as for every file tool (see :mod:`harness.tools.files`).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.engine.agent_client import AgentClient
from harness.engine.exec_result import collect
from harness.tools.file_support import (
    Refused,
    after,
    agent_failure,
    file_tool,
    fit_lines,
    note_budget,
    refuse,
    show_path,
)
from sandbox.v1 import filesystem_pb2

MAX_LIST_DEPTH = 5
MAX_LIST_ENTRIES = 1000
DEFAULT_SEARCH_RESULTS = 100
MAX_SEARCH_RESULTS = 1000
SEARCH_MAX_COLUMNS = 300
SEARCH_OUTPUT_CAP = 4 << 20


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
        listing = ctx.runtime().agent.list_dir(args.path, depth=args.depth, include_hidden=args.include_hidden,
                                              limit=MAX_LIST_ENTRIES)
    except AgentCallError as error:
        hint = "list_dir lists directories; use read_file for a file." if error.reason == "WRONG_TYPE" else ""
        return agent_failure(error, args.path, hint=hint)
    lines = [_entry_line(entry) for entry in listing.entries]
    shown = fit_lines(lines, note_budget(ctx))
    text = "\n".join(shown)
    structured = {"path": args.path, "entries": len(lines), "shown": len(shown), "truncated": listing.truncated}
    if len(shown) < len(lines):
        more = len(lines) - len(shown)
        extra = "at least " if listing.truncated else ""
        text = after(text, f"[... {extra}{more} more entries not shown; list a subdirectory or use a smaller depth.]")
    elif listing.truncated:
        text = after(text, (f"[... the listing stops after {MAX_LIST_ENTRIES} entries; list a subdirectory or "
                            "use a smaller depth to see the rest.]"))
    elif not lines:
        text = "[empty directory]"
    return ToolOutput(text=text, structured=structured)


LIST_DIR = file_tool(
    "list_dir",
    (
        "List a directory in the sandbox: one entry per line, relative to the directory, sorted; "
        "directories end with '/', symbolic links show as 'name -> target' (never followed). "
        f"depth (1-{MAX_LIST_DEPTH}) also lists subdirectories. Names starting with '.' are left out "
        f"unless include_hidden is true. At most {MAX_LIST_ENTRIES} entries."
    ),
    ListDirArgs, run_list_dir, title="List directory",
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
            raise refuse(f"{show_path(path)} is not a regular file or a directory; search reads files and "
                          "directories only.", path=path, reason="WRONG_TYPE")
    except AgentCallError as error:
        raise Refused(agent_failure(error, path)) from None


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
    agent = ctx.runtime().agent
    _check_search_root(agent, args.path)
    timeout_s = ctx.timeout_for(None)
    try:
        result = collect(agent.exec_buffered(search_argv(args), timeout_ms=max(1, int(timeout_s * 1000)),
                                             output_cap_bytes=SEARCH_OUTPUT_CAP))
    except AgentCallError as error:
        if error.message.startswith("rg: command not found"):
            return ToolOutput(text="search needs ripgrep (rg), which this sandbox's image does not have: "
                                   "search with the shell tool instead (grep -rn PATTERN PATH), or use an "
                                   "image with ripgrep installed", is_error=True, error=ErrorCode.TOOL_FAILED)
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
        return ToolOutput(text=after(text, f"[... search timed out after {timeout_s:g} seconds; narrow the path "
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
        text = after(text, f"[rg also reported: {stderr.splitlines()[0][:300]}]")
    return ToolOutput(text=text, structured=structured, raw_bytes=result.stdout.total_bytes)


def _search_text(lines: list[str], args: SearchArgs, ctx: ToolContext, *, complete: bool) -> str:
    shown = fit_lines(lines[: args.max_results], note_budget(ctx))
    text = "\n".join(shown)
    if len(shown) == len(lines) and complete:
        return text
    total = f"{len(lines)}" if complete else "more"
    return after(text, f"[... showing the first {len(shown)} of {total} matching lines; narrow the pattern, "
                       "the path or the glob to see the rest.]")


SEARCH = file_tool(
    "search",
    (
        "Search file contents in the sandbox with ripgrep. pattern is a regular expression (Rust regex "
        "syntax), or a plain string when literal is true; path is a file or a directory (default: the "
        "workspace); glob filters file names (e.g. '*.py'). Like rg, hidden and .gitignore'd files are "
        "skipped. Results are 'path:line:text' lines sorted by path, at most max_results of them."
    ),
    SearchArgs, run_search, title="Search files",
)
