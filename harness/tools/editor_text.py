"""The editor tool's text logic: path checks, the ``cat -n`` rendering and its clipping, the
``view`` texts, ``str_replace`` (including matching through expanded tabs), ``insert``, and how
a file's bytes become text and back (UTF-8, CRLF kept).

Pure: no I/O. The texts are those of Anthropic's reference implementation; where and why
they deliberately differ is in :mod:`harness.tools.editor`.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import PurePosixPath

from harness.core.calls import ErrorCode

SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 16000
TRUNCATED_MESSAGE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. "
    "You should retry this tool after you have searched inside the file with `grep -n` in order "
    "to find the line numbers of what you are looking for.</NOTE>"
)
MAX_PATH_LENGTH = 4096
MAX_NAME_BYTES = 255


class EditorError(Exception):
    """A result the model reads as an error: the exact text and the error code."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.TOOL_FAILED) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def invalid(message: str) -> EditorError:
    return EditorError(message, ErrorCode.INVALID_ARGUMENTS)


def check_path(path: str) -> str:
    """The path as the editor names it (normalised like ``pathlib``), or EditorError.

    Everything here is decided from the string alone, before any I/O.
    """
    if "\x00" in path:
        raise invalid(f"The path {path!r} contains a NUL byte; a path cannot contain NUL bytes.")
    if len(path) > MAX_PATH_LENGTH:
        raise invalid(
            f"The path is {len(path)} characters long; the sandbox accepts paths of at most "
            f"{MAX_PATH_LENGTH} characters."
        )
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"The path {path!r} is not valid Unicode text.") from None
    if not path:
        raise invalid("The path is empty; it should be an absolute path starting with `/`.")
    pure = PurePosixPath(path)
    if not pure.is_absolute():
        suggested = PurePosixPath("/") / pure
        raise invalid(
            f"The path {pure} is not an absolute path, it should start with `/`. Maybe you meant {suggested}?"
        )
    if ".." in pure.parts:
        raise invalid(f"The path {pure} contains `..`; give the absolute path without `..` components.")
    for name in pure.parts[1:]:
        if len(name.encode("utf-8")) > MAX_NAME_BYTES:
            raise invalid(
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
            raise invalid("Invalid `view_range`. It should be a list of two integers.")
        lines = text.split("\n")
        n_lines = len(lines)
        init_line, final_line = view_range
        if init_line < 1 or init_line > n_lines:
            raise invalid(
                f"Invalid `view_range`: {view_range}. Its first element `{init_line}` should be within the "
                f"range of lines of the file: {[1, n_lines]}"
            )
        if final_line > n_lines:
            raise invalid(
                f"Invalid `view_range`: {view_range}. Its second element `{final_line}` should be smaller than "
                f"the number of lines in the file: `{n_lines}`"
            )
        if final_line != -1 and final_line < init_line:
            raise invalid(
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
        raise invalid(
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
        raise invalid(f"The text cannot be written as UTF-8: {exc}.") from None
