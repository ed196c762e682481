"""The memory tool's commands and refusals against a real scope directory (a temp dir): the
documented texts, path safety (no escape by ``..``, absolute paths, symlinks, NUL bytes,
over-long names), size caps that leave the memory as it was, atomic writes and one lock per
scope under concurrent commands."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from harness.core.calls import ErrorCode, ToolOutput
from harness.core.context import ToolContext
from harness.core.memory import MemoryScope, MemorySettings
from harness.tools.memory import MemoryArgs, human_size, run_memory
from harness.tools.memory_store import opened


class NoSandbox:
    def sandbox(self) -> Any:
        raise AssertionError("the memory tool never starts a sandbox")


def scope_in(root: Path, **caps: Any) -> MemoryScope:
    return MemoryScope.of(MemorySettings(root=root, **caps), None)


@pytest.fixture
def scope(tmp_path: Path) -> MemoryScope:
    return scope_in(tmp_path / "store")


def call(scope: MemoryScope, **arguments: Any) -> ToolOutput:
    ctx = ToolContext(run_id="r", call_id="c", provider=NoSandbox(), default_timeout_s=10, timeout_ceiling_s=10,
                      output_budget=1 << 20, memory=scope)
    return run_memory(ctx, MemoryArgs.model_validate(arguments))


def ok(scope: MemoryScope, **arguments: Any) -> str:
    out = call(scope, **arguments)
    assert not out.is_error, out.text
    return out.text


def refused(scope: MemoryScope, code: ErrorCode = ErrorCode.TOOL_FAILED, **arguments: Any) -> str:
    out = call(scope, **arguments)
    assert out.is_error and out.error is code, (out.text, out.error)
    assert out.structured is not None and out.structured["scope"] == "project:default"
    return out.text


def memories(scope: MemoryScope) -> Path:
    return scope.directory / "memories"


# --- the commands ------------------------------------------------------------------------------------


def test_create_then_view_the_file_with_line_numbers(scope: MemoryScope) -> None:
    text = ok(scope, command="create", path="/memories/notes.md", file_text="first\nsecond\n")
    assert text == "File created successfully at: /memories/notes.md"
    assert (memories(scope) / "notes.md").read_bytes() == b"first\nsecond\n"
    assert ok(scope, command="view", path="/memories/notes.md") == (
        "Here's the content of /memories/notes.md with line numbers:\n     1\tfirst\n     2\tsecond")


def test_view_range_and_its_refusal(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/n.txt", file_text="a\nb\nc\nd\n")
    assert ok(scope, command="view", path="/memories/n.txt", view_range=[2, 3]).endswith("     2\tb\n     3\tc")
    assert ok(scope, command="view", path="/memories/n.txt", view_range=[3, -1]).endswith("     3\tc\n     4\td")
    text = refused(scope, ErrorCode.INVALID_ARGUMENTS, command="view", path="/memories/n.txt", view_range=[3, 9])
    assert text.startswith("Error: Invalid `view_range`: [3, 9].") and "<= 4" in text


def test_view_a_directory_two_levels_deep_without_hidden_items(scope: MemoryScope) -> None:
    for path in ("/memories/a.md", "/memories/dir/b.md", "/memories/dir/deep/c.md", "/memories/dir/deep/more/d.md",
                 "/memories/.hidden", "/memories/node_modules/x.js"):
        ok(scope, command="create", path=path, file_text="12345")
    lines = ok(scope, command="view", path="/memories").splitlines()
    assert lines[0] == ("Here're the files and directories up to 2 levels deep in /memories, excluding hidden items "
                        "and node_modules:")
    assert lines[1].endswith("\t/memories")
    assert [line.split("\t") for line in lines[2:]] == [
        ["5B", "/memories/a.md"], [lines[3].split("\t")[0], "/memories/dir/"], ["5B", "/memories/dir/b.md"],
        [lines[5].split("\t")[0], "/memories/dir/deep/"]]
    assert [line.split("\t")[1] for line in ok(scope, command="view", path="/memories/dir/").splitlines()[1:]] == [
        "/memories/dir", "/memories/dir/b.md", "/memories/dir/deep/", "/memories/dir/deep/c.md",
        "/memories/dir/deep/more/"]


def test_view_of_a_missing_path(scope: MemoryScope) -> None:
    assert refused(scope, command="view", path="/memories/nope.md") == (
        "The path /memories/nope.md does not exist. Please provide a valid path.")
    assert ok(scope, command="view", path="/memories").count("\n") == 1  # an empty memory: itself


def test_create_refuses_an_existing_path_and_makes_parents(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/x/y/z.md", file_text="one")
    assert refused(scope, command="create", path="/memories/x/y/z.md", file_text="two") == (
        "Error: File /memories/x/y/z.md already exists")
    assert refused(scope, command="create", path="/memories/x", file_text="two") == (
        "Error: File /memories/x already exists")
    assert (memories(scope) / "x/y/z.md").read_text() == "one"
    assert oct((memories(scope) / "x").stat().st_mode & 0o777) == "0o700"
    assert oct((memories(scope) / "x/y/z.md").stat().st_mode & 0o777) == "0o600"


def test_str_replace_one_none_several(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/p.txt", file_text="1\n2\ncolor: blue\n4\n5\n6\n")
    text = ok(scope, command="str_replace", path="/memories/p.txt", old_str="blue", new_str="green")
    assert text == ("The memory file has been edited. Here is the snippet showing the change (with line numbers):\n"
                    "     1\t1\n     2\t2\n     3\tcolor: green\n     4\t4\n     5\t5")
    assert (memories(scope) / "p.txt").read_text() == "1\n2\ncolor: green\n4\n5\n6\n"
    assert refused(scope, command="str_replace", path="/memories/p.txt", old_str="red", new_str="x") == (
        "No replacement was performed, old_str `red` did not appear verbatim in /memories/p.txt.")
    ok(scope, command="create", path="/memories/q.txt", file_text="x\ny\nx\n")
    assert refused(scope, command="str_replace", path="/memories/q.txt", old_str="x", new_str="z") == (
        "No replacement was performed. Multiple occurrences of old_str `x` in lines: 1, 3. Please ensure it is unique")
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="str_replace", path="/memories/q.txt", old_str="",
                   new_str="z").startswith("Error: `old_str` is empty")
    ok(scope, command="create", path="/memories/d/f", file_text="")
    for missing in ("/memories/none.txt", "/memories/d"):  # a directory is not a file to edit
        assert refused(scope, command="str_replace", path=missing, old_str="x", new_str="y") == (
            f"Error: The path {missing} does not exist. Please provide a valid path.")


def test_insert_at_the_top_the_end_and_out_of_range(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/todo.txt", file_text="a\nb\n")
    assert ok(scope, command="insert", path="/memories/todo.txt", insert_line=0, insert_text="top\n") == (
        "The file /memories/todo.txt has been edited.")
    ok(scope, command="insert", path="/memories/todo.txt", insert_line=3, insert_text="end")
    assert (memories(scope) / "todo.txt").read_text() == "top\na\nb\nend\n"
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="insert", path="/memories/todo.txt", insert_line=9,
                   insert_text="x") == ("Error: Invalid `insert_line` parameter: 9. It should be within the range of "
                                        "lines of the file: [0, 4]")
    assert refused(scope, command="insert", path="/memories/no.txt", insert_line=0, insert_text="x") == (
        "Error: The path /memories/no.txt does not exist")


def test_delete_a_file_a_directory_and_not_the_root(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/old.txt", file_text="x")
    ok(scope, command="create", path="/memories/dir/a/b.txt", file_text="x")
    assert ok(scope, command="delete", path="/memories/old.txt") == "Successfully deleted /memories/old.txt"
    assert ok(scope, command="delete", path="/memories/dir") == "Successfully deleted /memories/dir"
    assert list(memories(scope).iterdir()) == []
    assert refused(scope, command="delete", path="/memories/old.txt") == (
        "Error: The path /memories/old.txt does not exist")
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="delete", path="/memories/").startswith(
        "Error: Cannot delete the /memories directory itself")
    assert memories(scope).is_dir()


def test_rename_files_and_directories_without_overwriting(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/draft.txt", file_text="d")
    ok(scope, command="create", path="/memories/final.txt", file_text="f")
    assert refused(scope, command="rename", old_path="/memories/draft.txt", new_path="/memories/final.txt") == (
        "Error: The destination /memories/final.txt already exists")
    assert ok(scope, command="rename", old_path="/memories/draft.txt", new_path="/memories/arch/2026/draft.txt") == (
        "Successfully renamed /memories/draft.txt to /memories/arch/2026/draft.txt")
    ok(scope, command="rename", old_path="/memories/arch", new_path="/memories/archive")
    assert (memories(scope) / "archive/2026/draft.txt").read_text() == "d"
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="rename", old_path="/memories/archive",
                   new_path="/memories/archive/inner").startswith("Error: cannot move the directory /memories/archive")
    assert refused(scope, command="rename", old_path="/memories/gone", new_path="/memories/x") == (
        "Error: The path /memories/gone does not exist")
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="rename", old_path="/memories",
                   new_path="/memories/x").startswith("Error: Cannot rename the /memories directory itself")


def test_a_command_without_its_fields_names_them(scope: MemoryScope) -> None:
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="insert", path="/memories/a") == (
        "Error: the `insert` command needs `insert_line` and `insert_text`")
    assert refused(scope, ErrorCode.INVALID_ARGUMENTS, command="rename", path="/memories/a") == (
        "Error: the `rename` command needs `old_path` and `new_path`")


def test_human_sizes() -> None:
    assert [human_size(n) for n in (0, 5, 1024, 5632, 1 << 20, 1288490189)] == ["0B", "5B", "1K", "5.5K", "1M",
                                                                                 "1.2G"]


# --- path safety -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "why"), [
    ("/etc/passwd", "is outside /memories"),
    ("/memoriesX/a", "is outside /memories"),
    ("memories/a", "is outside /memories"),
    ("/memories/../etc/passwd", "has a `..` component"),
    ("/memories/a/../../x", "has a `..` component"),
    ("/memories/./a", "has a `.` component"),
    ("/memories//a", "has an empty component"),
    ("/memories/a\x00b", "contains a NUL byte"),
    ("/memories/a\nb", "contains a control character"),
    ("/memories/..\\..\\x", "or a backslash"),
    ("/memories/" + "n" * 256, "has a name of 256 bytes"),
    ("/memories/" + "é" * 128, "has a name of 256 bytes"),
    ("/memories/" + "a/" * 16 + "x", "is 17 levels deep"),
    ("/memories/" + "ab/" * 400, "characters long"),
])
def test_paths_that_are_refused_before_anything_is_opened(scope: MemoryScope, path: str, why: str) -> None:
    for arguments in ({"command": "view", "path": path}, {"command": "create", "path": path, "file_text": "x"},
                      {"command": "rename", "old_path": "/memories/a", "new_path": path}):
        text = refused(scope, ErrorCode.INVALID_ARGUMENTS, **arguments)
        assert text.startswith("Error: `") and why in text, text
    assert not scope.directory.exists() or list(memories(scope).iterdir()) == []


def test_a_symlink_in_the_tree_is_never_followed(scope: MemoryScope, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    ok(scope, command="create", path="/memories/keep.md", file_text="k")
    os.symlink(outside, memories(scope) / "link")
    os.symlink(outside / "secret.txt", memories(scope) / "file-link")
    for arguments in ({"command": "view", "path": "/memories/link/secret.txt"},
                      {"command": "view", "path": "/memories/file-link"},
                      {"command": "create", "path": "/memories/link/new.txt", "file_text": "x"},
                      {"command": "str_replace", "path": "/memories/file-link", "old_str": "host", "new_str": "x"},
                      {"command": "delete", "path": "/memories/link"},
                      {"command": "rename", "old_path": "/memories/file-link", "new_path": "/memories/x"},
                      {"command": "rename", "old_path": "/memories/keep.md", "new_path": "/memories/link/k.md"}):
        text = refused(scope, ErrorCode.INVALID_ARGUMENTS, **arguments)
        assert "is a symbolic link" in text and "host secret" not in text, text
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "host secret"
    listing = ok(scope, command="view", path="/memories")
    assert "keep.md" in listing and "link" not in listing  # a listing leaves links out


# --- caps, atomic writes, the lock ---------------------------------------------------------------------


def test_caps_refuse_and_change_nothing(tmp_path: Path) -> None:
    scope = scope_in(tmp_path / "store", max_file_bytes=10, max_scope_bytes=16, max_entries=4)
    text = refused(scope, command="create", path="/memories/big.txt", file_text="x" * 11)
    assert "would be 11 bytes" in text and "cap of 10 ([memory] max_file_bytes); nothing was changed" in text
    ok(scope, command="create", path="/memories/a.txt", file_text="x" * 10)
    assert "max_scope_bytes" in refused(scope, command="create", path="/memories/b.txt", file_text="y" * 7)
    ok(scope, command="create", path="/memories/b.txt", file_text="yy")
    assert "max_scope_bytes" in refused(scope, command="insert", path="/memories/b.txt", insert_line=1,
                                        insert_text="zzzzz")
    assert "max_file_bytes" in refused(scope, command="str_replace", path="/memories/a.txt", old_str="x" * 10,
                                       new_str="y" * 11)
    ok(scope, command="create", path="/memories/d/c.txt", file_text="")
    assert "max_entries" in refused(scope, command="create", path="/memories/e.txt", file_text="")
    assert "max_entries" in refused(scope, command="rename", old_path="/memories/a.txt", new_path="/memories/f/a.txt")
    assert (memories(scope) / "a.txt").read_text() == "x" * 10
    assert (memories(scope) / "b.txt").read_text() == "yy"
    assert sorted(str(p.relative_to(memories(scope))) for p in memories(scope).rglob("*")) == [
        "a.txt", "b.txt", "d", "d/c.txt"]


def test_writes_go_through_tmp_and_leave_nothing_there(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/a.txt", file_text="1\n")
    (scope.directory / "tmp" / "stopped-half-way").write_bytes(b"junk")
    ok(scope, command="insert", path="/memories/a.txt", insert_line=1, insert_text="2")
    assert list((scope.directory / "tmp").iterdir()) == []
    assert (memories(scope) / "a.txt").read_text() == "1\n2\n"


def test_a_file_that_is_not_text_is_refused(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/bin", file_text="")
    (memories(scope) / "bin").write_bytes(b"\xff\xfe")
    assert refused(scope, command="view", path="/memories/bin") == (
        "Error: /memories/bin is not UTF-8 text; the memory tool reads and edits text only")


def test_concurrent_commands_of_one_scope_never_lose_a_change(scope: MemoryScope) -> None:
    ok(scope, command="create", path="/memories/log.txt", file_text="")
    threads, per = 6, 15
    failures: list[str] = []

    def worker(n: int) -> None:
        for i in range(per):
            out = call(scope, command="insert", path="/memories/log.txt", insert_line=0, insert_text=f"{n}-{i}")
            if out.is_error:
                failures.append(out.text)

    running = [threading.Thread(target=worker, args=(n,)) for n in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join()
    assert failures == []
    lines = (memories(scope) / "log.txt").read_text().splitlines()
    assert sorted(lines) == sorted(f"{n}-{i}" for n in range(threads) for i in range(per))


def test_the_lock_is_held_while_a_command_runs(scope: MemoryScope) -> None:
    import fcntl

    with opened(scope):
        fd = os.open(scope.directory / "lock", os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    fd = os.open(scope.directory / "lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with the command
    finally:
        os.close(fd)
