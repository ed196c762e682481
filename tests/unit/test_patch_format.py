"""The Codex apply_patch format: parsing, context matching, applying (in memory), properties.

Expected messages and results are Codex's (codex-rs/apply-patch: parser.rs, lib.rs and
seek_sequence.rs tests, tests/suite/tool.rs), written out here.
"""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.tools.patch_format import (
    AddFile,
    ApplyError,
    DeleteFile,
    FileOp,
    MemoryTarget,
    ParseError,
    Patch,
    PatchError,
    ReadFailure,
    UpdateChunk,
    UpdateFile,
    apply_patch,
    derive_new_contents,
    hunk_ops,
    parse_patch,
    rust_lines,
    rust_trim,
    seek_sequence,
)

FIRST_LINE = "Invalid patch: The first line of the patch must be '*** Begin Patch'"
LAST_LINE = "Invalid patch: The last line of the patch must be '*** End Patch'"


def wrap(body: str) -> str:
    return f"*** Begin Patch\n{body}\n*** End Patch"


def parse_error(text: str) -> str:
    with pytest.raises(ParseError) as caught:
        parse_patch(text)
    return caught.value.message


def apply_text(text: str, files: dict[str, str]) -> str:
    """Apply to ``files`` (in place) and return the summary."""
    return apply_patch(parse_patch(text), MemoryTarget(files)).summary()


def apply_error(text: str, files: dict[str, str]) -> PatchError:
    with pytest.raises(PatchError) as caught:
        apply_patch(parse_patch(text), MemoryTarget(files))
    return caught.value


# ---- envelope --------------------------------------------------------------------------------


def test_envelope_errors():
    assert parse_error("bad") == FIRST_LINE
    assert parse_error("*** Begin Patch\nbad") == LAST_LINE
    assert parse_error("") == LAST_LINE  # no lines at all: Codex reports the last line
    assert parse_error("*** Begin Patch") == LAST_LINE
    assert parse_error("*** End Patch") == FIRST_LINE


def test_markers_may_be_padded_and_the_text_trimmed():
    text = "\n  *** Begin Patch \n*** Add File: foo\n+hi\n *** End Patch\t\n\n"
    assert parse_patch(text).hunks == (AddFile("foo", "hi\n"),)


def test_trimming_uses_rusts_whitespace_not_pythons():
    # U+001C is whitespace to Python's str.strip but not to Rust's str::trim.
    assert parse_error("\x1c*** Begin Patch\n*** Delete File: a\n*** End Patch") == FIRST_LINE
    # U+3000 (ideographic space) is whitespace to both.
    assert parse_patch("\u3000*** Begin Patch\n*** Delete File: a\n*** End Patch").hunks == (DeleteFile("a"),)


def test_crlf_patch_text_parses_like_lf():
    text = "*** Begin Patch\r\n*** Update File: f\r\n@@\r\n-a\r\n+b\r\n*** End Patch\r\n"
    assert parse_patch(text).hunks == (UpdateFile("f", None, (UpdateChunk(None, ("a",), ("b",)),)),)


def test_rust_lines():
    assert rust_lines("") == []
    assert rust_lines("\n") == [""]
    assert rust_lines("a\r\nb\n\nc") == ["a", "b", "", "c"]
    assert rust_lines("a\rb\r") == ["a\rb\r"]  # a bare CR ends no line


def test_an_empty_patch_parses_but_modifies_nothing():
    assert parse_patch("*** Begin Patch\n*** End Patch").hunks == ()
    error = apply_error("*** Begin Patch\n*** End Patch", {})
    assert isinstance(error, ApplyError)
    assert error.message == "No files were modified."


# ---- hunks -----------------------------------------------------------------------------------


def test_all_hunk_kinds():
    text = wrap(
        "*** Add File: path/add.py\n+abc\n+def\n"
        "*** Delete File: path/delete.py\n"
        "*** Update File: path/update.py\n*** Move to: path/update2.py\n@@ def f():\n-    pass\n+    return 123"
    )
    assert parse_patch(text).hunks == (
        AddFile("path/add.py", "abc\ndef\n"),
        DeleteFile("path/delete.py"),
        UpdateFile("path/update.py", "path/update2.py",
                   (UpdateChunk("def f():", ("    pass",), ("    return 123",)),)),
    )


def test_update_followed_by_add():
    assert parse_patch(wrap("*** Update File: file.py\n@@\n+line\n*** Add File: other.py\n+content")).hunks == (
        UpdateFile("file.py", None, (UpdateChunk(None, (), ("line",)),)),
        AddFile("other.py", "content\n"),
    )


def test_the_first_chunk_may_omit_its_header():
    assert parse_patch(wrap("*** Update File: file2.py\n import foo\n+bar")).hunks == (
        UpdateFile("file2.py", None, (UpdateChunk(None, ("import foo",), ("import foo", "bar")),)),
    )


def test_an_add_file_may_be_empty():
    assert parse_patch(wrap("*** Add File: empty.txt")).hunks == (AddFile("empty.txt", ""),)


def test_add_file_lines_must_all_start_with_plus():
    assert parse_patch(wrap("*** Add File: a\n+x\n+\n+ y")).hunks == (AddFile("a", "x\n\n y\n"),)
    # A blank line ends the Add; it is then read as a hunk header (Codex rejects it).
    assert parse_error(wrap("*** Add File: a\n+x\n\n+y")).startswith(
        "Invalid patch hunk on line 4: '' is not a valid hunk header.")


def test_steps_of_each_hunk():
    patch = parse_patch("cd w && apply_patch <<EOF\n" + wrap(
        "*** Add File: n/a.txt\n+a\n*** Delete File: d.txt\n*** Update File: u.txt\n*** Move to: /abs/v.txt\n@@\n+z"
    ) + "\nEOF")
    reads: list[str] = []

    def read(location: str) -> str:
        reads.append(location)
        return "y\n"

    ops = [op for hunk in patch.hunks for op in hunk_ops(hunk, read, patch.resolve)]
    assert ops == [
        FileOp("write", "n/a.txt", "w/n/a.txt", "a\n", make_parents=True),
        FileOp("delete", "d.txt", "w/d.txt"),
        FileOp("write", "/abs/v.txt", "/abs/v.txt", "y\nz\n", make_parents=True),
        FileOp("remove_original", "u.txt", "w/u.txt"),
    ]
    assert reads == ["w/u.txt"]
    assert [op.failed() for op in ops] == [
        "Failed to write file n/a.txt", "Failed to delete file d.txt", "Failed to write file /abs/v.txt",
        "Failed to remove original u.txt"]
    assert ops[0].parents_failed() == "Failed to create parent directories for n/a.txt"


def test_chunk_lines_and_end_of_file():
    text = wrap("*** Update File: f\n@@ ctx\n\n context\n-remove\n+add\n context2\n@@\n+tail\n*** End of File")
    (hunk,) = parse_patch(text).hunks
    assert hunk == UpdateFile("f", None, (
        UpdateChunk("ctx", ("", "context", "remove", "context2"), ("", "context", "add", "context2")),
        UpdateChunk(None, (), ("tail",), is_end_of_file=True),
    ))


def test_blank_lines_between_chunks_are_skipped():
    (hunk,) = parse_patch(wrap("*** Update File: f\n\n  \n@@\n-a\n+b\n\n@@\n-c\n+d")).hunks
    assert isinstance(hunk, UpdateFile)
    # The blank line after "+b" belongs to the first chunk (an empty context line).
    assert hunk.chunks == (UpdateChunk(None, ("a", ""), ("b", "")), UpdateChunk(None, ("c",), ("d",)))


def test_move_to_must_start_its_line():
    (hunk,) = parse_patch(wrap("*** Update File: f\n  *** Move to: g\n-a\n+b")).hunks
    assert isinstance(hunk, UpdateFile)
    assert hunk.move_path is None
    assert hunk.chunks[0].old_lines == (" *** Move to: g", "a")


def test_hunk_errors_and_their_line_numbers():
    valid = "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"
    assert parse_error(wrap("*** Frobnicate File: foo")) == (
        f"Invalid patch hunk on line 2: '*** Frobnicate File: foo' is not a valid hunk header. {valid}")
    assert parse_error(wrap("*** Add File: a\n+x\nbad")) == (
        f"Invalid patch hunk on line 4: 'bad' is not a valid hunk header. {valid}")
    assert parse_error(wrap("*** Update File: test.py")) == (
        "Invalid patch hunk on line 2: Update file hunk for path 'test.py' is empty")
    assert parse_error(wrap("*** Delete File: a\n*** Update File: b\n*** Delete File: c")) == (
        "Invalid patch hunk on line 3: Update file hunk for path 'b' is empty")
    assert parse_error(wrap("*** Update File: f\n@@")) == (
        "Invalid patch hunk on line 4: Update hunk does not contain any lines")
    assert parse_error(wrap("*** Update File: f\n@@\n*** End of File")) == (
        "Invalid patch hunk on line 4: Update hunk does not contain any lines")
    assert parse_error(wrap("*** Update File: f\n@@\nbad")) == (
        "Invalid patch hunk on line 4: Unexpected line found in update hunk: 'bad'. Every line should start "
        "with ' ' (context line), '+' (added line), or '-' (removed line)")
    assert parse_error(wrap("*** Update File: f\n@@\n-a\n+b\nbad")) == (
        "Invalid patch hunk on line 6: Expected update hunk to start with a @@ context marker, got: 'bad'")
    # Two @@ lines in a row: the second one is not a diff line (as in Codex).
    assert parse_error(wrap("*** Update File: f\n@@ class A\n@@ def f\n-a")).startswith(
        "Invalid patch hunk on line 4: Unexpected line found in update hunk: '@@ def f'.")


# ---- heredoc wrappers ------------------------------------------------------------------------

BODY = "*** Begin Patch\n*** Update File: file2.py\n import foo\n+bar\n*** End Patch"
BODY_HUNKS = (UpdateFile("file2.py", None, (UpdateChunk(None, ("import foo",), ("import foo", "bar")),)),)


@pytest.mark.parametrize("opener", ["<<EOF", "<<'EOF'", '<<"EOF"'])
def test_heredoc_wrapper_is_stripped(opener):
    assert parse_patch(f"{opener}\n{BODY}\nEOF\n") == Patch(BODY_HUNKS)


def test_heredoc_wrapper_errors():
    assert parse_error(f"<<\"EOF'\n{BODY}\nEOF\n") == FIRST_LINE
    assert parse_error("<<EOF\n*** Begin Patch\n*** Update File: file2.py\nEOF\n") == LAST_LINE


@pytest.mark.parametrize(
    ("text", "workdir"),
    [
        (f"apply_patch <<'PATCH'\n{BODY}\nPATCH", None),
        (f"applypatch <<EOF\n{BODY}\nEOF\n", None),
        (f'apply_patch <<"END"\n{BODY}\nEND', None),
        (f"cd foo && apply_patch <<'EOF'\n{BODY}\nEOF", "foo"),
        (f"cd 'foo bar' && apply_patch <<'EOF'\n{BODY}\nEOF", "foo bar"),
        (f'cd "foo bar" && apply_patch <<EOF\n{BODY}\nEOF', "foo bar"),
        ("apply_patch <<-EOF\n\t" + BODY.replace("\n", "\n\t") + "\n\tEOF", None),
    ],
)
def test_shell_heredoc_form_is_stripped(text, workdir):
    assert parse_patch(text) == Patch(BODY_HUNKS, workdir=workdir)


@pytest.mark.parametrize(
    "text",
    [
        f"apply_patch <<'PATCH'\n{BODY}\nEOF",  # the delimiter does not close it
        f"echo hi && apply_patch <<EOF\n{BODY}\nEOF",
        f"cd foo; apply_patch <<EOF\n{BODY}\nEOF",
        f"cd foo bar && apply_patch <<EOF\n{BODY}\nEOF",
        f"apply_patch foo <<EOF\n{BODY}\nEOF",
        f"apply_patch <<EOF\n{BODY}\nEOF\necho done",
    ],
)
def test_other_shell_scripts_are_not_patches(text):
    assert parse_error(text) == FIRST_LINE


def test_the_shell_form_reports_errors_in_its_body():
    assert parse_error("apply_patch <<'EOF'\n*** Begin Patch\n*** Update File: f\n*** End Patch\nEOF") == (
        "Invalid patch hunk on line 2: Update file hunk for path 'f' is empty")


def test_workdir_resolves_relative_paths_only():
    patch = Patch((), workdir="sub")
    assert patch.resolve("a/b.txt") == "sub/a/b.txt"
    assert patch.resolve("/tmp/x") == "/tmp/x"
    assert Patch(()).resolve("a") == "a"


def test_shell_form_workdir_is_applied():
    files = {"sub/file2.py": "import foo\n"}
    assert apply_text(f"cd sub && apply_patch <<'EOF'\n{BODY}\nEOF", files) == (
        "Success. Updated the following files:\nM file2.py\n")
    assert files == {"sub/file2.py": "import foo\nbar\n"}


# ---- seek_sequence: the four tiers -----------------------------------------------------------


def test_seek_exact():
    assert seek_sequence(["foo", "bar", "baz"], ["bar", "baz"], 0, eof=False) == 1


def test_seek_ignores_trailing_whitespace():
    assert seek_sequence(["foo   ", "bar\t\t"], ["foo", "bar"], 0, eof=False) == 0


def test_seek_ignores_surrounding_whitespace():
    assert seek_sequence(["    foo   ", "   bar\t"], ["foo", "bar"], 0, eof=False) == 0


def test_seek_normalises_unicode_punctuation():
    lines = ["x \u2013 y", "\u201cquoted\u201d \u2018single\u2019", "a\u00a0b\u3000c", "top\u2011level"]
    assert seek_sequence(lines, ["x - y", "\"quoted\" 'single'", "a b c", "top-level"], 0, eof=False) == 0
    assert seek_sequence(["a\u2026"], ["a..."], 0, eof=False) is None  # an ellipsis is not mapped


def test_seek_tiers_are_tried_in_order_over_the_whole_range():
    assert seek_sequence(["foo ", "foo"], ["foo"], 0, eof=False) == 1  # the exact match wins
    assert seek_sequence(["  foo", "foo  "], ["foo"], 0, eof=False) == 1  # rstrip before full trim


def test_seek_edge_cases():
    assert seek_sequence(["just one line"], ["too", "many", "lines"], 0, eof=False) is None
    assert seek_sequence(["a"], [], 5, eof=False) == 5
    assert seek_sequence(["a", "b", "a"], ["a"], 1, eof=False) == 2
    assert seek_sequence(["a", "b", "a"], ["a"], 3, eof=False) is None


def test_seek_end_of_file_anchors_at_the_end():
    assert seek_sequence(["a", "b", "a"], ["a"], 0, eof=False) == 0
    assert seek_sequence(["a", "b", "a"], ["a"], 0, eof=True) == 2
    assert seek_sequence(["a", "b", "c"], ["a"], 0, eof=True) is None  # only the end is searched


# ---- new contents (Codex's lib.rs cases) -----------------------------------------------------


def chunks_of(body: str) -> tuple[UpdateChunk, ...]:
    (hunk,) = parse_patch(wrap("*** Update File: f\n" + body)).hunks
    assert isinstance(hunk, UpdateFile)
    return hunk.chunks


def test_a_final_newline_is_always_written():
    assert derive_new_contents("no newline at end", chunks_of("@@\n-no newline at end\n+first line\n+second line"),
                               "f") == "first line\nsecond line\n"


def test_interleaved_changes():
    body = "@@\n a\n-b\n+B\n@@\n c\n d\n-e\n+E\n@@\n f\n+g\n*** End of File"
    assert derive_new_contents("a\nb\nc\nd\ne\nf\n", chunks_of(body), "f") == "a\nB\nc\nd\nE\nf\ng\n"


def test_multiple_chunks():
    body = "@@\n foo\n-bar\n+BAR\n@@\n baz\n-qux\n+QUX"
    assert derive_new_contents("foo\nbar\nbaz\nqux\n", chunks_of(body), "f") == "foo\nBAR\nbaz\nQUX\n"


def test_pure_addition_goes_to_the_end_even_before_a_later_chunk():
    body = "@@\n+after-context\n+second-line\n@@\n line1\n-line2\n-line3\n+line2-replacement"
    assert derive_new_contents("line1\nline2\nline3\n", chunks_of(body), "f") == (
        "line1\nline2-replacement\nafter-context\nsecond-line\n")


def test_unicode_dash_in_the_file_matches_ascii_in_the_patch():
    original = "import asyncio  # local import \u2013 avoids top\u2011level dep\n"
    body = "@@\n-import asyncio  # local import - avoids top-level dep\n+import asyncio  # HELLO"
    assert derive_new_contents(original, chunks_of(body), "f") == "import asyncio  # HELLO\n"


def test_insert_at_end_of_file():
    assert derive_new_contents("foo\nbar\nbaz\n", chunks_of("@@\n+quux\n*** End of File"), "f") == (
        "foo\nbar\nbaz\nquux\n")


def test_trailing_empty_context_line_stands_for_the_final_newline():
    # "-foo +FOO  bar" then a blank line before End Patch: old lines end with "".
    assert derive_new_contents("foo\nbar\nbaz\n", chunks_of("@@\n-foo\n+FOO\n bar\n"), "f") == "FOO\nbar\nbaz\n"
    assert derive_new_contents("foo\nbar\nbaz\n", chunks_of("@@\n foo\n bar\n-baz\n+BAZ\n"), "f") == (
        "foo\nbar\nBAZ\n")


def test_change_context_narrows_the_search():
    original = "class A:\n    x = 1\nclass B:\n    x = 1\n"
    assert derive_new_contents(original, chunks_of("@@ class B:\n-    x = 1\n+    x = 2"), "f") == (
        "class A:\n    x = 1\nclass B:\n    x = 2\n")


def test_repeated_lines_keep_the_patch_order():
    assert derive_new_contents("a\nb\n", chunks_of("@@\n-a\n-b\n+b\n+b\n+a"), "f") == "b\nb\na\n"


def test_missing_context_and_lines_messages():
    with pytest.raises(ApplyError) as caught:
        derive_new_contents("a\n", chunks_of("@@ def nope():\n-a\n+b"), "src/x.py")
    assert caught.value.message == "Failed to find context 'def nope():' in src/x.py"
    with pytest.raises(ApplyError) as caught:
        derive_new_contents("line1\nline2\n", chunks_of("@@\n-missing\n-also\n+changed"), "modify.txt")
    assert caught.value.message == "Failed to find expected lines in modify.txt:\nmissing\nalso"


def test_carriage_returns_stay_part_of_their_lines():
    # Codex's default mode splits at "\n" only: a CRLF file is matched leniently (the "\r" is
    # trailing whitespace) and the replaced lines come out with "\n".
    assert derive_new_contents("a\r\nb\r\nc\r\n", chunks_of("@@\n a\n-b\n+B"), "f") == "a\nB\nc\r\n"


def test_a_final_blank_line_is_folded_into_the_final_newline():
    # "a\n\n" is the lines ["a", ""]; joined again that is "a\n" (Codex's behaviour).
    assert derive_new_contents("a\n\n", chunks_of("@@\n-a\n+A"), "f") == "A\n"
    assert derive_new_contents("a\n\n", chunks_of("@@\n+b"), "f") == "a\nb\n"


def test_an_emptied_file_is_empty():
    assert derive_new_contents("only\n", chunks_of("@@\n-only"), "f") == ""
    assert derive_new_contents("", chunks_of("@@\n+first"), "f") == "first\n"


# ---- applying hunks --------------------------------------------------------------------------


def test_summary_lists_added_then_modified_then_deleted():
    files = {"modify.txt": "line1\nline2\n", "delete.txt": "obsolete\n"}
    text = wrap("*** Delete File: delete.txt\n*** Update File: modify.txt\n@@\n-line2\n+changed\n"
                "*** Add File: nested/new.txt\n+created")
    assert apply_text(text, files) == (
        "Success. Updated the following files:\nA nested/new.txt\nM modify.txt\nD delete.txt\n")
    assert files == {"modify.txt": "line1\nchanged\n", "nested/new.txt": "created\n"}


def test_add_and_move_overwrite():
    files = {"duplicate.txt": "old content\n", "old/name.txt": "from\n", "renamed/dir/name.txt": "existing\n"}
    text = wrap("*** Add File: duplicate.txt\n+new content\n"
                "*** Update File: old/name.txt\n*** Move to: renamed/dir/name.txt\n@@\n-from\n+new")
    assert apply_text(text, files) == (
        "Success. Updated the following files:\nA duplicate.txt\nM renamed/dir/name.txt\n")
    assert files == {"duplicate.txt": "new content\n", "renamed/dir/name.txt": "new\n"}


def test_moving_a_file_onto_itself_keeps_it():
    # Codex writes the destination then removes the original, losing a file moved onto itself.
    files = {"a.txt": "x\n"}
    assert apply_text(wrap("*** Update File: a.txt\n*** Move to: ./a.txt\n@@\n-x\n+y"), files) == (
        "Success. Updated the following files:\nM ./a.txt\n")
    assert files == {"a.txt": "y\n"}


def test_hunks_apply_in_order_so_a_later_hunk_sees_an_earlier_one():
    files: dict[str, str] = {}
    text = wrap("*** Add File: a.txt\n+one\n*** Update File: a.txt\n@@\n one\n+two\n*** Delete File: a.txt")
    assert apply_text(text, files) == "Success. Updated the following files:\nA a.txt\nM a.txt\nD a.txt\n"
    assert files == {}


def test_a_failure_keeps_earlier_hunks_and_reports_them():
    files: dict[str, str] = {"keep.txt": "k\n"}
    error = apply_error(wrap("*** Add File: created.txt\n+hello\n*** Delete File: keep.txt\n"
                             "*** Update File: missing.txt\n@@\n-old\n+new\n*** Add File: never.txt\n+x"), files)
    assert error.message == "Failed to read file to update missing.txt: No such file or directory (os error 2)"
    assert error.affected.as_dict() == {"added": ["created.txt"], "modified": [], "deleted": ["keep.txt"]}
    assert files == {"created.txt": "hello\n"}


def test_delete_of_a_missing_file():
    assert apply_error(wrap("*** Delete File: missing.txt"), {}).message == "Failed to delete file missing.txt"


def test_read_failures_are_worded_like_codex():
    class Unreadable(MemoryTarget):
        def read(self, path: str) -> str | None:
            raise ReadFailure("stream did not contain valid UTF-8")

    with pytest.raises(ApplyError) as caught:
        apply_patch(parse_patch(wrap("*** Update File: bin.dat\n@@\n+x")), Unreadable())
    assert caught.value.message == "Failed to read file to update bin.dat: stream did not contain valid UTF-8"


# ---- properties ------------------------------------------------------------------------------

# Line text: anything but line breaks (and no lone surrogates, which no patch can carry).
line_text = st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\n\r"), max_size=12)


def codex_join(lines: list[str]) -> str:
    """How Codex writes lines back: joined with "\\n", ending with one (a final "" supplies it)."""
    if not lines or lines[-1] != "":
        lines = [*lines, ""]
    return "\n".join(lines)


@st.composite
def file_and_edit(draw: st.DrawFn) -> tuple[list[str], int, int, int, int, list[str]]:
    lines = draw(st.lists(line_text, min_size=1, max_size=12, unique=True))
    start = draw(st.integers(0, len(lines)))
    end = draw(st.integers(start, len(lines)))
    before = draw(st.integers(0, start))
    after = draw(st.integers(0, len(lines) - end))
    if before + (end - start) + after == 0:  # keep at least one line to anchor the chunk
        if end < len(lines):
            after = 1
        else:
            before = 1
            start = max(start, 1)
            end = max(end, start)
    new = draw(st.lists(line_text, max_size=4))
    return lines, start, end, before, after, new


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(file_and_edit(), st.booleans(), st.booleans())
def test_round_trip_a_generated_update_applies_the_edit(case, trailing_newline, with_header):
    lines, start, end, before, after, new = case
    # Without a final newline a last empty line would not be a line of the file at all.
    assume(trailing_newline or lines[-1] != "")
    original = "\n".join(lines) + ("\n" if trailing_newline else "")
    body = [" " + line for line in lines[start - before:start]]
    body += ["-" + line for line in lines[start:end]]
    body += ["+" + line for line in new]
    body += [" " + line for line in lines[end:end + after]]
    # Without "@@", a leading blank context line would be skipped as a separator (as in Codex).
    with_header = with_header or not rust_trim(body[0])
    patch = wrap("*** Update File: f.txt\n" + ("@@\n" if with_header else "") + "\n".join(body))
    files = {"f.txt": original}
    assert apply_text(patch, files) == "Success. Updated the following files:\nM f.txt\n"
    assert files == {"f.txt": codex_join(lines[:start] + new + lines[end:])}


@settings(max_examples=200)
@given(st.lists(line_text, max_size=8), st.lists(line_text, min_size=1, max_size=4))
def test_round_trip_pure_addition_appends(lines, new):
    original = "".join(line + "\n" for line in lines)
    files = {"f.txt": original}
    apply_text(wrap("*** Update File: f.txt\n@@\n" + "\n".join("+" + n for n in new)), files)
    source = list(lines)
    at = len(source) - 1 if source and source[-1] == "" else len(source)
    assert files["f.txt"] == codex_join(source[:at] + new + source[at:])


@settings(max_examples=200)
@given(st.lists(line_text, max_size=6), st.sampled_from(["", "x\n", "x"]))
def test_round_trip_add_file(lines, existing):
    files = {"new.txt": existing} if existing else {}
    apply_text(wrap("\n".join(["*** Add File: new.txt", *("+" + line for line in lines)])), files)
    assert files == {"new.txt": "".join(line + "\n" for line in lines)}


@settings(max_examples=200)
@given(st.lists(line_text, min_size=1, max_size=10), st.data())
def test_whitespace_differences_still_match(lines, data):
    start = data.draw(st.integers(0, len(lines) - 1))
    stop = data.draw(st.integers(start + 1, len(lines)))
    pad = data.draw(st.sampled_from([" ", "\t", "  \t"]))
    padded = [pad + line + pad for line in lines]
    pattern = lines[start:stop]
    found = seek_sequence(padded, pattern, 0, eof=False)
    assert found is not None
    assert [rust_trim(line) for line in padded[found:found + len(pattern)]] == [rust_trim(p) for p in pattern]


@settings(max_examples=500)
@given(st.text(max_size=300))
def test_parsing_random_text_only_raises_parse_errors(text):
    with contextlib.suppress(ParseError):
        parse_patch(text)


PATCHISH = st.lists(
    st.one_of(
        st.sampled_from([
            "*** Begin Patch", "*** End Patch", "*** Add File: a.txt", "*** Delete File: a.txt",
            "*** Update File: a.txt", "*** Update File: b.txt", "*** Move to: b.txt", "*** End of File",
            "@@", "@@ x", "", " ", "+", "-", "<<EOF", "EOF", "apply_patch <<'EOF'", "cd d && applypatch <<EOF",
        ]),
        st.tuples(st.sampled_from([" ", "+", "-", "*", "@", ""]), line_text).map("".join),
    ),
    max_size=14,
).map("\n".join)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(PATCHISH, PATCHISH.map(lambda body: f"*** Begin Patch\n{body}\n*** End Patch")),
       st.dictionaries(st.sampled_from(["a.txt", "b.txt", "d/a.txt"]), st.text(max_size=40), max_size=3))
def test_applying_patchlike_text_only_raises_patch_errors(text, files):
    before = dict(files)
    try:
        affected = apply_patch(parse_patch(text), MemoryTarget(files))
    except ParseError:
        assert files == before  # a patch that does not parse changes nothing
    except PatchError:
        pass
    else:
        assert affected.summary().startswith("Success. Updated the following files:\n")
