"""``memory``: Anthropic's memory tool (``memory_20250818``), kept on this host per memory scope.

The model keeps notes under ``/memories`` that outlive the run: a later run of the same scope
(:mod:`harness.core.memory`: per project or per door client) reads them. The commands, their
fields and their texts are those of Anthropic's documentation, so a Claude model trained on
the tool reads them as it learned to:

* ``view {path, view_range?}``: a directory as ``Here're the files and directories up to 2
  levels deep in {path}, excluding hidden items and node_modules:`` then ``{size}\\t{path}``
  lines (sizes as ``4.0K``); a file as ``Here's the content of {path} with line numbers:`` then
  6-wide line numbers, a tab and the line; ``view_range`` is ``[first, last]``, 1-indexed,
  ``-1`` for the end. A missing path: ``The path {path} does not exist. Please provide a
  valid path.``
* ``create {path, file_text}``: ``File created successfully at: {path}``; an existing path
  gives ``Error: File {path} already exists``. Missing parent directories are made.
* ``str_replace {path, old_str, new_str}``: exactly one occurrence; ``The memory file has been
  edited.`` and a numbered snippet; none or several give the documented ``No replacement was
  performed...`` texts.
* ``insert {path, insert_line, insert_text}``: the text goes after line ``insert_line`` (0:
  the top); ``The file {path} has been edited.``
* ``delete {path}``: a file, or a directory with everything in it: ``Successfully deleted {path}``.
* ``rename {old_path, new_path}``: ``Successfully renamed {old_path} to {new_path}``; an
  existing destination is not overwritten.

Every path must be ``/memories`` or under it: a path elsewhere, a ``..`` or ``.`` component,
an empty one (``//``), a NUL byte or another control character, a backslash, a name over 255
bytes, a path over 1024 characters or 16 levels deep is refused before anything is opened; on
the host the tree is reached descriptor by descriptor without following links
(:mod:`harness.tools.memory_store`). A command that would leave a file over the scope's
``max_file_bytes``, or the scope over ``max_scope_bytes`` or ``max_entries``, is refused and
changes nothing. The result goes through the call path like any other, so it is redacted,
bounded and audited; the sandbox is never started for it. Anthropic models get the tool as
its own type (``{"type": "memory_20250818", "name": "memory"}``), every other format and
door as a plain function with the schema below.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.tools.memory_store import MemoryRefused, MemoryTree, NotFound, opened, shown

__all__ = ["MAX_DEPTH", "MAX_PATH_CHARS", "MEMORY", "MemoryArgs", "is_memory", "memory_parts", "run_memory"]

TOOL_NAME = "memory"
ROOT = "/memories"
MAX_PATH_CHARS = 1024
MAX_NAME_BYTES = 255
MAX_DEPTH = 16
MAX_LINES = 999_999
SNIPPET_LINES = 2
Command = Literal["view", "create", "str_replace", "insert", "delete", "rename"]


class MemoryArgs(BaseModel):
    """Your memory directory, /memories, kept between runs."""

    model_config = ConfigDict(extra="forbid")

    command: Command = Field(description="The command: `view`, `create`, `str_replace`, `insert`, `delete` or "
                                         "`rename`.")
    path: str | None = Field(default=None, description=(
        "The file or directory, under /memories (e.g. /memories or /memories/notes.md); every command but "
        "`rename` needs it."))
    view_range: list[int] | None = Field(default=None, min_length=2, max_length=2, description=(
        "`view` of a file: [first, last] line, 1-indexed; last -1 for the end."))
    file_text: str | None = Field(default=None, description="`create`: the content of the new file.")
    old_str: str | None = Field(default=None, description="`str_replace`: the text to replace; it must occur "
                                                          "exactly once.")
    new_str: str | None = Field(default=None, description="`str_replace`: the text that replaces it (absent: "
                                                          "nothing).")
    insert_line: int | None = Field(default=None, description="`insert`: the line after which the text goes (0: "
                                                              "the top).")
    insert_text: str | None = Field(default=None, description="`insert`: the text to insert.")
    old_path: str | None = Field(default=None, description="`rename`: the file or directory to move.")
    new_path: str | None = Field(default=None, description="`rename`: where it goes (it must not exist).")


def is_memory(definition: ToolDefinition) -> bool:
    """Whether ``definition`` is callbox's own ``memory`` tool (a declared tool of that name is not)."""
    return definition.name == TOOL_NAME and definition.input_model is MemoryArgs


# --- paths ------------------------------------------------------------------------------------------


def memory_parts(path: str, field: str = "path") -> tuple[str, ...]:
    """The names of ``path`` below /memories (empty: /memories itself), or MemoryRefused saying why not."""
    def refuse(why: str) -> MemoryRefused:
        return MemoryRefused(f"Error: `{field}` {path!r} {why}", "bad_path", ErrorCode.INVALID_ARGUMENTS)

    if "\x00" in path:
        raise refuse("contains a NUL byte")
    if len(path) > MAX_PATH_CHARS:
        raise refuse(f"is {len(path)} characters long; a memory path has at most {MAX_PATH_CHARS}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path) or "\\" in path:
        raise refuse("contains a control character or a backslash, which no memory path may hold")
    if path != ROOT and not path.startswith(ROOT + "/"):
        raise refuse(f"is outside {ROOT}: every memory path is {ROOT} or under it (e.g. {ROOT}/notes.md)")
    rest = path[len(ROOT) + 1:]
    rest = rest.rstrip("/") if rest.endswith("/") else rest  # a directory may be written with its slash
    if not rest:
        return ()
    parts = tuple(rest.split("/"))
    for name in parts:
        if not name:
            raise refuse("has an empty component (`//`); name each directory")
        if name in (".", ".."):
            raise refuse(f"has a `{name}` component; name each directory from {ROOT} down, without `..` or `.`")
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise refuse("is not valid Unicode text") from None
        if size > MAX_NAME_BYTES:
            raise refuse(f"has a name of {size} bytes; a name has at most {MAX_NAME_BYTES}")
    if len(parts) > MAX_DEPTH:
        raise refuse(f"is {len(parts)} levels deep; memories go at most {MAX_DEPTH} levels below {ROOT}")
    return parts


# --- the commands -----------------------------------------------------------------------------------


def run_memory(ctx: ToolContext, args: MemoryArgs) -> ToolOutput:
    if ctx.memory is None:
        return ToolOutput(text="Error: this run has no memory scope", is_error=True, error=ErrorCode.TOOL_FAILED)
    try:
        required: tuple[str, ...] = ("old_path", "new_path") if args.command == "rename" else ("path",)
        required += {"create": ("file_text",), "str_replace": ("old_str",),
                     "insert": ("insert_line", "insert_text")}.get(args.command, ())
        missing = [name for name in required if getattr(args, name) is None]
        if missing:
            raise MemoryRefused(f"Error: the `{args.command}` command needs "
                                f"{' and '.join(f'`{m}`' for m in missing)}", "missing_argument",
                                ErrorCode.INVALID_ARGUMENTS)
        with opened(ctx.memory) as tree:
            text = _COMMANDS[args.command](tree, args)
    except MemoryRefused as refused:
        return ToolOutput(text=refused.message, is_error=True, error=refused.code,
                          structured={"command": args.command, "reason": refused.reason, "scope": ctx.memory.label})
    except OSError as error:  # the host refused (permissions, a full disk): nothing was half-written
        return ToolOutput(text=f"Error: the memory could not be used: {error.strerror or error}", is_error=True,
                          error=ErrorCode.TOOL_FAILED,
                          structured={"command": args.command, "reason": "os_error", "scope": ctx.memory.label})
    return ToolOutput(text=text, structured={"command": args.command, "scope": ctx.memory.label})


def _view(tree: MemoryTree, args: MemoryArgs) -> str:
    parts = memory_parts(str(args.path))
    kind = tree.kind(parts)
    if kind is None:
        raise NotFound(parts).retold(f"The path {shown(parts)} does not exist. Please provide a valid path.")
    if kind == "dir":
        own, entries = tree.listing(parts)
        lines = [f"{human_size(own)}\t{shown(parts)}"]
        lines += [f"{human_size(e.size)}\t{shown(e.parts)}{'/' if e.is_dir else ''}" for e in entries]
        return (f"Here're the files and directories up to 2 levels deep in {shown(parts)}, excluding hidden items "
                "and node_modules:\n" + "\n".join(lines))
    lines = _lines(_text(tree, parts))
    if len(lines) > MAX_LINES:
        raise MemoryRefused(f"File {shown(parts)} exceeds maximum line limit of 999,999 lines.", "too_many_lines")
    first = 1
    if args.view_range is not None:
        first, last = args.view_range
        end = len(lines) if last == -1 else last
        if first < 1 or first > max(len(lines), 1) or end < first - 1 or end > len(lines):
            raise MemoryRefused(f"Error: Invalid `view_range`: {args.view_range}. It should be [first, last] with "
                                f"1 <= first <= last <= {len(lines)} (the file's lines), or last -1 for the end",
                                "bad_range", ErrorCode.INVALID_ARGUMENTS)
        lines = lines[first - 1:end]
    return f"Here's the content of {shown(parts)} with line numbers:\n" + _numbered(lines, first)


def _create(tree: MemoryTree, args: MemoryArgs) -> str:
    parts = _file_parts(str(args.path))
    if tree.kind(parts) is not None:
        raise MemoryRefused(f"Error: File {shown(parts)} already exists", "exists")
    data = str(args.file_text).encode("utf-8")
    _check_caps(tree, parts, data, new_entries=1 + tree.missing_dirs(parts[:-1]))
    tree.write(parts, data)
    return f"File created successfully at: {shown(parts)}"


def _str_replace(tree: MemoryTree, args: MemoryArgs) -> str:
    parts = _file_parts(str(args.path))
    if tree.kind(parts) != "file":
        raise NotFound(parts).retold(f"Error: The path {shown(parts)} does not exist. Please provide a valid path.")
    text, old, new = _text(tree, parts), str(args.old_str), args.new_str or ""
    if not old:
        raise MemoryRefused("Error: `old_str` is empty; give the exact text to replace", "empty_old_str",
                            ErrorCode.INVALID_ARGUMENTS)
    starts = _occurrences(text, old)
    if not starts:
        raise MemoryRefused(f"No replacement was performed, old_str `{old}` did not appear verbatim in "
                            f"{shown(parts)}.", "no_match")
    if len(starts) > 1:
        lines = ", ".join(str(text.count("\n", 0, s) + 1) for s in starts)
        raise MemoryRefused(f"No replacement was performed. Multiple occurrences of old_str `{old}` in lines: "
                            f"{lines}. Please ensure it is unique", "several_matches")
    edited = text[:starts[0]] + new + text[starts[0] + len(old):]
    data = edited.encode("utf-8")
    _check_caps(tree, parts, data)
    tree.write(parts, data)
    line = text.count("\n", 0, starts[0])
    new_lines = _lines(edited)
    first = max(0, line - SNIPPET_LINES)
    snippet = new_lines[first:line + new.count("\n") + SNIPPET_LINES + 1]
    return ("The memory file has been edited. Here is the snippet showing the change (with line numbers):\n"
            + _numbered(snippet, first + 1))


def _insert(tree: MemoryTree, args: MemoryArgs) -> str:
    parts = _file_parts(str(args.path))
    if tree.kind(parts) != "file":
        raise NotFound(parts).retold(f"Error: The path {shown(parts)} does not exist")
    lines = _lines(_text(tree, parts))
    at = int(args.insert_line or 0)
    if at < 0 or at > len(lines):
        raise MemoryRefused(f"Error: Invalid `insert_line` parameter: {at}. It should be within the range of lines "
                            f"of the file: [0, {len(lines)}]", "bad_line", ErrorCode.INVALID_ARGUMENTS)
    inserted = str(args.insert_text)
    lines[at:at] = _lines(inserted) or [""]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    _check_caps(tree, parts, data)
    tree.write(parts, data)
    return f"The file {shown(parts)} has been edited."


def _delete(tree: MemoryTree, args: MemoryArgs) -> str:
    parts = memory_parts(str(args.path))
    if not parts:
        raise MemoryRefused(f"Error: Cannot delete the {ROOT} directory itself; delete what is in it",
                            "root", ErrorCode.INVALID_ARGUMENTS)
    try:
        tree.delete(parts)
    except NotFound as missing:
        raise missing.retold(f"Error: The path {shown(parts)} does not exist") from None
    return f"Successfully deleted {shown(parts)}"


def _rename(tree: MemoryTree, args: MemoryArgs) -> str:
    old, new = memory_parts(str(args.old_path), "old_path"), memory_parts(str(args.new_path), "new_path")
    if not old or not new:
        raise MemoryRefused(f"Error: Cannot rename the {ROOT} directory itself, or move anything onto it",
                            "root", ErrorCode.INVALID_ARGUMENTS)
    kind = tree.kind(old)
    if kind is None:
        raise NotFound(old).retold(f"Error: The path {shown(old)} does not exist")
    if tree.kind(new) is None:
        _, entries = tree.usage()
        added = tree.missing_dirs(new[:-1])
        if added and entries + added > tree.scope.max_entries:
            raise _over("max_entries", f"{entries + added} entries", tree.scope.max_entries)
    tree.rename(old, new)
    return f"Successfully renamed {shown(old)} to {shown(new)}"


_COMMANDS = {"view": _view, "create": _create, "str_replace": _str_replace, "insert": _insert,
             "delete": _delete, "rename": _rename}


# --- helpers ----------------------------------------------------------------------------------------


def _file_parts(path: str) -> tuple[str, ...]:
    parts = memory_parts(path)
    if not parts:
        raise MemoryRefused(f"Error: {ROOT} is the memory directory itself; name a file under it "
                            f"(e.g. {ROOT}/notes.md)", "root", ErrorCode.INVALID_ARGUMENTS)
    return parts


def _text(tree: MemoryTree, parts: tuple[str, ...]) -> str:
    try:
        return tree.read(parts).decode("utf-8")
    except UnicodeDecodeError:
        raise MemoryRefused(f"Error: {shown(parts)} is not UTF-8 text; the memory tool reads and edits text only",
                            "not_text") from None


def _check_caps(tree: MemoryTree, parts: tuple[str, ...], data: bytes, *, new_entries: int = 0) -> None:
    """Refuse a write of ``data`` at ``parts`` that would pass a cap of the scope."""
    scope = tree.scope
    if len(data) > scope.max_file_bytes:
        raise _over("max_file_bytes", f"{shown(parts)} would be {len(data)} bytes", scope.max_file_bytes)
    used, entries = tree.usage()
    old = len(tree.read(parts)) if tree.kind(parts) == "file" else 0
    if used - old + len(data) > scope.max_scope_bytes:
        raise _over("max_scope_bytes", f"the memory would hold {used - old + len(data)} bytes", scope.max_scope_bytes)
    if entries + new_entries > scope.max_entries:
        raise _over("max_entries", f"the memory would hold {entries + new_entries} files and directories",
                    scope.max_entries)


def _over(key: str, what: str, cap: int) -> MemoryRefused:
    return MemoryRefused(f"Error: {what}, over the memory's cap of {cap} ([memory] {key}); nothing was changed. "
                         "Make it shorter, or delete memories that are no longer needed", "over_cap")


def _lines(text: str) -> list[str]:
    """The lines of ``text`` (a final newline ends the last line; it starts no new one)."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def _numbered(lines: list[str], first: int) -> str:
    return "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))


def _occurrences(text: str, needle: str) -> list[int]:
    found, at = [], text.find(needle)
    while at != -1:
        found.append(at)
        at = text.find(needle, at + 1)
    return found


def human_size(size: int) -> str:
    """``5632`` -> ``5.5K``: bytes in the largest unit of 1024 that keeps the number at least 1."""
    value, unit = float(size), "B"
    for unit in ("B", "K", "M", "G"):
        if value < 1024 or unit == "G":
            break
        value /= 1024
    return f"{int(value)}{unit}" if value == int(value) else f"{value:.1f}{unit}"


MEMORY = Tool(
    ToolDefinition(
        name=TOOL_NAME,
        description=(
            "Your memory directory, /memories, kept between runs: view it before you start a task, and record "
            "progress, decisions and what you learn as you go (your context may be reset at any moment). Commands: "
            "view (a directory two levels deep, or a file with line numbers), create, str_replace, insert, delete, "
            "rename; every path is /memories or under it."
        ),
        input_model=MemoryArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Memory"),
        path_fields=("path", "old_path", "new_path"),
        records_changes=False,
    ),
    run_memory,
)
