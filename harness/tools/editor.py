"""``str_replace_based_edit_tool``: Anthropic's text editor tool, run against the sandbox.

Claude models are trained on this tool (``text_editor_20250728``; earlier
``text_editor_20250124`` as ``str_replace_editor``). The texts below follow Anthropic's
reference implementation (anthropic-quickstarts, ``computer_use_demo/tools/edit.py``) word
for word, so a model recovers from an error the way it learned to:

* ``view`` of a file: ``Here's the result of running `cat -n` on {path}:`` then each line as
  a 6-wide right-aligned number, a tab and the line (tabs expanded); ``view_range`` is
  ``[start, end]``, 1-indexed, ``-1`` for the end, with the three ``Invalid `view_range```
  messages. The file text is clipped at ``max_characters`` (default 16000, the reference's
  ``MAX_RESPONSE_LEN``) and marked with the reference's ``<response clipped><NOTE>...``.
* ``view`` of a directory: ``Here's the files and directories up to 2 levels deep in {path},
  excluding hidden items:`` then the directory and its entries two levels deep, one per
  line, as ``find PATH -maxdepth 2 -not -path '*/\\.*'`` prints them (sorted here).
* ``create``: ``File created successfully at: {path}``; an existing path gives ``File already
  exists at: {path}. Cannot overwrite files using command `create`.``
* ``str_replace``: exactly one occurrence is replaced, then ``The file {path} has been
  edited.`` with a ``cat -n`` snippet (4 lines around the edit); none gives ``No replacement
  was performed, old_str `...` did not appear verbatim in {path}.``; several give ``No
  replacement was performed. Multiple occurrences of old_str `...` in lines [..]. Please
  ensure it is unique``.
* ``insert``: the text goes after line ``insert_line`` (0 is the top); out of range gives
  ``Invalid `insert_line` parameter: ...``. The text is ``insert_text`` (what Claude 4
  models send for text_editor_20250728); ``new_str`` is accepted instead, as older versions
  of the tool named it.
* ``undo_edit`` (text_editor_20250124; not part of 20250728, kept because models still
  send it): restores the file's content before the last edit made through this tool;
  ``No edit history found for {path}.`` when there is none.
* Paths must be absolute: ``The path {path} is not an absolute path, it should start with
  `/`. Maybe you meant /{path}?``. A missing path: ``The path {path} does not exist. Please
  provide a valid path.``; a directory with another command: ``The path {path} is a
  directory and only the `view` command can be used on directories``.

Where this deliberately differs from the reference (each an improvement a model cannot
trip over, since matching and messages stay the same):

* Tabs: ``old_str`` is matched as written first; if it does not occur, it is matched the
  way the reference does, with tabs expanded in the file and in ``old_str`` (so text copied
  from the tab-expanded ``view`` output still matches). The reference then writes the
  *whole file* back with its tabs expanded, which breaks Makefiles and tab-indented code;
  here only the replaced span changes and every other tab is kept. ``new_str`` and
  ``insert_text`` are written as given (the reference expands their tabs too).
* A file whose lines all end in CRLF is edited in LF form (as Python's text mode reads it
  in the reference) and written back with CRLF; the reference converts it to LF.
* ``undo_edit`` restores the exact previous bytes (the reference restores its
  tab-expanded copy), and undoing a ``create`` removes the created file (the reference
  writes the same content again).
* Several occurrences are reported by the line each *starts* on (the reference lists lines
  that contain the whole ``old_str``, which is ``[]`` for a multi-line one), and
  overlapping occurrences count (``aa`` occurs twice in ``aaa``).
* ``create`` makes missing parent directories (the reference fails on them).
* Required parameters are checked before the file is looked at (the reference reports a
  missing file first).

I/O and safety: every file operation is an RPC to the sandbox's agent (Read, Write, List,
Remove), which resolves the path fd by fd inside the allowed roots without following
symlinks out of them; an escape comes back as ``PATH_ESCAPE`` and is reported as ``The path
... is outside the sandbox's allowed directories``. Before any RPC (before the sandbox is
even started) the path is checked here: absolute, no NUL byte, at most 4096 characters and
255 bytes per name, no ``..`` component. Files are edited up to :data:`MAX_FILE_BYTES`;
``view`` without a range reads only what it can show. Files must be UTF-8.

``undo_edit`` history lives in this harness process, per sandbox (keyed by the sandbox id)
and per path, bounded in total bytes and in the number of sandboxes (least recently used
go first): :data:`HISTORY`.
"""

from __future__ import annotations

import codecs
import threading
from collections import OrderedDict, deque
from dataclasses import dataclass
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine.agent_client import AgentClient
from sandbox.v1 import filesystem_pb2

__all__ = [
    "EDITOR",
    "HISTORY",
    "Edit",
    "EditHistory",
    "EditorArgs",
    "EditorError",
    "FileText",
    "check_path",
    "decode_file",
    "encode_file",
    "insert_into",
    "make_output",
    "maybe_truncate",
    "replace_once",
    "run_editor",
    "view_directory",
    "view_file",
]

TOOL_NAME = "str_replace_based_edit_tool"
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 16000
TRUNCATED_MESSAGE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry this tool after you have searched inside the file with `grep -n` in order "
    "to find the line numbers of what you are looking for.</NOTE>"
)
MAX_FILE_BYTES = 8 << 20
"""Largest file ``str_replace``, ``insert``, ``undo_edit`` and ``view`` with a range work on."""
MAX_PATH_LENGTH = 4096
MAX_NAME_BYTES = 255
LIST_LIMIT = 10_000
HISTORY_MAX_BYTES = 64 << 20
HISTORY_MAX_SANDBOXES = 64


class EditorError(Exception):
    """A result the model reads as an error: the exact text and the error code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.TOOL_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class _IsDirectory(EditorError):
    """The path is a directory and the command needs a file."""


def _invalid(message: str) -> EditorError:
    return EditorError(message, ErrorCode.INVALID_ARGUMENTS)


# --- the arguments ----------------------------------------------------------------------------


class EditorArgs(BaseModel):
    """View, create and edit text files in the sandbox (Anthropic's text editor tool)."""

    model_config = ConfigDict(extra="forbid")

    command: str = Field(
        description="The commands to run. Allowed options are: `view`, `create`, `str_replace`, `insert`, "
        "`undo_edit`.",
        json_schema_extra={"enum": list(COMMANDS)},
    )
    path: str = Field(
        description="Absolute path to file or directory, e.g. `/workspace/file.py` or `/workspace`."
    )
    file_text: str | None = Field(
        default=None,
        description="Required parameter of `create` command, with the content of the file to be created.",
    )
    old_str: str | None = Field(
        default=None,
        description="Required parameter of `str_replace` command containing the string in `path` to replace.",
    )
    new_str: str | None = Field(
        default=None,
        description="Optional parameter of `str_replace` command containing the new string (if not given, "
        "no string will be added).",
    )
    insert_line: int | None = Field(
        default=None,
        description="Required parameter of `insert` command. The `insert_text` will be inserted AFTER the "
        "line `insert_line` of `path` (0 inserts at the top).",
    )
    insert_text: str | None = Field(
        default=None,
        description="Required parameter of `insert` command containing the text to insert.",
    )
    view_range: list[int] | None = Field(
        default=None,
        description="Optional parameter of `view` command when `path` points to a file. If none is given, "
        "the full file is shown. If provided, the file will be shown in the indicated line number range, "
        "e.g. [11, 12] will show lines 11 and 12. Indexing at 1 to start. Setting `[start_line, -1]` "
        "shows all lines from `start_line` to the end of the file.",
    )
    max_characters: int | None = Field(
        default=None,
        ge=1,
        description="Optional parameter of `view` command: show at most this many characters of the file "
        f"(default {MAX_RESPONSE_LEN}); longer output is clipped and marked with `<response clipped>`.",
    )


# --- pure text logic --------------------------------------------------------------------------


def check_path(path: str) -> str:
    """The path as the editor names it (normalised like ``pathlib``), or EditorError.

    Everything here is decided from the string alone, before any I/O.
    """
    if "\x00" in path:
        raise _invalid(f"The path {path!r} contains a NUL byte; a path cannot contain NUL bytes.")
    if len(path) > MAX_PATH_LENGTH:
        raise _invalid(
            f"The path is {len(path)} characters long; the sandbox accepts paths of at most "
            f"{MAX_PATH_LENGTH} characters."
        )
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise _invalid(f"The path {path!r} is not valid Unicode text.") from None
    if not path:
        raise _invalid("The path is empty; it should be an absolute path starting with `/`.")
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        suggested = PurePosixPath("/") / pure
        raise _invalid(
            f"The path {pure} is not an absolute path, it should start with `/`. Maybe you meant {suggested}?"
        )
    if ".." in pure.parts:
        raise _invalid(f"The path {pure} contains `..`; give the absolute path without `..` components.")
    for name in pure.parts[1:]:
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise _invalid(
                f"The path {pure} contains a name longer than {MAX_NAME_BYTES} bytes, which no file can have."
            )
    return str(pure)


def maybe_truncate(content: str, limit: int = MAX_RESPONSE_LEN) -> str:
    """``content`` cut to ``limit`` characters plus the clipped-response note, if longer."""
    return content if len(content) <= limit else content[:limit] + TRUNCATED_MESSAGE


def make_output(content: str, descriptor: str, init_line: int = 1, limit: int = MAX_RESPONSE_LEN) -> str:
    """The ``cat -n`` rendering: clipped, tabs expanded, 6-wide line numbers, a tab, the line."""
    content = maybe_truncate(content, limit).expandtabs()
    numbered = "\n".join(f"{i + init_line:6}\t{line}" for i, line in enumerate(content.split("\n")))
    return f"Here's the result of running `cat -n` on {descriptor}:\n{numbered}\n"


def view_file(
    text: str, path: str, view_range: list[int] | None = None, max_characters: int | None = None
) -> str:
    """The ``view`` result for a file's text (an empty ``view_range`` means the whole file)."""
    init_line = 1
    if view_range:
        if len(view_range) != 2:
            raise _invalid("Invalid `view_range`. It should be a list of two integers.")
        lines = text.split("\n")
        n_lines = len(lines)
        init_line, final_line = view_range
        if init_line < 1 or init_line > n_lines:
            raise _invalid(
                f"Invalid `view_range`: {view_range}. Its first element `{init_line}` should be within the "
                f"range of lines of the file: {[1, n_lines]}"
            )
        if final_line > n_lines:
            raise _invalid(
                f"Invalid `view_range`: {view_range}. Its second element `{final_line}` should be smaller than "
                f"the number of lines in the file: `{n_lines}`"
            )
        if final_line != -1 and final_line < init_line:
            raise _invalid(
                f"Invalid `view_range`: {view_range}. Its second element `{final_line}` should be larger or "
                f"equal than its first `{init_line}`"
            )
        selected = lines[init_line - 1 :] if final_line == -1 else lines[init_line - 1 : final_line]
        text = "\n".join(selected)
    return make_output(text, path, init_line, max_characters or MAX_RESPONSE_LEN)


def view_directory(path: str, entries: list[str], *, truncated: bool = False) -> str:
    """The ``view`` result for a directory: itself, then its entries (relative paths)."""
    base = path.rstrip("/")
    listing = "\n".join([path, *(f"{base}/{entry}" for entry in entries)]) + "\n"
    if truncated:
        listing += TRUNCATED_MESSAGE
    listing = maybe_truncate(listing)
    return f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden items:\n{listing}\n"


@dataclass(frozen=True)
class Edit:
    """A successful edit: the file's new text and the message for the model."""

    new_text: str
    message: str


def _occurrences(haystack: str, needle: str, cap: int = 10_000) -> list[int]:
    """Start offsets of ``needle`` in ``haystack``, overlapping ones included (at most ``cap``)."""
    if not needle:
        return list(range(min(len(haystack) + 1, cap)))
    found: list[int] = []
    index = haystack.find(needle)
    while index != -1 and len(found) < cap:
        found.append(index)
        index = haystack.find(needle, index + 1)
    return found


def _start_lines(text: str, offsets: list[int]) -> list[int]:
    """1-based line numbers of the given (ascending) offsets, without repeats."""
    lines: list[int] = []
    line, previous = 1, 0
    for offset in offsets:
        line += text.count("\n", previous, offset)
        previous = offset
        if not lines or lines[-1] != line:
            lines.append(line)
    return lines


def _line_start(text: str, line_index: int) -> int:
    """Offset of the start of 0-based line ``line_index``."""
    offset = 0
    for _ in range(line_index):
        offset = text.index("\n", offset) + 1
    return offset


def _raw_column(raw_line: str, column: int, *, end: bool) -> tuple[int, int]:
    """Map an offset in ``raw_line.expandtabs()`` to (offset in raw_line, spaces of a split tab).

    A match may begin or end inside the spaces a tab expands to; the tab is then replaced
    and the spaces of it outside the match are kept (returned as the second value).
    """
    if end and column == 0:
        return 0, 0
    col = 0  # column within the expanded line (reset by \r, as str.expandtabs does)
    off = 0  # offset within the expanded line
    for index, char in enumerate(raw_line):
        width = 8 - col % 8 if char == "\t" else 1
        if end:
            if off + width == column:
                return index + 1, 0
            if off < column < off + width:
                return index + 1, off + width - column
        else:
            if off == column:
                return index, 0
            if off < column < off + width:
                return index, column - off
        off += width
        col = 0 if char == "\r" else col + width
    return len(raw_line), 0


def _expanded_span_to_raw(raw: str, expanded: str, start: int, stop: int) -> tuple[int, int, int, int]:
    """Raw (start, stop, leading pad, trailing pad) of the span [start, stop) of ``raw.expandtabs()``."""
    spans = []
    for offset, is_end in ((start, False), (stop, True)):
        line_index = expanded.count("\n", 0, offset)
        exp_line_start = expanded.rfind("\n", 0, offset) + 1
        raw_line_start = _line_start(raw, line_index)
        raw_line_end = raw.find("\n", raw_line_start)
        raw_line = raw[raw_line_start : None if raw_line_end == -1 else raw_line_end]
        index, pad = _raw_column(raw_line, offset - exp_line_start, end=is_end)
        spans.append((raw_line_start + index, pad))
    (raw_start, lead), (raw_stop, trail) = spans
    return raw_start, raw_stop, lead, trail


def replace_once(text: str, old_str: str, new_str: str, path: str) -> Edit:
    """``str_replace``: replace the one occurrence of ``old_str`` (see the module docstring on tabs)."""
    shown = old_str.expandtabs()
    found = _occurrences(text, old_str)
    if len(found) == 1:
        start, stop, lead, trail = found[0], found[0] + len(old_str), 0, 0
    elif len(found) > 1:
        raise EditorError(
            f"No replacement was performed. Multiple occurrences of old_str `{shown}` in lines "
            f"{_start_lines(text, found)}. Please ensure it is unique"
        )
    else:
        expanded = text.expandtabs()
        found = _occurrences(expanded, shown) if ("\t" in text or "\t" in old_str) else []
        if not found:
            raise EditorError(f"No replacement was performed, old_str `{shown}` did not appear verbatim in {path}.")
        if len(found) > 1:
            raise EditorError(
                f"No replacement was performed. Multiple occurrences of old_str `{shown}` in lines "
                f"{_start_lines(expanded, found)}. Please ensure it is unique"
            )
        start, stop, lead, trail = _expanded_span_to_raw(text, expanded, found[0], found[0] + len(shown))
    new_text = text[:start] + " " * lead + new_str + " " * trail + text[stop:]

    replacement_line = text.count("\n", 0, start)
    start_line = max(0, replacement_line - SNIPPET_LINES)
    end_line = replacement_line + SNIPPET_LINES + new_str.count("\n")
    snippet = "\n".join(new_text.split("\n")[start_line : end_line + 1])
    message = (
        f"The file {path} has been edited. "
        + make_output(snippet, f"a snippet of {path}", start_line + 1)
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )
    return Edit(new_text, message)


def insert_into(text: str, insert_line: int, insert_text: str, path: str) -> Edit:
    """``insert``: put ``insert_text`` after line ``insert_line`` (0 = before the first line)."""
    lines = text.split("\n")
    n_lines = len(lines)
    if insert_line < 0 or insert_line > n_lines:
        raise _invalid(
            f"Invalid `insert_line` parameter: {insert_line}. It should be within the range of lines of the "
            f"file: {[0, n_lines]}"
        )
    new_lines = insert_text.split("\n")
    new_text = "\n".join(lines[:insert_line] + new_lines + lines[insert_line:])
    snippet = "\n".join(
        lines[max(0, insert_line - SNIPPET_LINES) : insert_line]
        + new_lines
        + lines[insert_line : insert_line + SNIPPET_LINES]
    )
    message = (
        f"The file {path} has been edited. "
        + make_output(snippet, "a snippet of the edited file", max(1, insert_line - SNIPPET_LINES + 1))
        + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
        "etc). Edit the file again if necessary."
    )
    return Edit(new_text, message)


@dataclass(frozen=True)
class FileText:
    """A file's text with CRLF line ends folded to LF, and whether to write them back as CRLF."""

    text: str
    crlf: bool = False

    def lf(self, value: str) -> str:
        """An argument string in the same form as ``text`` (CRLF folded for a CRLF file)."""
        return value.replace("\r\n", "\n") if self.crlf else value


def decode_file(data: bytes, path: str, *, final: bool = True) -> FileText:
    """Decode UTF-8 (``final=False``: ``data`` is a prefix, a cut character at its end is dropped)."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
    except UnicodeDecodeError as exc:
        raise EditorError(
            f"Ran into {exc} while trying to read {path}. The file is not UTF-8 text; this tool only views and "
            "edits UTF-8 text files."
        ) from None
    newlines = text.count("\n")
    if newlines and text.count("\r\n") == newlines:
        return FileText(text.replace("\r\n", "\n"), crlf=True)
    return FileText(text)


def encode_file(text: str, crlf: bool = False) -> bytes:
    """The bytes to write for ``text`` (LF turned back into CRLF for a CRLF file)."""
    if crlf:
        text = text.replace("\n", "\r\n")
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _invalid(f"The text cannot be written as UTF-8: {exc}.") from None


# --- undo history -----------------------------------------------------------------------------


@dataclass
class _Entry:
    sandbox: str
    path: str
    previous: bytes | None
    """The file's bytes before the edit; None if the edit created it."""
    live: bool = True

    @property
    def size(self) -> int:
        return len(self.previous or b"") + len(self.path) + 64


class EditHistory:
    """Per sandbox and path, a stack of the contents before each edit; bounded in memory.

    At most ``max_bytes`` in all (the oldest entries are dropped first) and ``max_sandboxes``
    sandboxes (the least recently used one is dropped whole). Thread-safe.
    """

    def __init__(self, max_bytes: int = HISTORY_MAX_BYTES, max_sandboxes: int = HISTORY_MAX_SANDBOXES) -> None:
        self.max_bytes = max_bytes
        self.max_sandboxes = max_sandboxes
        self._lock = threading.Lock()
        self._stacks: OrderedDict[str, dict[str, list[_Entry]]] = OrderedDict()
        self._order: deque[_Entry] = deque()  # every pushed entry, oldest first (dead ones skipped)
        self._bytes = 0
        self._live = 0

    @property
    def bytes_held(self) -> int:
        return self._bytes

    def push(self, sandbox: str, path: str, previous: bytes | None) -> None:
        entry = _Entry(sandbox, path, previous)
        if entry.size > self.max_bytes:
            return  # larger than the whole budget: this edit cannot be undone
        with self._lock:
            stacks = self._stacks.get(sandbox)
            if stacks is None:
                stacks = self._stacks[sandbox] = {}
                while len(self._stacks) > self.max_sandboxes:
                    self._drop_sandbox(next(iter(self._stacks)))
            self._stacks.move_to_end(sandbox)
            stacks.setdefault(path, []).append(entry)
            self._order.append(entry)
            self._bytes += entry.size
            self._live += 1
            while self._bytes > self.max_bytes:
                self._evict_oldest()
            if len(self._order) > 2 * self._live + 64:
                self._order = deque(e for e in self._order if e.live)

    def pop(self, sandbox: str, path: str) -> _Entry | None:
        """The most recent entry for ``path`` (removed), or None."""
        with self._lock:
            stacks = self._stacks.get(sandbox)
            stack = stacks.get(path) if stacks is not None else None
            if not stack:
                return None
            assert stacks is not None
            self._stacks.move_to_end(sandbox)
            entry = stack.pop()
            if not stack:
                del stacks[path]
            self._kill(entry)
            return entry

    def depth(self, sandbox: str, path: str) -> int:
        with self._lock:
            return len(self._stacks.get(sandbox, {}).get(path, ()))

    def forget(self, sandbox: str) -> None:
        """Drop a sandbox's history (e.g. when it is destroyed)."""
        with self._lock:
            if sandbox in self._stacks:
                self._drop_sandbox(sandbox)

    def _kill(self, entry: _Entry) -> None:
        entry.live = False
        self._bytes -= entry.size
        self._live -= 1

    def _drop_sandbox(self, sandbox: str) -> None:
        for stack in self._stacks.pop(sandbox).values():
            for entry in stack:
                self._kill(entry)

    def _evict_oldest(self) -> None:
        while self._order:
            entry = self._order.popleft()
            if not entry.live:
                continue
            stacks = self._stacks[entry.sandbox]
            stack = stacks[entry.path]
            stack.remove(entry)  # it is the oldest, so at the bottom of its stack
            if not stack:
                del stacks[entry.path]
            self._kill(entry)
            return


HISTORY = EditHistory()
"""The harness process's undo history (``undo_edit`` works within one harness process)."""


# --- the handler ------------------------------------------------------------------------------


def _agent_failure(error: AgentCallError, path: str, action: str) -> EditorError:
    """An agent refusal as the model should read it; ``action`` is "read" or "write to"."""
    if error.reason == "PATH_ESCAPE":
        return EditorError(
            f"The path {path} is outside the sandbox's allowed directories and was refused. {error.message}"
        )
    if error.reason == "NOT_FOUND":
        return EditorError(f"The path {path} does not exist. Please provide a valid path.")
    if error.reason == "UNSPECIFIED" and error.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED", "CANCELLED"):
        return EditorError(
            f"The sandbox did not answer while trying to {action} {path} ({error.message}).",
            ErrorCode.SANDBOX_UNAVAILABLE,
        )
    return EditorError(f"Ran into {error.message.rstrip('.')} while trying to {action} {path}")


class _Session:
    """One call: the path, the sandbox (started on first use) and the bytes moved."""

    def __init__(self, ctx: ToolContext, path: str) -> None:
        self.ctx = ctx
        self.path = path
        self.bytes = 0

    @property
    def agent(self) -> AgentClient:
        return self.ctx.sandbox().agent

    @property
    def sandbox_id(self) -> str:
        return str(self.ctx.sandbox().id)

    def read(self, limit: int) -> filesystem_pb2.ReadResponse:
        try:
            response: filesystem_pb2.ReadResponse = self.agent.read_file(self.path, limit=limit)
        except AgentCallError as error:
            if error.reason == "WRONG_TYPE":
                raise self._not_a_file() from None
            raise _agent_failure(error, self.path, "read") from None
        self.bytes += len(response.data)
        return response

    def read_whole(self) -> bytes:
        response = self.read(MAX_FILE_BYTES)
        if response.truncated:
            raise EditorError(
                f"The file {self.path} is too large for this tool ({response.size} bytes; the limit is "
                f"{MAX_FILE_BYTES} bytes). Use the shell to work with it, e.g. `grep -n` to find lines and "
                "`sed -n 'START,ENDp'` to print them."
            )
        return bytes(response.data)

    def write(self, data: bytes) -> None:
        try:
            self.agent.write_file(self.path, data)
        except AgentCallError as error:
            if error.reason == "WRONG_TYPE" and self.is_directory():
                raise self._directory_refusal() from None
            raise _agent_failure(error, self.path, "write to") from None
        self.bytes += len(data)

    def is_directory(self) -> bool:
        try:
            self.agent.list_dir(self.path, depth=1, limit=1)
        except AgentCallError:
            return False
        return True

    def _directory_refusal(self) -> EditorError:
        return _IsDirectory(
            f"The path {self.path} is a directory and only the `view` command can be used on directories"
        )

    def _not_a_file(self) -> EditorError:
        if self.is_directory():
            return self._directory_refusal()
        return EditorError(f"The path {self.path} is not a regular file; this tool only works on text files.")


def _required(value: object, name: str, command: str) -> None:
    if value is None:
        raise _invalid(f"Parameter `{name}` is required for command: {command}")


def _view(session: _Session, args: EditorArgs) -> str:
    limit = args.max_characters or MAX_RESPONSE_LEN
    try:
        if args.view_range:
            data, complete = session.read_whole(), True
        else:
            # Only what can be shown: enough bytes for ``limit`` characters and the clipping.
            response = session.read(min(MAX_FILE_BYTES, limit * 4 + 4))
            data, complete = bytes(response.data), not response.truncated
    except _IsDirectory:
        return _view_directory(session, args)
    text = decode_file(data, session.path, final=complete).text
    if not complete and len(text) <= limit:  # only when max_characters is beyond MAX_FILE_BYTES / 4
        return make_output(text + TRUNCATED_MESSAGE, session.path, 1, len(text) + len(TRUNCATED_MESSAGE))
    return view_file(text, session.path, args.view_range, args.max_characters)


def _view_directory(session: _Session, args: EditorArgs) -> str:
    if args.view_range:
        raise _invalid("The `view_range` parameter is not allowed when `path` points to a directory.")
    try:
        listing = session.agent.list_dir(session.path, depth=2, include_hidden=False, limit=LIST_LIMIT)
    except AgentCallError as error:
        raise _agent_failure(error, session.path, "read") from None
    entries = [entry.path for entry in listing.entries]
    return view_directory(session.path, entries, truncated=listing.truncated)


def _create(session: _Session, args: EditorArgs) -> str:
    _required(args.file_text, "file_text", "create")
    assert args.file_text is not None
    data = encode_file(args.file_text)
    exists = EditorError(
        f"File already exists at: {session.path}. Cannot overwrite files using command `create`."
    )
    try:
        session.agent.write_file(session.path, data, no_overwrite=True, make_parents=True)
    except AgentCallError as error:
        if error.reason == "ALREADY_EXISTS" or (error.reason == "WRONG_TYPE" and session.is_directory()):
            raise exists from None
        raise _agent_failure(error, session.path, "write to") from None
    session.bytes += len(data)
    HISTORY.push(session.sandbox_id, session.path, None)
    return f"File created successfully at: {session.path}"


def _edit(session: _Session, args: EditorArgs) -> str:
    if args.command == "str_replace":
        _required(args.old_str, "old_str", "str_replace")
    else:
        _required(args.insert_line, "insert_line", "insert")
        if args.insert_text is None and args.new_str is None:
            raise _invalid("Parameter `insert_text` is required for command: insert")
    previous = session.read_whole()
    file = decode_file(previous, session.path)
    if args.command == "str_replace":
        assert args.old_str is not None
        edit = replace_once(file.text, file.lf(args.old_str), file.lf(args.new_str or ""), session.path)
    else:
        assert args.insert_line is not None
        text = args.insert_text if args.insert_text is not None else args.new_str
        assert text is not None
        edit = insert_into(file.text, args.insert_line, file.lf(text), session.path)
    session.write(encode_file(edit.new_text, file.crlf))
    HISTORY.push(session.sandbox_id, session.path, previous)
    return edit.message


def _undo(session: _Session) -> str:
    session.read(1)  # the path must lead to a file inside the roots, as the write will need it to
    sandbox = session.sandbox_id
    entry = HISTORY.pop(sandbox, session.path)
    if entry is None:
        raise EditorError(f"No edit history found for {session.path}.")
    try:
        if entry.previous is None:
            try:
                session.agent.remove(session.path)
            except AgentCallError as error:
                raise _agent_failure(error, session.path, "remove") from None
            return (
                f"Last edit to {session.path} undone successfully. The file did not exist before it was "
                "created with `create`, so it has been removed."
            )
        session.write(entry.previous)
    except EditorError:
        HISTORY.push(sandbox, session.path, entry.previous)  # nothing was undone: keep it
        raise
    file = decode_file(entry.previous, session.path)  # it was decoded before that edit, so it decodes
    return f"Last edit to {session.path} undone successfully. {make_output(file.text, session.path)}"


def run_editor(ctx: ToolContext, args: EditorArgs) -> ToolOutput:
    session: _Session | None = None
    try:
        if args.command not in COMMANDS:
            raise _invalid(
                f"Unrecognized command {args.command}. The allowed commands for the {TOOL_NAME} tool are: "
                + ", ".join(COMMANDS)
            )
        session = _Session(ctx, check_path(args.path))
        if args.command == "view":
            text = _view(session, args)
        elif args.command == "create":
            text = _create(session, args)
        elif args.command == "undo_edit":
            text = _undo(session)
        else:
            text = _edit(session, args)
    except EditorError as error:
        return ToolOutput(text=error.message, is_error=True, error=error.code,
                          raw_bytes=session.bytes if session else 0)
    return ToolOutput(text=text, raw_bytes=session.bytes)


EDITOR = Tool(
    ToolDefinition(
        name=TOOL_NAME,
        description=(
            "Custom editing tool for viewing, creating and editing files in the sandbox.\n"
            "* If `path` is a file, `view` displays the result of applying `cat -n`. If `path` is a directory, "
            "`view` lists non-hidden files and directories up to 2 levels deep\n"
            "* The `create` command cannot be used if the specified `path` already exists as a file\n"
            "* If a `command` generates a long output, it will be truncated and marked with `<response clipped>`\n"
            "* The `undo_edit` command will revert the last edit made to the file at `path`\n"
            "* Paths are absolute and must lie inside the sandbox's working directories (e.g. /workspace)\n"
            "Notes for using the `str_replace` command:\n"
            "* The `old_str` parameter should match EXACTLY one or more consecutive lines from the original "
            "file. Be mindful of whitespaces!\n"
            "* If the `old_str` parameter is not unique in the file, the replacement will not be performed. "
            "Make sure to include enough context in `old_str` to make it unique\n"
            "* The `new_str` parameter should contain the edited lines that should replace the `old_str`"
        ),
        input_model=EditorArgs,
        annotations=ToolAnnotations(read_only=False, destructive=True, idempotent=False, open_world=False,
                                    title="Text editor"),
        path_fields=("path",),
    ),
    run_editor,
)
