"""Filesystem Download, Move and Watch through the agent's real gRPC server, in this process, on a
unix socket, with harness.engine.transfer.TransferClient on the other end.

One agent serves the whole module (a workspace root plus a second root on another filesystem,
/dev/shm, for moves across filesystems); each test works in its own directory. Watch events are
waited for with a bounded queue read, never a sleep.
"""

from __future__ import annotations

import io
import os
import queue
import shutil
import tarfile
import tempfile
import threading
import time
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.errors import AgentCallError, UsageError
from harness.engine.agent_client import AgentClient
from harness.engine.transfer import TransferClient, Watch, WatchChange
from sandbox import download
from sandbox import watch as watch_module
from sandbox.fs import FilesystemService
from sandbox.identity import FsIdentity, current_fsuid
from sandbox.server import AgentConfig, build_server
from sandbox.v1 import filesystem_pb2 as pb

IS_ROOT = os.geteuid() == 0
TOOL_UID = 1000


class Agent:
    def __init__(self, workspace: Path, other: Path, client: AgentClient) -> None:
        self.workspace, self.other, self.client = workspace, other, client
        self.transfer: TransferClient = client.transfer


@pytest.fixture(scope="module")
def agent() -> Iterator[Agent]:
    base = Path(tempfile.mkdtemp(prefix="cbx-"))  # short: a unix socket path is at most 108 bytes
    other = Path(tempfile.mkdtemp(prefix="cbx-files-", dir="/dev/shm"))
    workspace = base / "ws"
    workspace.mkdir()
    socket = str(base / "a.sock")
    served = build_server(AgentConfig(socket=socket, workspace=str(workspace), roots=[str(workspace), str(other)],
                                      user=None, max_concurrent=4))
    served.server.add_insecure_port(f"unix:{socket}")
    served.server.start()
    client = AgentClient(socket)
    try:
        yield Agent(workspace, other, client)
    finally:
        client.close()
        served.server.stop(grace=1).wait()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(other, ignore_errors=True)


@pytest.fixture
def here(agent: Agent) -> Path:
    """A fresh directory in the workspace for one test."""
    path = agent.workspace / uuid.uuid4().hex[:8]
    path.mkdir()
    return path


def members(data: bytes) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        return {m.name: m for m in tar}


def reason(call: object) -> str:
    assert isinstance(call, AgentCallError)
    return call.reason


# --- Download --------------------------------------------------------------------------------------------


def test_download_streams_a_tree_relative_to_its_parent(agent: Agent, here: Path) -> None:
    (here / "src" / "pkg").mkdir(parents=True)
    (here / "src" / "pkg" / "big.bin").write_bytes(os.urandom(3 << 20))
    (here / "src" / "a.txt").write_text("a\n")
    (here / "src" / "link").symlink_to("/etc/passwd")
    (here / "src" / "hard").hardlink_to(here / "src" / "a.txt")
    os.mkfifo(here / "src" / "fifo")
    chunks = list(agent.transfer.download(f"{here.name}/src"))
    assert all(len(c) <= 1 << 20 for c in chunks) and len(chunks) >= 3
    found = members(b"".join(chunks))
    assert list(found) == ["src", "src/a.txt", "src/hard", "src/link", "src/pkg", "src/pkg/big.bin"]
    assert found["src/link"].issym() and found["src/link"].linkname == "/etc/passwd"
    assert found["src/hard"].isreg() and found["src/hard"].size == 2  # a copy, not a hard-link member
    assert found["src/pkg/big.bin"].size == 3 << 20
    # The last message's summary counts the FIFO it left out.
    outcome = agent.transfer.copy_out(f"{here.name}/src", here / "out-dir-does-not-exist")
    assert outcome.skipped == ["src/fifo", "out-dir-does-not-exist/link -> /etc/passwd (a symbolic link out of "
                                           "the copy)"]


def test_download_of_a_file_a_symlink_and_the_errors(agent: Agent, here: Path) -> None:
    (here / "f.txt").write_text("hello")
    (here / "l").symlink_to("f.txt")
    assert list(members(b"".join(agent.transfer.download(str(here / "f.txt"))))) == ["f.txt"]
    only = members(b"".join(agent.transfer.download(str(here / "l"))))
    assert only["l"].issym()  # the final symlink is stored, not followed
    for path, expected in (("/etc", "PATH_ESCAPE"), (f"{here}/missing", "NOT_FOUND")):
        with pytest.raises(AgentCallError) as caught:
            b"".join(agent.transfer.download(path))
        assert caught.value.reason == expected, path
    (here / "two").mkdir()
    (here / "two" / "a").write_bytes(b"a" * 600)
    (here / "two" / "b").write_bytes(b"b" * 600)
    with pytest.raises(AgentCallError) as caught:
        b"".join(agent.transfer.download(str(here / "two"), max_bytes=1000))
    assert caught.value.reason == "TOO_LARGE" and "max_bytes" in str(caught.value)


def test_download_memory_is_bounded_by_the_chunk_not_the_file(agent: Agent, here: Path) -> None:
    with open(here / "sparse.bin", "wb") as f:
        f.truncate(96 << 20)  # reads as zeros, costs no memory or disk
    tracemalloc.start()
    try:
        total = sum(len(c) for c in agent.transfer.download(str(here / "sparse.bin")))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 96 << 20
    assert peak < 12 << 20, f"peak {peak >> 20} MiB for a 96 MiB file"


@pytest.mark.skipif(not IS_ROOT, reason="switching the filesystem identity needs root")
def test_download_runs_as_the_tool_user_and_never_holds_the_identity_between_chunks(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "big.bin").write_bytes(b"z" * (3 << 20))
    (root / "d" / "secret").write_bytes(b"root only")
    os.chmod(root / "d" / "secret", 0o600)
    os.chmod(tmp_path, 0o755)
    service = FilesystemService([str(root)], str(root), FsIdentity(TOOL_UID, TOOL_UID))
    try:
        # The generator the gRPC server drives, driven here: between two messages this thread
        # is the agent's own again.
        messages = download.stream(service.resolver, pb.DownloadRequest(path="d"), service.acting, lambda: True)
        first = next(messages)
        assert current_fsuid() == 0 and len(first.data) == 1 << 20
        rest = list(messages)
        assert current_fsuid() == 0
        assert rest[-1].summary.skipped_paths == ["d/secret"]  # unreadable to the tool user: left out
        assert list(members(first.data + b"".join(m.data for m in rest))) == ["d", "d/big.bin"]
        # Closed half-way on another thread (what a cancelled RPC's garbage collection may do).
        messages = download.stream(service.resolver, pb.DownloadRequest(path="d"), service.acting, lambda: True)
        next(messages)
        closer = threading.Thread(target=messages.close)
        closer.start()
        closer.join(10)
        assert current_fsuid() == 0 and fsuids() == {0}
    finally:
        service.close()


def fsuids() -> set[int]:
    """The filesystem uid of every thread of this process."""
    found = set()
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/status") as f:
                status = f.read()
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        for line in status.splitlines():
            if line.startswith("Uid:"):
                found.add(int(line.split()[4]))
    return found


# --- Move ------------------------------------------------------------------------------------------------


def test_move_renames_and_keeps_or_replaces_per_overwrite(agent: Agent, here: Path) -> None:
    (here / "a").write_text("a")
    (here / "b").write_text("b")
    (here / "dir" / "inner").mkdir(parents=True)
    (here / "full").mkdir()
    (here / "full" / "x").write_text("x")
    agent.transfer.move(f"{here}/dir", f"{here}/moved")
    assert (here / "moved" / "inner").is_dir() and not (here / "dir").exists()
    with pytest.raises(AgentCallError) as caught:
        agent.transfer.move(f"{here}/a", f"{here}/b")
    assert caught.value.reason == "ALREADY_EXISTS" and "set overwrite" in str(caught.value)
    agent.transfer.move(f"{here}/a", f"{here}/b", overwrite=True)
    assert (here / "b").read_text() == "a" and not (here / "a").exists()
    cases = [
        ((f"{here}/b", f"{here}/full"), "WRONG_TYPE"),  # a file never replaces a directory
        ((f"{here}/moved", f"{here}/full"), "WRONG_TYPE"),  # a non-empty directory is never replaced
        ((f"{here}/moved", f"{here}/moved/inner/deeper"), "INVALID_ARGUMENT"),
        ((str(agent.workspace), f"{here}/ws"), "PERMISSION_DENIED"),
        ((f"{here}/b", "/etc/b"), "PATH_ESCAPE"),
        ((f"{here}/nothing", f"{here}/c"), "NOT_FOUND"),
    ]
    for (source, destination), expected in cases:
        with pytest.raises(AgentCallError) as caught:
            agent.transfer.move(source, destination, overwrite=True)
        assert caught.value.reason == expected, (source, destination, str(caught.value))
    assert (here / "full" / "x").read_text() == "x"


def test_move_across_filesystems_copies_files_and_refuses_directories(agent: Agent, here: Path) -> None:
    if os.stat(agent.other).st_dev == os.stat(here).st_dev:
        pytest.skip("/dev/shm is on the same filesystem as the temporary directory here")
    (here / "f.bin").write_bytes(b"data" * 1000)
    os.chmod(here / "f.bin", 0o640)
    os.utime(here / "f.bin", (1_600_000_000, 1_600_000_000))
    (here / "l").symlink_to("f.bin")
    agent.transfer.move(f"{here}/f.bin", f"{agent.other}/f.bin")
    moved = agent.other / "f.bin"
    assert moved.read_bytes() == b"data" * 1000 and not (here / "f.bin").exists()
    assert (moved.stat().st_mode & 0o777, moved.stat().st_mtime) == (0o640, 1_600_000_000)
    agent.transfer.move(f"{here}/l", f"{agent.other}/l")
    assert os.readlink(agent.other / "l") == "f.bin"
    (here / "again").write_text("again")
    with pytest.raises(AgentCallError) as caught:
        agent.transfer.move(f"{here}/again", f"{agent.other}/f.bin")
    assert caught.value.reason == "ALREADY_EXISTS" and (here / "again").exists()
    (here / "tree").mkdir()
    with pytest.raises(AgentCallError) as caught:
        agent.transfer.move(f"{here}/tree", f"{agent.other}/tree")
    assert caught.value.reason == "WRONG_TYPE" and "different filesystems" in str(caught.value)
    assert not [n for n in os.listdir(agent.other) if n.startswith(".callbox")]


# --- Watch -----------------------------------------------------------------------------------------------


class Changes:
    """A watch read on a thread, so the test waits for each change with a timeout."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch
        self.items: queue.Queue[WatchChange | None] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for change in self.watch:
                self.items.put(change)
        finally:
            self.items.put(None)

    def until(self, kind: str, path: Path, timeout: float = 10.0) -> list[WatchChange]:
        seen: list[WatchChange] = []
        while True:
            change = self.items.get(timeout=timeout)
            assert change is not None, f"the watch ended before {kind} {path}; saw {seen}"
            seen.append(change)
            if (change.kind, change.path) == (kind, str(path)):
                return seen

    def close(self) -> None:
        self.watch.close()
        self.thread.join(10)
        assert not self.thread.is_alive()


def test_watch_reports_changes_after_ready(agent: Agent, here: Path) -> None:
    changes = Changes(agent.transfer.watch(str(here)))
    try:
        (here / "new.txt").write_text("x")
        assert changes.until("created", here / "new.txt")[0] == WatchChange("created", str(here / "new.txt"), False)
        with open(here / "new.txt", "a") as f:
            f.write("more")
        changes.until("modified", here / "new.txt")
        os.chmod(here / "new.txt", 0o600)  # metadata only: attrib, not modified
        assert {c.kind for c in changes.until("attrib", here / "new.txt")} <= {"modified", "attrib"}
        os.rename(here / "new.txt", here / "renamed.txt")
        changes.until("moved_from", here / "new.txt")
        changes.until("moved_to", here / "renamed.txt")
        (here / "sub").mkdir()
        assert changes.until("created", here / "sub")[-1].is_dir
        os.remove(here / "renamed.txt")
        changes.until("removed", here / "renamed.txt")
    finally:
        changes.close()


def test_recursive_watch_follows_new_directories_and_ends_with_its_directory(agent: Agent, here: Path) -> None:
    (here / "old" / "deep").mkdir(parents=True)
    changes = Changes(agent.transfer.watch(str(here), recursive=True))
    try:
        (here / "old" / "deep" / "f").write_text("f")
        changes.until("created", here / "old" / "deep" / "f")
        (here / "a" / "b").mkdir(parents=True)
        (here / "a" / "b" / "late").write_text("x")  # maybe before the watch on a/b: then found by a scan
        changes.until("created", here / "a" / "b" / "late")
        shutil.rmtree(here)
        seen = changes.until("removed", here)
        assert changes.items.get(timeout=10) is None, f"the stream went on after its directory; saw {seen}"
    finally:
        changes.close()


def test_a_directory_moved_in_reports_its_files_as_created_and_the_written_ones_as_modified(
    agent: Agent, here: Path
) -> None:
    """What a new directory already holds when its watch is added is found by a scan: a file with
    content is reported CREATED then MODIFIED, as a watch in place would have seen it written."""
    outside = here.parent / f"{here.name}-outside"
    (outside / "d").mkdir(parents=True)
    (outside / "d" / "full.txt").write_text("content")
    (outside / "d" / "empty.txt").write_text("")
    changes = Changes(agent.transfer.watch(str(here), recursive=True))
    try:
        os.rename(outside / "d", here / "d")
        seen = changes.until("modified", here / "d" / "full.txt")  # the scan lists by name: empty.txt first
        full = [c.kind for c in seen if c.path == str(here / "d" / "full.txt")]
        assert full[:2] == ["created", "modified"], seen
        empty = [c.kind for c in seen if c.path == str(here / "d" / "empty.txt")]
        assert empty == ["created"], seen
    finally:
        changes.close()
        shutil.rmtree(outside, ignore_errors=True)


def test_watch_refusals_and_cancelled_watches_free_their_slot(agent: Agent, here: Path) -> None:
    (here / "file").write_text("x")
    for path, expected in ((str(here / "file"), "WRONG_TYPE"), ("/etc", "PATH_ESCAPE"),
                           (str(here / "missing"), "NOT_FOUND")):
        with pytest.raises(AgentCallError) as caught:
            agent.transfer.watch(path)
        assert caught.value.reason == expected, path
    # More watches than may run at once, one after the other: each cancelled one gives its
    # slot back (the agent's select wakes up at once, not after its poll interval).
    for _ in range(watch_module.MAX_ACTIVE + 2):
        opened = [agent.transfer.watch(str(here)) for _ in range(watch_module.MAX_ACTIVE)]
        with pytest.raises(AgentCallError) as caught:
            agent.transfer.watch(str(here))
        assert caught.value.reason == "BUSY"
        for w in opened:
            w.close()
        wait_for_free_slots()


def wait_for_free_slots(timeout: float = 5.0) -> None:
    """Take and give back every watch slot of the agent (in this process), waiting for each."""
    taken = 0
    try:
        for _ in range(watch_module.MAX_ACTIVE):
            assert watch_module._active.acquire(timeout=timeout), "a cancelled watch kept its slot"
            taken += 1
    finally:
        for _ in range(taken):
            watch_module._active.release()


# --- copy_in and upload_tar_stream ------------------------------------------------------------------------


def test_copy_in_destinations_follow_docker_cp(agent: Agent, here: Path, tmp_path: Path) -> None:
    (tmp_path / "proj" / "src").mkdir(parents=True)
    (tmp_path / "proj" / "src" / "main.py").write_text("print(1)\n")
    (tmp_path / "one.txt").write_text("one\n")
    result = agent.transfer.copy_in(tmp_path / "proj", str(here))  # an existing directory: here/proj/...
    assert (result.files, result.dirs, result.bytes) == (1, 2, 9)
    assert (here / "proj" / "src" / "main.py").read_text() == "print(1)\n"
    agent.transfer.copy_in(tmp_path / "proj", f"{here}/renamed")  # a new name: here/renamed/...
    assert (here / "renamed" / "src" / "main.py").exists()
    agent.transfer.copy_in(tmp_path / "one.txt", f"{here}/copy.txt")
    with pytest.raises(AgentCallError) as caught:
        agent.transfer.copy_in(tmp_path / "one.txt", f"{here}/copy.txt")
    assert caught.value.reason == "ALREADY_EXISTS"
    (tmp_path / "one.txt").write_text("two\n")
    agent.transfer.copy_in(tmp_path / "one.txt", f"{here}/copy.txt", overwrite=True)
    assert (here / "copy.txt").read_text() == "two\n"
    with pytest.raises(UsageError, match="not a directory"):
        agent.transfer.copy_in(tmp_path / "proj", f"{here}/copy.txt")
    with pytest.raises(UsageError, match="does not exist"):
        agent.transfer.copy_in(tmp_path / "missing", str(here))


def wait_for_file(directory: Path, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.listdir(directory):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: nothing in {directory} after {timeout} s")
        time.sleep(0.005)


def test_a_failing_source_cancels_the_upload_and_its_error_is_raised(
    agent: Agent, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sandbox import upload

    # The agent rolls back on its own thread once it sees the cancellation, maybe after the
    # client's error is raised here: the test waits for the agent's upload to return.
    received = upload.receive
    returned = threading.Event()

    def receive(*args: Any) -> Any:
        try:
            return received(*args)
        finally:
            returned.set()

    monkeypatch.setattr(upload, "receive", receive)

    def chunks() -> Iterator[bytes]:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            info = tarfile.TarInfo("complete.txt")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
        yield buf.getvalue()[:1024]  # one whole member: ending here would look like a whole archive
        wait_for_file(here, "the agent staging the first member")
        raise RuntimeError("the source broke")

    with pytest.raises(RuntimeError, match="the source broke"):
        agent.transfer.upload_tar_stream(str(here), chunks())
    assert returned.wait(10), "the agent's upload did not return within 10 s of the cancel"
    assert os.listdir(here) == []
