"""Putting an image on a node without a registry, against the real Docker engine.

A second dockerd is too heavy here, so the "node" is the main engine under a tag namespace of its own
(``callbox-test/imagesync...``): the images are made for each test (``docker import`` of a file of
random bytes, so no other test has them), saved, deleted, and received through :class:`ImageReceiver`
as the node would. :func:`sync_image` is driven end to end through a port that renames the image on
its way to the "node". Every tag and image a test makes is removed in ``finally``.
"""

from __future__ import annotations

import contextlib
import io
import os
import tarfile
import time
import uuid
from collections.abc import Callable, Iterator

import docker
import docker.errors
import pytest

from harness.engine.ray.images import (
    ImageProgress,
    ImageReceiveError,
    ImageReceiver,
    ImageSyncError,
    ProgressPrinter,
    archive_size,
    local_image,
    sync_image,
)

pytestmark = pytest.mark.docker

REPO = "callbox-test/imagesync"
CHUNK = 256 << 10
MISSING = "sha256:" + "0" * 64


class Images:
    """Makes the tests' images and removes them, and every tag given to ``track``, at the end."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.token = uuid.uuid4().hex[:12]
        self.tags: list[str] = []
        self.ids: list[str] = []

    def tag(self, label: str) -> str:
        tag = f"{REPO}-{label}:{self.token}" if label else f"{REPO}:{self.token}"
        self.tags.append(tag)
        return tag

    def make(self, label: str) -> tuple[str, str]:
        """A new image with a file of random bytes, tagged ``tag(label)``: (tag, id)."""
        tag = self.tag(label)
        payload = os.urandom(700_000)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            info = tarfile.TarInfo("payload")
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
        repo, _, name = tag.rpartition(":")
        self.client.api.import_image_from_data(buffer.getvalue(), repository=repo, tag=name)
        image_id = str(self.client.images.get(tag).id)
        self.ids.append(image_id)
        return tag, image_id

    def point(self, tag: str, image_id: str) -> None:
        repo, _, name = tag.rpartition(":")
        assert self.client.api.tag(image_id, repo, name, force=True)
        self.tags.append(tag)

    def saved(self, ref: str) -> list[bytes]:
        return list(self.client.api.get_image(ref, chunk_size=CHUNK))

    def delete(self, image_id: str) -> None:
        self.client.api.remove_image(image_id, force=True)
        assert not self.exists(image_id)

    def exists(self, ref: str) -> bool:
        try:
            self.client.images.get(ref)
        except docker.errors.NotFound:
            return False
        return True

    def cleanup(self) -> None:
        for ref in [*self.tags, *self.ids]:
            with contextlib.suppress(docker.errors.NotFound):
                self.client.api.remove_image(ref, force=ref in self.ids)


@pytest.fixture
def images(engine) -> Iterator[Images]:  # type: ignore[no-untyped-def]
    made = Images(engine.client)
    try:
        yield made
    finally:
        made.cleanup()


@pytest.fixture
def receiver(engine) -> Iterator[ImageReceiver]:  # type: ignore[no-untyped-def]
    node = ImageReceiver(engine.client)
    try:
        yield node
    finally:
        node.abort()


def send(receiver: ImageReceiver, chunks: list[bytes]) -> None:
    for seq, data in enumerate(chunks):
        receiver.chunk(seq, data)


def test_a_missing_image_is_loaded_then_tagged(images: Images, receiver: ImageReceiver) -> None:
    _, image_id = images.make("src")
    chunks = images.saved(image_id)
    assert len(chunks) > 2
    images.delete(image_id)
    name = images.tag("")
    assert receiver.image_digest(name) is None

    receiver.begin(name, image_id, sum(map(len, chunks)))
    send(receiver, [chunks[0], b"", *chunks[1:]])  # an empty chunk is no end of the stream
    assert receiver.image_digest(name) is None  # nothing is tagged before the id is checked
    assert receiver.finish() == image_id

    assert receiver.image_digest(name) == image_id
    assert receiver.bytes_received == sum(map(len, chunks)) == archive_size(images.client, image_id)
    assert not receiver.active


def test_a_stale_tag_is_replaced_and_the_image_it_held_dropped(images: Images, receiver: ImageReceiver) -> None:
    _, new_id = images.make("src")
    name, stale_id = images.make("")  # only ``name`` holds it
    kept_tag, kept_id = images.make("kept")
    chunks = images.saved(new_id)

    receiver.begin(name, new_id, sum(map(len, chunks)))
    send(receiver, chunks)
    assert receiver.finish() == new_id
    assert receiver.image_digest(name) == new_id
    assert not images.exists(stale_id)

    images.point(name, kept_id)  # stale again, but this image has another tag: it stays
    receiver.begin(name, new_id, sum(map(len, chunks)))
    send(receiver, chunks)
    assert receiver.finish() == new_id
    assert receiver.image_digest(name) == new_id
    assert receiver.image_digest(kept_tag) == kept_id


def test_an_archive_of_another_image_is_refused_and_nothing_changes(images: Images, receiver: ImageReceiver) -> None:
    _, sent_id = images.make("src")
    name, before_id = images.make("")
    chunks = images.saved(sent_id)
    images.delete(sent_id)

    receiver.begin(name, MISSING, sum(map(len, chunks)))
    send(receiver, chunks)
    with pytest.raises(ImageReceiveError) as caught:
        receiver.finish()
    assert str(caught.value) == (f"the archive sent for {name} holds {sent_id}, not the announced {MISSING}; "
                                 f"{name} was left as it was ({before_id})")
    assert receiver.image_digest(name) == before_id
    assert not images.exists(sent_id)  # the image it brought is gone again


def test_a_refused_archive_that_carried_a_tag_puts_the_tag_back(images: Images, receiver: ImageReceiver) -> None:
    carried, sent_id = images.make("carried")
    chunks = images.saved(carried)  # saved by tag: loading it moves ``carried``
    _, other_id = images.make("other")
    images.point(carried, other_id)
    images.delete(sent_id)
    name = images.tag("")

    receiver.begin(name, MISSING, sum(map(len, chunks)))
    send(receiver, chunks)
    with pytest.raises(ImageReceiveError, match=f"holds {sent_id}, not the announced {MISSING}; .* \\(absent\\)"):
        receiver.finish()
    assert receiver.image_digest(carried) == other_id
    assert receiver.image_digest(name) is None
    assert not images.exists(sent_id)


def test_chunks_out_of_order_or_past_the_size_end_the_transfer(images: Images, receiver: ImageReceiver) -> None:
    _, image_id = images.make("src")
    chunks = images.saved(image_id)
    images.delete(image_id)
    name = images.tag("")
    total = sum(map(len, chunks))

    cases: list[tuple[Callable[[], None], str]] = [
        (lambda: (receiver.chunk(0, chunks[0]), receiver.chunk(2, chunks[2])),
         "chunk 2 arrived where chunk 1 was due"),
        (lambda: (receiver.chunk(0, chunks[0]), receiver.chunk(0, chunks[0])),
         "chunk 0 arrived where chunk 1 was due"),
        (lambda: receiver.chunk(0, b"x" * (total + 1)), f"chunk 0 goes past the announced {total} bytes"),
    ]
    for feed, problem in cases:
        receiver.begin(name, image_id, total)
        with pytest.raises(ImageReceiveError, match=f"^image {name}: {problem}"):
            feed()
        assert not receiver.active
        with pytest.raises(ImageReceiveError, match="without an open transfer"):
            receiver.chunk(1, chunks[1])

    receiver.begin(name, image_id, total)
    send(receiver, chunks[:-1])
    with pytest.raises(ImageReceiveError, match=f"received {total - len(chunks[-1])} of the announced {total} bytes"):
        receiver.finish()
    assert receiver.image_digest(name) is None and not images.exists(image_id)


def test_an_abort_after_every_byte_loads_nothing(images: Images, receiver: ImageReceiver) -> None:
    _, image_id = images.make("src")
    chunks = images.saved(image_id)
    images.delete(image_id)
    name = images.tag("")

    receiver.begin(name, image_id, sum(map(len, chunks)))
    send(receiver, chunks)
    receiver.abort()
    assert not receiver.active
    assert receiver.image_digest(name) is None and not images.exists(image_id)
    with pytest.raises(ImageReceiveError, match="without an open transfer"):
        receiver.finish()

    receiver.begin(name, image_id, sum(map(len, chunks)))  # a new begin replaces an open transfer
    send(receiver, chunks[:2])
    receiver.begin(name, image_id, sum(map(len, chunks)))
    send(receiver, chunks)
    assert receiver.finish() == image_id


def test_garbage_is_refused_with_dockers_reason(images: Images, receiver: ImageReceiver) -> None:
    name = images.tag("")
    garbage = os.urandom(3 * CHUNK)
    receiver.begin(name, MISSING, len(garbage))
    with pytest.raises(ImageReceiveError, match="invalid tar header"):
        for seq in range(3):
            receiver.chunk(seq, garbage[seq * CHUNK:(seq + 1) * CHUNK])
        receiver.finish()
    assert receiver.image_digest(name) is None
    assert not receiver.active


def test_a_silent_sender_is_dropped(engine, images: Images) -> None:  # type: ignore[no-untyped-def]
    _, image_id = images.make("src")
    chunks = images.saved(image_id)
    images.delete(image_id)
    name = images.tag("")
    receiver = ImageReceiver(engine.client, idle_timeout=0.5, queue_chunks=1)
    receiver.begin(name, image_id, sum(map(len, chunks)))
    receiver.chunk(0, chunks[0])
    loader = receiver._transfer.thread  # type: ignore[union-attr]  # the load request, ended by the idle limit
    assert loader is not None
    loader.join(timeout=30)
    assert not loader.is_alive()
    with pytest.raises(ImageReceiveError, match=r"the transfer was aborted \(no chunk for 0.5 s\)$"):
        receiver.chunk(1, chunks[1])
    assert not receiver.active and not images.exists(image_id)


class RenamingPort:
    """The receiver as a node: ``name`` on the harness is ``node_name`` there."""

    def __init__(self, receiver: ImageReceiver, node_name: str) -> None:
        self.receiver = receiver
        self.node_name = node_name

    def image_digest(self, name: str) -> str | None:
        return self.receiver.image_digest(self.node_name)

    def begin(self, name: str, expected_id: str, total_bytes: int) -> None:
        self.receiver.begin(self.node_name, expected_id, total_bytes)

    def chunk(self, seq: int, data: bytes) -> None:
        self.receiver.chunk(seq, data)

    def finish(self) -> str:
        return self.receiver.finish()

    def abort(self) -> None:
        self.receiver.abort()


def test_sync_image_loads_a_missing_or_stale_node_and_leaves_a_current_one(engine, images: Images) -> None:  # type: ignore[no-untyped-def]
    source, image_id = images.make("src")
    _, stale_id = images.make("stale")
    w1, w2 = ImageReceiver(engine.client), ImageReceiver(engine.client)
    nodes = {"w1": RenamingPort(w1, images.tag("w1")), "w2": RenamingPort(w2, images.tag("w2"))}
    images.point(nodes["w2"].node_name, stale_id)
    out = io.StringIO()

    assert sync_image(source, engine.client, nodes, ProgressPrinter(out), chunk_bytes=CHUNK) == {
        "w1": "loaded", "w2": "loaded"}
    assert w1.image_digest(nodes["w1"].node_name) == w2.image_digest(nodes["w2"].node_name) == image_id
    assert w1.bytes_received == w2.bytes_received == archive_size(engine.client, image_id, chunk_bytes=CHUNK)
    lines = out.getvalue().splitlines()
    assert [line.split(" (")[0] for line in lines if line.startswith("w1: sending")] == [
        f"w1: sending {source} {percent}%" for percent in range(0, 101, 10)]
    assert lines[-1].startswith(("w1: ", "w2: ")) and " loaded (" in lines[-1]

    events: list[ImageProgress] = []
    assert sync_image(source, engine.client, nodes, events.append) == {"w1": "current", "w2": "current"}
    assert [(event.node, event.state) for event in events] == [("w1", "current"), ("w2", "current")]


def test_sync_image_names_the_node_that_refused(engine, images: Images) -> None:  # type: ignore[no-untyped-def]
    source, _ = images.make("src")
    bad = RenamingPort(ImageReceiver(engine.client), "Not A Valid Tag")
    good = RenamingPort(ImageReceiver(engine.client), images.tag("good"))
    with pytest.raises(ImageSyncError) as caught:
        sync_image(source, engine.client, {"bad": bad, "good": good}, chunk_bytes=CHUNK)
    assert list(caught.value.failures) == ["bad"]
    assert "invalid image tag 'Not A Valid Tag'" in caught.value.failures["bad"]
    assert caught.value.results == {"good": "loaded"}
    assert str(caught.value).startswith(f"could not put image {source} on node bad: invalid image tag")


@pytest.mark.slow
def test_the_sandbox_image_streams_at_a_useful_rate(engine, images: Images) -> None:  # type: ignore[no-untyped-def]
    from tests.conftest import IMAGE

    local = local_image(engine.client, IMAGE)
    node = RenamingPort(ImageReceiver(engine.client), images.tag("sandbox"))
    total = archive_size(engine.client, local.id)
    started = time.monotonic()
    assert sync_image(IMAGE, engine.client, {"n1": node}) == {"n1": "loaded"}
    seconds = time.monotonic() - started
    assert node.receiver.image_digest(node.node_name) == local.id
    assert node.receiver.bytes_received == total
    print(f"\n{IMAGE}: {total / 1e6:.0f} MB received and loaded in {seconds:.1f} s ({total / seconds / 1e6:.0f} MB/s)")
