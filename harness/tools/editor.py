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
go first): :data:`harness.tools.editor_history.HISTORY`. The pure text logic (rendering,
matching, replacing) is :mod:`harness.tools.editor_text`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.errors import AgentCallError
from harness.core.registry import Tool, ToolAnnotations, ToolDefinition
from harness.engine.agent_client import AgentClient
from harness.engine.agent_errors import sandbox_gone
from harness.tools.editor_history import HISTORY
from harness.tools.editor_text import (
    MAX_RESPONSE_LEN,
    TRUNCATED_MESSAGE,
    EditorError,
    check_path,
    decode_file,
    encode_file,
    insert_into,
    invalid,
    make_output,
    replace_once,
    view_directory,
    view_file,
)
from sandbox.v1 import filesystem_pb2

__all__ = ["EDITOR", "MAX_FILE_BYTES", "EditorArgs", "run_editor"]

TOOL_NAME = "str_replace_based_edit_tool"
COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
MAX_FILE_BYTES = 8 << 20
"""Largest file ``str_replace``, ``insert``, ``undo_edit`` and ``view`` with a range work on."""
LIST_LIMIT = 10_000


class _IsDirectory(EditorError):
    """The path is a directory and the command needs a file."""


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


# --- the handler ------------------------------------------------------------------------------


def _agent_failure(error: AgentCallError, path: str, action: str) -> EditorError:
    """An agent refusal as the model should read it; ``action`` is "read" or "write to"."""
    if error.reason == "PATH_ESCAPE":
        return EditorError(
            f"The path {path} is outside the sandbox's allowed directories and was refused. {error.message}"
        )
    if error.reason == "NOT_FOUND":
        return EditorError(f"The path {path} does not exist. Please provide a valid path.")
    if sandbox_gone(error):
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
        return self.ctx.runtime().agent

    @property
    def sandbox_id(self) -> str:
        return self.ctx.runtime().sandbox_id

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
        raise invalid(f"Parameter `{name}` is required for command: {command}")


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
        raise invalid("The `view_range` parameter is not allowed when `path` points to a directory.")
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
            raise invalid("Parameter `insert_text` is required for command: insert")
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
            raise invalid(
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
