"""Path safety of ``str_replace_based_edit_tool``: every escape is refused, nothing outside is touched.

What proves "nothing outside the root was read or written":

* The witness directory is ``/dev/shm``: it is *not* one of the agent's roots (``/workspace``,
  ``/tmp``, ``/home/sandbox``, the workdir, mount targets) yet the tool user can write to it (a
  shell command does, in ``outside``). So if a refused write had gone through, it would have
  landed there; the root filesystem (``/etc``, ``/opt``, ``/usr``) is read-only and could not
  show a write. Each test records ``/dev/shm`` (names, sizes, mtimes, SHA-256 of contents)
  before and after and asserts it is unchanged, and that no result text contains the secret
  kept in it (or ``/etc/passwd``'s first line): a read that got through would show it.
* Refusals decided from the path string alone (``..``, NUL, over-long, not absolute) are also
  shown never to ask for the sandbox at all (a provider that counts).
* Sibling prefixes: ``/workspace-x`` cannot exist (the root filesystem is read-only and every
  mount target becomes a root), so that case only shows the lexical refusal. A sandbox whose
  workdir is ``/dev/sh`` makes it real: ``/dev/sh`` is a root and ``/dev/shm`` an existing,
  writable sibling whose name starts with it.
* A host directory that is mounted but *not* a root cannot be set up (mount targets are
  roots), so the host side is covered by ``/dev/shm`` inside the container instead.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from harness.core.context import ToolContext
from harness.engine.exec_result import collect
from harness.tools.editor import EDITOR, EditorArgs
from harness.tools.editor_history import HISTORY

pytestmark = pytest.mark.docker

SECRET = "TOP-SECRET-7f3a needle"
PASSWD_LINE = "root:x:0:0"


class CountingProvider:
    def __init__(self, box: Any) -> None:
        self.box = box
        self.calls = 0

    def sandbox(self) -> Any:
        self.calls += 1
        return self.box


def sh(box: Any, command: str) -> str:
    result = collect(box.agent.exec(command))
    assert result.exit_code == 0, (command, result.stderr.data())
    return result.stdout.data().decode()


def outside(box: Any) -> str:
    """Everything observable about the witness directory outside the roots."""
    return sh(box, "cd /dev/shm && find . -printf '%p %y %s %T@\\n' | sort && "
                   "find . -type f -exec sha256sum {} + | sort")


def call(box: Any, **arguments: Any) -> tuple[Any, int]:
    provider = CountingProvider(box)
    ctx = ToolContext(run_id="run", call_id="call", provider=provider, default_timeout_s=30,
                      timeout_ceiling_s=60, output_budget=30000)
    return EDITOR.handler(ctx, EditorArgs(**arguments)), provider.calls


@pytest.fixture
def box(clean_sandbox):  # type: ignore[no-untyped-def]
    """The module's shared sandbox, set up afresh for each test: scratch directories and the
    witness emptied, no undo history, then the links and the secret. Each test compares the
    witness before and after its own calls, so a refusal that failed still shows in that test."""
    sandbox = clean_sandbox
    HISTORY.forget(sandbox.id)
    sh(sandbox, f"""
        set -e
        find /dev/shm -mindepth 1 -delete
        printf '%s\\n' '{SECRET}' > /dev/shm/secret.txt
        touch /dev/shm/probe && rm /dev/shm/probe   # the tool user CAN write here; only confinement stops it
        cd /workspace
        mkdir -p a/b/c sub
        ln -s /dev/shm shm-link                      # a directory link leaving the root, as a middle component
        ln -s /dev/shm a/b/c/deep-link               # the same, three levels down
        ln -s /dev/shm/secret.txt secret-link        # the final component is a link to a file outside
        ln -s /dev/shm/new.txt dangling-link         # a final link to a file that does not exist yet, outside
        ln -s ../../dev/shm sub/rel-link             # a relative link climbing out with ..
        ln -s /workspace/chain2 chain1 && ln -s /dev/shm chain2   # a chain whose second hop leaves
        ln -s /etc etc-link
        ln -s /etc /tmp/etc-link                     # from another root
    """)
    return sandbox


READ_ESCAPES = [
    "/dev/shm/secret.txt",
    "/etc/passwd",
    "/opt/callbox/agent.py",
    "/usr/bin",
    "/workspace/shm-link/secret.txt",
    "/workspace/a/b/c/deep-link/secret.txt",
    "/workspace/secret-link",
    "/workspace/sub/rel-link/secret.txt",
    "/workspace/chain1/secret.txt",
    "/workspace/etc-link/passwd",
    "/tmp/etc-link/passwd",
    "/workspace/shm-link",
    "/workspace-x/secret.txt",
]

WRITE_ESCAPES = [
    "/dev/shm/new.txt",
    "/workspace/shm-link/new.txt",
    "/workspace/a/b/c/deep-link/new.txt",
    "/workspace/sub/rel-link/new.txt",
    "/workspace/chain1/new.txt",
    "/workspace/dangling-link",
    "/workspace/shm-link/newdir/new.txt",
    "/workspace/etc-link/new.txt",
    "/workspace-x/new.txt",
]

LEXICAL = [
    ("/workspace/../dev/shm/secret.txt", "contains `..`"),
    ("/workspace/sub/../../dev/shm/secret.txt", "contains `..`"),
    ("/workspace/x\x00/../../dev/shm/secret.txt", "contains a NUL byte"),
    ("/workspace/" + "a/" * 2100 + "secret.txt", "the sandbox accepts paths of at most 4096 characters"),
    ("/workspace/" + "n" * 300, "contains a name longer than 255 bytes"),
    ("dev/shm/secret.txt", "is not an absolute path"),
]

EDITS = [
    {"command": "view"},
    {"command": "view", "view_range": [1, -1]},
    {"command": "str_replace", "old_str": "needle", "new_str": "PWNED"},
    {"command": "insert", "insert_line": 0, "insert_text": "PWNED"},
    {"command": "undo_edit"},
]


def assert_refused(output: Any, path: str) -> None:
    assert output.is_error, output.text
    assert SECRET not in output.text
    assert PASSWD_LINE not in output.text
    assert "import " not in output.text  # no agent source
    if not path.startswith("/workspace/") or "-link" in path or "chain" in path:
        assert "outside the sandbox's allowed directories" in output.text, output.text


@pytest.mark.parametrize("path", READ_ESCAPES)
def test_reads_and_edits_that_leave_the_roots_are_refused(box, path):
    before = outside(box)
    for arguments in EDITS:
        output, _ = call(box, path=path, **arguments)
        assert_refused(output, path)
    assert outside(box) == before
    assert sh(box, "cat /dev/shm/secret.txt") == SECRET + "\n"


@pytest.mark.parametrize("path", WRITE_ESCAPES)
def test_creates_that_would_land_outside_the_roots_are_refused(box, path):
    before = outside(box)
    output, _ = call(box, command="create", path=path, file_text="PWNED\n")
    assert_refused(output, path)
    assert outside(box) == before
    assert sh(box, "test ! -e /dev/shm/new.txt && test ! -e /dev/shm/newdir && echo absent") == "absent\n"


@pytest.mark.parametrize(("path", "reason"), LEXICAL)
def test_lexically_unsafe_paths_are_refused_before_the_sandbox_is_asked(box, path, reason):
    before = outside(box)
    for arguments in [*EDITS, {"command": "create", "file_text": "PWNED"}]:
        output, sandbox_requests = call(box, path=path, **arguments)
        assert output.is_error
        assert reason in output.text
        assert SECRET not in output.text
        assert sandbox_requests == 0
    assert outside(box) == before


def test_the_refusal_names_the_roots(box):
    output, _ = call(box, command="view", path="/etc/passwd")
    assert output.text == (
        "The path /etc/passwd is outside the sandbox's allowed directories and was refused. "
        "/etc/passwd is outside the allowed roots (/home/sandbox, /tmp, /workspace)."
    )
    output, _ = call(box, command="view", path="/workspace/shm-link/secret.txt")
    assert output.text == (
        "The path /workspace/shm-link/secret.txt is outside the sandbox's allowed directories and was refused. "
        "/workspace/shm-link/secret.txt leads outside the allowed roots (/home/sandbox, /tmp, /workspace) "
        "through a symbolic link."
    )


def test_a_sibling_whose_name_extends_a_root_is_outside_it(make_sandbox):
    # A spec of its own (so a sandbox of its own); roots: /dev/sh, ...; /dev/shm exists, is writable, and is
    # not one.
    sibling = make_sandbox(workdir="/dev/sh")
    sh(sibling, f"printf '%s\\n' '{SECRET}' > /dev/shm/secret.txt")
    before = outside(sibling)
    for arguments in EDITS:
        output, _ = call(sibling, path="/dev/shm/secret.txt", **arguments)
        assert_refused(output, "/dev/shm/secret.txt")
    output, _ = call(sibling, command="create", path="/dev/shm/new.txt", file_text="PWNED")
    assert_refused(output, "/dev/shm/new.txt")
    assert outside(sibling) == before
    # ... while the root itself works
    output, _ = call(sibling, command="create", path="/dev/sh/ok.txt", file_text="fine\n")
    assert output.text == "File created successfully at: /dev/sh/ok.txt"
    assert sh(sibling, "cat /dev/sh/ok.txt") == "fine\n"


def test_a_final_component_swapped_for_a_symlink_while_calls_run(box):
    """A shell loop keeps replacing /workspace/race, atomically, by a file and by a link to /dev/shm."""
    sh(box, f"printf '%s\\n' '{SECRET}' > /dev/shm/target && printf 'needle\\n' > /workspace/race")
    before = outside(box)
    swapper = threading.Thread(target=lambda: collect(box.agent.exec(
        "end=$((SECONDS+6)); cd /workspace; while [ $SECONDS -lt $end ]; do "
        "printf 'needle\\n' > race.f; mv -f race.f race; ln -sfn /dev/shm/target race.l; mv -fT race.l race; "
        "done", timeout_ms=30_000)))
    swapper.start()
    outcomes = {"edited": 0, "refused": 0, "other": 0}
    try:
        while swapper.is_alive():
            for arguments in ({"command": "view"},
                              {"command": "str_replace", "old_str": "needle", "new_str": "PWNED"},
                              {"command": "insert", "insert_line": 0, "insert_text": "PWNED"},
                              {"command": "undo_edit"}):
                output, _ = call(box, path="/workspace/race", **arguments)
                assert SECRET not in output.text
                if not output.is_error:
                    outcomes["edited"] += 1
                elif "outside the sandbox's allowed directories" in output.text:
                    outcomes["refused"] += 1
                else:
                    outcomes["other"] += 1
    finally:
        swapper.join()
    assert sh(box, "cat /dev/shm/target") == SECRET + "\n"
    assert outside(box) == before
    # Both states were met: the regular file (edited in place) and the link (refused).
    assert outcomes["refused"] > 0, outcomes
    assert outcomes["edited"] > 0, outcomes
