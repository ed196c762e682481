"""``str_replace_based_edit_tool`` in a real sandbox: the published texts, and the file bytes behind them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolOutput
from harness.core.context import ToolContext
from harness.core.policy import load_policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.spec import SandboxSpec
from harness.tools.editor import EDITOR, MAX_FILE_BYTES, EditorArgs
from harness.tools.editor_history import HISTORY
from harness.tools.editor_text import TRUNCATED_MESSAGE
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


class Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def editor_for(box: Any) -> Any:
    ctx = ToolContext(run_id="run", call_id="call", provider=Provider(box), default_timeout_s=30,
                      timeout_ceiling_s=60, output_budget=30000)

    def edit(**arguments: Any) -> ToolOutput:
        return EDITOR.handler(ctx, EditorArgs(**arguments))

    return edit


@pytest.fixture
def box(clean_sandbox):  # type: ignore[no-untyped-def]
    """The module's shared sandbox, emptied, with no undo history (it is kept per sandbox id)."""
    HISTORY.forget(clean_sandbox.id)
    return clean_sandbox


@pytest.fixture
def edit(box):  # type: ignore[no-untyped-def]
    return editor_for(box)


def file_bytes(box: Any, path: str) -> bytes:
    result = run(box, ["cat", path])
    assert result.exit_code == 0, result.stderr.data()
    return result.stdout.data()


def ok(output: ToolOutput) -> str:
    assert not output.is_error, output.text
    return output.text


def failed(output: ToolOutput, code: ErrorCode = ErrorCode.TOOL_FAILED) -> str:
    assert output.is_error, output.text
    assert output.error is code
    return output.text


# --- create and view ---------------------------------------------------------------------------


def test_create_writes_the_file_and_view_shows_it_numbered(box, edit):
    assert ok(edit(command="create", path="/workspace/hello.py", file_text="print('hi')\n\tx = 1\n")) == (
        "File created successfully at: /workspace/hello.py"
    )
    assert file_bytes(box, "/workspace/hello.py") == b"print('hi')\n\tx = 1\n"
    assert ok(edit(command="view", path="/workspace/hello.py")) == (
        "Here's the result of running `cat -n` on /workspace/hello.py:\n"
        "     1\tprint('hi')\n     2\t        x = 1\n     3\t\n"
    )


def test_create_makes_missing_parent_directories(box, edit):
    ok(edit(command="create", path="/workspace/pkg/sub/mod.py", file_text="x = 1\n"))
    assert file_bytes(box, "/workspace/pkg/sub/mod.py") == b"x = 1\n"


def test_create_refuses_to_overwrite_a_file_or_a_directory(box, edit):
    run(box, "echo original > /workspace/f.txt && mkdir /workspace/d")
    for path in ("/workspace/f.txt", "/workspace/d"):
        assert failed(edit(command="create", path=path, file_text="new\n")) == (
            f"File already exists at: {path}. Cannot overwrite files using command `create`."
        )
    assert file_bytes(box, "/workspace/f.txt") == b"original\n"


def test_a_missing_path_gets_the_published_message(edit):
    for command, extra in (("view", {}), ("str_replace", {"old_str": "a"}),
                           ("insert", {"insert_line": 0, "insert_text": "x"}), ("undo_edit", {})):
        assert failed(edit(command=command, path="/workspace/nope.txt", **extra)) == (
            "The path /workspace/nope.txt does not exist. Please provide a valid path."
        )


def test_view_of_a_directory_lists_two_levels_without_hidden_items(box, edit):
    run(box, "cd /workspace && mkdir -p src/pkg/deep .git/objects && touch README.md .env src/main.py "
                 "src/.hidden src/pkg/deep/too-deep.py .git/config")
    assert ok(edit(command="view", path="/workspace/")) == (
        "Here's the files and directories up to 2 levels deep in /workspace, excluding hidden items:\n"
        "/workspace\n/workspace/README.md\n/workspace/src\n/workspace/src/main.py\n/workspace/src/pkg\n\n"
    )
    assert failed(edit(command="view", path="/workspace", view_range=[1, 2]), ErrorCode.INVALID_ARGUMENTS) == (
        "The `view_range` parameter is not allowed when `path` points to a directory."
    )


def test_other_commands_on_a_directory_are_refused(box, edit):
    run(box, "mkdir /workspace/dir")
    for command, extra in (("str_replace", {"old_str": "a"}), ("insert", {"insert_line": 0, "insert_text": "x"}),
                           ("undo_edit", {})):
        assert failed(edit(command=command, path="/workspace/dir", **extra)) == (
            "The path /workspace/dir is a directory and only the `view` command can be used on directories"
        )


def test_view_range_and_max_characters(box, edit):
    run(box, "seq 1 20 > /workspace/n.txt")
    assert ok(edit(command="view", path="/workspace/n.txt", view_range=[18, -1])) == (
        "Here's the result of running `cat -n` on /workspace/n.txt:\n    18\t18\n    19\t19\n    20\t20\n    21\t\n"
    )
    assert failed(edit(command="view", path="/workspace/n.txt", view_range=[0, 5]), ErrorCode.INVALID_ARGUMENTS) == (
        "Invalid `view_range`: [0, 5]. Its first element `0` should be within the range of lines of the file: [1, 21]"
    )
    assert ok(edit(command="view", path="/workspace/n.txt", max_characters=4)) == (
        "Here's the result of running `cat -n` on /workspace/n.txt:\n     1\t1\n     2\t2\n     3\t"
        + TRUNCATED_MESSAGE + "\n"
    )


def test_a_fifo_is_refused_without_hanging(box, edit):
    run(box, "mkfifo /workspace/pipe")
    assert failed(edit(command="view", path="/workspace/pipe")) == (
        "The path /workspace/pipe is not a regular file; this tool only works on text files."
    )


# --- str_replace and insert --------------------------------------------------------------------


def test_str_replace_edits_exactly_one_occurrence(box, edit):
    run(box, "printf 'def f():\\n    return 1\\n\\ndef g():\\n    return 1\\n' > /workspace/m.py")
    assert failed(edit(command="str_replace", path="/workspace/m.py", old_str="return 1", new_str="return 2")) == (
        "No replacement was performed. Multiple occurrences of old_str `return 1` in lines [2, 5]. "
        "Please ensure it is unique"
    )
    assert failed(edit(command="str_replace", path="/workspace/m.py", old_str="return 3", new_str="x")) == (
        "No replacement was performed, old_str `return 3` did not appear verbatim in /workspace/m.py."
    )
    assert file_bytes(box, "/workspace/m.py") == b"def f():\n    return 1\n\ndef g():\n    return 1\n"
    assert ok(edit(command="str_replace", path="/workspace/m.py", old_str="def g():\n    return 1",
                   new_str="def g():\n    return 2")) == (
        "The file /workspace/m.py has been edited. Here's the result of running `cat -n` on a snippet of "
        "/workspace/m.py:\n     1\tdef f():\n     2\t    return 1\n     3\t\n     4\tdef g():\n     5\t    return 2\n"
        "     6\t\nReview the changes and make sure they are as expected. Edit the file again if necessary."
    )
    assert file_bytes(box, "/workspace/m.py") == b"def f():\n    return 1\n\ndef g():\n    return 2\n"


def test_str_replace_without_new_str_deletes(box, edit):
    run(box, "printf 'a\\nb\\nc\\n' > /workspace/d.txt")
    ok(edit(command="str_replace", path="/workspace/d.txt", old_str="b\n"))
    assert file_bytes(box, "/workspace/d.txt") == b"a\nc\n"


def test_tabs_elsewhere_in_the_file_survive_an_edit_made_with_spaces(box, edit):
    run(box, "printf 'all:\\n\\techo one\\n\\techo two\\n' > /workspace/Makefile")
    ok(edit(command="str_replace", path="/workspace/Makefile", old_str="        echo one", new_str="\techo 1"))
    assert file_bytes(box, "/workspace/Makefile") == b"all:\n\techo 1\n\techo two\n"


def test_crlf_files_match_lf_strings_and_keep_crlf(box, edit):
    run(box, "printf 'one\\r\\ntwo\\r\\nthree\\r\\n' > /workspace/win.txt")
    ok(edit(command="str_replace", path="/workspace/win.txt", old_str="one\ntwo", new_str="1\n2"))
    ok(edit(command="insert", path="/workspace/win.txt", insert_line=3, insert_text="four"))
    assert file_bytes(box, "/workspace/win.txt") == b"1\r\n2\r\nthree\r\nfour\r\n"


def test_insert_at_top_middle_and_end_and_the_older_new_str_name(box, edit):
    run(box, "printf 'a\\nb\\n' > /workspace/i.txt")
    assert ok(edit(command="insert", path="/workspace/i.txt", insert_line=0, insert_text="top")) == (
        "The file /workspace/i.txt has been edited. Here's the result of running `cat -n` on a snippet of the "
        "edited file:\n     1\ttop\n     2\ta\n     3\tb\n     4\t\nReview the changes and make sure they are as "
        "expected (correct indentation, no duplicate lines, etc). Edit the file again if necessary."
    )
    ok(edit(command="insert", path="/workspace/i.txt", insert_line=2, new_str="mid"))
    ok(edit(command="insert", path="/workspace/i.txt", insert_line=4, insert_text="end"))
    assert file_bytes(box, "/workspace/i.txt") == b"top\na\nmid\nb\nend\n"
    assert failed(edit(command="insert", path="/workspace/i.txt", insert_line=9, insert_text="x"),
                  ErrorCode.INVALID_ARGUMENTS) == (
        "Invalid `insert_line` parameter: 9. It should be within the range of lines of the file: [0, 6]"
    )


def test_edits_through_a_symlink_inside_the_root_change_the_target(box, edit):
    run(box, "mkdir /workspace/real && echo 'v = 1' > /workspace/real/conf.py && "
                 "ln -s /workspace/real/conf.py /workspace/conf-link.py && ln -s /tmp /workspace/tmp-link")
    ok(edit(command="str_replace", path="/workspace/conf-link.py", old_str="v = 1", new_str="v = 2"))
    assert file_bytes(box, "/workspace/real/conf.py") == b"v = 2\n"
    assert run(box, "readlink /workspace/conf-link.py").stdout.data() == b"/workspace/real/conf.py\n"
    ok(edit(command="create", path="/workspace/tmp-link/via-link.txt", file_text="x"))  # /tmp is a root too
    assert file_bytes(box, "/tmp/via-link.txt") == b"x"


# --- encodings and sizes -----------------------------------------------------------------------


def test_non_utf8_files_get_a_readable_error_and_stay_unchanged(box, edit):
    run(box, "printf 'caf\\xe9\\n' > /workspace/latin1.txt")
    expected = (
        "Ran into 'utf-8' codec can't decode byte 0xe9 in position 3: invalid continuation byte while trying to "
        "read /workspace/latin1.txt. The file is not UTF-8 text; this tool only views and edits UTF-8 text files."
    )
    assert failed(edit(command="view", path="/workspace/latin1.txt")) == expected
    assert failed(edit(command="str_replace", path="/workspace/latin1.txt", old_str="caf", new_str="x")) == expected
    assert file_bytes(box, "/workspace/latin1.txt") == b"caf\xe9\n"


def test_large_files_are_viewed_clipped_but_not_edited(box, edit):
    size = MAX_FILE_BYTES + 10
    run(box, f"head -c {size - 1} /dev/zero | tr '\\0' 'a' > /workspace/big.txt && echo >> /workspace/big.txt")
    view = ok(edit(command="view", path="/workspace/big.txt"))
    assert view == "Here's the result of running `cat -n` on /workspace/big.txt:\n     1\t" + "a" * 16000 + \
        TRUNCATED_MESSAGE + "\n"
    too_large = (
        f"The file /workspace/big.txt is too large for this tool ({size} bytes; the limit is {MAX_FILE_BYTES} "
        "bytes). Use the shell to work with it, e.g. `grep -n` to find lines and `sed -n 'START,ENDp'` to print them."
    )
    assert failed(edit(command="str_replace", path="/workspace/big.txt", old_str="a", new_str="b")) == too_large
    assert failed(edit(command="view", path="/workspace/big.txt", view_range=[1, 1])) == too_large


def test_writing_to_a_read_only_mount_fails_readably(make_sandbox, tmp_path):
    (tmp_path / "conf.txt").write_text("setting = 1\n")
    tmp_path.chmod(0o777)  # only the read-only mount stands in the way
    box = make_sandbox(mounts=[{"source": tmp_path, "target": "/data/ro", "read_only": True}])  # a spec of its own
    edit = editor_for(box)
    text = failed(edit(command="str_replace", path="/data/ro/conf.txt", old_str="1", new_str="2"))
    assert text == "Ran into /data/ro/conf.txt is on a read-only filesystem while trying to write to /data/ro/conf.txt"
    assert (tmp_path / "conf.txt").read_text() == "setting = 1\n"


# --- undo_edit ---------------------------------------------------------------------------------


def test_undo_walks_back_every_edit_including_the_create(box, edit):
    path = "/workspace/u.txt"
    ok(edit(command="create", path=path, file_text="one\n\ttwo\r\n"))
    ok(edit(command="str_replace", path=path, old_str="one", new_str="ONE"))
    ok(edit(command="insert", path=path, insert_line=0, insert_text="zero"))
    assert file_bytes(box, path) == b"zero\nONE\n\ttwo\r\n"
    assert ok(edit(command="undo_edit", path=path)) == (
        f"Last edit to {path} undone successfully. Here's the result of running `cat -n` on {path}:\n"
        "     1\tONE\n     2\t        two\r\n     3\t\n"
    )
    assert file_bytes(box, path) == b"ONE\n\ttwo\r\n"
    ok(edit(command="undo_edit", path=path))
    assert file_bytes(box, path) == b"one\n\ttwo\r\n"  # the exact bytes, tab and CR included
    assert ok(edit(command="undo_edit", path=path)) == (
        f"Last edit to {path} undone successfully. The file did not exist before it was created with `create`, "
        "so it has been removed."
    )
    assert run(box, f"test -e {path}").exit_code == 1
    assert failed(edit(command="undo_edit", path=path)) == (
        f"The path {path} does not exist. Please provide a valid path."
    )


def test_undo_without_history(box, edit):
    run(box, "echo shell-made > /workspace/s.txt")
    assert failed(edit(command="undo_edit", path="/workspace/s.txt")) == (
        "No edit history found for /workspace/s.txt."
    )


def test_failed_edits_leave_nothing_to_undo(box, edit):
    run(box, "echo a > /workspace/f.txt")
    failed(edit(command="str_replace", path="/workspace/f.txt", old_str="zzz", new_str="b"))
    assert failed(edit(command="undo_edit", path="/workspace/f.txt")) == "No edit history found for /workspace/f.txt."


def test_history_is_kept_per_sandbox(box, make_sandbox):
    first, second = box, make_sandbox()  # a sandbox of its own beside the shared one: two ids to tell apart
    for box in (first, second):
        run(box, "echo base > /workspace/shared.txt")
    ok(editor_for(first)(command="str_replace", path="/workspace/shared.txt", old_str="base", new_str="changed"))
    assert failed(editor_for(second)(command="undo_edit", path="/workspace/shared.txt")) == (
        "No edit history found for /workspace/shared.txt."
    )
    ok(editor_for(first)(command="undo_edit", path="/workspace/shared.txt"))
    assert file_bytes(first, "/workspace/shared.txt") == b"base\n"


# --- through the harness -----------------------------------------------------------------------


def test_calls_through_the_harness_with_strict_null_arguments(tmp_path):
    nulls = {key: None for key in EDITOR.definition.input_schema()["properties"]}
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry([EDITOR]), load_policy(None), audit, spec=SandboxSpec(image=IMAGE)
    ) as harness:
        created = harness.call(ToolCall("str_replace_based_edit_tool", json.dumps(
            {**nulls, "command": "create", "path": "/workspace/h.txt", "file_text": "hello\n"}), "c1"))
        assert created.text == "File created successfully at: /workspace/h.txt"
        viewed = harness.call(ToolCall("str_replace_based_edit_tool", json.dumps(
            {**nulls, "command": "view", "path": "/workspace/h.txt"}), "c2"))
        assert not viewed.is_error
        assert viewed.text == "Here's the result of running `cat -n` on /workspace/h.txt:\n     1\thello\n     2\t\n"
        unknown = harness.call(ToolCall("str_replace_based_edit_tool", json.dumps(
            {**nulls, "command": "rename", "path": "/workspace/h.txt"}), "c3"))
        assert unknown.is_error
        assert unknown.error is ErrorCode.INVALID_ARGUMENTS
        assert unknown.text == (
            "Unrecognized command rename. The allowed commands for the str_replace_based_edit_tool tool are: "
            "view, create, str_replace, insert, undo_edit"
        )
