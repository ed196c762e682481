"""Upload member checks and the unpacking logic of sandbox/upload.py, on real temporary directories.

The member checks are pure (a TarInfo in, components or an AgentError out). The ``receive`` cases
run the real unpacking into a temporary root without a filesystem identity (the Docker tests in
tests/security/test_upload_refusal.py and tests/integration/test_upload.py run it as the tool user).
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sandbox import upload
from sandbox.errors import (
    ALREADY_EXISTS,
    INVALID_ARGUMENT,
    NOT_FOUND,
    PATH_ESCAPE,
    TOO_LARGE,
    WRONG_TYPE,
    AgentError,
)
from sandbox.paths import Resolver
from sandbox.upload import ChunkReader, member_parts, receive
from sandbox.v1 import filesystem_pb2 as pb


def info(name: str, kind: bytes = tarfile.REGTYPE, *, linkname: str = "", size: int = 0) -> tarfile.TarInfo:
    member = tarfile.TarInfo(name)
    member.type = kind
    member.linkname = linkname
    member.size = size
    return member


def archive(*members: tuple[tarfile.TarInfo, bytes | None], gzip: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gzip else "w", format=tarfile.PAX_FORMAT) as tar:
        for member, data in members:
            if data is not None:
                member.size = len(data)
            tar.addfile(member, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def file(name: str, data: bytes, mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    member = info(name)
    member.mode = mode
    member.mtime = 1_600_000_000
    return member, data


def directory(name: str, mode: int = 0o755) -> tuple[tarfile.TarInfo, None]:
    member = info(name, tarfile.DIRTYPE)
    member.mode = mode
    return member, None


def stream(dest: str, data: bytes, chunk: int = 100, **options: object) -> Iterator[pb.UploadChunk]:
    yield pb.UploadChunk(dest=dest, data=data[:chunk], **options)  # type: ignore[arg-type]
    for start in range(chunk, len(data), chunk):
        yield pb.UploadChunk(data=data[start : start + chunk])


# --- member_parts ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "parts"),
    [("a", ("a",)), ("a/b/c.txt", ("a", "b", "c.txt")), ("./a//b/./c", ("a", "b", "c")), ("a/b/", ("a", "b")),
     ("..a/b..", ("..a", "b..")), ("a/.../b", ("a", "...", "b"))],
)
def test_relative_names_become_components(name, parts):
    assert member_parts(info(name)) == parts


def test_a_dot_directory_member_is_the_destination_itself():
    assert member_parts(info(".", tarfile.DIRTYPE)) == ()
    with pytest.raises(AgentError) as caught:
        member_parts(info("."))
    assert caught.value.reason == INVALID_ARGUMENT and "names the destination itself" in caught.value.message


@pytest.mark.parametrize("name", ["/etc/evil", "//etc/evil", "/", "/workspace/a"])
def test_absolute_names_are_escapes(name):
    with pytest.raises(AgentError) as caught:
        member_parts(info(name))
    assert caught.value.reason == PATH_ESCAPE
    assert "is an absolute path" in caught.value.message


@pytest.mark.parametrize("name", ["..", "../escape", "a/../../escape", "a/../b", "a/b/..", "./../x", "a//../b"])
def test_any_dotdot_component_is_an_escape(name):
    with pytest.raises(AgentError) as caught:
        member_parts(info(name))
    assert caught.value.reason == PATH_ESCAPE
    assert "has a '..' component" in caught.value.message


@pytest.mark.parametrize(
    ("kind", "linkname", "words"),
    [
        (tarfile.SYMTYPE, "/etc/passwd", "is a symbolic link (to '/etc/passwd')"),
        (tarfile.SYMTYPE, "..", "is a symbolic link (to '..')"),
        (tarfile.LNKTYPE, "/etc/passwd", "is a hard link (to '/etc/passwd')"),
        (tarfile.LNKTYPE, "earlier.txt", "is a hard link (to 'earlier.txt')"),
        (tarfile.CHRTYPE, "", "is a device"),
        (tarfile.BLKTYPE, "", "is a device"),
        (tarfile.FIFOTYPE, "", "is a FIFO"),
        (b"V", "", "of an unsupported type (b'V')"),
        (b"Z", "", "of an unsupported type (b'Z')"),
    ],
)
def test_links_and_special_members_are_refused(kind, linkname, words):
    with pytest.raises(AgentError) as caught:
        member_parts(info("inside", kind, linkname=linkname))
    assert caught.value.reason == INVALID_ARGUMENT
    assert words in caught.value.message
    assert "only regular files and directories" in caught.value.message


def test_sparse_members_are_refused():
    member = info("sparse")
    member.sparse = [(0, 10)]  # type: ignore[assignment]
    with pytest.raises(AgentError) as caught:
        member_parts(member)
    assert "is a sparse file" in caught.value.message


@pytest.mark.parametrize("name", ["", "a\x00b", "x" * 5000])
def test_empty_nul_and_overlong_names_are_invalid(name):
    with pytest.raises(AgentError) as caught:
        member_parts(info(name))
    assert caught.value.reason == INVALID_ARGUMENT


def test_the_name_check_comes_before_the_type_check():
    with pytest.raises(AgentError) as caught:
        member_parts(info("../x", tarfile.SYMTYPE, linkname="/etc"))
    assert caught.value.reason == PATH_ESCAPE


# --- ChunkReader ----------------------------------------------------------------------------------


def test_chunk_reader_reads_across_messages_and_peeks_without_consuming():
    reader = ChunkReader(iter([b"a", b"", b"bcd", b"ef"]))
    assert reader.peek(3) == b"abc"
    assert reader.read(2) == b"ab"
    assert reader.read(10) == b"cd"
    assert reader.read(10) == b"ef"
    assert reader.read(10) == b""
    assert reader.received == 6


def test_chunk_reader_drain_has_a_limit():
    assert ChunkReader(iter([b"x" * 10, b"y" * 10])).drain(20) == 20
    with pytest.raises(AgentError) as caught:
        ChunkReader(iter([b"x" * 10, b"y" * 11])).drain(20)
    assert "follow the end of the tar archive" in caught.value.message


# --- receive into a temporary root -----------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Iterator[tuple[Resolver, Path]]:
    workspace = tmp_path / "ws"
    (workspace / "dst").mkdir(parents=True)
    resolver = Resolver([str(workspace)], str(workspace))
    yield resolver, workspace
    resolver.close()


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def refused(resolver: Resolver, data: bytes, **options: object) -> AgentError:
    with pytest.raises(AgentError) as caught:
        receive(resolver, stream("dst", data, **options))
    return caught.value


def test_receive_writes_files_and_directories_with_masked_modes(root):
    resolver, ws = root
    data = archive(directory("./"), directory("d", 0o777), file("d/e/f.txt", b"hello", 0o6777),
                   file("top.bin", bytes(range(256)) * 40, 0o600), gzip=True)
    response = receive(resolver, stream("dst", data, chunk=7))
    assert (response.files_written, response.dirs_created, response.bytes_written) == (2, 2, 10245)
    dst = ws / "dst"
    assert (dst / "d/e/f.txt").read_bytes() == b"hello"
    assert (dst / "top.bin").read_bytes() == bytes(range(256)) * 40
    assert stat.S_IMODE((dst / "d/e/f.txt").stat().st_mode) == 0o755
    assert stat.S_IMODE((dst / "top.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((dst / "d").stat().st_mode) == 0o755
    assert (dst / "top.bin").stat().st_mtime == 1_600_000_000
    assert tree(dst) == ["d", "d/e", "d/e/f.txt", "top.bin"]


def test_a_bad_member_after_good_ones_leaves_nothing_behind(root):
    resolver, ws = root
    (ws / "dst/keep").mkdir()
    before = tree(ws)
    data = archive(file("keep/new.txt", b"1"), directory("newdir"), file("newdir/x/y", b"2"),
                   (info("evil", tarfile.SYMTYPE, linkname="/etc/passwd"), None))
    error = refused(resolver, data)
    assert error.reason == INVALID_ARGUMENT and error.message.endswith("The upload wrote nothing.")
    assert tree(ws) == before


def test_existing_files_need_overwrite(root):
    resolver, ws = root
    (ws / "dst/a.txt").write_bytes(b"old")
    data = archive(file("new.txt", b"n"), file("a.txt", b"new"))
    error = refused(resolver, data)
    assert error.reason == ALREADY_EXISTS and "set overwrite" in error.message
    assert tree(ws / "dst") == ["a.txt"] and (ws / "dst/a.txt").read_bytes() == b"old"
    receive(resolver, stream("dst", data, overwrite=True))
    assert (ws / "dst/a.txt").read_bytes() == b"new"


def test_an_existing_symlink_is_never_followed(root):
    resolver, ws = root
    (ws / "other").mkdir()
    os.symlink("../other", ws / "dst/inside-link")  # points inside the root, but outside the destination
    os.symlink("/etc", ws / "dst/outside-link")
    for name in ("inside-link/x", "outside-link/evil", "inside-link"):
        member = directory(name) if name == "inside-link" else file(name, b"x")
        error = refused(resolver, archive(file("first", b"1"), member))
        assert error.reason == PATH_ESCAPE, name
        assert "symbolic link already in the destination" in error.message
    assert tree(ws) == ["dst", "dst/inside-link", "dst/outside-link", "other"]


def test_one_name_cannot_be_both_a_file_and_a_directory(root):
    resolver, ws = root
    for members in ([file("z", b"1"), file("z/y", b"2")], [file("z", b"1"), directory("z")]):
        assert refused(resolver, archive(*members)).reason == INVALID_ARGUMENT
    (ws / "dst/d").mkdir()
    assert refused(resolver, archive(file("d", b"1")), overwrite=True).reason == WRONG_TYPE
    assert tree(ws / "dst") == ["d"]


def test_the_later_of_two_members_with_one_name_wins(root):
    resolver, ws = root
    response = receive(resolver, stream("dst", archive(file("dup", b"1"), file("dup", b"22"))))
    assert (response.files_written, response.bytes_written) == (1, 2)
    assert tree(ws / "dst") == ["dup"] and (ws / "dst/dup").read_bytes() == b"22"


def test_size_limits(root, monkeypatch):
    resolver, ws = root
    error = refused(resolver, archive(file("a", b"x" * 60), file("b", b"y" * 60)), max_bytes=100)
    assert error.reason == TOO_LARGE and "limit of 100 bytes" in error.message
    monkeypatch.setattr(upload, "MAX_MEMBERS", 2)
    error = refused(resolver, archive(directory("a"), directory("b"), directory("c")))
    assert error.reason == TOO_LARGE and "more than 2 members" in error.message
    big_header = info("p", size=0)
    big_header.pax_headers = {"comment": "x" * (upload.MAX_HEADER_BYTES + 1)}
    error = refused(resolver, archive((big_header, b"")), chunk=1 << 16)
    assert error.reason == TOO_LARGE and "extended tar header" in error.message
    assert tree(ws / "dst") == []


def test_broken_archives_and_streams(root):
    resolver, ws = root
    good = archive(directory("n"), file("n/f", b"x" * 5000))
    for data in (good[:3000], b"not a tar archive" * 100, b""):
        error = refused(resolver, data)
        assert error.reason == INVALID_ARGUMENT and "not a complete tar archive" in error.message
    error = refused(resolver, good + b"\x01" * (upload.MAX_TRAILING_BYTES + 20_000), chunk=1 << 16)
    assert "follow the end" in error.message
    with pytest.raises(AgentError) as caught:
        receive(resolver, iter([]))
    assert caught.value.reason == INVALID_ARGUMENT
    with pytest.raises(AgentError) as caught:
        receive(resolver, iter([pb.UploadChunk(dest="dst", data=good[:512]), pb.UploadChunk(dest="dst")]))
    assert "first message only" in caught.value.message
    assert tree(ws / "dst") == []


@pytest.mark.parametrize(("dest", "reason"), [("missing", NOT_FOUND), ("..", PATH_ESCAPE), ("/etc", PATH_ESCAPE),
                                               ("file", WRONG_TYPE), ("", INVALID_ARGUMENT)])
def test_the_destination_is_confined_and_must_be_a_directory(root, dest, reason):
    resolver, ws = root
    (ws / "file").write_bytes(b"")
    with pytest.raises(AgentError) as caught:
        receive(resolver, stream(dest, archive(file("f", b"1"))))
    assert caught.value.reason == reason


@pytest.mark.parametrize("gzip", [False, True])
def test_an_archive_cut_at_a_member_boundary_is_refused(root, gzip):
    """gRPC may deliver a client's cancel as an ordinary end of stream: an archive that stops
    between two members must not be taken for a complete one."""
    resolver, ws = root
    whole = archive(file("a", b"x" * 1000), file("b", b"y" * 1000))
    boundary = 512 + 1024  # a's pax-less header and its padded data
    cut = whole[:boundary]
    if gzip:
        import gzip as gz

        cut = gz.compress(cut)
    with tarfile.open(fileobj=io.BytesIO(cut)) as alone:
        assert alone.getnames() == ["a"]  # tarfile alone takes it for a whole archive
    error = refused(resolver, cut)
    assert error.reason == INVALID_ARGUMENT and "end-of-archive marker" in error.message
    assert tree(ws / "dst") == []


def test_an_invalid_header_after_the_first_member_is_refused(root):
    resolver, ws = root
    whole = archive(file("a", b"x" * 1000))
    garbage = bytearray(whole[:1536]) + b"\x07" * 512 + whole[1536:]
    with tarfile.open(fileobj=io.BytesIO(bytes(garbage))) as alone:
        assert alone.getnames() == ["a"]
    error = refused(resolver, bytes(garbage))
    assert error.reason == INVALID_ARGUMENT and "bad header" in error.message
    assert tree(ws / "dst") == []


def test_a_stream_that_breaks_off_leaves_nothing_behind(root):
    resolver, ws = root
    data = archive(directory("n"), file("n/f", b"x" * 5000), file("g", b"y" * 5000))

    def broken() -> Iterator[pb.UploadChunk]:
        yield from stream("dst", data[:7000], chunk=1000)
        raise grpc.RpcError()  # what the server's request iterator raises when the client cancels

    with pytest.raises(AgentError) as caught:
        receive(resolver, broken())
    assert caught.value.reason == INVALID_ARGUMENT and "broke off" in caught.value.message
    assert tree(ws / "dst") == []
