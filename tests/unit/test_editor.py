"""The text editor's pure logic: each published message and output shape, written out in full."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.core.calls import ErrorCode
from harness.core.context import ToolContext
from harness.core.registry import ToolRegistry
from harness.tools import editor_text
from harness.tools.editor import EDITOR, EditorArgs
from harness.tools.editor_history import EditHistory
from harness.tools.editor_text import (
    MAX_RESPONSE_LEN,
    TRUNCATED_MESSAGE,
    EditorError,
    check_path,
    decode_file,
    encode_file,
    insert_into,
    make_output,
    maybe_truncate,
    replace_once,
    view_directory,
    view_file,
)

CLIPPED = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line numbers "
    "of what you are looking for.</NOTE>"
)
TWELVE = "\n".join(f"line {i}" for i in range(1, 13)) + "\n"


def error_of(func: Any, *args: Any) -> EditorError:
    with pytest.raises(EditorError) as caught:
        func(*args)
    return caught.value


# --- paths -------------------------------------------------------------------------------------


def test_relative_path_gets_the_published_message_with_a_suggestion():
    error = error_of(check_path, "src/app.py")
    assert error.message == (
        "The path src/app.py is not an absolute path, it should start with `/`. Maybe you meant /src/app.py?"
    )
    assert error.code is ErrorCode.INVALID_ARGUMENTS


def test_paths_are_normalised_like_pathlib():
    assert check_path("/workspace//a/./b/") == "/workspace/a/b"
    assert check_path("/workspace") == "/workspace"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("", "The path is empty; it should be an absolute path starting with `/`."),
        ("/workspace/a\x00b", "The path '/workspace/a\\x00b' contains a NUL byte; a path cannot contain NUL bytes."),
        ("/workspace/../etc/passwd",
         "The path /workspace/../etc/passwd contains `..`; give the absolute path without `..` components."),
        ("/workspace/a/..",
         "The path /workspace/a/.. contains `..`; give the absolute path without `..` components."),
        ("/workspace/" + "n" * 256,
         f"The path /workspace/{'n' * 256} contains a name longer than 255 bytes, which no file can have."),
        ("/workspace/" + "a/" * 2100,
         "The path is 4211 characters long; the sandbox accepts paths of at most 4096 characters."),
        ("/workspace/\udc80", "The path '/workspace/\\udc80' is not valid Unicode text."),
    ],
)
def test_unsafe_paths_are_refused_from_the_string_alone(path, message):
    error = error_of(check_path, path)
    assert error.message == message
    assert error.code is ErrorCode.INVALID_ARGUMENTS


def test_dots_inside_names_are_not_parent_references():
    assert check_path("/workspace/..hidden/a..b") == "/workspace/..hidden/a..b"


# --- view --------------------------------------------------------------------------------------


def test_make_output_is_cat_n_with_six_wide_numbers_and_a_tab():
    assert make_output("a\n\tb\nc", "/w/f") == (
        "Here's the result of running `cat -n` on /w/f:\n     1\ta\n     2\t        b\n     3\tc\n"
    )
    assert make_output("x", "/w/f", init_line=123456) == "Here's the result of running `cat -n` on /w/f:\n123456\tx\n"


def test_view_of_a_whole_file_numbers_the_line_after_the_final_newline():
    assert view_file("alpha\nbeta\n", "/workspace/f.txt") == (
        "Here's the result of running `cat -n` on /workspace/f.txt:\n     1\talpha\n     2\tbeta\n     3\t\n"
    )


def test_view_of_an_empty_file():
    assert view_file("", "/workspace/e") == "Here's the result of running `cat -n` on /workspace/e:\n     1\t\n"


def test_view_range_shows_those_lines_numbered_from_the_start():
    assert view_file(TWELVE, "/w/t", [3, 5]) == (
        "Here's the result of running `cat -n` on /w/t:\n     3\tline 3\n     4\tline 4\n     5\tline 5\n"
    )
    assert view_file(TWELVE, "/w/t", [11, -1]) == (
        "Here's the result of running `cat -n` on /w/t:\n    11\tline 11\n    12\tline 12\n    13\t\n"
    )
    assert view_file(TWELVE, "/w/t", [13, 13]) == "Here's the result of running `cat -n` on /w/t:\n    13\t\n"


def test_an_empty_view_range_means_the_whole_file():
    assert view_file("a", "/w/t", []) == view_file("a", "/w/t")


@pytest.mark.parametrize(
    ("view_range", "message"),
    [
        ([1], "Invalid `view_range`. It should be a list of two integers."),
        ([1, 2, 3], "Invalid `view_range`. It should be a list of two integers."),
        ([0, 3], "Invalid `view_range`: [0, 3]. Its first element `0` should be within the range of lines of "
                 "the file: [1, 13]"),
        ([14, -1], "Invalid `view_range`: [14, -1]. Its first element `14` should be within the range of lines "
                   "of the file: [1, 13]"),
        ([2, 14], "Invalid `view_range`: [2, 14]. Its second element `14` should be smaller than the number of "
                  "lines in the file: `13`"),
        ([5, 3], "Invalid `view_range`: [5, 3]. Its second element `3` should be larger or equal than its "
                 "first `5`"),
        ([5, -2], "Invalid `view_range`: [5, -2]. Its second element `-2` should be larger or equal than its "
                  "first `5`"),
    ],
)
def test_invalid_view_ranges_get_the_published_messages(view_range, message):
    error = error_of(view_file, TWELVE, "/w/t", view_range)
    assert error.message == message
    assert error.code is ErrorCode.INVALID_ARGUMENTS


def test_long_files_are_clipped_with_the_published_note():
    assert TRUNCATED_MESSAGE == CLIPPED
    assert MAX_RESPONSE_LEN == 16000
    text = "x" * 16001
    assert view_file(text, "/w/big") == (
        "Here's the result of running `cat -n` on /w/big:\n     1\t" + "x" * 16000 + CLIPPED + "\n"
    )
    assert view_file("x" * 16000, "/w/big") == "Here's the result of running `cat -n` on /w/big:\n     1\t" + \
        "x" * 16000 + "\n"


def test_max_characters_clips_the_file_text_before_numbering():
    assert view_file("abc\ndef\nghi\n", "/w/f", None, 5) == (
        "Here's the result of running `cat -n` on /w/f:\n     1\tabc\n     2\td" + CLIPPED + "\n"
    )
    assert view_file(TWELVE, "/w/t", [2, 3], 9) == (
        "Here's the result of running `cat -n` on /w/t:\n     2\tline 2\n     3\tli" + CLIPPED + "\n"
    )
    assert maybe_truncate("abc", 3) == "abc"


def test_directory_view_lists_the_directory_then_its_entries():
    assert view_directory("/workspace", ["a", "a/b.py", "c.txt"]) == (
        "Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items:\n"
        "/workspace\n/workspace/a\n/workspace/a/b.py\n/workspace/c.txt\n\n"
    )
    assert view_directory("/workspace/empty", []) == (
        "Here's the files and directories up to 2 levels deep in /workspace/empty, excluding hidden items:\n"
        "/workspace/empty\n\n"
    )


def test_a_huge_directory_listing_is_clipped():
    text = view_directory("/w", [f"f{i:05}" for i in range(5000)], truncated=True)
    header = "Here's the files and directories up to 2 levels deep in /w, excluding hidden items:\n"
    assert text.startswith(header + "/w\n/w/f00000\n")
    assert text.endswith(CLIPPED + "\n")
    assert len(text) == len(header) + 16000 + len(CLIPPED) + 1


# --- str_replace -------------------------------------------------------------------------------


def test_a_unique_match_is_replaced_and_a_snippet_shown():
    edit = replace_once(TWELVE, "line 7", "LINE SEVEN", "/w/t")
    assert edit.new_text == TWELVE.replace("line 7", "LINE SEVEN")
    assert edit.message == (
        "The file /w/t has been edited. Here's the result of running `cat -n` on a snippet of /w/t:\n"
        "     3\tline 3\n     4\tline 4\n     5\tline 5\n     6\tline 6\n     7\tLINE SEVEN\n"
        "     8\tline 8\n     9\tline 9\n    10\tline 10\n    11\tline 11\n"
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


def test_the_snippet_grows_with_the_lines_of_new_str_and_starts_at_line_one_near_the_top():
    edit = replace_once("a\nb\nc\n", "b", "b1\nb2", "/w/s")
    assert edit.new_text == "a\nb1\nb2\nc\n"
    assert edit.message == (
        "The file /w/s has been edited. Here's the result of running `cat -n` on a snippet of /w/s:\n"
        "     1\ta\n     2\tb1\n     3\tb2\n     4\tc\n     5\t\n"
        "Review the changes and make sure they are as expected. Edit the file again if necessary."
    )


def test_no_match_gets_the_published_message():
    error = error_of(replace_once, TWELVE, "line 99", "x", "/w/t")
    assert error.message == "No replacement was performed, old_str `line 99` did not appear verbatim in /w/t."
    assert error.code is ErrorCode.TOOL_FAILED


def test_several_matches_list_their_lines():
    error = error_of(replace_once, TWELVE, "line 1", "x", "/w/t")
    assert error.message == (
        "No replacement was performed. Multiple occurrences of old_str `line 1` in lines [1, 10, 11, 12]. "
        "Please ensure it is unique"
    )
    assert error.code is ErrorCode.TOOL_FAILED


def test_several_matches_of_a_multi_line_old_str_list_the_lines_they_start_on():
    error = error_of(replace_once, "a\nb\nx\na\nb\n", "a\nb", "z", "/w/m")
    assert error.message == (
        "No replacement was performed. Multiple occurrences of old_str `a\nb` in lines [1, 4]. "
        "Please ensure it is unique"
    )


def test_two_matches_on_one_line_list_it_once_and_overlapping_ones_count():
    assert "in lines [1]." in error_of(replace_once, "ab ab\n", "ab", "x", "/w/x").message
    assert "in lines [1]." in error_of(replace_once, "aaa", "aa", "x", "/w/x").message


def test_empty_old_str_fills_an_empty_file_and_is_ambiguous_otherwise():
    assert replace_once("", "", "new\n", "/w/e").new_text == "new\n"
    assert error_of(replace_once, "a\nb", "", "x", "/w/e").message == (
        "No replacement was performed. Multiple occurrences of old_str `` in lines [1, 2]. Please ensure it is "
        "unique"
    )


def test_deleting_with_an_empty_new_str():
    assert replace_once("keep\ndrop\nkeep2\n", "drop\n", "", "/w/d").new_text == "keep\nkeep2\n"


def test_old_str_written_with_tabs_matches_as_written_and_tabs_elsewhere_stay():
    text = "all:\n\techo one\n\techo two\n"
    edit = replace_once(text, "\techo one", "\techo 1", "/w/Makefile")
    assert edit.new_text == "all:\n\techo 1\n\techo two\n"
    assert "     2\t        echo 1\n" in edit.message  # the snippet shows tabs expanded


def test_old_str_copied_from_the_expanded_view_matches_a_tabbed_file_and_only_that_span_changes():
    text = "all:\n\techo one\n\techo two\n"
    edit = replace_once(text, "        echo one", "        echo 1", "/w/Makefile")
    assert edit.new_text == "all:\n        echo 1\n\techo two\n"  # the reference would expand line 3 too
    edit = replace_once(text, "echo one", "echo 1", "/w/Makefile")
    assert edit.new_text == "all:\n\techo 1\n\techo two\n"


def test_a_match_beginning_or_ending_inside_a_tab_keeps_the_rest_of_that_tab_as_spaces():
    text = "x\tyz\n"  # expands to "x       yz": the tab covers columns 1-7
    assert replace_once(text, "   yz", "Q", "/w/t").new_text == "x    Q\n"
    assert replace_once(text, "x  ", "Q", "/w/t").new_text == "Q     yz\n"


def test_expanded_matching_reports_none_and_several_like_the_reference():
    text = "\tone\n\tone\n"
    assert error_of(replace_once, text, "        one", "x", "/w/t").message == (
        "No replacement was performed. Multiple occurrences of old_str `        one` in lines [1, 2]. "
        "Please ensure it is unique"
    )
    assert error_of(replace_once, text, "\ttwo", "x", "/w/t").message == (
        "No replacement was performed, old_str `        two` did not appear verbatim in /w/t."
    )


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet="ab\t \n\r", max_size=40),
    bounds=st.tuples(st.integers(0, 400), st.integers(0, 400)),
)
def test_expanded_spans_map_back_to_raw_offsets_exactly(text, bounds):
    expanded = text.expandtabs()
    start, stop = sorted(b % (len(expanded) + 1) for b in bounds)
    raw_start, raw_stop, lead, trail = editor_text._expanded_span_to_raw(text, expanded, start, stop)
    # What precedes the span is unchanged, and the part of a split tab before it is kept as spaces ...
    assert text[:raw_start].expandtabs() + " " * lead == expanded[:start]
    # ... and the span's end falls on a raw boundary, with the rest of a split tab kept after it.
    assert text[:raw_stop].expandtabs() == expanded[:stop] + " " * trail
    assert raw_start <= raw_stop


# --- insert ------------------------------------------------------------------------------------


def test_insert_at_the_top():
    edit = insert_into("a\nb\n", 0, "first", "/w/i")
    assert edit.new_text == "first\na\nb\n"
    assert edit.message == (
        "The file /w/i has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n"
        "     1\tfirst\n     2\ta\n     3\tb\n     4\t\n"
        "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )


def test_insert_after_a_middle_line_shows_four_lines_either_side():
    edit = insert_into(TWELVE, 6, "new A\nnew B", "/w/t")
    assert edit.new_text.split("\n")[5:9] == ["line 6", "new A", "new B", "line 7"]
    assert edit.message == (
        "The file /w/t has been edited. Here's the result of running `cat -n` on a snippet of the edited file:\n"
        "     3\tline 3\n     4\tline 4\n     5\tline 5\n     6\tline 6\n     7\tnew A\n     8\tnew B\n"
        "     9\tline 7\n    10\tline 8\n    11\tline 9\n    12\tline 10\n"
        "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, etc). "
        "Edit the file again if necessary."
    )


def test_insert_after_the_last_line():
    assert insert_into("a\nb", 2, "c", "/w/i").new_text == "a\nb\nc"
    assert insert_into("a\nb\n", 2, "c", "/w/i").new_text == "a\nb\nc\n"


def test_insert_keeps_tabs_as_written():
    assert insert_into("\tx\n", 1, "\ty", "/w/i").new_text == "\tx\n\ty\n"


@pytest.mark.parametrize(("line", "message"), [
    (-1, "Invalid `insert_line` parameter: -1. It should be within the range of lines of the file: [0, 3]"),
    (4, "Invalid `insert_line` parameter: 4. It should be within the range of lines of the file: [0, 3]"),
])
def test_insert_line_out_of_range_gets_the_published_message(line, message):
    error = error_of(insert_into, "a\nb\n", line, "x", "/w/i")
    assert error.message == message
    assert error.code is ErrorCode.INVALID_ARGUMENTS


# --- encoding ----------------------------------------------------------------------------------


def test_utf8_decodes_and_crlf_files_are_edited_as_lf_and_written_back_as_crlf():
    file = decode_file("é\r\nb\r\n".encode(), "/w/c")
    assert (file.text, file.crlf) == ("é\nb\n", True)
    assert file.lf("x\r\ny") == "x\ny"
    assert encode_file("é\nz\n", file.crlf) == "é\r\nz\r\n".encode()
    mixed = decode_file(b"a\r\nb\n", "/w/m")
    assert (mixed.text, mixed.crlf) == ("a\r\nb\n", False)
    assert mixed.lf("x\r\ny") == "x\r\ny"


def test_non_utf8_files_get_a_readable_error():
    error = error_of(decode_file, b"ok\n\xff\xfe", "/w/bin")
    assert error.message == (
        "Ran into 'utf-8' codec can't decode byte 0xff in position 3: invalid start byte while trying to read "
        "/w/bin. The file is not UTF-8 text; this tool only views and edits UTF-8 text files."
    )


def test_a_prefix_cut_inside_a_character_decodes_without_it():
    data = "abé".encode()
    assert decode_file(data[:-1], "/w/p", final=False).text == "ab"
    assert "codec can't decode" in error_of(decode_file, data[:-1], "/w/p").message


def test_text_that_cannot_be_utf8_is_refused():
    error = error_of(encode_file, "bad \udc80")
    assert error.code is ErrorCode.INVALID_ARGUMENTS
    assert error.message.startswith("The text cannot be written as UTF-8: ")


# --- undo history ------------------------------------------------------------------------------


def test_history_is_a_stack_per_sandbox_and_path():
    history = EditHistory()
    history.push("s1", "/w/a", b"v1")
    history.push("s1", "/w/a", b"v2")
    history.push("s1", "/w/b", None)
    history.push("s2", "/w/a", b"other")
    assert history.depth("s1", "/w/a") == 2
    entry = history.pop("s1", "/w/a")
    assert entry is not None
    assert entry.previous == b"v2"
    popped = history.pop("s1", "/w/a")
    assert popped is not None
    assert popped.previous == b"v1"
    assert history.pop("s1", "/w/a") is None
    created = history.pop("s1", "/w/b")
    assert created is not None
    assert created.previous is None
    other = history.pop("s2", "/w/a")
    assert other is not None
    assert other.previous == b"other"
    assert history.bytes_held == 0


def test_history_drops_the_oldest_entries_beyond_its_byte_budget():
    history = EditHistory(max_bytes=1000)
    for i in range(10):
        history.push("s", "/w/a", bytes([48 + i]) * 200)
    assert history.bytes_held <= 1000
    kept = []
    while (entry := history.pop("s", "/w/a")) is not None:
        assert entry.previous is not None
        kept.append(entry.previous[:1])
    assert kept == [b"9", b"8", b"7"]  # newest first; the oldest were dropped
    assert history.bytes_held == 0


def test_history_keeps_a_bounded_number_of_sandboxes_least_recently_used_first():
    history = EditHistory(max_sandboxes=2)
    history.push("s1", "/w/a", b"1")
    history.push("s2", "/w/a", b"2")
    history.push("s1", "/w/b", b"1b")  # s1 is now the most recently used
    history.push("s3", "/w/a", b"3")
    assert history.depth("s2", "/w/a") == 0
    assert history.depth("s1", "/w/a") == 1
    assert history.depth("s3", "/w/a") == 1
    history.forget("s1")
    assert history.depth("s1", "/w/b") == 0


def test_an_entry_larger_than_the_budget_is_not_kept():
    history = EditHistory(max_bytes=100)
    history.push("s", "/w/a", b"x" * 500)
    assert history.depth("s", "/w/a") == 0
    assert history.bytes_held == 0


def test_history_bookkeeping_stays_small_under_many_pushes_and_pops():
    history = EditHistory()
    for _ in range(1000):
        history.push("s", "/w/a", b"data")
        history.pop("s", "/w/a")
    assert len(history._order) < 200
    assert history.bytes_held == 0


# --- the tool and its handler before any I/O --------------------------------------------------


class NoSandbox:
    """A provider that fails the test if the handler asks for the sandbox at all."""

    def sandbox(self) -> Any:
        raise AssertionError("the sandbox was used, but this call must be refused before any I/O")


def run(**arguments: Any) -> Any:
    ctx = ToolContext(run_id="r", call_id="c", provider=NoSandbox(), default_timeout_s=10,
                      timeout_ceiling_s=10, output_budget=30000)
    return EDITOR.handler(ctx, EditorArgs(**arguments))


@pytest.mark.parametrize(("arguments", "message"), [
    ({"command": "delete", "path": "/workspace/a"},
     "Unrecognized command delete. The allowed commands for the str_replace_based_edit_tool tool are: view, "
     "create, str_replace, insert, undo_edit"),
    ({"command": "create", "path": "/workspace/a"}, "Parameter `file_text` is required for command: create"),
    ({"command": "str_replace", "path": "/workspace/a", "new_str": "x"},
     "Parameter `old_str` is required for command: str_replace"),
    ({"command": "insert", "path": "/workspace/a", "insert_text": "x"},
     "Parameter `insert_line` is required for command: insert"),
    ({"command": "insert", "path": "/workspace/a", "insert_line": 1},
     "Parameter `insert_text` is required for command: insert"),
    ({"command": "view", "path": "notes.txt"},
     "The path notes.txt is not an absolute path, it should start with `/`. Maybe you meant /notes.txt?"),
    ({"command": "create", "path": "/workspace/../etc/x", "file_text": "x"},
     "The path /workspace/../etc/x contains `..`; give the absolute path without `..` components."),
    ({"command": "view", "path": "/workspace/\x00"},
     "The path '/workspace/\\x00' contains a NUL byte; a path cannot contain NUL bytes."),
    ({"command": "create", "path": "/workspace/" + "a" * 5000, "file_text": "x"},
     "The path is 5011 characters long; the sandbox accepts paths of at most 4096 characters."),
])
def test_bad_calls_are_refused_before_the_sandbox_is_touched(arguments, message):
    output = run(**arguments)
    assert output.is_error
    assert output.error is ErrorCode.INVALID_ARGUMENTS
    assert output.text == message


def test_the_tool_registers_with_a_strict_schema_naming_every_parameter():
    registry = ToolRegistry([EDITOR])
    assert "str_replace_based_edit_tool" in registry
    schema = EDITOR.definition.input_schema()
    assert schema["additionalProperties"] is False
    assert list(schema["properties"]) == [
        "command", "path", "file_text", "old_str", "new_str", "insert_line", "insert_text", "view_range",
        "max_characters",
    ]
    assert schema["required"] == list(schema["properties"])
    assert schema["properties"]["command"]["enum"] == ["view", "create", "str_replace", "insert", "undo_edit"]
    assert EDITOR.definition.path_fields == ("path",)
