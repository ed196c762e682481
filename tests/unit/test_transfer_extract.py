"""Host-side tar streams (harness/engine/tarstream.py): copy_out's safe extraction refuses hostile
archives and never writes outside the destination; copy_in's host tar reads back with tarfile.

Archives are built in memory with tarfile and fed in small chunks, as the agent's stream would be.
"""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.errors import UsageError
from harness.engine.tarstream import (
    ChunkReader,
    Extractor,
    HostTar,
    UnsafeArchive,
    chunked,
    host_destination,
    link_escapes,
)

MTIME = 1_600_000_000


def member(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", link: str = "",
           mode: int = 0o644) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode, info.mtime = kind, link, mode, MTIME
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return buf.getvalue()


def pieces(data: bytes, size: int = 777) -> Iterator[bytes]:
    return (data[i : i + size] for i in range(0, len(data), size))


def extract(data: bytes, root: Path, *, rename: str | None = None) -> Extractor:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        extractor = Extractor(fd, root, rename=rename)
        extractor.run(ChunkReader(pieces(data)))
    finally:
        os.close(fd)
    return extractor


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    (tmp_path / "dest").mkdir()
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep.txt").write_bytes(b"keep\n")
    return tmp_path / "dest"


def test_a_tree_unpacks_with_modes_mtimes_and_inner_symlinks(dest: Path) -> None:
    data = archive(
        member("src", tarfile.DIRTYPE, mode=0o755),
        member("src/ro", tarfile.DIRTYPE, mode=0o555),  # read-only: its mode is applied after its contents
        member("src/ro/a.txt", data=b"a\n", mode=0o4755),
        member("src/b.bin", data=bytes(range(256)) * 100),
        member("src/link", tarfile.SYMTYPE, link="ro/a.txt"),
        member("src/ro/up", tarfile.SYMTYPE, link="../b.bin"),
    )
    result = extract(data, dest)
    assert (result.files, result.dirs, result.symlinks, result.skipped) == (2, 2, 2, [])
    assert result.bytes == 2 + 25600
    assert (dest / "src/ro/a.txt").read_bytes() == b"a\n"
    assert (dest / "src/ro/a.txt").stat().st_mode & 0o7777 == 0o755  # no set-id bit
    assert (dest / "src/ro").stat().st_mode & 0o777 == 0o755  # 0o555 plus the owner's write
    assert (dest / "src/b.bin").stat().st_mtime == MTIME
    assert os.readlink(dest / "src/link") == "ro/a.txt"
    assert (dest / "src/ro/up").read_bytes() == bytes(range(256)) * 100
    assert not [p for p in tree(dest) if ".callbox" in p]


def test_rename_gives_the_top_entry_a_new_name(dest: Path) -> None:
    extract(archive(member("src", tarfile.DIRTYPE), member("src/a", data=b"x")), dest, rename="copy")
    assert tree(dest) == ["copy", "copy/a"]


@pytest.mark.parametrize(
    ("bad", "words"),
    [
        (member("/etc/passwd", data=b"x"), "absolute path"),
        (member("src/../../outside/keep.txt", data=b"x"), "'..' component"),
        (member("src/hard", tarfile.LNKTYPE, link="src/a"), "hard link"),
        (member("src/dev", tarfile.CHRTYPE), "device"),
        (member("src/fifo", tarfile.FIFOTYPE), "FIFO"),
        (member("other/a", data=b"x"), "outside its top entry"),
    ],
)
def test_hostile_members_refuse_the_archive(dest: Path, bad: tuple[tarfile.TarInfo, bytes], words: str) -> None:
    data = archive(member("src", tarfile.DIRTYPE), member("src/a", data=b"a"), bad, member("src/z", data=b"z"))
    with pytest.raises(UnsafeArchive, match=words):
        extract(data, dest)
    assert "src/z" not in tree(dest)  # nothing after the refused member
    assert tree(dest.parent / "outside") == ["keep.txt"]
    assert (dest.parent / "outside" / "keep.txt").read_bytes() == b"keep\n"


def test_an_oversized_extended_header_is_refused_before_it_is_read(dest: Path) -> None:
    info, _ = member("src/" + "x" * 100, data=b"")
    info.pax_headers = {"comment": "y" * (2 << 20)}
    with pytest.raises(UnsafeArchive, match="extended header"):
        extract(archive(member("src", tarfile.DIRTYPE), (info, b"")), dest)


def test_symlinks_out_of_the_copy_are_left_out_and_listed(dest: Path) -> None:
    data = archive(
        member("src", tarfile.DIRTYPE),
        member("src/abs", tarfile.SYMTYPE, link="/etc/passwd"),
        member("src/up", tarfile.SYMTYPE, link="../outside/keep.txt"),
        member("src/dot", tarfile.SYMTYPE, link="."),
        # Inside as text (dot/.. is src), but dot is src itself, so at run time it is dest: out.
        member("src/chain", tarfile.SYMTYPE, link="dot/.."),
        member("src/ok", tarfile.SYMTYPE, link="dot/a"),
    )
    result = extract(data, dest)
    assert not (dest / "src/abs").is_symlink() and not (dest / "src/up").is_symlink()
    assert not (dest / "src/chain").is_symlink()
    assert os.readlink(dest / "src/ok") == "dot/a"
    assert result.symlinks == 2  # dot and ok
    assert [s.split(" ->")[0] for s in result.skipped] == ["src/abs", "src/up", "src/chain"]


def test_link_escapes_on_text() -> None:
    assert link_escapes(("t", "l"), "/etc", ("t",))
    assert link_escapes(("t", "l"), "..", ("t",))
    assert link_escapes(("t", "l"), "../t2/x", ("t",))
    assert not link_escapes(("t", "d", "l"), "../x", ("t",))
    assert not link_escapes(("t", "l"), "../t/x", ("t",))
    assert not link_escapes(("l",), "sibling", ())
    assert link_escapes(("l",), "../x", ())


def test_writing_through_a_symlink_the_archive_made_is_refused(dest: Path) -> None:
    data = archive(
        member("src", tarfile.DIRTYPE),
        member("src/sub", tarfile.DIRTYPE),
        member("src/l", tarfile.SYMTYPE, link="sub"),
        member("src/l/f", data=b"through the link"),
    )
    with pytest.raises(UnsafeArchive, match="its own symbolic link"):
        extract(data, dest)
    assert tree(dest / "src" / "sub") == []


def test_a_symlink_already_in_the_destination_is_never_written_through(dest: Path) -> None:
    outside = dest.parent / "outside"
    (dest / "src").symlink_to(outside)
    with pytest.raises(UsageError, match="never writes through one"):
        extract(archive(member("src", tarfile.DIRTYPE), member("src/keep.txt", data=b"evil")), dest)
    assert (outside / "keep.txt").read_bytes() == b"keep\n"
    # A file member replaces a symlink itself, not what it points to.
    (dest / "src").unlink()
    (dest / "src").mkdir()
    (dest / "src" / "keep.txt").symlink_to(outside / "keep.txt")
    extract(archive(member("src", tarfile.DIRTYPE), member("src/keep.txt", data=b"new")), dest)
    assert not (dest / "src" / "keep.txt").is_symlink()
    assert (dest / "src" / "keep.txt").read_bytes() == b"new"
    assert (outside / "keep.txt").read_bytes() == b"keep\n"


def test_existing_files_are_replaced_and_type_clashes_refused(dest: Path) -> None:
    (dest / "src").mkdir()
    (dest / "src" / "a").write_bytes(b"old")
    (dest / "src" / "d").mkdir()
    extract(archive(member("src", tarfile.DIRTYPE), member("src/a", data=b"new")), dest)
    assert (dest / "src" / "a").read_bytes() == b"new"
    with pytest.raises(UsageError, match="is a directory"):
        extract(archive(member("src", tarfile.DIRTYPE), member("src/d", data=b"x")), dest)
    with pytest.raises(UsageError, match="not a directory"):
        extract(archive(member("src", tarfile.DIRTYPE), member("src/a", tarfile.DIRTYPE)), dest)


def test_a_truncated_stream_is_refused(dest: Path) -> None:
    data = archive(member("src", tarfile.DIRTYPE), member("src/a", data=b"x" * 5000))
    with pytest.raises(UnsafeArchive, match="not a valid tar stream"):
        extract(data[:2048], dest)
    assert not [p for p in tree(dest) if ".callbox" in p]


def test_destinations_follow_docker_cp(tmp_path: Path) -> None:
    assert host_destination(tmp_path) == (tmp_path, None)
    assert host_destination(tmp_path / "new") == (tmp_path, "new")
    with pytest.raises(UsageError, match="create it first"):
        host_destination(tmp_path / "missing" / "new")


def test_host_tar_streams_in_chunks_and_leaves_symlinks_out(tmp_path: Path) -> None:
    src = tmp_path / "proj"
    (src / "pkg").mkdir(parents=True)
    big = os.urandom(3 << 20) + b"tail"
    (src / "pkg" / "big.bin").write_bytes(big)
    (src / "readme").write_text("hello\n")
    (src / "link").symlink_to("readme")
    os.mkfifo(src / "fifo")
    host = HostTar(src, "copy")
    chunks = list(chunked(host.pieces()))
    assert all(len(c) == 1 << 20 for c in chunks[:-1]) and 0 < len(chunks[-1]) <= 1 << 20
    with tarfile.open(fileobj=io.BytesIO(b"".join(chunks)), mode="r|") as tar:
        found = {m.name: (tar.extractfile(m).read() if m.isreg() else None) for m in tar}  # type: ignore[union-attr]
    assert found == {"copy": None, "copy/pkg": None, "copy/pkg/big.bin": big, "copy/readme": b"hello\n"}
    assert sorted(s.split(" ")[0] for s in host.skipped) == ["copy/fifo", "copy/link"]
