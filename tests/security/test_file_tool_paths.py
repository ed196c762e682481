"""Path safety of the file tools, through the real tools and agent.

Every case asks read_file / write_file / list_dir / search for something outside the
allowed roots (/workspace, /tmp, /home/sandbox) and checks two things: the call is refused
with a clear error, and nothing outside the roots was read (no result ever carries one of
the canaries below) or written (the one writable place outside the roots, /dev/shm, and
/etc/passwd are unchanged).

Canaries outside the roots: /etc/passwd (``root:x:0:0``), the agent's entry point
/opt/callbox/agent.py, /proc/self/environ (``LOGNAME=``), and a file the test plants in
/dev/shm, a tmpfs the sandbox user can write but no root covers.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pydantic
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import ToolContext
from harness.core.policy import Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.engine.spec import SandboxSpec
from harness.tools.file_search import LIST_DIR, SEARCH, ListDirArgs, SearchArgs
from harness.tools.files import FILE_TOOLS, READ_FILE, WRITE_FILE, ReadFileArgs, WriteFileArgs
from tests.conftest import IMAGE, RUNTIME
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

SECRET = "CANARY-OUTSIDE-THE-ROOTS-7f3a"
OUTSIDE_MARKERS = ("root:x:0:0", "callbox agent entry point", "LOGNAME=", SECRET)
ESCAPE_TEXT = "outside the sandbox's allowed directories"

# Built inside the workspace by the fixture: symlinks that leave the roots at every depth.
TREE = rf"""
set -e
printf '{SECRET}\n' > /dev/shm/secret-outside
printf 'original\n' > /dev/shm/victim
mkdir -p a/b/c/d sub
printf 'inside\n' > inside.txt
printf 'in tmp\n' > /tmp/in-tmp.txt
ln -s /etc/passwd pw
ln -s /etc etc
ln -s / root-link
ln -s /dev/shm shm
ln -s /dev/shm/secret-outside secret-link
ln -s /proc/self proc-self
ln -s ../../../../.. a/b/c/d/up
ln -s /etc a/b/c/abs
ln -s ../../../../etc a/b/c/rel
ln -s /dev/shm a/b/shm
ln -s chain2 chain1
ln -s chain3 chain2
ln -s /dev/shm/secret-outside chain3
ln -s loop2 loop1
ln -s loop1 loop2
ln -s /tmp/in-tmp.txt tmp-link
ln -s ../inside.txt sub/back
"""

READ_ESCAPES = [
    # ..
    "../etc/passwd", "../../../../../../etc/passwd", "/workspace/../etc/passwd", "sub/../../etc/passwd",
    "./../opt/callbox/agent.py", "/tmp/../etc/passwd", "/home/sandbox/../../etc/passwd", "..",
    # absolute paths outside the roots
    "/etc/passwd", "/opt/callbox/agent.py", "/proc/self/environ", "/proc/1/environ", "/dev/shm/secret-outside",
    "/run/callbox/agent.sock", "/", "/etc",
    # sibling prefixes of the roots (they do not exist: refused lexically, not as "not found")
    "/workspace-x/inside.txt", "/workspacex", "/tmpx/in-tmp.txt", "/home/sandbox-x/a", "/home/sandboxx",
    # symlinks that leave the roots, at every depth
    "pw", "etc/passwd", "root-link/etc/passwd", "shm/secret-outside", "secret-link", "proc-self/environ",
    "a/b/c/d/up/etc/passwd", "a/b/c/abs/passwd", "a/b/c/rel/passwd", "a/b/shm/secret-outside", "chain1",
]
LIST_ESCAPES = ["..", "/", "/etc", "/proc/self", "/dev/shm", "etc", "root-link", "shm", "a/b/c/abs", "a/b/c/rel",
                "a/b/c/d/up", "a/b/shm", "/workspace-x", "proc-self"]
WRITE_ESCAPES = ["../escape.txt", "/dev/shm/written", "/workspace/../dev/shm/written", "shm/written",
                 "a/b/shm/written", "a/b/c/d/up/dev/shm/written", "secret-link", "chain1", "pw", "etc/evil",
                 "/etc/evil", "/opt/callbox/evil.py", "/workspace-x/new.txt", "shm/new-dir/written"]


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _ctx(box: Any) -> ToolContext:
    return ToolContext(run_id="path-safety", call_id="c1", provider=_Provider(box), default_timeout_s=30.0,
                       timeout_ceiling_s=60.0, output_budget=30_000)


def _sh(box: Any, script: str, **options: Any) -> str:
    result = run(box, script, **options)
    assert result.exit_code == 0, result.stderr.data()
    return result.stdout.data().decode()


def outside_state(box: Any) -> str:
    """Everything writable outside the roots, and /etc/passwd, as one comparable string."""
    return _sh(box, "cd /dev/shm && ls -la --time-style=+%s . && for f in *; do [ ! -f \"$f\" ] || cat \"$f\"; done && "
                    "md5sum /etc/passwd && { [ ! -d /dev/mqueue ] || ls -A /dev/mqueue; }")  # gVisor has no /dev/mqueue


def assert_clean(text: str) -> None:
    for marker in OUTSIDE_MARKERS:
        assert marker not in text, f"outside content leaked: {marker!r} in {text[:300]!r}"


def assert_escape(out: Any, path: str) -> None:
    assert out.is_error, (path, out.text)
    assert out.error == ErrorCode.TOOL_FAILED
    assert out.structured["reason"] == "PATH_ESCAPE", (path, out.text)
    assert ESCAPE_TEXT in out.text
    assert_clean(out.text)


@pytest.fixture(scope="module")
def box(engine):  # type: ignore[no-untyped-def]
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    _sh(sandbox, TREE)
    yield sandbox
    sandbox.destroy()


@pytest.fixture
def unchanged_outside(box):  # type: ignore[no-untyped-def]
    before = outside_state(box)
    yield
    assert outside_state(box) == before


@pytest.mark.parametrize("path", READ_ESCAPES)
def test_read_file_refuses_escapes(box, unchanged_outside, path):
    out = READ_FILE.handler(_ctx(box), ReadFileArgs(path=path))
    assert_escape(out, path)
    assert out.text.startswith(f"path {path} is outside the sandbox's allowed directories.")


@pytest.mark.parametrize("path", LIST_ESCAPES)
def test_list_dir_refuses_escapes(box, unchanged_outside, path):
    assert_escape(LIST_DIR.handler(_ctx(box), ListDirArgs(path=path, depth=2, include_hidden=True)), path)


@pytest.mark.parametrize("path", [*LIST_ESCAPES, "pw", "secret-link", "chain1"])
def test_search_refuses_escaping_roots(box, unchanged_outside, path):
    out = SEARCH.handler(_ctx(box), SearchArgs(pattern="root|CANARY|LOGNAME|agent", path=path))
    assert_escape(out, path)


@pytest.mark.parametrize("path", WRITE_ESCAPES)
def test_write_file_refuses_escapes_and_writes_nothing_outside(box, unchanged_outside, path):
    out = WRITE_FILE.handler(_ctx(box), WriteFileArgs(path=path, content="PWNED\n"))
    assert out.is_error and out.structured["reason"] in ("PATH_ESCAPE", "PERMISSION_DENIED"), (path, out.text)
    if out.structured["reason"] == "PATH_ESCAPE":
        assert ESCAPE_TEXT in out.text


def test_dotdot_and_links_that_stay_inside_are_allowed(box):
    """The confinement is not a blanket ban: .. and symlinks within the roots work."""
    read = READ_FILE.handler
    assert read(_ctx(box), ReadFileArgs(path="sub/../inside.txt")).text == "inside\n"
    assert read(_ctx(box), ReadFileArgs(path="sub/back")).text == "inside\n"
    assert read(_ctx(box), ReadFileArgs(path="tmp-link")).text == "in tmp\n"  # into another root
    assert read(_ctx(box), ReadFileArgs(path="/home/sandbox/../sandbox/../../workspace/inside.txt")).text \
        == "inside\n"


def test_symlink_loops_are_refused(box):
    out = READ_FILE.handler(_ctx(box), ReadFileArgs(path="loop1"))
    assert out.is_error and "too many levels of symbolic links" in out.text


def test_listing_and_searching_a_tree_never_go_through_links(box, unchanged_outside):
    listing = LIST_DIR.handler(_ctx(box), ListDirArgs(path=".", depth=5, include_hidden=True))
    lines = listing.text.split("\n")
    assert "a/b/c/abs -> /etc" in lines and "root-link -> /" in lines and "shm -> /dev/shm" in lines
    entries = [line for line in lines if " -> " not in line]  # what is not a symlink itself
    assert not {"passwd", "shadow", "secret-outside", "agent.py", "environ"} & {e.rsplit("/", 1)[-1] for e in entries}
    assert all(not line.startswith(("etc/", "root-link/", "shm/", "a/b/c/abs/", "a/b/shm/")) for line in lines)
    found = SEARCH.handler(_ctx(box), SearchArgs(pattern="root:x|CANARY|LOGNAME|entry point", path="."))
    assert found.text == "No matches found."


def test_sibling_prefix_of_a_root_is_not_inside_it(make_sandbox):
    """A root named /et: /etc shares its prefix, so a string-prefix check would let it through.

    The image's root filesystem is read-only, so a directory like /workspace-x cannot be made
    next to /workspace; instead the sandbox's workdir (a root) is /et, and /etc/passwd and
    the agent's /opt/callbox (next to a root /opt/call) are the real, existing siblings.
    """
    box = make_sandbox(workdir="/et")
    _sh(box, "ln -s /etc/passwd /et/pw; ln -s /etc /et/etc-link; ln -s /dev/shm /et/shm; "
             "printf 'mine\\n' > /et/mine.txt")
    before = outside_state(box)
    ctx = _ctx(box)
    assert READ_FILE.handler(ctx, ReadFileArgs(path="mine.txt")).text == "mine\n"
    for path in ("/etc/passwd", "/et/../etc/passwd", "/etc", "pw", "etc-link/passwd", "/etc/./passwd",
                 "/et/c/../../etc/passwd"):
        assert_escape(READ_FILE.handler(ctx, ReadFileArgs(path=path)), path)
    for path in ("/etc", "etc-link"):
        assert_escape(LIST_DIR.handler(ctx, ListDirArgs(path=path)), path)
        assert_escape(SEARCH.handler(ctx, SearchArgs(pattern="root", path=path)), path)
    for path in ("/etc/evil", "shm/evil", "/et/../dev/shm/evil"):
        assert_escape(WRITE_FILE.handler(ctx, WriteFileArgs(path=path, content="x")), path)
    assert outside_state(box) == before

    other = make_sandbox(workdir="/opt/call")  # /opt/callbox/agent.py is a sibling-prefixed path
    for path in ("/opt/callbox/agent.py", "/opt/call/../callbox/agent.py", "/opt/callbox"):
        assert_escape(READ_FILE.handler(_ctx(other), ReadFileArgs(path=path)), path)


# ---- NUL bytes and over-long paths -------------------------------------------------------------


NUL_PATHS = ["a\x00b", "inside.txt\x00/../../etc/passwd", "/etc/passwd\x00", "\x00"]


@pytest.mark.parametrize("path", NUL_PATHS)
def test_nul_bytes_are_refused_by_the_agent(box, unchanged_outside, path):
    for out in (
        READ_FILE.handler(_ctx(box), ReadFileArgs(path=path)),
        WRITE_FILE.handler(_ctx(box), WriteFileArgs(path=path, content="x")),
        LIST_DIR.handler(_ctx(box), ListDirArgs(path=path)),
        SEARCH.handler(_ctx(box), SearchArgs(pattern="x", path=path)),
    ):
        assert out.is_error and out.structured["reason"] == "INVALID_ARGUMENT", out.text
        assert out.text.startswith("invalid path ") and "NUL character" in out.text
        assert "\x00" not in out.text
        assert_clean(out.text)


def test_nul_bytes_never_reach_the_sandbox_through_the_harness(engine, tmp_path):
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry(list(FILE_TOOLS)), Policy(), audit, spec=SandboxSpec(image=IMAGE, runtime=RUNTIME),
        engine_factory=lambda: engine
    ) as harness:
        for index, path in enumerate(NUL_PATHS):
            result = harness.call(ToolCall("read_file", {"path": path}, f"c{index}"))
            assert result.error == ErrorCode.INVALID_ARGUMENTS and "NUL" in result.text
        written = harness.call(ToolCall("write_file", {"path": "../x\u0000", "content": "x"}, "w1"))
        assert written.error == ErrorCode.INVALID_ARGUMENTS
        assert harness._sandbox is None  # refused before any sandbox (or any I/O) existed


LONG_PATHS = ["a/" * 2100 + "f", "/workspace/" + "x" * 5000, "x" * 256, "sub/" + "y" * 300 + "/z", "../" * 1400]


@pytest.mark.parametrize("path", LONG_PATHS, ids=["deep", "long-abs", "name-256", "mid-300", "dotdots"])
def test_over_long_paths_are_refused_readably(box, unchanged_outside, path):
    inside_before = _sh(box, "find /workspace /tmp /home/sandbox | sort")
    for out in (
        READ_FILE.handler(_ctx(box), ReadFileArgs(path=path)),
        WRITE_FILE.handler(_ctx(box), WriteFileArgs(path=path, content="x")),
        LIST_DIR.handler(_ctx(box), ListDirArgs(path=path)),
        SEARCH.handler(_ctx(box), SearchArgs(pattern="x", path=path)),
    ):
        assert out.is_error
        assert out.structured["reason"] in ("INVALID_ARGUMENT", "PATH_ESCAPE", "NOT_FOUND"), out.text
        if len(path) > 4096 or "x" * 256 in path or "y" * 300 in path:
            assert out.structured["reason"] == "INVALID_ARGUMENT", out.text
            assert "too long" in out.text or "longer than 4096" in out.text
        assert len(out.text) < 700  # the path is shortened in the message
    assert _sh(box, "find /workspace /tmp /home/sandbox | sort") == inside_before  # nothing was created


# ---- a final component swapped for a symlink while the calls run -------------------------------

SWAPPER = r"""
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
RENAME_EXCHANGE = 2
exchange = True
os.chdir("/workspace/race")
end = time.time() + float(sys.argv[1])
swaps = 0
while time.time() < end:
    # the final component: a regular file <-> a symlink to a file outside the roots
    os.symlink(sys.argv[2], "l.tmp"); os.rename("l.tmp", "target")
    with open("f.tmp", "w") as f:
        f.write("safe\n")
    os.rename("f.tmp", "target")
    # a directory component: a real directory <-> a symlink to /dev/shm, swapped atomically.
    # gVisor has no RENAME_EXCHANGE (EINVAL): there "dir" becomes a symlink, atomically
    # replaced by one to the real directory (moved to "realdir") or to /dev/shm in turn
    if exchange and libc.renameat2(-100, b"dir", -100, b"dirlink", RENAME_EXCHANGE) != 0:
        if ctypes.get_errno() != errno.EINVAL:
            raise OSError(ctypes.get_errno(), "renameat2")
        exchange = False  # (on the first swap: a kernel has RENAME_EXCHANGE or not)
        os.rename("dir", "realdir")
        os.symlink("realdir", "dir")
    if not exchange:
        os.symlink("/dev/shm" if swaps % 2 else "realdir", "d.tmp"); os.rename("d.tmp", "dir")
    swaps += 1
print(swaps)
"""


def _race(box: Any, seconds: float, outside_target: str, calls: Any) -> tuple[Counter[str], int]:
    _sh(box, "rm -rf race && mkdir -p race/dir && printf 'safe\\n' > race/target && "
             "printf 'safe\\n' > race/dir/secret-outside && printf 'safe\\n' > race/dir/victim && "
             "ln -s /dev/shm race/dirlink")
    swaps: list[int] = []
    done = threading.Event()

    def swapper() -> None:
        result = run(box, ["python3", "-c", SWAPPER, str(seconds), outside_target],
                     timeout_ms=int(seconds * 1000) + 20_000)
        swaps.append(int(result.stdout.data() or b"0"))
        done.set()

    thread = threading.Thread(target=swapper)
    thread.start()
    outcomes: Counter[str] = Counter()
    time.sleep(0.3)
    while not done.is_set():
        calls(outcomes)
    thread.join()
    return outcomes, swaps[0]


def test_reads_racing_a_symlink_swap_never_leave_the_roots(box, unchanged_outside):
    def calls(outcomes: Counter[str]) -> None:
        for path in ("race/target", "race/dir/secret-outside"):
            out = READ_FILE.handler(_ctx(box), ReadFileArgs(path=path))
            assert_clean(out.text)
            if out.is_error:
                outcomes[out.structured["reason"]] += 1
            else:
                assert out.text == "safe\n", out.text
                outcomes["read"] += 1
        listing = LIST_DIR.handler(_ctx(box), ListDirArgs(path="race/dir"))
        assert_clean(listing.text)
        if not listing.is_error:
            assert listing.text == "secret-outside\nvictim", listing.text
    outcomes, swaps = _race(box, 3.0, "/dev/shm/secret-outside", calls)
    assert swaps > 100
    assert outcomes["read"] > 0 and outcomes["PATH_ESCAPE"] > 0, outcomes  # both sides of the race were hit
    assert set(outcomes) <= {"read", "PATH_ESCAPE", "NOT_FOUND"}, outcomes


def test_writes_racing_a_symlink_swap_never_write_outside(box, unchanged_outside):
    def calls(outcomes: Counter[str]) -> None:
        for path in ("race/target", "race/dir/victim"):
            out = WRITE_FILE.handler(_ctx(box), WriteFileArgs(path=path, content="PWNED\n"))
            outcomes[out.structured["reason"] if out.is_error else "written"] += 1
    outcomes, swaps = _race(box, 3.0, "/dev/shm/victim", calls)
    assert swaps > 100
    assert outcomes["written"] > 0 and outcomes["PATH_ESCAPE"] > 0, outcomes
    # unchanged_outside: /dev/shm/victim still says "original", no new file (or temp file) in /dev/shm


# ---- property: random paths never read outside the roots ---------------------------------------

TOKENS = ["..", ".", "", "etc", "passwd", "pw", "shm", "secret-outside", "secret-link", "root-link", "proc-self",
          "environ", "a", "b", "c", "d", "up", "abs", "rel", "chain1", "loop1", "sub", "back", "inside.txt",
          "workspace", "workspace-x", "tmp", "tmp-link", "in-tmp.txt", "home", "sandbox", "dev", "proc", "self",
          "opt", "callbox", "agent.py", "1", "root"]
INSIDE_CONTENTS = {"inside\n", "in tmp\n"}

paths = st.one_of(
    st.builds(lambda absolute, parts: ("/" if absolute else "") + "/".join(parts),
              st.booleans(), st.lists(st.sampled_from(TOKENS), min_size=1, max_size=9)),
    st.text(min_size=1, max_size=40),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=paths)
def test_random_paths_never_read_outside_the_roots(box, path):
    try:
        read_args, list_args = ReadFileArgs(path=path), ListDirArgs(path=path)
    except pydantic.ValidationError:
        assume(False)
        return
    out = READ_FILE.handler(_ctx(box), read_args)
    assert_clean(out.text)
    assert out.error in (None, ErrorCode.TOOL_FAILED), out.text  # never INTERNAL, never a crash
    if not out.is_error:
        assert out.text in INSIDE_CONTENTS, (path, out.text)
    listing = LIST_DIR.handler(_ctx(box), list_args)
    assert_clean(listing.text)
    assert listing.error in (None, ErrorCode.TOOL_FAILED), listing.text
    if not listing.is_error:
        assert not {"passwd", "shadow", "agent.py", "environ"} & set(listing.text.split("\n")), (path, listing.text)
