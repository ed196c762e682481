"""The filesystem identity on kernels without setfsuid (gVisor): per-thread effective ids instead."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import sandbox.identity as identity

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="switching ids needs root")


@pytest.fixture
def effective_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    setfsuid, setfsgid = identity._effective_id_setters()
    monkeypatch.setattr(identity, "_setfsuid", setfsuid)
    monkeypatch.setattr(identity, "_setfsgid", setfsgid)


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory uid 1000 can reach and write (pytest's tmp_path sits under a 0700 one)."""
    path = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        path.chmod(0o777)
        yield path
    finally:
        shutil.rmtree(path)


def test_files_are_made_as_the_tool_user_on_this_thread_only(effective_ids: None, open_dir: Path) -> None:
    tmp_path = open_dir
    seen_elsewhere: list[int] = []
    inside, done = threading.Event(), threading.Event()

    def other_thread() -> None:
        inside.wait(10)
        seen_elsewhere.append(os.geteuid())
        done.set()

    thread = threading.Thread(target=other_thread)
    thread.start()
    with identity.FsIdentity(1000, 1000).acting():
        (tmp_path / "made").write_text("x")
        assert os.geteuid() == 1000 and os.getegid() == 1000
        assert os.getresuid()[0::2] == (0, 0)  # real and saved stay root: root can come back
        inside.set()
        assert done.wait(10)
    thread.join()
    assert seen_elsewhere == [0]
    info = (tmp_path / "made").stat()
    assert (info.st_uid, info.st_gid) == (1000, 1000)
    assert (os.geteuid(), os.getegid()) == (0, 0)


def test_permissions_are_checked_as_the_tool_user(effective_ids: None, open_dir: Path) -> None:
    with identity.FsIdentity(1000, 1000).acting():
        (open_dir / "reachable").write_text("x")  # the directory itself is open to the user
    private = open_dir / "root-only"
    private.mkdir(mode=0o700)
    with identity.FsIdentity(1000, 1000).acting(), pytest.raises(PermissionError):
        (private / "f").write_text("x")
    assert os.geteuid() == 0
