"""read_file, write_file, list_dir and search against a real sandbox (harness/tools/files.py, file_search.py)."""

from __future__ import annotations

import re
import time
from typing import Any

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import ToolContext
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.spec import SandboxSpec
from harness.tools.file_search import LIST_DIR, SEARCH, ListDirArgs, SearchArgs
from harness.tools.files import FILE_TOOLS, READ_CHUNK, READ_FILE, WRITE_FILE, ReadFileArgs, WriteFileArgs
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _ctx(box: Any, budget: int = 30_000) -> ToolContext:
    return ToolContext(run_id="file-tools", call_id="c1", provider=_Provider(box), default_timeout_s=30.0,
                       timeout_ceiling_s=60.0, output_budget=budget)


def _sh(box: Any, script: str) -> str:
    result = run(box, script)
    assert result.exit_code == 0, result.stderr.data()
    return result.stdout.data().decode()


def read(box: Any, budget: int = 30_000, **args: Any) -> Any:
    return READ_FILE.handler(_ctx(box, budget), ReadFileArgs(**args))


def write(box: Any, **args: Any) -> Any:
    return WRITE_FILE.handler(_ctx(box), WriteFileArgs(**args))


def ls(box: Any, budget: int = 30_000, **args: Any) -> Any:
    return LIST_DIR.handler(_ctx(box, budget), ListDirArgs(**args))


def search(box: Any, budget: int = 30_000, **args: Any) -> Any:
    return SEARCH.handler(_ctx(box, budget), SearchArgs(**args))


@pytest.fixture(scope="module")
def box(engine):  # type: ignore[no-untyped-def]
    """One sandbox with a small tree, shared by the read-only tests of this module."""
    sandbox = engine.create(SandboxSpec(image=IMAGE))
    _sh(sandbox, r"""
        set -e
        mkdir -p src/pkg docs .hidden-dir empty-dir
        printf 'alpha\nbeta\ngamma\n' > notes.txt
        printf 'no final newline' > tail.txt
        : > empty.txt
        printf 'def main():\n    return 42\n' > src/app.py
        printf 'import os\nVALUE = "a.b"\n' > src/pkg/util.py
        printf '# Title\nsee -v flag\n' > docs/readme.md
        printf 'secret\n' > .hidden-file
        printf 'hidden match\n' > .hidden-dir/inner.txt
        printf 'x\0y' > blob.bin
        printf 'caf\xc3' > latin.txt
        seq 1 20000 > numbers.txt
        head -c 5000 /dev/zero | tr '\0' 'z' > oneline.txt
        ln -s notes.txt link-to-notes
        ln -s /etc etc-link
        ln -s src src-link
        ln -s /dev/zero zero-link
        mkfifo fifo
        ln -s fifo fifo-link
        python3 -c 'import socket; socket.socket(socket.AF_UNIX).bind("sock")'
    """)
    _sh(sandbox, f"python3 -c \"open('chunky.txt','w').write('a' * {READ_CHUNK - 1} + 'é\\nnext\\n')\"")
    yield sandbox
    sandbox.destroy()


# ---- read_file -------------------------------------------------------------------------------------


def test_read_whole_file_is_plain_text(box):
    out = read(box, path="notes.txt")
    assert (out.is_error, out.text) == (False, "alpha\nbeta\ngamma\n")
    assert out.structured == {"path": "notes.txt", "size": 17, "start_line": 1, "end_line": 3, "total_lines": 3,
                              "truncated": False}
    assert read(box, path="/workspace/notes.txt").text == "alpha\nbeta\ngamma\n"
    assert read(box, path="tail.txt").text == "no final newline"
    assert read(box, path="link-to-notes").text == "alpha\nbeta\ngamma\n"  # a symlink inside the root


def test_read_line_ranges(box):
    assert read(box, path="notes.txt", start_line=2).text == "beta\ngamma\n"
    assert read(box, path="notes.txt", start_line=2, end_line=2).text == "beta\n"
    assert read(box, path="notes.txt", start_line=3, end_line=99).text == "gamma\n"
    assert read(box, path="numbers.txt", start_line=19_999).text == "19999\n20000\n"
    assert read(box, path="numbers.txt", start_line=10, end_line=12).text == "10\n11\n12\n"


def test_start_line_past_the_end_is_an_error(box):
    out = read(box, path="notes.txt", start_line=9)
    assert (out.is_error, out.error) == (True, ErrorCode.TOOL_FAILED)
    assert out.text == "start_line 9 is past the end of notes.txt, which has 3 lines."
    tail = read(box, path="tail.txt", start_line=2)  # a last line without a newline counts
    assert tail.text == "start_line 2 is past the end of tail.txt, which has 1 line."


def test_end_before_start_is_refused_by_the_schema():
    with pytest.raises(pydantic.ValidationError, match="end_line"):
        ReadFileArgs(path="a", start_line=5, end_line=2)


def test_empty_file(box):
    out = read(box, path="empty.txt")
    assert (out.is_error, out.text) == (False, "[empty file]")


def test_a_file_over_the_budget_returns_its_head_and_where_to_continue(box):
    out = read(box, budget=2000, path="numbers.txt")
    assert not out.is_error and len(out.text.encode()) <= 2000
    body, note = out.text.rsplit("\n[", 1)
    last = int(body.splitlines()[-1])
    assert body + "\n" == "".join(f"{i}\n" for i in range(1, last + 1))
    assert note == (f"... read_file stopped after line {last} to stay within 1700 bytes; the file has "
                    f"108894 bytes. Call read_file with start_line={last + 1} to read on.]")
    assert out.structured["truncated"] is True


def test_reading_on_from_the_note_reconstructs_the_file(box):
    start, pieces = 1, []
    for _ in range(200):
        out = read(box, budget=4000, path="numbers.txt", start_line=start)
        assert not out.is_error
        found = re.search(r"\n\[\.\.\. read_file stopped after line \d+ .* start_line=(\d+) to read on\.\]$",
                          out.text)
        if found is None:
            pieces.append(out.text)
            break
        pieces.append(out.text[: found.start() + 1])
        start = int(found.group(1))
    assert "".join(pieces) == "".join(f"{i}\n" for i in range(1, 20001))


def test_max_bytes_argument(box):
    out = read(box, path="numbers.txt", max_bytes=10)
    assert out.text.startswith("1\n2\n3\n4\n5\n[... read_file stopped after line 5 to stay within 10 bytes")


def test_a_line_longer_than_the_cap_shows_its_head(box):
    out = read(box, path="oneline.txt", max_bytes=100)
    assert out.text == ("z" * 100 + "\n[... line 1 is longer than 100 bytes; only its first 100 bytes are shown. "
                        "Use the shell tool to see the rest of it, or call read_file with start_line=2 for the "
                        "lines after it.]")


def test_fifo_socket_and_devices_are_refused_without_hanging(box):
    started = time.monotonic()
    fifo = read(box, path="fifo")
    assert time.monotonic() - started < 5
    assert fifo.is_error
    assert fifo.text == "fifo is not a regular file. read_file reads regular files only, not FIFOs, sockets or devices."
    assert fifo.structured == {"reason": "WRONG_TYPE", "path": "fifo"}
    sock = read(box, path="sock")
    assert sock.is_error and sock.structured["reason"] == "WRONG_TYPE"
    for device in ("/dev/zero", "/dev/urandom", "/dev/tty"):  # outside the roots: refused before opening
        out = read(box, path=device)
        assert out.is_error and out.text.startswith(f"path {device} is outside the sandbox's allowed directories.")
    # A device node cannot be made inside the roots (tmpfs mounted nodev, no CAP_MKNOD), so a
    # symlink to one is the closest case: it leaves the roots and is refused.
    out = read(box, path="zero-link")
    assert out.is_error and out.structured["reason"] == "PATH_ESCAPE"
    # a FIFO reached through a symlink inside the root
    assert read(box, path="fifo-link").structured == {"reason": "WRONG_TYPE", "path": "fifo-link"}


def test_directory_and_missing_paths(box):
    out = read(box, path="src")
    assert out.text == "src is a directory; list it instead of reading it. Use list_dir to see what it contains."
    missing = read(box, path="nope.txt")
    assert (missing.is_error, missing.text) == (True, "no such file or directory: nope.txt")
    deep = read(box, path="no/such/dir.txt")
    assert deep.text == ("no such file or directory: no/such/dir.txt. "
                         "A parent directory of no/such/dir.txt does not exist.")


def test_binary_files_are_refused_readably(box):
    out = read(box, path="blob.bin")
    assert out.is_error and out.text.startswith("blob.bin is not a UTF-8 text file (a NUL byte at byte 1)")
    latin = read(box, path="latin.txt")
    assert latin.is_error and latin.text.startswith("latin.txt is not a UTF-8 text file (invalid UTF-8 at byte 3)")


def test_a_character_split_across_read_chunks_is_decoded(box):
    assert read(box, path="chunky.txt", start_line=2).text == "next\n"
    out = read(box, path="chunky.txt", max_bytes=READ_CHUNK + 10, budget=4 << 20)
    assert out.text == "a" * (READ_CHUNK - 1) + "é\nnext\n"


def test_a_lone_surrogate_is_refused_by_the_schema():
    with pytest.raises(pydantic.ValidationError, match="unicode"):
        ReadFileArgs(path="bad\ud800name")


# ---- write_file ------------------------------------------------------------------------------------


@pytest.fixture
def sandbox(clean_sandbox: Any) -> Any:
    """For the tests that write: the module's shared default sandbox with an empty workspace
    (``box``, with its tree, stays read-only)."""
    return clean_sandbox


def test_write_creates_parents_and_reports_bytes(sandbox):
    out = write(sandbox, path="a/b/c.txt", content="héllo\n")
    assert (out.is_error, out.text) == (False, "Wrote 7 bytes to a/b/c.txt (new file).")
    assert out.structured == {"path": "a/b/c.txt", "bytes_written": 7, "created": True}
    assert bytes(sandbox.agent.read_file("a/b/c.txt").data) == "héllo\n".encode()
    again = write(sandbox, path="/workspace/a/b/c.txt", content="bye\n")
    assert again.text == "Wrote 4 bytes to /workspace/a/b/c.txt (replaced the previous content)."
    assert _sh(sandbox, "cat a/b/c.txt; stat -c %U a/b/c.txt") == "bye\nuser\n"


def test_create_only_refuses_an_existing_file(sandbox):
    assert not write(sandbox, path="once.txt", content="first", create_only=True).is_error
    out = write(sandbox, path="once.txt", content="second", create_only=True)
    assert out.is_error
    assert out.text == ("file already exists: once.txt. create_only is set: read the file first, or write it "
                        "without create_only to replace it.")
    assert _sh(sandbox, "cat once.txt") == "first"


def test_write_to_a_directory_is_refused(sandbox):
    _sh(sandbox, "mkdir -p somedir")
    out = write(sandbox, path="somedir", content="x")
    assert out.is_error and out.text == "somedir is a directory; give the path of a file to write."


def test_write_an_empty_file(sandbox):
    assert write(sandbox, path="e.txt", content="").text == "Wrote 0 bytes to e.txt (new file)."
    assert _sh(sandbox, "wc -c < e.txt").strip() == "0"


# ---- list_dir --------------------------------------------------------------------------------------


def test_list_one_level_sorted_with_marks(box):
    out = ls(box)
    assert out.text.split("\n") == [
        "blob.bin", "chunky.txt", "docs/", "empty-dir/", "empty.txt", "etc-link -> /etc", "fifo",
        "fifo-link -> fifo", "latin.txt", "link-to-notes -> notes.txt", "notes.txt", "numbers.txt", "oneline.txt",
        "sock", "src/", "src-link -> src", "tail.txt", "zero-link -> /dev/zero",
    ]


def test_list_depth_and_hidden(box):
    out = ls(box, path="src", depth=2)
    assert out.text == "app.py\npkg/\npkg/util.py"
    hidden = ls(box, path=".", include_hidden=True)
    assert ".hidden-file" in hidden.text.split("\n") and ".hidden-dir/" in hidden.text.split("\n")
    deep = ls(box, depth=3, include_hidden=True).text.split("\n")
    assert ".hidden-dir/inner.txt" in deep and "src/pkg/util.py" in deep
    assert not any(line.startswith(("etc-link/", "src-link/")) for line in deep)  # symlinks not descended


def test_list_empty_dir_and_errors(box):
    assert ls(box, path="empty-dir").text == "[empty directory]"
    out = ls(box, path="notes.txt")
    assert out.is_error
    assert out.text == "notes.txt is not a directory. list_dir lists directories; use read_file for a file."
    assert ls(box, path="etc-link").structured["reason"] == "PATH_ESCAPE"


def test_depth_is_bounded_by_the_schema():
    with pytest.raises(pydantic.ValidationError):
        ListDirArgs(depth=6)


def test_list_caps_entries_and_the_budget(sandbox):
    _sh(sandbox, "mkdir many && cd many && seq -f 'f%04g' 1 1200 | xargs touch")
    out = ls(sandbox, path="many")
    assert out.text.endswith("\n[... the listing stops after 1000 entries; list a subdirectory or use a smaller "
                             "depth to see the rest.]")
    assert out.text.split("\n")[:2] == ["f0001", "f0002"] and out.text.count("\n") == 1000
    small = ls(sandbox, budget=600, path="many")
    assert len(small.text.encode()) <= 600
    assert re.search(r"\n\[\.\.\. at least \d+ more entries not shown; list a subdirectory or use a smaller "
                     r"depth\.\]$", small.text)


# ---- search ----------------------------------------------------------------------------------------


def test_search_regex_results_are_path_line_text(box):
    out = search(box, pattern=r"^(def|import) ")
    assert (out.is_error, out.text) == (False, "src/app.py:1:def main():\nsrc/pkg/util.py:1:import os")
    assert search(box, pattern="return", path="src").text == "src/app.py:2:    return 42"
    assert search(box, pattern="return", path="src/app.py").text == "src/app.py:2:    return 42"
    assert search(box, pattern="return", path="/workspace/src").text == "/workspace/src/app.py:2:    return 42"


def test_search_literal_and_glob(box):
    assert search(box, pattern="a.b", literal=True).text == 'src/pkg/util.py:2:VALUE = "a.b"'
    assert search(box, pattern="e", glob="*.md").text == "docs/readme.md:1:# Title\ndocs/readme.md:2:see -v flag"


def test_no_matches_is_not_an_error(box):
    out = search(box, pattern="no-such-text-anywhere")
    assert (out.is_error, out.text) == (False, "No matches found.")


def test_invalid_regex_is_a_readable_error(box):
    out = search(box, pattern="(unclosed")
    assert out.is_error and out.error == ErrorCode.TOOL_FAILED
    assert out.text.startswith("search failed (rg exit code 2): regex parse error:")
    assert "unclosed group" in out.text


def test_results_are_capped_with_a_note(box):
    out = search(box, pattern="^1", path="numbers.txt", max_results=3)
    assert out.text == ("numbers.txt:1:1\nnumbers.txt:10:10\nnumbers.txt:11:11\n"
                        "[... showing the first 3 of 11111 matching lines; narrow the pattern, the path or the "
                        "glob to see the rest.]")
    small = search(box, budget=800, pattern="^1", path="numbers.txt", max_results=1000)
    assert len(small.text.encode()) <= 800 and small.text.endswith("to see the rest.]")


def test_arguments_are_never_options_or_shell(box):
    assert search(box, pattern="-v", literal=True).text == "docs/readme.md:2:see -v flag"
    assert search(box, pattern="--files").text == "No matches found."
    out = search(box, pattern="$(touch /workspace/pwned)`touch /workspace/pwned2`;", glob="*;touch pwned3")
    assert not out.is_error
    assert _sh(box, "ls pwned pwned2 pwned3 2>/dev/null || true") == ""


def test_search_skips_hidden_and_special_files_and_does_not_follow_links(box):
    started = time.monotonic()
    out = search(box, pattern="hidden match|secret|root:x")
    assert out.text == "No matches found."  # .hidden-*, the fifo and etc-link -> /etc are all skipped
    assert time.monotonic() - started < 10


def test_search_root_must_be_inside_the_roots(box):
    for path in ("/etc", "etc-link", "../etc", "/proc/self"):
        out = search(box, pattern="root", path=path)
        assert out.is_error and out.structured["reason"] == "PATH_ESCAPE", path
        assert "outside the sandbox's allowed directories" in out.text
    fifo = search(box, pattern="x", path="fifo")
    assert fifo.text == "fifo is not a regular file or a directory; search reads files and directories only."
    assert search(box, pattern="return", path="src-link").text == "src-link/app.py:2:    return 42"


# ---- through the dispatcher ------------------------------------------------------------------------


def test_file_tools_through_the_harness_with_a_path_rule(engine, tmp_path):
    policy = Policy.model_validate({"tools": {"read_file": {"rules": [
        {"action": "deny", "path": "private/**", "reason": "private files stay private"}]}}})
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry(list(FILE_TOOLS)), policy, audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as harness:
        wrote = harness.call(ToolCall("write_file", {"path": "private/key.txt", "content": "k\n"}, "c1"))
        assert wrote.text == "Wrote 2 bytes to private/key.txt (new file)."
        denied = harness.call(ToolCall("read_file", {"path": "private/key.txt"}, "c2"))
        assert denied.error == ErrorCode.DENIED and "private files stay private" in denied.text
        listed = harness.call(ToolCall("list_dir", {"path": ".", "depth": 2}, "c3"))
        assert listed.text == "private/\nprivate/key.txt"
        found = harness.call(ToolCall("search", {"pattern": "k", "path": None, "glob": None}, "c4"))
        assert found.text == "private/key.txt:1:k"
        nul = harness.call(ToolCall("read_file", {"path": "a\u0000b"}, "c5"))
        assert nul.error == ErrorCode.INVALID_ARGUMENTS
        surrogate = harness.call(ToolCall("read_file", '{"path": "bad\\ud800"}', "c7"))
        assert surrogate.error == ErrorCode.INVALID_ARGUMENTS
        bad = harness.call(ToolCall("read_file", {"path": "x", "start_line": 3, "end_line": 1}, "c6"))
        assert bad.error == ErrorCode.INVALID_ARGUMENTS and "end_line" in bad.text
