"""Receiving the sandbox image on a node without a registry: ``docker load`` fed as a stream.

The harness sends ``docker save`` of its image in numbered chunks (see
:mod:`harness.engine.ray.images`). This side feeds them, in order, into one ``docker load``
request through a bounded queue that a loader thread drains, so a node holds only a few chunks
in memory whatever the image's size. Nothing is tagged until the load is over and the loaded
image's id (the digest of its config, against which Docker checks every layer it loads) equals
the id the harness announced; only then is ``name`` moved to it, and the image it replaces is
removed if nothing else holds it (no tag, no container, no child image). A refused load leaves
``name`` where it was, puts back any tag the archive carried, and removes the image it brought.

One transfer at a time: ``begin`` while one is open aborts that one (its sender is gone or was
replaced). A transfer whose sender goes silent for ``idle_timeout`` seconds is aborted by the
loader, so a dead harness does not hold a Docker request open. Calls may come from several
threads (a threaded actor); chunks must come one at a time, in order.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import docker
import docker.errors

from harness.core.errors import CallboxError, short_reason
from harness.engine.image.engine import split_tag
from harness.engine.image.errors import ImageBuildError

log = logging.getLogger("callbox.ray.images")

QUEUE_CHUNKS = 4
"""Chunks waiting for ``docker load`` at most; a sender's next chunk waits until one is taken."""
MAX_CHUNK_BYTES = 64 << 20
IDLE_TIMEOUT_S = 120.0
"""How long a transfer waits for its next chunk (or for Docker to take one) before it is aborted."""
LOAD_TIMEOUT_S = 900.0
"""How long ``finish`` waits for Docker to register the image after the last byte."""
_POLL_S = 0.2
_IMAGE_ID = re.compile(r"sha256:[0-9a-f]{64}")
_LOADED_ID = "Loaded image ID: "
_LOADED_REF = "Loaded image: "


class ImageReceiveError(CallboxError):
    """A node could not take the image it was sent; the message names the image and the cause."""


class _Cancelled(Exception):
    """Raised inside the request body to make ``docker load`` fail and load nothing."""


class _Transfer:
    """One image on its way in: the queue the loader reads, and what was there before."""

    def __init__(self, name: str, expected_id: str, total_bytes: int, queue_chunks: int) -> None:
        self.name = name
        self.expected_id = expected_id
        self.total_bytes = total_bytes
        self.chunks: queue.Queue[bytes | None] = queue.Queue(maxsize=queue_chunks)
        self.cancelled = threading.Event()
        self.reason = ""
        self.next_seq = 0
        self.received = 0
        self.events: list[dict[str, Any]] = []
        self.error: Exception | None = None
        self.thread: threading.Thread | None = None
        self.before_name: str | None = None
        self.before_tags: dict[str, str] = {}
        self.before_ids: set[str] = set()


class ImageReceiver:
    """The node's side of an image transfer, on the node's own Docker engine."""

    def __init__(self, client: docker.DockerClient, *, queue_chunks: int = QUEUE_CHUNKS,
                 idle_timeout: float = IDLE_TIMEOUT_S, load_timeout: float = LOAD_TIMEOUT_S) -> None:
        self._client = client
        self._queue_chunks = queue_chunks
        self._idle_timeout = idle_timeout
        self._load_timeout = load_timeout
        self._lock = threading.Lock()
        self._feed = threading.Lock()
        self._transfer: _Transfer | None = None
        self._last_received = 0

    # ---- queries ---------------------------------------------------------------------------------

    def image_digest(self, name: str) -> str | None:
        """The id (``sha256:...``, the digest of its config) of the local image ``name``; None if missing."""
        try:
            return str(self._client.images.get(name).id)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            if exc.status_code == 400:  # 20.10 answers an invalid reference with 400
                return None
            raise

    @property
    def active(self) -> bool:
        with self._lock:
            return self._transfer is not None

    @property
    def bytes_received(self) -> int:
        """Bytes taken by the open transfer, or by the last one once it is over."""
        with self._lock:
            return self._transfer.received if self._transfer is not None else self._last_received

    # ---- the transfer ----------------------------------------------------------------------------

    def begin(self, name: str, expected_id: str, total_bytes: int) -> None:
        """Open a transfer of ``total_bytes`` of ``docker save`` output holding image ``expected_id``,
        to be tagged ``name``. An open transfer is aborted first."""
        try:
            split_tag(name)
        except ImageBuildError as exc:
            raise ImageReceiveError(exc.message) from None
        if not _IMAGE_ID.fullmatch(expected_id):
            raise ImageReceiveError(f"expected image id {expected_id!r} for {name} is not sha256:<64 hex digits>")
        if total_bytes <= 0:
            raise ImageReceiveError(f"an image archive of {total_bytes} bytes for {name} cannot hold an image")
        with self._lock:
            previous, self._transfer = self._transfer, None
        if previous is not None:
            log.warning("image %s: a new transfer began while one of %s was open; aborting that one",
                        name, previous.name)
            self._cancel(previous, "a new transfer began")
        transfer = _Transfer(name, expected_id, total_bytes, self._queue_chunks)
        transfer.before_name = self.image_digest(name)
        for image in self._client.api.images(all=True):
            transfer.before_ids.add(str(image["Id"]))
            for tag in image.get("RepoTags") or []:
                if tag != "<none>:<none>":
                    transfer.before_tags[tag] = str(image["Id"])
        transfer.thread = threading.Thread(target=self._load, args=(transfer,), name="callbox-image-load",
                                           daemon=True)
        transfer.thread.start()
        with self._lock:
            self._transfer = transfer
        log.info("image %s: receiving %s (%d bytes)", name, expected_id[7:19], total_bytes)

    def chunk(self, seq: int, data: bytes) -> None:
        """Take chunk ``seq`` (0, 1, 2, ...); it waits while ``docker load`` is behind. A chunk out of
        order, or past the announced size, aborts the transfer."""
        with self._feed:
            transfer = self._open("chunk")
            with self._lock:
                problem = None
                if seq != transfer.next_seq:
                    problem = f"chunk {seq} arrived where chunk {transfer.next_seq} was due"
                elif len(data) > MAX_CHUNK_BYTES:
                    problem = f"chunk {seq} has {len(data)} bytes, more than {MAX_CHUNK_BYTES}"
                elif transfer.received + len(data) > transfer.total_bytes:
                    problem = (f"chunk {seq} goes past the announced {transfer.total_bytes} bytes "
                               f"({transfer.received + len(data)})")
                else:
                    transfer.next_seq += 1
                    transfer.received += len(data)
            if problem is not None:
                self._end(transfer, problem)
                raise ImageReceiveError(f"image {transfer.name}: {problem}; nothing was loaded, begin again")
            self._put(transfer, bytes(data))

    def finish(self) -> str:
        """Close the stream, wait for ``docker load``, check the image's id, tag ``name``; the id."""
        with self._feed:
            transfer = self._open("finish")
            if transfer.received != transfer.total_bytes:
                problem = f"received {transfer.received} of the announced {transfer.total_bytes} bytes"
                self._end(transfer, problem)
                raise ImageReceiveError(f"image {transfer.name}: {problem}; nothing was loaded")
            self._put(transfer, None)
            thread = transfer.thread
            assert thread is not None
            thread.join(self._load_timeout)
            if thread.is_alive():
                self._end(transfer, "docker load did not finish in time")
                raise ImageReceiveError(
                    f"image {transfer.name}: docker load did not finish within {self._load_timeout:g} s "
                    "after the last byte")
            self._detach(transfer)
            return self._conclude(transfer)

    def abort(self) -> None:
        """Drop the open transfer, if any; Docker loads nothing of it."""
        with self._lock:
            transfer, self._transfer = self._transfer, None
            if transfer is not None:
                self._last_received = transfer.received
        if transfer is not None:
            self._cancel(transfer, "aborted by the sender")
            log.info("image %s: transfer aborted after %d bytes", transfer.name, transfer.received)

    # ---- internals -------------------------------------------------------------------------------

    def _open(self, what: str) -> _Transfer:
        with self._lock:
            transfer = self._transfer
        if transfer is None:
            raise ImageReceiveError(f"image {what} without an open transfer (begin first; it may have been "
                                    "aborted or replaced)")
        return transfer

    def _detach(self, transfer: _Transfer) -> None:
        with self._lock:
            if self._transfer is transfer:
                self._transfer = None
            self._last_received = transfer.received

    def _end(self, transfer: _Transfer, reason: str) -> None:
        self._detach(transfer)
        self._cancel(transfer, reason)

    def _cancel(self, transfer: _Transfer, reason: str) -> None:
        transfer.reason = transfer.reason or reason
        transfer.cancelled.set()
        with contextlib.suppress(queue.Full):  # a full queue is being read anyway
            transfer.chunks.put_nowait(b"")  # wakes the loader
        if transfer.thread is not None:
            transfer.thread.join(timeout=10.0)

    def _put(self, transfer: _Transfer, item: bytes | None) -> None:
        """Queue ``item`` for the loader, waiting while the queue is full; fail if the load ended."""
        deadline = time.monotonic() + self._idle_timeout
        while True:
            if transfer.cancelled.is_set():
                self._detach(transfer)
                raise ImageReceiveError(f"image {transfer.name}: the transfer was aborted ({transfer.reason})")
            thread = transfer.thread
            if thread is not None and not thread.is_alive():
                self._detach(transfer)
                raise ImageReceiveError(f"image {transfer.name}: docker load ended before the last byte "
                                        f"({self._load_problem(transfer) or 'no reason given'})")
            try:
                transfer.chunks.put(item, timeout=_POLL_S)
                return
            except queue.Full:
                if time.monotonic() > deadline:
                    self._end(transfer, "docker load stopped reading")
                    raise ImageReceiveError(f"image {transfer.name}: docker load took nothing for "
                                            f"{self._idle_timeout:g} s; aborted") from None

    def _body(self, transfer: _Transfer) -> Iterator[bytes]:
        """The request body of ``docker load``: the queued chunks until the end mark."""
        while True:
            try:
                item = transfer.chunks.get(timeout=self._idle_timeout)
            except queue.Empty:
                transfer.reason = transfer.reason or f"no chunk for {self._idle_timeout:g} s"
                transfer.cancelled.set()
                raise _Cancelled(transfer.reason) from None
            if transfer.cancelled.is_set():
                raise _Cancelled(transfer.reason)
            if item is None:
                return
            if item:  # in a chunked request body an empty chunk is the end mark
                yield item

    def _load(self, transfer: _Transfer) -> None:
        """The loader thread: one ``docker load`` request whose body is the queue."""
        try:
            # quiet: without progress bars Docker writes nothing until the end, so a response it
            # cannot send never stops it from reading the body.
            load: Callable[..., Iterator[dict[str, Any]]] = self._client.api.load_image
            transfer.events = list(load(self._body(transfer), quiet=True))
        except _Cancelled:
            log.info("image %s: load cancelled (%s)", transfer.name, transfer.reason)
        except Exception as exc:  # requests and docker raise many kinds; chunk()/finish() report it
            transfer.error = exc
            if transfer.cancelled.is_set() or isinstance(exc.__context__, _Cancelled):
                log.info("image %s: load cancelled (%s)", transfer.name, transfer.reason)
            else:
                log.warning("image %s: docker load failed: %s", transfer.name, short_reason(exc))

    @staticmethod
    def _load_problem(transfer: _Transfer) -> str | None:
        for event in transfer.events:
            if event.get("error"):
                return str(event["error"]).strip()
        if transfer.error is not None:
            return short_reason(transfer.error)
        return None

    def _conclude(self, transfer: _Transfer) -> str:
        name, expected = transfer.name, transfer.expected_id
        problem = self._load_problem(transfer)
        if problem is not None:
            raise ImageReceiveError(f"docker load of {name} ({expected[7:19]}) failed: {problem}")
        ids: set[str] = set()
        refs: list[str] = []
        for event in transfer.events:
            for line in str(event.get("stream") or "").splitlines():
                if line.startswith(_LOADED_ID):
                    ids.add(line[len(_LOADED_ID):].strip())
                elif line.startswith(_LOADED_REF):
                    refs.append(line[len(_LOADED_REF):].strip())
        for ref in refs:
            found = self.image_digest(ref)
            if found is not None:
                ids.add(found)
        if ids != {expected}:
            self._restore(transfer, refs, ids)
            held = ", ".join(sorted(ids)) or "no image"
            kept = transfer.before_name or "absent"
            raise ImageReceiveError(
                f"the archive sent for {name} holds {held}, not the announced {expected}; "
                f"{name} was left as it was ({kept})")
        repo, tag = split_tag(name)
        if not self._client.api.tag(expected, repo, tag, force=True):
            raise ImageReceiveError(f"image {name}: the Docker engine refused the tag on {expected}")
        self._drop_replaced(transfer.before_name, expected)
        log.info("image %s: loaded %s (%d bytes)", name, expected[7:19], transfer.received)
        return expected

    def _restore(self, transfer: _Transfer, refs: list[str], loaded: set[str]) -> None:
        """Undo a refused load: tags the archive moved go back, images it brought go away."""
        for ref in refs:
            try:
                before = transfer.before_tags.get(ref)
                if before is None:
                    self._client.api.remove_image(ref)
                elif self.image_digest(ref) != before:
                    repo, tag = split_tag(ref)
                    self._client.api.tag(before, repo, tag, force=True)
            except (docker.errors.APIError, ImageBuildError) as exc:
                log.warning("image %s: could not put tag %s back: %s", transfer.name, ref, short_reason(exc))
        for image_id in loaded - transfer.before_ids:
            self._remove_if_unused(image_id)

    def _drop_replaced(self, old: str | None, new: str) -> None:
        """The image ``name`` pointed to before goes if nothing holds it any more (a node does not
        pile up stale copies of a large image); one a container or child image uses stays."""
        if old is not None and old != new:
            self._remove_if_unused(old)

    def _remove_if_unused(self, image_id: str) -> None:
        try:
            tags = [t for t in self._client.images.get(image_id).tags if t != "<none>:<none>"]
            if tags:
                return
            self._client.api.remove_image(image_id)
            log.info("removed image %s: nothing uses it any more", image_id[7:19])
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:  # 409: a container or a child image still uses it
            log.debug("image %s stays: %s", image_id[7:19], short_reason(exc))
