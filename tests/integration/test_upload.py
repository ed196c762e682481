"""Filesystem.Upload in a real sandbox: tar archives unpack as the tool user and read back byte for byte.

The refusals (``..``, absolute, links, devices, symlinks in the destination) are in
tests/security/test_upload_refusal.py.
"""

from __future__ import annotations

import hashlib
import io
import os
import random
import tarfile
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import AgentCallError
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

TOOL_UID = 1000
MTIME = 1_600_000_000


def build(files: dict[str, bytes], dirs: tuple[str, ...] = (), *, mode: int = 0o644, gzip: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gzip else "w") as tar:
        for name in dirs:
            info = tarfile.TarInfo(name)
            info.type = tarfile.DIRTYPE
            info.mode = 0o755
            tar.addfile(info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = mode
            info.mtime = MTIME
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


class CountingReader(io.BytesIO):
    """A file object that counts how often the client read a piece of it."""

    reads = 0

    def read(self, size: int | None = -1, /) -> bytes:
        self.reads += 1
        return super().read(size)


def read_back(box: Any, path: str) -> bytes:
    """A whole file through the agent's Read RPC, in pieces if large."""
    pieces, offset = [], 0
    while True:
        response = box.agent.read_file(path, offset=offset, limit=4 << 20)
        pieces.append(response.data)
        offset += len(response.data)
        if not response.truncated:
            return b"".join(pieces)


@pytest.fixture
def sandbox(clean_sandbox: Any) -> Any:
    """The module's shared sandbox (reset before each test): each test uploads into a directory
    of its own and reads it back."""
    return clean_sandbox


def test_nested_directories_and_files_upload_and_read_back_as_the_tool_user(sandbox):
    rng = random.Random(7)
    files = {
        "README.md": b"# project\n",
        "src/pkg/__init__.py": b"",
        "src/pkg/core.py": b"def f():\n    return 42\n",
        "src/pkg/data/blob.bin": rng.randbytes(70_000),
        "docs/deep/er/still/note.txt": "naïve ✓\n".encode(),
        "bin/run.sh": b"#!/bin/sh\necho ran\n",
    }
    sandbox.agent.make_dir("project")
    response = sandbox.agent.upload_tar("project", build(files, dirs=("src", "src/pkg", "empty")))
    assert response.files_written == len(files)
    assert response.bytes_written == sum(map(len, files.values()))
    assert response.dirs_created == 9  # src, src/pkg, empty, src/pkg/data, bin, docs/deep/er/still (4)
    for name, data in files.items():
        assert read_back(sandbox, f"/workspace/project/{name}") == data, name
        info = sandbox.agent.stat(f"project/{name}")
        assert (info.uid, info.gid, info.mode, info.mtime_ns) == (TOOL_UID, TOOL_UID, 0o644, MTIME * 10**9), name
    for name in ("src", "src/pkg/data", "docs/deep/er/still", "empty"):
        info = sandbox.agent.stat(f"project/{name}")
        assert (info.uid, info.mode) == (TOOL_UID, 0o755), name
    listing = run(sandbox, "cd /workspace/project && find . | sort").stdout.data().decode().split()
    assert ".callbox" not in " ".join(listing)  # no temporary file is left behind
    assert sorted(listing) == sorted([".", "./README.md", "./bin", "./bin/run.sh", "./docs", "./docs/deep",
                                      "./docs/deep/er", "./docs/deep/er/still", "./docs/deep/er/still/note.txt",
                                      "./empty", "./src", "./src/pkg", "./src/pkg/__init__.py", "./src/pkg/core.py",
                                      "./src/pkg/data", "./src/pkg/data/blob.bin"])
    assert run(sandbox, ["cat", "/workspace/project/src/pkg/core.py"]).stdout.data() == files["src/pkg/core.py"]


def test_an_8_mib_archive_streams_in_many_chunks(sandbox, tmp_path: Path):
    payload = os.urandom(8 << 20)
    data = build({"big/payload.bin": payload, "big/small.txt": b"small\n"})
    source = CountingReader(data)
    sandbox.agent.make_dir("/tmp/big-upload")
    response = sandbox.agent.upload_tar("/tmp/big-upload", source, chunk_size=256 << 10)
    assert source.reads >= len(data) // (256 << 10)  # the client sent it piece by piece
    assert (response.files_written, response.bytes_written) == (2, len(payload) + 6)
    digest = run(sandbox, ["sha256sum", "/tmp/big-upload/big/payload.bin"]).stdout.data().decode().split()[0]
    assert digest == hashlib.sha256(payload).hexdigest()
    assert read_back(sandbox, "/tmp/big-upload/big/payload.bin") == payload
    # The same archive from a file on the host, gzip-compressed this time.
    archive = tmp_path / "big.tar.gz"
    archive.write_bytes(build({"payload.bin": payload}, gzip=True))
    sandbox.agent.make_dir("/tmp/big-gz")
    assert sandbox.agent.upload_tar("/tmp/big-gz", archive).bytes_written == len(payload)
    assert run(sandbox, ["sha256sum", "/tmp/big-gz/payload.bin"]).stdout.data().decode().split()[0] == digest


def test_modes_lose_setid_sticky_and_group_other_write_bits(sandbox):
    sandbox.agent.make_dir("modes")
    sandbox.agent.upload_tar("modes", build({"suid": b"x"}, mode=0o7777))
    sandbox.agent.upload_tar("modes", build({"private": b"x"}, mode=0o600))
    assert sandbox.agent.stat("modes/suid").mode == 0o755
    assert sandbox.agent.stat("modes/private").mode == 0o600


def test_existing_files_are_kept_unless_overwrite_is_set(sandbox):
    sandbox.agent.write_file("keep/a.txt", b"old\n", make_parents=True)
    with pytest.raises(AgentCallError) as caught:
        sandbox.agent.upload_tar("keep", build({"b.txt": b"b\n", "a.txt": b"new\n"}))
    assert (caught.value.reason, caught.value.grpc_code) == ("ALREADY_EXISTS", "ALREADY_EXISTS")
    assert "set overwrite to replace it" in str(caught.value)
    assert sandbox.agent.read_file("keep/a.txt").data == b"old\n"
    assert [e.path for e in sandbox.agent.list_dir("keep", include_hidden=True).entries] == ["a.txt"]
    response = sandbox.agent.upload_tar("keep", build({"b.txt": b"b\n", "a.txt": b"new\n"}), overwrite=True)
    assert response.files_written == 2
    assert sandbox.agent.read_file("keep/a.txt").data == b"new\n"
    assert sandbox.agent.read_file("keep/b.txt").data == b"b\n"


def test_the_destination_must_exist_and_the_size_limit_applies(sandbox):
    with pytest.raises(AgentCallError) as caught:
        sandbox.agent.upload_tar("no-such-dir", build({"a": b"a"}))
    assert caught.value.reason == "NOT_FOUND" and "create it first" in str(caught.value)
    sandbox.agent.make_dir("limited")
    with pytest.raises(AgentCallError) as caught:
        sandbox.agent.upload_tar("limited", build({"a": b"a" * 600, "b": b"b" * 600}), max_bytes=1000)
    assert (caught.value.reason, caught.value.grpc_code) == ("TOO_LARGE", "OUT_OF_RANGE")
    assert sandbox.agent.list_dir("limited", include_hidden=True).entries == []
