"""The Filesystem service through a real in-process gRPC server on a unix socket.

Everything runs against real temporary directories; errors are asserted as a client sees them
(status code plus the ErrorDetail in the ``callbox-error-bin`` trailing metadata).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from sandbox.errors import DETAIL_METADATA_KEY, AgentError
from sandbox.fs import MAX_READ_BYTES, FilesystemService
from sandbox.identity import FsIdentity, current_fsgid, current_fsuid
from sandbox.v1 import errors_pb2, filesystem_pb2_grpc
from sandbox.v1 import filesystem_pb2 as pb

ESCAPE = errors_pb2.ERROR_REASON_PATH_ESCAPE
INVALID = errors_pb2.ERROR_REASON_INVALID_ARGUMENT
NOT_FOUND = errors_pb2.ERROR_REASON_NOT_FOUND
WRONG_TYPE = errors_pb2.ERROR_REASON_WRONG_TYPE
DENIED = errors_pb2.ERROR_REASON_PERMISSION_DENIED
EXISTS = errors_pb2.ERROR_REASON_ALREADY_EXISTS
TOO_LARGE = errors_pb2.ERROR_REASON_TOO_LARGE
# The status code a client sees for each reason (the contract in proto/sandbox/v1/errors.proto).
STATUS = {
    ESCAPE: grpc.StatusCode.PERMISSION_DENIED,
    INVALID: grpc.StatusCode.INVALID_ARGUMENT,
    NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    WRONG_TYPE: grpc.StatusCode.FAILED_PRECONDITION,
    DENIED: grpc.StatusCode.PERMISSION_DENIED,
    EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    TOO_LARGE: grpc.StatusCode.OUT_OF_RANGE,
}
IS_ROOT = os.geteuid() == 0
TOOL_UID = TOOL_GID = 1000
LIBC = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
RENAME_EXCHANGE = 2

StubFactory = Callable[..., filesystem_pb2_grpc.FilesystemStub]


@pytest.fixture
def serve() -> Iterator[StubFactory]:
    """Start a FilesystemService on a unix socket and return a stub for it."""
    cleanups: list[Callable[[], None]] = []

    def start(
        roots: Sequence[Path], workspace: Path, identity: FsIdentity | None = None
    ) -> filesystem_pb2_grpc.FilesystemStub:
        service = FilesystemService([str(r) for r in roots], str(workspace), identity)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        filesystem_pb2_grpc.add_FilesystemServicer_to_server(service, server)
        sock_dir = tempfile.mkdtemp(prefix="cbx-")  # short: unix socket paths are limited
        address = f"unix:{sock_dir}/fs.sock"
        server.add_insecure_port(address)
        server.start()
        channel = grpc.insecure_channel(address, options=[("grpc.max_receive_message_length", 64 << 20)])
        cleanups.extend(
            [channel.close, lambda: server.stop(None), service.close, lambda: shutil.rmtree(sock_dir)]
        )
        return filesystem_pb2_grpc.FilesystemStub(channel)

    yield start
    for cleanup in cleanups:
        cleanup()


@dataclass
class Box:
    ws: Path
    other: Path
    outside: Path
    stub: filesystem_pb2_grpc.FilesystemStub

    def outside_listing(self) -> list[str]:
        return sorted(str(p.relative_to(self.outside)) for p in self.outside.rglob("*"))


@pytest.fixture
def box(tmp_path: Path, serve: StubFactory) -> Box:
    """ws (root and workspace) and other (root) are allowed; outside is not."""
    ws, other, outside = tmp_path / "ws", tmp_path / "other", tmp_path / "outside"
    for d in (ws / "sub", other, outside):
        d.mkdir(parents=True)
    (ws / "hello.txt").write_text("hello world")
    (ws / "sub/inner.txt").write_text("inner")
    (outside / "secret.txt").write_text("secret")
    return Box(ws, other, outside, serve([ws, other], ws))


def detail_of(exc: grpc.RpcError) -> errors_pb2.ErrorDetail:
    for key, value in exc.trailing_metadata() or ():
        if key == DETAIL_METADATA_KEY:
            return errors_pb2.ErrorDetail.FromString(value)
    raise AssertionError(f"no {DETAIL_METADATA_KEY} in the trailing metadata")


def fails(call: Any, request: Any, reason: errors_pb2.ErrorReason.ValueType) -> errors_pb2.ErrorDetail:
    """Call the RPC, expect it to fail with ``reason`` (and its status code); return the detail."""
    with pytest.raises(grpc.RpcError) as info:
        call(request, timeout=10)
    assert info.value.code() == STATUS[reason], info.value.details()
    detail = detail_of(info.value)
    assert detail.reason == reason, detail.message
    assert detail.message == info.value.details()
    assert "Traceback" not in detail.message
    return detail


# --- Read ---------------------------------------------------------------------------------------


def test_read_relative_path_from_workspace(box: Box) -> None:
    resp = box.stub.Read(pb.ReadRequest(path="hello.txt"))
    assert resp.data == b"hello world"
    assert resp.size == 11
    assert not resp.truncated


def test_read_absolute_path_and_other_root(box: Box) -> None:
    (box.other / "o.txt").write_bytes(b"o")
    assert box.stub.Read(pb.ReadRequest(path=str(box.ws / "sub/inner.txt"))).data == b"inner"
    assert box.stub.Read(pb.ReadRequest(path=str(box.other / "o.txt"))).data == b"o"


def test_read_offset_and_limit(box: Box) -> None:
    resp = box.stub.Read(pb.ReadRequest(path="hello.txt", offset=6, limit=3))
    assert (resp.data, resp.size, resp.truncated) == (b"wor", 11, True)
    resp = box.stub.Read(pb.ReadRequest(path="hello.txt", offset=6))
    assert (resp.data, resp.truncated) == (b"world", False)
    resp = box.stub.Read(pb.ReadRequest(path="hello.txt", offset=100))
    assert (resp.data, resp.size, resp.truncated) == (b"", 11, False)


def test_read_large_file_is_truncated_at_default_limit(box: Box) -> None:
    with open(box.ws / "big.bin", "wb") as f:
        f.truncate(MAX_READ_BYTES + 5)
    resp = box.stub.Read(pb.ReadRequest(path="big.bin"))
    assert len(resp.data) == MAX_READ_BYTES
    assert resp.size == MAX_READ_BYTES + 5
    assert resp.truncated


def test_read_limit_over_maximum_is_too_large(box: Box) -> None:
    fails(box.stub.Read, pb.ReadRequest(path="hello.txt", limit=MAX_READ_BYTES + 1), TOO_LARGE)


def test_read_follows_symlink_inside_root(box: Box) -> None:
    (box.ws / "link").symlink_to("sub/inner.txt")
    (box.ws / "to_other").symlink_to(box.other)
    (box.other / "o.txt").write_bytes(b"o")
    assert box.stub.Read(pb.ReadRequest(path="link")).data == b"inner"
    assert box.stub.Read(pb.ReadRequest(path="to_other/o.txt")).data == b"o"


def test_read_directory_is_wrong_type(box: Box) -> None:
    fails(box.stub.Read, pb.ReadRequest(path="sub"), WRONG_TYPE)


def test_read_missing_is_not_found(box: Box) -> None:
    detail = fails(box.stub.Read, pb.ReadRequest(path="nope.txt"), NOT_FOUND)
    assert "nope.txt" in detail.message
    fails(box.stub.Read, pb.ReadRequest(path="nodir/x"), NOT_FOUND)


def test_read_fifo_is_refused_without_hanging(box: Box) -> None:
    os.mkfifo(box.ws / "pipe")
    fails(box.stub.Read, pb.ReadRequest(path="pipe"), WRONG_TYPE)


def test_read_dotdot_escape(box: Box) -> None:
    detail = fails(box.stub.Read, pb.ReadRequest(path="../../etc/passwd"), ESCAPE)
    assert "../../etc/passwd" in detail.message
    assert str(box.ws) in detail.message  # names the allowed roots
    fails(box.stub.Read, pb.ReadRequest(path="../outside/secret.txt"), ESCAPE)


def test_read_absolute_symlink_to_etc(box: Box) -> None:
    (box.ws / "etc").symlink_to("/etc")
    (box.ws / "passwd").symlink_to("/etc/passwd")
    for path in ("etc/passwd", "passwd"):
        detail = fails(box.stub.Read, pb.ReadRequest(path=path), ESCAPE)
        assert "root:" not in detail.message


def test_read_relative_symlink_chain_climbing_out(box: Box) -> None:
    (box.ws / "sub/l1").symlink_to("../l2")
    (box.ws / "l2").symlink_to("../outside/secret.txt")
    detail = fails(box.stub.Read, pb.ReadRequest(path="sub/l1"), ESCAPE)
    assert str(box.outside) not in detail.message  # no host path beyond what the client sent


def test_read_symlinked_directory_in_the_middle(box: Box) -> None:
    (box.ws / "sub/mid").symlink_to(box.outside)
    fails(box.stub.Read, pb.ReadRequest(path="sub/mid/secret.txt"), ESCAPE)


def test_read_symlink_loop_and_nul(box: Box) -> None:
    (box.ws / "loop1").symlink_to("loop2")
    (box.ws / "loop2").symlink_to("loop1")
    fails(box.stub.Read, pb.ReadRequest(path="loop1"), INVALID)
    fails(box.stub.Read, pb.ReadRequest(path="hello.txt\x00x"), INVALID)
    fails(box.stub.Read, pb.ReadRequest(path=""), INVALID)


# --- Write --------------------------------------------------------------------------------------


def test_write_new_file_default_mode(box: Box) -> None:
    resp = box.stub.Write(pb.WriteRequest(path="new.txt", data=b"abc"))
    assert resp.bytes_written == 3
    assert (box.ws / "new.txt").read_bytes() == b"abc"
    assert stat.S_IMODE((box.ws / "new.txt").stat().st_mode) == 0o644
    assert not [p for p in os.listdir(box.ws) if p.startswith(".callbox-")]


def test_write_new_file_explicit_mode(box: Box) -> None:
    box.stub.Write(pb.WriteRequest(path="run.sh", data=b"#!/bin/sh\n", mode=0o750))
    assert stat.S_IMODE((box.ws / "run.sh").stat().st_mode) == 0o750
    fails(box.stub.Write, pb.WriteRequest(path="x", mode=0o10000), INVALID)


def test_atomic_replace_keeps_mode(box: Box) -> None:
    script = box.ws / "script.sh"
    script.write_text("old")
    script.chmod(0o755)
    old_inode = script.stat().st_ino
    box.stub.Write(pb.WriteRequest(path="script.sh", data=b"new content"))
    assert script.read_bytes() == b"new content"
    assert stat.S_IMODE(script.stat().st_mode) == 0o755
    assert script.stat().st_ino != old_inode  # replaced by rename, not rewritten in place
    assert not [p for p in os.listdir(box.ws) if p.startswith(".callbox-")]


def test_replace_is_atomic_for_readers(box: Box) -> None:
    target = box.ws / "atomic.txt"
    target.write_bytes(b"A" * 200_000)
    seen: set[bytes] = set()
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            data = target.read_bytes()
            seen.add(data[:1] + data[-1:] + str(len(data)).encode())

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        for i in range(30):
            box.stub.Write(pb.WriteRequest(path="atomic.txt", data=(b"AB"[i % 2 : i % 2 + 1]) * 200_000))
    finally:
        stop.set()
        thread.join()
    assert seen <= {b"AA200000", b"BB200000"}


def test_write_no_overwrite(box: Box) -> None:
    fails(box.stub.Write, pb.WriteRequest(path="hello.txt", data=b"x", no_overwrite=True), EXISTS)
    assert (box.ws / "hello.txt").read_text() == "hello world"
    box.stub.Write(pb.WriteRequest(path="fresh.txt", data=b"x", no_overwrite=True, mode=0o600))
    assert (box.ws / "fresh.txt").read_bytes() == b"x"
    assert stat.S_IMODE((box.ws / "fresh.txt").stat().st_mode) == 0o600
    assert not [p for p in os.listdir(box.ws) if p.startswith(".callbox-")]


def test_write_append(box: Box) -> None:
    assert box.stub.Write(pb.WriteRequest(path="hello.txt", data=b"!!", append=True)).bytes_written == 2
    assert (box.ws / "hello.txt").read_bytes() == b"hello world!!"
    box.stub.Write(pb.WriteRequest(path="log.txt", data=b"1", append=True))
    box.stub.Write(pb.WriteRequest(path="log.txt", data=b"2", append=True))
    assert (box.ws / "log.txt").read_bytes() == b"12"
    assert stat.S_IMODE((box.ws / "log.txt").stat().st_mode) == 0o644


def test_write_make_parents(box: Box) -> None:
    fails(box.stub.Write, pb.WriteRequest(path="a/b/c.txt", data=b"x"), NOT_FOUND)
    assert not (box.ws / "a").exists()
    box.stub.Write(pb.WriteRequest(path="a/b/c.txt", data=b"x", make_parents=True))
    assert (box.ws / "a/b/c.txt").read_bytes() == b"x"
    assert (box.ws / "a/b").is_dir()


def test_write_to_directory_is_wrong_type(box: Box) -> None:
    fails(box.stub.Write, pb.WriteRequest(path="sub", data=b"x"), WRONG_TYPE)
    fails(box.stub.Write, pb.WriteRequest(path=str(box.ws), data=b"x"), WRONG_TYPE)
    assert (box.ws / "sub").is_dir()


def test_write_through_symlink_inside_root_replaces_target(box: Box) -> None:
    (box.ws / "link").symlink_to("sub/inner.txt")
    box.stub.Write(pb.WriteRequest(path="link", data=b"changed"))
    assert (box.ws / "link").is_symlink()
    assert (box.ws / "sub/inner.txt").read_bytes() == b"changed"


def test_write_escapes_create_nothing_outside(box: Box) -> None:
    before = box.outside_listing()
    (box.ws / "abs").symlink_to(box.outside)
    (box.ws / "sub/rel").symlink_to("../../outside")
    (box.ws / "dangling").symlink_to(box.outside / "created.txt")
    (box.ws / "dangling_rel").symlink_to("../outside/created.txt")
    (box.ws / "etc").symlink_to("/etc")
    cases = [
        pb.WriteRequest(path="../outside/pwned.txt", data=b"x"),
        pb.WriteRequest(path=str(box.outside / "pwned.txt"), data=b"x"),
        pb.WriteRequest(path="abs/pwned.txt", data=b"x"),
        pb.WriteRequest(path="abs/new/dir/pwned.txt", data=b"x", make_parents=True),
        pb.WriteRequest(path="sub/rel/pwned.txt", data=b"x"),
        pb.WriteRequest(path="sub/rel/secret.txt", data=b"x"),
        pb.WriteRequest(path="dangling", data=b"x"),
        pb.WriteRequest(path="dangling_rel", data=b"x", append=True),
        pb.WriteRequest(path="etc/callbox-pwned", data=b"x"),
    ]
    for request in cases:
        fails(box.stub.Write, request, ESCAPE)
    assert box.outside_listing() == before
    assert (box.outside / "secret.txt").read_text() == "secret"
    assert not Path("/etc/callbox-pwned").exists()


def test_write_nul_in_path(box: Box) -> None:
    fails(box.stub.Write, pb.WriteRequest(path="a\x00b", data=b"x"), INVALID)
    assert sorted(os.listdir(box.ws)) == ["hello.txt", "sub"]


def exchange(a: Path, b: Path) -> None:
    """Atomically swap two names (renameat2 RENAME_EXCHANGE), so neither is ever missing."""
    if LIBC.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


@pytest.mark.parametrize("make_parents", [False, True])
def test_write_under_concurrent_directory_swap_never_escapes(box: Box, make_parents: bool) -> None:
    """An attacker keeps swapping ws/d (a real directory) with a symlink to outside/."""
    ws = box.ws
    (ws / "d/sub").mkdir(parents=True)
    (ws / "lnk").symlink_to(box.outside)
    stop = threading.Event()

    def attacker() -> None:
        while not stop.is_set():
            exchange(ws / "d", ws / "lnk")
            time.sleep(0.0001)

    thread = threading.Thread(target=attacker)
    thread.start()
    outcomes = {"written": 0, "refused": 0}
    deadline = time.monotonic() + 10
    try:
        i = 0
        while time.monotonic() < deadline and min(outcomes.values()) < 20:
            i += 1
            path = f"d/new{i}/pwned.txt" if make_parents else f"d/sub/pwned{i}.txt"
            request = pb.WriteRequest(path=path, data=b"x", make_parents=make_parents)
            try:
                box.stub.Write(request)
                outcomes["written"] += 1
            except grpc.RpcError as exc:
                assert detail_of(exc).reason in (ESCAPE, NOT_FOUND)
                outcomes["refused"] += 1
    finally:
        stop.set()
        thread.join()
    assert outcomes["written"] > 0
    assert outcomes["refused"] > 0
    assert box.outside_listing() == ["secret.txt"]


# --- List ---------------------------------------------------------------------------------------


@pytest.fixture
def listing_tree(box: Box) -> Box:
    (box.ws / ".hidden").mkdir()
    (box.ws / ".hidden/h.txt").write_text("h")
    (box.ws / ".dotfile").write_text("d")
    (box.ws / "sub/.secret").write_text("s")
    (box.ws / "sub/deep").mkdir()
    (box.ws / "sub/deep/x.txt").write_text("x")
    (box.ws / "b-file").write_text("b")
    (box.ws / "linkdir").symlink_to(box.outside)
    return box


def paths_of(resp: pb.ListResponse) -> list[str]:
    return [e.path for e in resp.entries]


def test_list_depth_one(listing_tree: Box) -> None:
    resp = listing_tree.stub.List(pb.ListRequest(path="."))
    assert paths_of(resp) == ["b-file", "hello.txt", "linkdir", "sub"]
    assert not resp.truncated
    by_path = {e.path: e for e in resp.entries}
    assert by_path["sub"].type == pb.FILE_TYPE_DIRECTORY
    assert by_path["hello.txt"].type == pb.FILE_TYPE_FILE
    assert by_path["hello.txt"].size == 11


def test_list_depth_two_excludes_hidden_and_does_not_follow_symlinks(listing_tree: Box) -> None:
    resp = listing_tree.stub.List(pb.ListRequest(path=str(listing_tree.ws), depth=2))
    assert paths_of(resp) == ["b-file", "hello.txt", "linkdir", "sub", "sub/deep", "sub/inner.txt"]
    link = next(e for e in resp.entries if e.path == "linkdir")
    assert link.type == pb.FILE_TYPE_SYMLINK
    assert link.link_target == str(listing_tree.outside)
    assert not any("secret" in p for p in paths_of(resp))


def test_list_include_hidden_and_deeper(listing_tree: Box) -> None:
    resp = listing_tree.stub.List(pb.ListRequest(path=".", depth=5, include_hidden=True))
    assert paths_of(resp) == [
        ".dotfile",
        ".hidden",
        ".hidden/h.txt",
        "b-file",
        "hello.txt",
        "linkdir",
        "sub",
        "sub/.secret",
        "sub/deep",
        "sub/deep/x.txt",
        "sub/inner.txt",
    ]


def test_list_limit_truncates(listing_tree: Box) -> None:
    resp = listing_tree.stub.List(pb.ListRequest(path=".", depth=3, limit=3))
    assert paths_of(resp) == ["b-file", "hello.txt", "linkdir"]
    assert resp.truncated
    resp = listing_tree.stub.List(pb.ListRequest(path="sub", depth=2, limit=3))
    assert paths_of(resp) == ["deep", "deep/x.txt", "inner.txt"]
    assert not resp.truncated


def test_list_symlink_to_directory_inside_root_is_followed_at_top(listing_tree: Box) -> None:
    (listing_tree.ws / "sublink").symlink_to("sub")
    assert paths_of(listing_tree.stub.List(pb.ListRequest(path="sublink"))) == ["deep", "inner.txt"]


def test_list_refusals(listing_tree: Box) -> None:
    stub = listing_tree.stub
    fails(stub.List, pb.ListRequest(path="hello.txt"), WRONG_TYPE)
    fails(stub.List, pb.ListRequest(path="missing"), NOT_FOUND)
    fails(stub.List, pb.ListRequest(path="linkdir"), ESCAPE)
    fails(stub.List, pb.ListRequest(path=".."), ESCAPE)


def test_list_undecodable_names(box: Box) -> None:
    os.close(os.open(os.fsencode(box.ws / "sub") + b"/bad-\xff.txt", os.O_CREAT | os.O_WRONLY, 0o644))
    assert "bad-\ufffd.txt" in paths_of(box.stub.List(pb.ListRequest(path="sub")))


# --- Stat ---------------------------------------------------------------------------------------


def test_stat_file_and_directory(box: Box) -> None:
    (box.ws / "hello.txt").chmod(0o640)
    info = box.stub.Stat(pb.StatRequest(path="hello.txt")).info
    st = (box.ws / "hello.txt").stat()
    assert (info.path, info.type, info.size, info.mode) == ("hello.txt", pb.FILE_TYPE_FILE, 11, 0o640)
    assert (info.uid, info.gid, info.mtime_ns) == (st.st_uid, st.st_gid, st.st_mtime_ns)
    assert box.stub.Stat(pb.StatRequest(path="sub")).info.type == pb.FILE_TYPE_DIRECTORY
    assert box.stub.Stat(pb.StatRequest(path=str(box.ws))).info.type == pb.FILE_TYPE_DIRECTORY


def test_stat_symlink_is_not_followed(box: Box) -> None:
    (box.ws / "etc").symlink_to("/etc")
    info = box.stub.Stat(pb.StatRequest(path="etc")).info
    assert (info.type, info.link_target) == (pb.FILE_TYPE_SYMLINK, "/etc")
    fails(box.stub.Stat, pb.StatRequest(path="etc/passwd"), ESCAPE)
    fails(box.stub.Stat, pb.StatRequest(path="missing"), NOT_FOUND)


# --- Remove -------------------------------------------------------------------------------------


def test_remove_file_and_symlink_without_following(box: Box) -> None:
    (box.ws / "abs").symlink_to(box.outside)
    (box.ws / "fl").symlink_to(box.outside / "secret.txt")
    box.stub.Remove(pb.RemoveRequest(path="hello.txt"))
    box.stub.Remove(pb.RemoveRequest(path="abs"))
    box.stub.Remove(pb.RemoveRequest(path="fl"))
    assert sorted(os.listdir(box.ws)) == ["sub"]
    assert box.outside_listing() == ["secret.txt"]


def test_remove_directory_needs_recursive(box: Box) -> None:
    detail = fails(box.stub.Remove, pb.RemoveRequest(path="sub"), WRONG_TYPE)
    assert "recursive" in detail.message
    assert (box.ws / "sub/inner.txt").exists()


def test_remove_recursive_does_not_follow_symlinks(box: Box) -> None:
    (box.outside / "keep").mkdir()
    (box.outside / "keep/k.txt").write_text("k")
    tree = box.ws / "sub"
    (tree / "a/b/c").mkdir(parents=True)
    (tree / "a/b/c/f.txt").write_text("f")
    (tree / "a/.hidden").write_text("h")
    (tree / "a/out").symlink_to(box.outside)
    (tree / "a/b/keep").symlink_to(box.outside / "keep")
    before = box.outside_listing()
    box.stub.Remove(pb.RemoveRequest(path="sub", recursive=True))
    assert not tree.exists()
    assert box.outside_listing() == before


def test_remove_refusals(box: Box) -> None:
    stub = box.stub
    fails(stub.Remove, pb.RemoveRequest(path=str(box.ws), recursive=True), DENIED)
    fails(stub.Remove, pb.RemoveRequest(path=".", recursive=True), DENIED)
    fails(stub.Remove, pb.RemoveRequest(path=str(box.other)), DENIED)
    fails(stub.Remove, pb.RemoveRequest(path="missing"), NOT_FOUND)
    fails(stub.Remove, pb.RemoveRequest(path="../outside/secret.txt"), ESCAPE)
    (box.ws / "abs").symlink_to(box.outside)
    fails(stub.Remove, pb.RemoveRequest(path="abs/secret.txt"), ESCAPE)
    assert box.ws.is_dir()
    assert box.other.is_dir()
    assert box.outside_listing() == ["secret.txt"]


def test_remove_directory_containing_a_root(tmp_path: Path, serve: StubFactory) -> None:
    (tmp_path / "ws/dir/mnt").mkdir(parents=True)
    stub = serve([tmp_path / "ws", tmp_path / "ws/dir/mnt"], tmp_path / "ws")
    fails(stub.Remove, pb.RemoveRequest(path="dir", recursive=True), DENIED)
    assert (tmp_path / "ws/dir/mnt").is_dir()


# --- MakeDir ------------------------------------------------------------------------------------


def test_make_dir(box: Box) -> None:
    box.stub.MakeDir(pb.MakeDirRequest(path="newdir"))
    assert (box.ws / "newdir").is_dir()
    fails(box.stub.MakeDir, pb.MakeDirRequest(path="newdir"), EXISTS)
    box.stub.MakeDir(pb.MakeDirRequest(path="newdir", exist_ok=True))
    fails(box.stub.MakeDir, pb.MakeDirRequest(path="x/y/z"), NOT_FOUND)
    box.stub.MakeDir(pb.MakeDirRequest(path="x/y/z", parents=True))
    assert (box.ws / "x/y/z").is_dir()
    box.stub.MakeDir(pb.MakeDirRequest(path="x/y/z", parents=True, exist_ok=True))
    box.stub.MakeDir(pb.MakeDirRequest(path=str(box.ws), exist_ok=True))


def test_make_dir_exist_ok_on_a_file_fails(box: Box) -> None:
    fails(box.stub.MakeDir, pb.MakeDirRequest(path="hello.txt", exist_ok=True), EXISTS)
    (box.ws / "sublink").symlink_to("sub")
    box.stub.MakeDir(pb.MakeDirRequest(path="sublink", exist_ok=True))  # like os.makedirs


def test_make_dir_escapes_create_nothing_outside(box: Box) -> None:
    (box.ws / "abs").symlink_to(box.outside)
    (box.ws / "rel").symlink_to("../outside")
    for path in ("abs/newdir", "rel/a/b", "../outside/newdir", "rel"):
        fails(
            box.stub.MakeDir,
            pb.MakeDirRequest(path=path + ("/x" if path == "rel" else ""), parents=True),
            ESCAPE,
        )
    assert box.outside_listing() == ["secret.txt"]


# --- filesystem identity -------------------------------------------------------------------------


def thread_fs_ids() -> tuple[int, int]:
    with open("/proc/thread-self/status") as f:
        lines = {line.split(":")[0]: line.split()[1:] for line in f}
    return int(lines["Uid"][3]), int(lines["Gid"][3])


@pytest.mark.skipif(not IS_ROOT, reason="switching the filesystem uid needs root (CAP_SETUID)")
def test_identity_is_per_thread_and_restored() -> None:
    identity = FsIdentity(TOOL_UID, TOOL_GID)
    seen: dict[str, tuple[int, int]] = {}
    inside = threading.Event()
    release = threading.Event()

    def worker() -> None:
        with identity.acting():
            seen["worker"] = thread_fs_ids()
            seen["worker_api"] = (current_fsuid(), current_fsgid())
            inside.set()
            release.wait(5)
        seen["worker_after"] = thread_fs_ids()

    thread = threading.Thread(target=worker)
    thread.start()
    assert inside.wait(5)
    seen["main"] = thread_fs_ids()
    release.set()
    thread.join()
    assert seen["worker"] == seen["worker_api"] == (TOOL_UID, TOOL_GID)
    assert seen["main"] == (0, 0)
    assert seen["worker_after"] == (0, 0)


def test_identity_validates_ids() -> None:
    with pytest.raises(ValueError, match="out of range"):
        FsIdentity(-1, 0)
    with pytest.raises(ValueError, match="out of range"):
        FsIdentity(0, 2**32 - 1)


@pytest.mark.skipif(not IS_ROOT, reason="switching the filesystem uid needs root (CAP_SETUID)")
def test_writes_act_as_the_tool_user(tmp_path: Path, serve: StubFactory) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    os.chown(ws, TOOL_UID, TOOL_GID)
    ws.chmod(0o755)
    locked = ws / "locked"
    locked.mkdir(mode=0o755)  # owned by root: not writable by the tool user
    locked.chmod(0o755)
    (locked / "root-file.txt").write_text("root")
    (locked / "root-file.txt").chmod(0o644)
    stub = serve([ws], ws, FsIdentity(TOOL_UID, TOOL_GID))

    stub.Write(pb.WriteRequest(path="mine.txt", data=b"x"))
    st = (ws / "mine.txt").stat()
    assert (st.st_uid, st.st_gid) == (TOOL_UID, TOOL_GID)
    stub.MakeDir(pb.MakeDirRequest(path="d1/d2", parents=True))
    st = (ws / "d1/d2").stat()
    assert (st.st_uid, st.st_gid) == (TOOL_UID, TOOL_GID)
    stub.Write(pb.WriteRequest(path="d1/d2/f", data=b"y", make_parents=True))

    for request in (
        pb.WriteRequest(path="locked/new.txt", data=b"x"),
        pb.WriteRequest(path="locked/root-file.txt", data=b"x"),
        pb.WriteRequest(path="locked/root-file.txt", data=b"x", append=True),
        pb.WriteRequest(path="locked/a/b.txt", data=b"x", make_parents=True),
    ):
        fails(stub.Write, request, DENIED)
    fails(stub.MakeDir, pb.MakeDirRequest(path="locked/sub"), DENIED)
    fails(stub.Remove, pb.RemoveRequest(path="locked/root-file.txt"), DENIED)
    assert sorted(os.listdir(locked)) == ["root-file.txt"]
    assert (locked / "root-file.txt").read_text() == "root"
    # Reading what the tool user may read still works.
    assert stub.Read(pb.ReadRequest(path="locked/root-file.txt")).data == b"root"
    (locked / "root-file.txt").chmod(0o600)
    fails(stub.Read, pb.ReadRequest(path="locked/root-file.txt"), DENIED)


def test_operations_called_directly_raise_agent_errors(tmp_path: Path) -> None:
    """Other in-agent code may call the operations without gRPC: only AgentError comes out."""
    service = FilesystemService([str(tmp_path)], str(tmp_path), None)
    try:
        with pytest.raises(AgentError) as info:
            service.read(pb.ReadRequest(path="missing.txt"))
        assert info.value.reason == NOT_FOUND
        assert info.value.message == "missing.txt does not exist."
        with pytest.raises(AgentError) as info:
            service.remove(pb.RemoveRequest(path="missing.txt"))
        assert info.value.reason == NOT_FOUND
    finally:
        service.close()
