"""Pure logic of putting the image on the nodes (harness/engine/ray/images.py): which nodes are sent
the image, in what order the chunks go, what a node's failure does to the others, and how progress is
shown. Nodes and the archive are in-memory stand-ins; the real receiver runs against the real Docker
engine in tests/integration/test_image_sync.py."""

from __future__ import annotations

import hashlib
import io
import threading
from collections.abc import Iterator

import pytest

from harness.core.errors import CallboxError
from harness.engine.ray.images import ImageProgress, ImageSyncError, ProgressPrinter, sync_archive

NAME = "callbox-sandbox:latest"
IMAGE = "sha256:" + hashlib.sha256(b"the harness's image").hexdigest()
OTHER = "sha256:" + hashlib.sha256(b"an older image").hexdigest()


class Archive:
    """An image archive in memory, cut into ``chunk`` byte pieces."""

    def __init__(self, data: bytes, *, chunk: int = 10, image_id: str = IMAGE, size: int | None = None,
                 break_at: int | None = None) -> None:
        self.image_id = image_id
        self.data = data
        self.chunk = chunk
        self._size = len(data) if size is None else size
        self.break_at = break_at
        self.closed = False
        self.sizes_asked = 0

    def size(self) -> int:
        self.sizes_asked += 1
        return self._size

    def chunks(self) -> Iterator[bytes]:
        try:
            for index, start in enumerate(range(0, len(self.data), self.chunk)):
                if index == self.break_at:
                    raise ConnectionError("the engine closed the stream")
                yield self.data[start:start + self.chunk]
        finally:
            self.closed = True


class Node:
    """A node's receiver: its current image id, what it was sent, and where it is told to fail."""

    def __init__(self, current: str | None = None, *, fail_at: int | None = None, loads_as: str | None = None,
                 digest_error: Exception | None = None, finish_error: Exception | None = None) -> None:
        self.current = current
        self.fail_at = fail_at
        self.loads_as = loads_as
        self.digest_error = digest_error
        self.finish_error = finish_error
        self.calls: list[str] = []
        self.seqs: list[int] = []
        self.received = io.BytesIO()
        self.announced: tuple[str, str, int] | None = None
        self.lock = threading.Lock()

    def image_digest(self, name: str) -> str | None:
        self.calls.append("image_digest")
        if self.digest_error is not None:
            raise self.digest_error
        return self.current

    def begin(self, name: str, expected_id: str, total_bytes: int) -> None:
        self.calls.append("begin")
        self.announced = (name, expected_id, total_bytes)

    def chunk(self, seq: int, data: bytes) -> None:
        self.calls.append("chunk")
        if seq == self.fail_at:
            raise CallboxError(f"docker load failed: disk full at chunk {seq}")
        self.seqs.append(seq)
        self.received.write(data)

    def finish(self) -> str:
        self.calls.append("finish")
        if self.finish_error is not None:
            raise self.finish_error
        assert self.announced is not None
        self.current = self.loads_as or self.announced[1]
        return self.current

    def abort(self) -> None:
        self.calls.append("abort")


DATA = bytes(range(256)) * 4  # 1024 bytes: 103 chunks of 10


def test_current_nodes_are_left_alone_and_missing_or_stale_ones_loaded() -> None:
    nodes = {"w1": Node(IMAGE), "w2": Node(None), "w3": Node(OTHER)}
    archive = Archive(DATA)
    assert sync_archive(NAME, archive, nodes) == {"w1": "current", "w2": "loaded", "w3": "loaded"}
    assert nodes["w1"].calls == ["image_digest"]
    for node in ("w2", "w3"):
        assert nodes[node].received.getvalue() == DATA
        assert nodes[node].announced == (NAME, IMAGE, len(DATA))
        assert nodes[node].current == IMAGE
        assert nodes[node].calls[-1] == "finish"


def test_no_node_stale_reads_no_archive() -> None:
    archive = Archive(DATA)
    assert sync_archive(NAME, archive, {"w1": Node(IMAGE), "w2": Node(IMAGE)}) == {"w1": "current", "w2": "current"}
    assert archive.sizes_asked == 0 and not archive.closed
    assert sync_archive(NAME, archive, {}) == {}


def test_chunks_go_in_order_each_to_every_node_before_the_next() -> None:
    nodes = {"w1": Node(), "w2": Node()}
    sync_archive(NAME, Archive(DATA, chunk=100), nodes)
    for node in nodes.values():
        assert node.seqs == list(range(11))
        assert node.calls == ["image_digest", "begin", *["chunk"] * 11, "finish"]


def test_a_node_failing_mid_stream_is_aborted_and_the_others_finish() -> None:
    nodes = {"w1": Node(), "w2": Node(fail_at=3), "w3": Node(OTHER)}
    events: list[ImageProgress] = []
    with pytest.raises(ImageSyncError) as caught:
        sync_archive(NAME, Archive(DATA), nodes, events.append)
    error = caught.value
    assert isinstance(error, CallboxError)
    assert error.failures == {"w2": "docker load failed: disk full at chunk 3"}
    assert error.results == {"w1": "loaded", "w3": "loaded"}
    assert str(error) == f"could not put image {NAME} on node w2: docker load failed: disk full at chunk 3"
    assert nodes["w2"].calls == ["image_digest", "begin", "chunk", "chunk", "chunk", "chunk", "abort"]
    assert nodes["w1"].received.getvalue() == nodes["w3"].received.getvalue() == DATA
    failed = [event for event in events if event.node == "w2" and event.done]
    assert [(event.state, event.error, event.bytes_sent) for event in failed] == [
        ("failed", "docker load failed: disk full at chunk 3", 30)]


def test_every_failing_node_is_named() -> None:
    nodes = {"w1": Node(fail_at=0), "w2": Node(loads_as=OTHER), "w3": Node(digest_error=TimeoutError("no answer"))}
    with pytest.raises(ImageSyncError) as caught:
        sync_archive(NAME, Archive(DATA), nodes)
    assert caught.value.failures == {
        "w1": "docker load failed: disk full at chunk 0",
        "w2": f"the node loaded {OTHER}, not {IMAGE}",
        "w3": "no answer",
    }
    assert caught.value.results == {}
    message = str(caught.value)
    assert message.startswith(f"could not put image {NAME} on 3 nodes: w1: ")
    assert "w2: the node loaded" in message and "w3: no answer" in message
    assert nodes["w3"].calls == ["image_digest"]  # never begun: nothing to abort


def test_a_remote_error_is_reported_by_its_cause() -> None:
    class Wrapped(Exception):
        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::SandboxHost.image_finish() (pid=1, ip=10.250.0.2)\n  traceback ...")
            self.cause = cause

    nodes = {"w1": Node(finish_error=Wrapped(CallboxError("the archive holds sha256:aa, not sha256:bb")))}
    with pytest.raises(ImageSyncError, match=r"on node w1: the archive holds sha256:aa, not sha256:bb$"):
        sync_archive(NAME, Archive(DATA), nodes)


def test_a_broken_local_stream_fails_every_node_and_aborts_them() -> None:
    nodes = {"w1": Node(), "w2": Node()}
    archive = Archive(DATA, break_at=5)
    with pytest.raises(ImageSyncError) as caught:
        sync_archive(NAME, archive, nodes)
    assert set(caught.value.failures) == {"w1", "w2"}
    assert all("the engine closed the stream" in cause for cause in caught.value.failures.values())
    for node in nodes.values():
        assert node.calls[-1] == "abort" and "finish" not in node.calls
    assert archive.closed


def test_a_stream_shorter_than_counted_is_not_finished() -> None:
    nodes = {"w1": Node()}
    with pytest.raises(ImageSyncError, match=f"docker save gave 1024 bytes, not the {len(DATA) + 5} counted"):
        sync_archive(NAME, Archive(DATA, size=len(DATA) + 5), nodes)
    assert "finish" not in nodes["w1"].calls and nodes["w1"].calls[-1] == "abort"


def test_an_exception_in_the_caller_aborts_the_open_transfers() -> None:
    nodes = {"w1": Node(), "w2": Node(IMAGE)}

    def progress(event: ImageProgress) -> None:
        if event.bytes_sent >= 50:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        sync_archive(NAME, Archive(DATA), nodes, progress)
    assert nodes["w1"].calls[-1] == "abort" and "finish" not in nodes["w1"].calls
    assert nodes["w2"].calls == ["image_digest"]


def test_progress_events_count_up_to_the_total_and_end_once_per_node() -> None:
    events: list[ImageProgress] = []
    sync_archive(NAME, Archive(DATA, chunk=256), {"w1": Node(), "w2": Node(IMAGE)}, events.append)
    w1 = [event for event in events if event.node == "w1"]
    assert [(event.bytes_sent, event.total, event.state) for event in w1] == [
        (256, 1024, "sending"), (512, 1024, "sending"), (768, 1024, "sending"), (1024, 1024, "sending"),
        (1024, 1024, "loaded")]
    assert [event.done for event in w1] == [False, False, False, False, True]
    assert [(event.state, event.done) for event in events if event.node == "w2"] == [("current", True)]


def test_the_printer_writes_a_line_per_tenth_per_node() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out)
    sync_archive(NAME, Archive(bytes(100_000), chunk=1000), {"w1": Node(), "w2": Node(), "w3": Node(IMAGE)},
                 printer)
    lines = out.getvalue().splitlines()
    assert lines[0] == f"w3: {NAME} is current"
    for node in ("w1", "w2"):
        mine = [line for line in lines if line.startswith(f"{node}: ")]
        assert mine[:-1] == [f"{node}: sending {NAME} {percent}% ({percent / 1000:.1f} MB of 0.1 MB)"
                             for percent in range(0, 101, 10)]
        assert mine[-1].startswith(f"{node}: {NAME} loaded (0.1 MB in ")
    assert len(lines) == 1 + 2 * 12


def test_the_printer_shows_a_failure_and_a_coarser_step() -> None:
    out = io.StringIO()
    printer = ProgressPrinter(out, step=25)
    for sent in range(0, 1001, 10):
        printer(ImageProgress("w1", NAME, sent, 1000))
    printer(ImageProgress("w1", NAME, 1000, 1000, "failed", "docker load failed: no space left on device", 2.0))
    assert out.getvalue().splitlines() == [
        *[f"w1: sending {NAME} {p}% ({p * 10 / 1e6:.1f} MB of 0.0 MB)" for p in (0, 25, 50, 75, 100)],
        f"w1: {NAME} failed: docker load failed: no space left on device",
    ]
