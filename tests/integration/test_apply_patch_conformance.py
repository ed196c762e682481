"""apply_patch against the 23 upstream Codex scenarios, through the real tool in a real sandbox.

Each scenario (``input/`` tree, ``patch.txt``, ``expected/`` tree) runs in a fresh sandbox: the
input is copied byte for byte into its empty workspace through the agent, the tool handler
applies the patch, and the whole workspace tree (hidden files and directories included) must
equal ``expected/`` byte for byte, with no extra file or empty directory. The result text is
compared with what Codex's ``apply_patch`` prints for the scenario (its CLI tests,
codex-rs/apply-patch/tests/suite/tool.rs, give the messages of the rejecting cases).

The fixtures live beside the repository (``../shared``), which a fresh clone lacks: the module
is skipped then, except with CI=true, where that is a failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import ToolContext
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.spec import SandboxSpec
from harness.tools.apply_patch import APPLY_PATCH, ApplyPatchArgs
from sandbox.v1 import filesystem_pb2
from tests.conftest import IMAGE, unavailable
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

SCENARIOS = Path(__file__).resolve().parents[3] / "shared" / "conformance" / "codex-apply-patch" / "scenarios"
WORKSPACE = "/workspace"

if not SCENARIOS.is_dir():
    unavailable(f"the Codex apply_patch scenario fixtures are not at {SCENARIOS} "
                "(they live in ../shared beside the repository, which a plain clone lacks)", module=True)

_HEADER = "Success. Updated the following files:\n"
_VALID_HEADERS = "Valid hunk headers: '*** Add File: {path}', '*** Delete File: {path}', '*** Update File: {path}'"

# What Codex's apply_patch prints for each scenario: (is_error, exact text). The rejecting ones
# and 002/003/004/010/011/014/015 are spelled out in Codex's tests/suite/tool.rs; the other
# summaries follow its print_summary (A, then M, then D lines, paths as written).
EXPECTED_RESULTS: dict[str, tuple[bool, str]] = {
    "001_add_file": (False, _HEADER + "A bar.md\n"),
    "002_multiple_operations": (False, _HEADER + "A nested/new.txt\nM modify.txt\nD delete.txt\n"),
    "003_multiple_chunks": (False, _HEADER + "M multi.txt\n"),
    "004_move_to_new_directory": (False, _HEADER + "M renamed/dir/name.txt\n"),
    "005_rejects_empty_patch": (True, "No files were modified.\n"),
    "006_rejects_missing_context": (True, "Failed to find expected lines in modify.txt:\nmissing\n"),
    "007_rejects_missing_file_delete": (True, "Failed to delete file missing.txt\n"),
    "008_rejects_empty_update_hunk": (
        True, "Invalid patch hunk on line 2: Update file hunk for path 'foo.txt' is empty\n"),
    "009_requires_existing_file_for_update": (
        True, "Failed to read file to update missing.txt: No such file or directory (os error 2)\n"),
    "010_move_overwrites_existing_destination": (False, _HEADER + "M renamed/dir/name.txt\n"),
    "011_add_overwrites_existing_file": (False, _HEADER + "A duplicate.txt\n"),
    "012_delete_directory_fails": (True, "Failed to delete file dir\n"),
    "013_rejects_invalid_hunk_header": (
        True,
        f"Invalid patch hunk on line 2: '*** Frobnicate File: foo' is not a valid hunk header. {_VALID_HEADERS}\n",
    ),
    "014_update_file_appends_trailing_newline": (False, _HEADER + "M no_newline.txt\n"),
    "015_failure_after_partial_success_leaves_changes": (
        True, "Failed to read file to update missing.txt: No such file or directory (os error 2)\n"),
    "016_pure_addition_update_chunk": (False, _HEADER + "M input.txt\n"),
    "017_whitespace_padded_hunk_header": (False, _HEADER + "M foo.txt\n"),
    "018_whitespace_padded_patch_markers": (False, _HEADER + "M file.txt\n"),
    "019_unicode_simple": (False, _HEADER + "M foo.txt\n"),
    "020_delete_file_success": (False, _HEADER + "D obsolete.txt\n"),
    "020_whitespace_padded_patch_marker_lines": (False, _HEADER + "M file.txt\n"),
    "021_update_file_deletion_only": (False, _HEADER + "M lines.txt\n"),
    "022_update_file_end_of_file_marker": (False, _HEADER + "M tail.txt\n"),
}

# The error class of each rejection: a patch that does not parse is invalid arguments; one that
# parses but cannot be applied is a tool failure.
PARSE_REJECTIONS = {"008_rejects_empty_update_hunk", "013_rejects_invalid_hunk_header"}

Tree = dict[str, Any]  # relative path -> "dir" | file bytes | ("symlink", target) | ("other",)


def _scenario_names() -> list[str]:
    return sorted(p.name for p in SCENARIOS.iterdir() if p.is_dir())


def test_the_fixture_set_is_the_23_upstream_scenarios():
    assert _scenario_names() == sorted(EXPECTED_RESULTS)
    assert len(EXPECTED_RESULTS) == 23


def host_tree(root: Path) -> Tree:
    tree: Tree = {}
    if not root.is_dir():
        return tree
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            tree[rel] = ("symlink", str(path.readlink()))
        elif path.is_dir():
            tree[rel] = "dir"
        elif path.is_file():
            tree[rel] = path.read_bytes()
        else:
            tree[rel] = ("other",)
    return tree


def sandbox_tree(agent: Any, top: str = WORKSPACE) -> Tree:
    """The whole tree under ``top`` as the agent sees it (hidden entries included)."""
    listing = agent.list_dir(top, depth=64, include_hidden=True)
    assert not listing.truncated
    tree: Tree = {}
    for entry in listing.entries:
        if entry.type == filesystem_pb2.FILE_TYPE_DIRECTORY:
            tree[entry.path] = "dir"
        elif entry.type == filesystem_pb2.FILE_TYPE_FILE:
            response = agent.read_file(f"{top}/{entry.path}")
            assert not response.truncated
            tree[entry.path] = response.data
        elif entry.type == filesystem_pb2.FILE_TYPE_SYMLINK:
            tree[entry.path] = ("symlink", entry.link_target)
        else:
            tree[entry.path] = ("other",)
    return tree


def copy_in(agent: Any, source: Path, top: str = WORKSPACE) -> None:
    """Copy a host tree into the sandbox byte for byte (directories, even empty ones, too)."""
    for rel, item in host_tree(source).items():
        if item == "dir":
            agent.make_dir(f"{top}/{rel}", parents=True, exist_ok=True)
        elif isinstance(item, bytes):
            agent.write_file(f"{top}/{rel}", item, make_parents=True)
        else:
            raise AssertionError(f"fixture {source / rel} is neither a file nor a directory")


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _context(box: Any, call_id: str) -> ToolContext:
    return ToolContext(run_id="apply-patch-conformance", call_id=call_id, provider=_Provider(box),
                       default_timeout_s=30.0, timeout_ceiling_s=60.0, output_budget=1 << 20)


@pytest.mark.parametrize("name", _scenario_names())
def test_codex_scenario(name, clean_sandbox):
    scenario = SCENARIOS / name
    box = clean_sandbox  # the module's shared sandbox, its workspace emptied for each scenario
    assert sandbox_tree(box.agent) == {}, "each scenario's workspace must start empty"
    copy_in(box.agent, scenario / "input")
    assert sandbox_tree(box.agent) == host_tree(scenario / "input"), "the input must arrive byte for byte"

    patch = (scenario / "patch.txt").read_bytes().decode("utf-8")
    output = APPLY_PATCH.handler(_context(box, f"c-{name[:3]}"), ApplyPatchArgs(patch=patch))

    assert sandbox_tree(box.agent) == host_tree(scenario / "expected")
    is_error, text = EXPECTED_RESULTS[name]
    assert output.text == text
    assert output.is_error is is_error
    if is_error:
        expected_code = ErrorCode.INVALID_ARGUMENTS if name in PARSE_REJECTIONS else ErrorCode.TOOL_FAILED
        assert output.error is expected_code
    else:
        assert output.text.startswith("Success. Updated the following files:")
        assert output.error is None


def test_partial_success_is_reported_in_structured_output(clean_sandbox):
    patch = (SCENARIOS / "015_failure_after_partial_success_leaves_changes" / "patch.txt").read_text()
    output = APPLY_PATCH.handler(_context(clean_sandbox, "c-015"), ApplyPatchArgs(patch=patch))
    assert output.is_error
    assert output.structured == {"applied": False, "added": ["created.txt"], "modified": [], "deleted": []}


# ---- through the dispatcher: freeform text and JSON arguments ---------------------------------


@pytest.fixture
def harness(engine, tmp_path):  # type: ignore[no-untyped-def]
    registry = ToolRegistry([APPLY_PATCH])
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        registry, Policy(), audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as h:
        yield h


def _read(h: Session, path: str) -> bytes:
    return bytes(h.sandbox().agent.read_file(path).data)


def test_freeform_text_and_json_arguments_both_apply(harness):
    add = "*** Begin Patch\n*** Add File: notes/hello.txt\n+hello\n+world\n*** End Patch\n"
    result = harness.call(ToolCall("apply_patch", add, "c1"))  # freeform: the raw patch text
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nA notes/hello.txt\n")
    assert _read(harness, "notes/hello.txt") == b"hello\nworld\n"

    update = "*** Begin Patch\n*** Update File: notes/hello.txt\n@@\n hello\n-world\n+there\n*** End Patch"
    result = harness.call(ToolCall("apply_patch", json.dumps({"patch": update}), "c2"))  # JSON text
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nM notes/hello.txt\n")
    assert _read(harness, "notes/hello.txt") == b"hello\nthere\n"

    move = ("*** Begin Patch\n*** Update File: notes/hello.txt\n*** Move to: greeting.txt\n@@\n-there\n+you\n"
            "*** Delete File: notes/missing.txt\n*** End Patch")
    result = harness.call(ToolCall("apply_patch", {"patch": move}, "c3"))  # an arguments object
    assert result.is_error and result.error is ErrorCode.TOOL_FAILED
    assert result.text == "Failed to delete file notes/missing.txt\n"
    assert _read(harness, "greeting.txt") == b"hello\nyou\n"  # the hunk before the failure stays applied
    assert result.structured == {"applied": False, "added": [], "modified": ["greeting.txt"], "deleted": []}


def test_heredoc_wrappers_are_stripped(harness):
    body = "*** Begin Patch\n*** Add File: a.txt\n+from a heredoc\n*** End Patch"
    result = harness.call(ToolCall("apply_patch", f"<<'EOF'\n{body}\nEOF\n", "h1"))
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nA a.txt\n")
    result = harness.call(ToolCall("apply_patch", f"apply_patch <<'PATCH'\n{body}\nPATCH\n", "h2"))
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nA a.txt\n")
    harness.sandbox().agent.make_dir("sub")
    result = harness.call(ToolCall("apply_patch", f"cd sub && apply_patch <<EOF\n{body}\nEOF", "h3"))
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nA a.txt\n")
    assert _read(harness, "sub/a.txt") == b"from a heredoc\n"


def test_a_malformed_patch_is_an_invalid_arguments_result(harness):
    result = harness.call(ToolCall("apply_patch", "Begin Patch\n*** Add File: x\n+x\n*** End Patch", "m1"))
    assert result.is_error and result.error is ErrorCode.INVALID_ARGUMENTS
    assert result.text == "Invalid patch: The first line of the patch must be '*** Begin Patch'\n"


def test_fuzzy_context_matching_in_the_sandbox(harness):
    agent = harness.sandbox().agent
    agent.write_file("fuzzy.py", "def f():\n    x = 1   \n    return x \u2013 1\n".encode())
    patch = ("*** Begin Patch\n*** Update File: fuzzy.py\n@@ def f():\n x = 1\n-    return x - 1\n"
             "+    return x + 1\n*** End Patch")
    result = harness.call(ToolCall("apply_patch", patch, "f1"))
    assert not result.is_error, result.text
    # Codex writes the patch's version of the context lines it matched leniently.
    assert _read(harness, "fuzzy.py") == b"def f():\nx = 1\n    return x + 1\n"


# ---- path safety: every path goes through the agent's confined resolution ----------------------


def test_paths_outside_the_roots_are_refused_with_a_clear_error(harness):
    box = harness.sandbox()
    setup = run(box, "ln -s /etc /workspace/etc-link && echo original > /tmp/inside.txt", cwd=WORKSPACE)
    assert setup.exit_code == 0, setup.stderr.data()
    hostname_before = run(box, ["cat", "/etc/hostname"]).stdout.data()
    cases = {
        "../escape.txt": "*** Add File: ../escape.txt\n+x",
        "/etc/callbox-x": "*** Add File: /etc/callbox-x\n+x",
        "etc-link/callbox-y": "*** Add File: etc-link/callbox-y\n+x",
        "/etc/hostname": "*** Update File: /etc/hostname\n@@\n+x",
        "etc-link/hostname": "*** Delete File: etc-link/hostname",
        "etc-link/passwd": "*** Update File: etc-link/passwd\n*** Move to: stolen.txt\n@@\n+x",
    }
    for index, (path, hunk) in enumerate(cases.items()):
        result = harness.call(ToolCall("apply_patch", f"*** Begin Patch\n{hunk}\n*** End Patch", f"p{index}"))
        assert result.is_error and result.error is ErrorCode.TOOL_FAILED, result.text
        assert result.text.startswith("Failed to "), result.text
        assert path in result.text and "outside the allowed roots" in result.text, result.text
    # Nothing was written, removed or copied outside the roots (nor into the workspace).
    check = run(box, "test ! -e /escape.txt && test ! -e /etc/callbox-x && test ! -e /etc/callbox-y "
                     "&& test ! -e /workspace/stolen.txt", cwd=WORKSPACE)
    assert check.exit_code == 0
    assert run(box, ["cat", "/etc/hostname"]).stdout.data() == hostname_before

    inside = "*** Begin Patch\n*** Update File: /tmp/inside.txt\n@@\n-original\n+patched\n*** End Patch"
    result = harness.call(ToolCall("apply_patch", inside, "p-in"))
    assert (result.is_error, result.text) == (False, "Success. Updated the following files:\nM /tmp/inside.txt\n")
    assert _read(harness, "/tmp/inside.txt") == b"patched\n"


def test_io_failures_are_worded_like_codex(harness):
    agent = harness.sandbox().agent
    agent.make_dir("adir")
    agent.write_file("binary.dat", b"\xff\xfe\x00 not utf-8\n")
    agent.write_file("plain", b"a file, not a directory\n")
    agent.write_file("script.sh", b"echo old\n", mode=0o755)
    cases = {
        "*** Update File: adir\n@@\n+x": "Failed to read file to update adir: Is a directory (os error 21)\n",
        "*** Update File: binary.dat\n@@\n+x":
            "Failed to read file to update binary.dat: stream did not contain valid UTF-8\n",
        "*** Update File: plain/x\n@@\n+x": "Failed to read file to update plain/x: Not a directory (os error 20)\n",
        "*** Update File: nowhere/x\n@@\n+x":
            "Failed to read file to update nowhere/x: No such file or directory (os error 2)\n",
        "*** Add File: plain/new.txt\n+x": "Failed to create parent directories for plain/new.txt\n",
        "*** Add File: adir\n+x": "Failed to write file adir\n",
        "*** Delete File: adir": "Failed to delete file adir\n",
    }
    for index, (hunk, message) in enumerate(cases.items()):
        result = harness.call(ToolCall("apply_patch", f"*** Begin Patch\n{hunk}\n*** End Patch", f"io{index}"))
        assert (result.is_error, result.text) == (True, message)
    assert sandbox_tree(agent)["binary.dat"] == b"\xff\xfe\x00 not utf-8\n"

    # An updated file keeps its permission bits (Codex rewrites it in place).
    result = harness.call(ToolCall("apply_patch", "*** Begin Patch\n*** Update File: script.sh\n@@\n-echo old\n"
                                                  "+echo new\n*** End Patch", "io-mode"))
    assert not result.is_error, result.text
    assert agent.stat("script.sh").mode == 0o755
    assert _read(harness, "script.sh") == b"echo new\n"
