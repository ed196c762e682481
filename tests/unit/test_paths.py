"""Confined path resolution against a real directory tree (no mocks)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandbox.errors import AgentError
from sandbox.paths import MAX_SYMLINK_HOPS, Resolved, Resolver
from sandbox.v1 import errors_pb2

ESCAPE = errors_pb2.ERROR_REASON_PATH_ESCAPE
INVALID = errors_pb2.ERROR_REASON_INVALID_ARGUMENT
NOT_FOUND = errors_pb2.ERROR_REASON_NOT_FOUND
WRONG_TYPE = errors_pb2.ERROR_REASON_WRONG_TYPE


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """tmp/ws (root + workspace), tmp/other (root), tmp/outside (not a root)."""
    for name in ("ws/sub", "other", "outside"):
        (tmp_path / name).mkdir(parents=True)
    (tmp_path / "ws/sub/real.txt").write_text("real")
    (tmp_path / "ws/top.txt").write_text("top")
    (tmp_path / "other/o.txt").write_text("other")
    (tmp_path / "outside/secret.txt").write_text("secret")
    return tmp_path


@pytest.fixture
def resolver(tree: Path) -> Iterator[Resolver]:
    r = Resolver([str(tree / "ws"), str(tree / "other")], str(tree / "ws"))
    yield r
    r.close()


def reason_of(resolver: Resolver, path: str, **kwargs: bool) -> int:
    kwargs.setdefault("follow_final", True)
    with pytest.raises(AgentError) as info:
        resolver.resolve(path, **kwargs).close()
    return info.value.reason


def read_via(res: Resolved) -> str:
    fd = os.open(res.name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=res.dir_fd)
    try:
        return os.read(fd, 100).decode()
    finally:
        os.close(fd)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# --- legitimate paths ---------------------------------------------------------------------------


def test_relative_path_starts_at_workspace(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve("sub/real.txt", follow_final=True) as res:
        assert res.name == "real.txt"
        assert res.path == str(tree / "ws/sub/real.txt")
        assert res.root == str(tree / "ws")
        assert res.display == "sub/real.txt"
        assert not res.is_root
        assert read_via(res) == "real"


def test_absolute_path_in_second_root(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve(str(tree / "other/o.txt"), follow_final=False) as res:
        assert res.root == str(tree / "other")
        assert read_via(res) == "other"


def test_lexical_dotdot_inside_root_is_fine(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve("sub/../sub/./real.txt", follow_final=True) as res:
        assert res.path == str(tree / "ws/sub/real.txt")


def test_root_itself(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve(str(tree / "ws") + "/", follow_final=True) as res:
        assert res.is_root
        assert res.name == "."
    with resolver.resolve(".", follow_final=False) as res:
        assert res.is_root


def test_leading_double_slash_is_folded(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve("/" + str(tree / "ws/top.txt"), follow_final=True) as res:
        assert read_via(res) == "top"


def test_symlink_inside_root_is_followed(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/link").symlink_to("sub/real.txt")
    with resolver.resolve("link", follow_final=True) as res:
        assert res.path == str(tree / "ws/sub/real.txt")
        assert read_via(res) == "real"
    with resolver.resolve("link", follow_final=False) as res:
        assert res.name == "link"
        assert os.readlink(res.name, dir_fd=res.dir_fd) == "sub/real.txt"


def test_relative_symlink_with_dotdot_staying_inside(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sub/up").symlink_to("../top.txt")
    with resolver.resolve("sub/up", follow_final=True) as res:
        assert res.path == str(tree / "ws/top.txt")
        assert read_via(res) == "top"


def test_symlink_ending_in_dotdot_names_the_directory(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sub/deeper").mkdir()
    (tree / "ws/sub/back").symlink_to("deeper/..")
    with resolver.resolve("sub/back", follow_final=True) as res:
        assert res.path == str(tree / "ws/sub")
        assert res.name == "sub"


def test_absolute_symlink_into_another_root(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/to_other").symlink_to(tree / "other")
    with resolver.resolve("to_other/o.txt", follow_final=True) as res:
        assert res.root == str(tree / "other")
        assert read_via(res) == "other"


def test_longest_root_wins(tree: Path) -> None:
    (tree / "ws/mnt").mkdir()
    r = Resolver([str(tree / "ws"), str(tree / "ws/mnt")], str(tree / "ws"))
    try:
        with r.resolve("mnt/x", follow_final=False) as res:
            assert res.root == str(tree / "ws/mnt")
        assert r.roots_under(str(tree / "ws")) == [str(tree / "ws/mnt")]
        # '..' from a symlink may not climb out of the inner root, even into the outer one.
        (tree / "ws/mnt/up").symlink_to("../top.txt")
        assert reason_of(r, "mnt/up") == ESCAPE
    finally:
        r.close()


def test_make_parents_creates_directories(resolver: Resolver, tree: Path) -> None:
    with resolver.resolve("new/a/b/file.txt", follow_final=True, make_parents=True) as res:
        assert res.name == "file.txt"
    assert (tree / "ws/new/a/b").is_dir()
    assert (tree / "ws/new/a").stat().st_mode & 0o777 == 0o755 & ~_umask()


def _umask() -> int:
    old = os.umask(0)
    os.umask(old)
    return old


# --- refusals -----------------------------------------------------------------------------------


def test_empty_and_nul_paths_are_invalid(resolver: Resolver) -> None:
    assert reason_of(resolver, "") == INVALID
    assert reason_of(resolver, "top.txt\x00/etc/passwd") == INVALID
    assert reason_of(resolver, "a" * 5000) == INVALID


def test_dotdot_escape_names_the_roots(resolver: Resolver, tree: Path) -> None:
    with pytest.raises(AgentError) as info:
        resolver.resolve("../../etc/passwd", follow_final=True)
    assert info.value.reason == ESCAPE
    assert str(tree / "ws") in info.value.message
    assert "../../etc/passwd" in info.value.message


def test_absolute_path_outside_roots(resolver: Resolver, tree: Path) -> None:
    assert reason_of(resolver, "/etc/passwd") == ESCAPE
    assert reason_of(resolver, str(tree / "outside/secret.txt")) == ESCAPE
    assert reason_of(resolver, str(tree / "ws") + "x/file") == ESCAPE  # a sibling with a common prefix


def test_absolute_symlink_to_etc(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/etc").symlink_to("/etc")
    assert reason_of(resolver, "etc/passwd") == ESCAPE
    assert reason_of(resolver, "etc") == ESCAPE
    with resolver.resolve("etc", follow_final=False) as res:  # the link itself is inside
        assert res.name == "etc"


def test_absolute_symlink_with_dotdot_out_of_root(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sneaky").symlink_to(str(tree / "ws") + "/../outside/secret.txt")
    assert reason_of(resolver, "sneaky") == ESCAPE


def test_relative_symlink_chain_that_climbs_out(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sub/l1").symlink_to("../l2")
    (tree / "ws/l2").symlink_to("../outside")
    assert reason_of(resolver, "sub/l1/secret.txt") == ESCAPE
    assert reason_of(resolver, "sub/l1") == ESCAPE


def test_symlinked_directory_in_the_middle_pointing_outside(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sub/mid").symlink_to(tree / "outside")
    assert reason_of(resolver, "sub/mid/secret.txt", follow_final=False) == ESCAPE
    assert reason_of(resolver, "sub/mid/new/file", follow_final=False, make_parents=True) == ESCAPE
    assert not (tree / "outside/new").exists()


def test_dangling_symlink_to_outside_file(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/dangling").symlink_to(tree / "outside/created.txt")
    assert reason_of(resolver, "dangling") == ESCAPE


def test_symlink_loop(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/loop1").symlink_to("loop2")
    (tree / "ws/loop2").symlink_to("loop1")
    with pytest.raises(AgentError) as info:
        resolver.resolve("loop1/x", follow_final=True)
    assert info.value.reason == INVALID
    assert str(MAX_SYMLINK_HOPS) in info.value.message
    assert reason_of(resolver, "loop1") == INVALID


def test_self_referencing_directory_symlink(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/self").symlink_to(".")
    with resolver.resolve("self/self/self/top.txt", follow_final=True) as res:
        assert read_via(res) == "top"
    deep = "/".join(["self"] * (MAX_SYMLINK_HOPS + 1)) + "/top.txt"
    assert reason_of(resolver, deep) == INVALID


def test_missing_parent_and_file_component(resolver: Resolver) -> None:
    assert reason_of(resolver, "nope/file.txt") == NOT_FOUND
    assert reason_of(resolver, "top.txt/file") == WRONG_TYPE
    with resolver.resolve("nope.txt", follow_final=True) as res:  # a missing final name is fine
        assert res.name == "nope.txt"


def test_constructor_validation(tree: Path) -> None:
    with pytest.raises(ValueError, match="not inside any root"):
        Resolver([str(tree / "ws")], str(tree / "outside"))
    with pytest.raises(ValueError, match="absolute"):
        Resolver(["relative/root"], "/")
    with pytest.raises(ValueError, match="cannot be opened"):
        Resolver([str(tree / "missing")], str(tree / "missing"))


def test_no_fd_leaks(resolver: Resolver, tree: Path) -> None:
    (tree / "ws/sub/l1").symlink_to("../l2")
    (tree / "ws/l2").symlink_to("../outside")
    (tree / "ws/to_other").symlink_to(tree / "other")
    before = open_fds()
    for _ in range(20):
        for path in ("sub/l1/secret.txt", "sub/real.txt", "to_other/o.txt", "nope/x", "top.txt/x", "."):
            with contextlib.suppress(AgentError):
                resolver.resolve(path, follow_final=True).close()
    assert open_fds() == before


def test_concurrent_directory_symlink_swap_never_escapes(resolver: Resolver, tree: Path) -> None:
    """An attacker keeps swapping ws/d (a real directory) with a symlink to outside/."""
    ws, outside = tree / "ws", tree / "outside"
    (ws / "d").mkdir()
    (ws / "d/secret.txt").write_text("inside")
    (ws / "lnk").symlink_to(outside)
    libc = ctypes.CDLL(None, use_errno=True)
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():  # renameat2(RENAME_EXCHANGE): neither name is ever missing
            assert libc.renameat2(-100, os.fsencode(ws / "d"), -100, os.fsencode(ws / "lnk"), 2) == 0
            time.sleep(0.0001)

    thread = threading.Thread(target=attacker)
    thread.start()
    outcomes = {"resolved": 0, "refused": 0}
    deadline = time.monotonic() + 5
    try:
        while time.monotonic() < deadline and min(outcomes.values()) < 50:
            try:
                with resolver.resolve("d/secret.txt", follow_final=True) as res:
                    assert res.path.startswith(str(ws) + "/")
                    assert os.fstat(res.dir_fd).st_ino != os.stat(outside).st_ino
                    outcomes["resolved"] += 1
            except AgentError as exc:
                assert exc.reason in (ESCAPE, NOT_FOUND)
                outcomes["refused"] += 1
    finally:
        stop.set()
        thread.join()
    assert outcomes["resolved"] > 0
    assert outcomes["refused"] > 0
