"""The Codex ``apply_patch`` format: parse a patch and work out its file changes, without I/O.

This is an independent Python implementation of the format and semantics of OpenAI Codex's
``apply_patch`` (``codex-rs/apply-patch``), matched to its published behaviour: the grammar,
the lenient parsing rules, the error messages, the four-tier context matching and the
success summary. The I/O is left to a :class:`PatchTarget` (the tool reads and writes
through the sandbox agent; the unit tests use a dict).

Format (the grammar Codex publishes)::

    Patch      := "*** Begin Patch" NL { FileOp } "*** End Patch" NL?
    FileOp     := AddFile | DeleteFile | UpdateFile
    AddFile    := "*** Add File: " path NL { "+" line NL }
    DeleteFile := "*** Delete File: " path NL
    UpdateFile := "*** Update File: " path NL [ "*** Move to: " path NL ] { Chunk }
    Chunk      := ("@@" | "@@ " context) NL { (" " | "-" | "+") line NL } [ "*** End of File" NL ]

Lenient rules, as Codex applies them:

* The whole text is trimmed; the ``*** Begin Patch`` / ``*** End Patch`` lines and the file
  operation headers may carry surrounding whitespace. ``*** Move to:``, ``@@`` and
  ``*** End of File`` must start their line.
* A heredoc wrapper is stripped: first line ``<<EOF`` / ``<<'EOF'`` / ``<<"EOF"`` and last
  line ending in ``EOF``. So is the shell form Codex intercepts from its shell tool,
  ``apply_patch <<'DELIM'`` ... ``DELIM`` (also ``applypatch``, and ``cd DIR && apply_patch``,
  which makes relative paths relative to DIR).
* The first chunk of an Update may omit its ``@@`` line; blank lines between chunks are
  skipped; an empty line inside a chunk is an empty context line.

Applying (what ``apply_patch`` does, in order, hunk by hunk, so an error leaves the
changes made by the hunks before it):

* Add writes the file (creating parent directories), replacing an existing one.
* Delete removes a file (a directory is an error).
* Update reads the file, locates each chunk with :func:`seek_sequence` (the ``@@ context``
  line first, then the old lines at or after it; ``*** End of File`` anchors at the end),
  writes the result with a final newline, and for ``*** Move to`` writes the destination
  (replacing it) and removes the original. Directories emptied by a move or delete stay.
* Lines are split at ``\n`` only and written back joined with ``\n`` (Codex's default
  ``NormalizeToLf`` mode; its opt-in mode that keeps CRLF endings is not implemented).

One deliberate difference: Codex removes the original of a move even when it is the
destination itself (``Move to`` the same path), which deletes the file; here it is kept.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

__all__ = [
    "NOT_FOUND_DETAIL",
    "NOT_UTF8_DETAIL",
    "AddFile",
    "Affected",
    "ApplyError",
    "DeleteFile",
    "FileOp",
    "Hunk",
    "MemoryTarget",
    "ParseError",
    "Patch",
    "PatchError",
    "PatchTarget",
    "ReadFailure",
    "UpdateChunk",
    "UpdateFile",
    "apply_patch",
    "derive_new_contents",
    "hunk_ops",
    "parse_patch",
    "seek_sequence",
]

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
ADD_FILE = "*** Add File: "
DELETE_FILE = "*** Delete File: "
UPDATE_FILE = "*** Update File: "
MOVE_TO = "*** Move to: "
END_OF_FILE = "*** End of File"
CHANGE_CONTEXT = "@@ "
EMPTY_CHANGE_CONTEXT = "@@"

NOT_FOUND_DETAIL = "No such file or directory (os error 2)"
"""How Codex (Rust's io::Error) words a missing file in "Failed to read file to update"."""
NOT_UTF8_DETAIL = "stream did not contain valid UTF-8"

# Rust's char::is_whitespace (Unicode White_Space), which str::trim uses. Python's str.strip()
# also strips U+001C..U+001F, which Rust keeps, so the set is spelled out.
RUST_WHITESPACE = (
    "\t\n\v\f\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000"
)

# The fourth matching tier maps typographic punctuation and odd spaces to ASCII.
_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("\u2010\u2011\u2012\u2013\u2014\u2015\u2212", "-"),
        **dict.fromkeys("\u2018\u2019\u201a\u201b", "'"),
        **dict.fromkeys("\u201c\u201d\u201e\u201f", '"'),
        **dict.fromkeys(
            "\u00a0\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a\u202f\u205f\u3000", " "
        ),
    }
)

_HEREDOC_OPENERS = ("<<EOF", "<<'EOF'", '<<"EOF"')
_SHELL_FORM = re.compile(
    r"""(?:cd[ \t]+(?P<cd>'[^']*'|"[^"\\$`]*"|[^\s'"&|;<>()$`\\]+)[ \t]*&&[ \t]*)?
        (?:apply_patch|applypatch)[ \t]+<<(?P<dash>-?)[ \t]*
        (?P<q>['"]?)(?P<delim>[A-Za-z_][A-Za-z0-9_]*)(?P=q)[ \t]*""",
    re.VERBOSE,
)


def rust_trim(text: str) -> str:
    return text.strip(RUST_WHITESPACE)


def rust_trim_end(text: str) -> str:
    return text.rstrip(RUST_WHITESPACE)


def rust_lines(text: str) -> list[str]:
    """Rust's ``str::lines``: split at ``\\n`` (dropping one ``\\r`` before it), no final empty line."""
    pieces = text.split("\n")
    last = pieces.pop()
    lines = [piece.removesuffix("\r") for piece in pieces]
    if last:
        lines.append(last)
    return lines


# ---- errors -------------------------------------------------------------------------------


class PatchError(Exception):
    """A patch that cannot be parsed or applied; ``str(error)`` is Codex's message."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.affected = Affected()
        """The changes made before the failure (apply_patch does not roll them back)."""


class ParseError(PatchError):
    """The text is not a valid patch (nothing was changed)."""

    def __init__(self, reason: str, line_number: int | None = None) -> None:
        if line_number is None:
            message = f"Invalid patch: {reason}"
        else:
            message = f"Invalid patch hunk on line {line_number}: {reason}"
        super().__init__(message)
        self.reason = reason
        self.line_number = line_number


class ApplyError(PatchError):
    """The patch parsed but could not be applied (hunks before the failing one stay applied)."""


class ReadFailure(Exception):
    """Raised by ``PatchTarget.read`` for a file that exists but cannot be read as text.

    ``detail`` is the cause as Codex words it after "Failed to read file to update PATH: ".
    """

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


# ---- the parsed patch ------------------------------------------------------------------------


@dataclass(frozen=True)
class UpdateChunk:
    """One ``@@`` section of an Update: replace ``old_lines`` (after ``change_context``) by ``new_lines``."""

    change_context: str | None
    old_lines: tuple[str, ...]
    new_lines: tuple[str, ...]
    is_end_of_file: bool = False


@dataclass(frozen=True)
class AddFile:
    path: str
    contents: str


@dataclass(frozen=True)
class DeleteFile:
    path: str


@dataclass(frozen=True)
class UpdateFile:
    path: str
    move_path: str | None
    chunks: tuple[UpdateChunk, ...]


Hunk = AddFile | DeleteFile | UpdateFile


@dataclass(frozen=True)
class Patch:
    hunks: tuple[Hunk, ...]
    workdir: str | None = None
    """Set by the ``cd DIR && apply_patch <<EOF`` form: relative paths are relative to DIR."""

    def resolve(self, path: str) -> str:
        """The path to act on: the patch's path, under ``workdir`` when that is set."""
        return posixpath.join(self.workdir, path) if self.workdir else path


# ---- parsing ---------------------------------------------------------------------------------


def parse_patch(text: str) -> Patch:
    """Parse a patch (lenient, as Codex parses every patch); raise :class:`ParseError`."""
    try:
        return Patch(_parse_lenient(text))
    except ParseError as error:
        shell = None if error.line_number is not None else _strip_shell_form(text)
        if shell is None:
            raise
    body, workdir = shell
    return Patch(_parse_lenient(body), workdir=workdir)


def _strip_shell_form(text: str) -> tuple[str, str | None] | None:
    """``[cd DIR &&] apply_patch <<'DELIM'`` NL body NL ``DELIM``: the body and DIR, or None."""
    lines = rust_lines(rust_trim(text))
    if len(lines) < 2:
        return None
    opener = _SHELL_FORM.fullmatch(lines[0])
    if opener is None:
        return None
    closing = lines[-1].lstrip("\t") if opener["dash"] else lines[-1]
    if closing != opener["delim"]:
        return None
    body = lines[1:-1]
    if opener["dash"]:
        body = [line.lstrip("\t") for line in body]
    cd = opener["cd"]
    if cd is not None and cd[:1] in ("'", '"'):
        cd = cd[1:-1]
    return "\n".join(body), cd


def _parse_lenient(text: str) -> tuple[Hunk, ...]:
    lines = rust_lines(rust_trim(text))
    try:
        _check_boundaries(lines)
    except ParseError as original:
        if not (len(lines) >= 4 and lines[0] in _HEREDOC_OPENERS and lines[-1].endswith("EOF")):
            raise original from None
        lines = lines[1:-1]
        _check_boundaries(lines)
    hunks: list[Hunk] = []
    pos, end = 1, len(lines) - 1  # the hunk lines lie between the two markers
    while pos < end:
        hunk, pos = _parse_one_hunk(lines, pos, end)
        hunks.append(hunk)
    return tuple(hunks)


def _check_boundaries(lines: Sequence[str]) -> None:
    first = rust_trim(lines[0]) if lines else None
    last = rust_trim(lines[-1]) if lines else None
    if first == BEGIN_PATCH and last == END_PATCH:
        return
    if first is not None and first != BEGIN_PATCH:
        raise ParseError("The first line of the patch must be '*** Begin Patch'")
    raise ParseError("The last line of the patch must be '*** End Patch'")


def _parse_one_hunk(lines: Sequence[str], pos: int, end: int) -> tuple[Hunk, int]:
    """The hunk starting at ``lines[pos]`` (``lines[pos]`` is patch line ``pos + 1``) and where it ends."""
    line_number = pos + 1
    first = rust_trim(lines[pos])
    pos += 1
    if first.startswith(ADD_FILE):
        contents: list[str] = []
        while pos < end and lines[pos].startswith("+"):
            contents.append(lines[pos][1:] + "\n")
            pos += 1
        return AddFile(first.removeprefix(ADD_FILE), "".join(contents)), pos
    if first.startswith(DELETE_FILE):
        return DeleteFile(first.removeprefix(DELETE_FILE)), pos
    if first.startswith(UPDATE_FILE):
        path = first.removeprefix(UPDATE_FILE)
        move_path = None
        if pos < end and lines[pos].startswith(MOVE_TO):
            move_path = lines[pos].removeprefix(MOVE_TO)
            pos += 1
        chunks: list[UpdateChunk] = []
        while pos < end:
            if not rust_trim(lines[pos]):  # blank lines between chunks
                pos += 1
                continue
            if lines[pos].startswith("*"):  # the next hunk
                break
            chunk, pos = _parse_chunk(lines, pos, end, allow_missing_context=not chunks)
            chunks.append(chunk)
        if not chunks:
            raise ParseError(f"Update file hunk for path '{path}' is empty", line_number)
        return UpdateFile(path, move_path, tuple(chunks)), pos
    raise ParseError(
        f"'{first}' is not a valid hunk header. Valid hunk headers: "
        "'*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'",
        line_number,
    )


def _parse_chunk(lines: Sequence[str], pos: int, end: int, *, allow_missing_context: bool) -> tuple[UpdateChunk, int]:
    line_number = pos + 1
    if lines[pos] == EMPTY_CHANGE_CONTEXT:
        context, pos = None, pos + 1
    elif lines[pos].startswith(CHANGE_CONTEXT):
        context, pos = lines[pos].removeprefix(CHANGE_CONTEXT), pos + 1
    elif allow_missing_context:
        context = None
    else:
        raise ParseError(f"Expected update hunk to start with a @@ context marker, got: '{lines[pos]}'", line_number)
    # As in Codex, errors inside a chunk name the line after its first one.
    if pos >= end:
        raise ParseError("Update hunk does not contain any lines", line_number + 1)
    old: list[str] = []
    new: list[str] = []
    end_of_file = False
    first = pos
    while pos < end:
        line = lines[pos]
        if line == END_OF_FILE:
            if pos == first:
                raise ParseError("Update hunk does not contain any lines", line_number + 1)
            end_of_file = True
            pos += 1
            break
        marker, text = line[:1], line[1:]
        if marker == "":  # an empty line is an empty context line
            old.append("")
            new.append("")
        elif marker == " ":
            old.append(text)
            new.append(text)
        elif marker == "+":
            new.append(text)
        elif marker == "-":
            old.append(text)
        elif pos == first:
            raise ParseError(
                f"Unexpected line found in update hunk: '{line}'. Every line should start with "
                "' ' (context line), '+' (added line), or '-' (removed line)",
                line_number + 1,
            )
        else:
            break  # the start of the next chunk
        pos += 1
    return UpdateChunk(context, tuple(old), tuple(new), end_of_file), pos


# ---- locating and replacing lines ------------------------------------------------------------


def _normalise(text: str) -> str:
    return rust_trim(text).translate(_PUNCTUATION)


_TIERS: tuple[Callable[[str], str], ...] = (
    lambda s: s,  # exact
    rust_trim_end,  # trailing whitespace ignored
    rust_trim,  # leading and trailing whitespace ignored
    _normalise,  # and typographic punctuation / odd spaces taken as ASCII
)


def seek_sequence(lines: Sequence[str], pattern: Sequence[str], start: int, eof: bool) -> int | None:
    """Where ``pattern`` occurs in ``lines`` at or after ``start`` (at the very end when ``eof``).

    Each tier scans the whole range before the next, more lenient one is tried: exact, then
    trailing whitespace trimmed, then both sides trimmed, then Unicode punctuation normalised.
    """
    if not pattern:
        return start
    if len(pattern) > len(lines):
        return None
    first = len(lines) - len(pattern) if eof else start
    last = len(lines) - len(pattern)
    if first > last:
        return None
    for tier in _TIERS:
        wanted = [tier(p) for p in pattern]
        head = wanted[0]
        for i in range(first, last + 1):
            if tier(lines[i]) == head and all(tier(lines[i + k]) == w for k, w in enumerate(wanted[1:], 1)):
                return i
    return None


Replacement = tuple[int, int, tuple[str, ...]]


def _compute_replacements(lines: Sequence[str], path: str, chunks: Sequence[UpdateChunk]) -> list[Replacement]:
    replacements: list[Replacement] = []
    line_index = 0
    for chunk in chunks:
        if chunk.change_context is not None:
            found = seek_sequence(lines, [chunk.change_context], line_index, eof=False)
            if found is None:
                raise ApplyError(f"Failed to find context '{chunk.change_context}' in {path}")
            line_index = found + 1
        if not chunk.old_lines:  # a pure addition goes at the end (before a final empty line)
            at = len(lines) - 1 if lines and lines[-1] == "" else len(lines)
            replacements.append((at, 0, chunk.new_lines))
            continue
        pattern = chunk.old_lines
        new_lines = chunk.new_lines
        start = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if start is None and pattern[-1] == "":
            # The trailing empty line may stand for the file's final newline: retry without it.
            pattern = pattern[:-1]
            if new_lines and new_lines[-1] == "":
                new_lines = new_lines[:-1]
            start = seek_sequence(lines, pattern, line_index, chunk.is_end_of_file)
        if start is None:
            raise ApplyError(f"Failed to find expected lines in {path}:\n" + "\n".join(chunk.old_lines))
        replacements.append((start, len(pattern), new_lines))
        line_index = start + len(pattern)
    replacements.sort(key=lambda r: r[0])
    return replacements


def derive_new_contents(original: str, chunks: Sequence[UpdateChunk], path: str) -> str:
    """The file's text after the chunks (``path`` is only for messages); raise :class:`ApplyError`.

    Lines are the text split at ``\\n`` (a ``\\r`` stays part of its line, as in Codex's
    default mode); the result always ends with a newline.
    """
    lines = original.split("\n")
    if lines[-1] == "":
        lines.pop()
    for start, old_len, new_segment in reversed(_compute_replacements(lines, path, chunks)):
        del lines[start : start + old_len]
        lines[start:start] = new_segment
    if not lines or lines[-1] != "":
        lines.append("")
    return "\n".join(lines)


# ---- applying ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileOp:
    """One filesystem step on ``location``; ``path`` is how the patch wrote it (for messages)."""

    kind: Literal["write", "delete", "remove_original"]
    path: str
    location: str
    contents: str = ""
    make_parents: bool = False
    """For ``write``: create missing parent directories first (Add, and Move to)."""

    def parents_failed(self) -> str:
        return f"Failed to create parent directories for {self.path}"

    def failed(self) -> str:
        """Codex's message when this step fails (it adds no OS detail to these)."""
        if self.kind == "write":
            return f"Failed to write file {self.path}"
        if self.kind == "delete":
            return f"Failed to delete file {self.path}"
        return f"Failed to remove original {self.path}"


def _as_is(path: str) -> str:
    return path


def hunk_ops(
    hunk: Hunk, read: Callable[[str], str | None], resolve: Callable[[str], str] = _as_is
) -> list[FileOp]:
    """The steps that apply one hunk; an Update first reads its file through ``read``.

    ``resolve`` maps a path as written to the location acted on (:meth:`Patch.resolve`).
    ``read(location)`` returns the text, None for a missing file, or raises :class:`ReadFailure`.
    """
    if isinstance(hunk, AddFile):
        return [FileOp("write", hunk.path, resolve(hunk.path), hunk.contents, make_parents=True)]
    if isinstance(hunk, DeleteFile):
        return [FileOp("delete", hunk.path, resolve(hunk.path))]
    source = resolve(hunk.path)
    try:
        original = read(source)
    except ReadFailure as failure:
        raise ApplyError(f"Failed to read file to update {hunk.path}: {failure.detail}") from None
    if original is None:
        raise ApplyError(f"Failed to read file to update {hunk.path}: {NOT_FOUND_DETAIL}")
    contents = derive_new_contents(original, hunk.chunks, hunk.path)
    if hunk.move_path is None:
        return [FileOp("write", hunk.path, source, contents)]
    destination = resolve(hunk.move_path)
    ops = [FileOp("write", hunk.move_path, destination, contents, make_parents=True)]
    # Codex removes the original even when it is the destination, losing the file; we keep it.
    if posixpath.normpath(source) != posixpath.normpath(destination):
        ops.append(FileOp("remove_original", hunk.path, source))
    return ops


@dataclass
class Affected:
    """The files a patch added, modified and deleted, in order (paths as written)."""

    added: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def summary(self) -> str:
        """Codex's success text: ``Success. Updated the following files:`` then A, M, D lines."""
        lines = ["Success. Updated the following files:"]
        lines += [f"A {p}" for p in self.added]
        lines += [f"M {p}" for p in self.modified]
        lines += [f"D {p}" for p in self.deleted]
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict[str, list[str]]:
        return {"added": list(self.added), "modified": list(self.modified), "deleted": list(self.deleted)}


class PatchTarget(Protocol):
    """Where a patch is applied: ``read`` as in :func:`hunk_ops`; ``perform`` does one step on
    ``op.location`` or raises :class:`ApplyError` (with ``op.failed()`` or a clearer message)."""

    def read(self, path: str) -> str | None: ...

    def perform(self, op: FileOp) -> None: ...


def apply_patch(patch: Patch, target: PatchTarget) -> Affected:
    """Apply the hunks in order; return what changed or raise :class:`PatchError`.

    As in Codex, a failure does not undo the hunks applied before it; the error's
    ``affected`` lists them.
    """
    affected = Affected()
    try:
        if not patch.hunks:
            raise ApplyError("No files were modified.")
        for hunk in patch.hunks:
            for op in hunk_ops(hunk, target.read, patch.resolve):
                target.perform(op)
            if isinstance(hunk, AddFile):
                affected.added.append(hunk.path)
            elif isinstance(hunk, DeleteFile):
                affected.deleted.append(hunk.path)
            else:
                affected.modified.append(hunk.move_path if hunk.move_path is not None else hunk.path)
    except PatchError as error:
        error.affected = affected
        raise
    return affected


class MemoryTarget:
    """A dict of path -> text as the filesystem (directories are implicit); for tests and previews."""

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files: dict[str, str] = {} if files is None else files

    def read(self, path: str) -> str | None:
        return self.files.get(posixpath.normpath(path))

    def perform(self, op: FileOp) -> None:
        key = posixpath.normpath(op.location)
        if op.kind == "write":
            self.files[key] = op.contents
        elif key in self.files:
            del self.files[key]
        else:
            raise ApplyError(op.failed())
