"""The sandbox image on every node without a registry: compare by content hash, stream what is missing.

The harness's image is identified by its id (``sha256:...``, the digest of its config: the same
image has the same id on every engine, and Docker checks every layer against it on load). Each node
is asked for the id its ``name`` has there; a node that lacks the image *or holds a different one*
(stale) is sent ``docker save`` of the harness's image, which the node feeds into ``docker load``
(:class:`~harness.engine.ray.image_receive.ImageReceiver`) and tags only once the loaded id matches.

The archive is saved by id, so it carries no tag: ``docker load`` moves no tag on the node before
the id is checked. It is read once and sent to all stale nodes at the same time, chunk by chunk
(each chunk goes to every node before the next is read): one ``docker save`` whatever the number of
nodes, the whole roll-out takes about as long as the slowest node, and the harness holds one chunk.
A node that fails is dropped from the fan-out and the others carry on; at the end
:class:`ImageSyncError` names every node that failed, its cause, and what the others did.

Its exact size is announced first (nodes check it and show progress against it): it is counted
once per image id per process by reading a ``docker save`` that is thrown away, because Docker
reports only the image's unpacked size (the 555 MB sandbox image: about 3 s of the local dockerd,
paid only when some node is stale). ``docker save`` of an id is deterministic, so the count holds
for the stream that follows; a node refuses a stream that does not match it.

Nothing here imports Ray: the engine wraps each node's host actor in a :class:`NodeImagePort`.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal, Protocol, TextIO, TypeVar

import docker
import docker.errors

from harness.core.errors import CallboxError, ImageNotFound, short_reason
from harness.engine.ray.image_receive import ImageReceiveError, ImageReceiver

__all__ = [
    "CHUNK_BYTES", "DockerSave", "ImageArchive", "ImageProgress", "ImageReceiveError", "ImageReceiver",
    "ImageSyncError", "LocalImage", "NodeImagePort", "ProgressPrinter", "archive_size", "local_image",
    "sync_archive", "sync_image",
]

CHUNK_BYTES = 4 << 20
MAX_WORKERS = 16

T = TypeVar("T")
SyncState = Literal["sending", "current", "loaded", "failed"]


class ImageSyncError(CallboxError):
    """The image could not be put on one or more nodes; the others were synced (see ``results``)."""

    def __init__(self, image: str, failures: Mapping[str, str], results: Mapping[str, str]) -> None:
        self.image = image
        self.failures = dict(failures)
        """node -> why its load failed"""
        self.results = dict(results)
        """node -> "current" or "loaded", for the nodes that have the image"""
        if len(self.failures) == 1:
            ((node, cause),) = self.failures.items()
            message = f"could not put image {image} on node {node}: {cause}"
        else:
            causes = "; ".join(f"{node}: {cause}" for node, cause in sorted(self.failures.items()))
            message = f"could not put image {image} on {len(self.failures)} nodes: {causes}"
        super().__init__(message)


@dataclass(frozen=True)
class LocalImage:
    """The harness's image: its id (``sha256:...``) and size as Docker reports it (unpacked bytes)."""

    id: str
    size: int


class NodeImagePort(Protocol):
    """One node's image receiver as the harness reaches it (the engine wraps a host actor in it).

    The methods are :class:`ImageReceiver`'s; each call returns when the node has done it, and
    raises when the node cannot be reached: the port bounds each call in time (a dead node must
    raise, not hang, since the fan-out waits for every node). ``chunk`` may wait while the node's
    ``docker load`` is behind, up to the receiver's idle limit.
    """

    def image_digest(self, name: str) -> str | None: ...

    def begin(self, name: str, expected_id: str, total_bytes: int) -> None: ...

    def chunk(self, seq: int, data: bytes) -> None: ...

    def finish(self) -> str: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class ImageProgress:
    """Where the image stands on one node. ``sending`` events come after each chunk; every node ends
    with one ``current``, ``loaded`` or ``failed`` event (``done``)."""

    node: str
    image: str
    bytes_sent: int
    total: int
    state: SyncState = "sending"
    error: str | None = None
    seconds: float = 0.0
    """Since the transfer to this node began (0 for a node that was current)."""

    @property
    def done(self) -> bool:
        return self.state != "sending"


def local_image(client: docker.DockerClient, name: str) -> LocalImage:
    """The local image ``name``; ImageNotFound (with the fix) when the harness has none."""
    try:
        found = client.images.get(name)
    except docker.errors.NotFound:
        raise ImageNotFound.named(name) from None
    except docker.errors.APIError as exc:
        if exc.status_code == 400:
            raise ImageNotFound.named(name) from None
        raise
    return LocalImage(id=str(found.id), size=int(found.attrs.get("Size") or 0))


_sizes: dict[tuple[str, str], int] = {}
_sizes_lock = threading.Lock()


def archive_size(client: docker.DockerClient, image_id: str, *, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Bytes of ``docker save`` of ``image_id``, counted by reading it once (then remembered)."""
    key = (client.api.base_url, image_id)
    with _sizes_lock:
        if key in _sizes:
            return _sizes[key]
    total = sum(len(chunk) for chunk in client.api.get_image(image_id, chunk_size=chunk_bytes))
    with _sizes_lock:
        _sizes[key] = total
    return total


def _cause(exc: BaseException) -> str:
    """A one-line reason for a node's failure; a remote call's wrapper (``.cause``) is seen through."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException) and inner is not exc:
        exc = inner
    if isinstance(exc, CallboxError):
        return exc.message
    return short_reason(exc) if str(exc).strip() else type(exc).__name__


class _FanOut:
    """The nodes still being sent to, each call to them run on all at once."""

    def __init__(self, name: str, image_id: str, total: int, nodes: Mapping[str, NodeImagePort],
                 pool: ThreadPoolExecutor, emit: Callable[[ImageProgress], None]) -> None:
        self.name, self.image_id, self.total = name, image_id, total
        self.live = dict(nodes)
        self.pool = pool
        self.emit = emit
        self.failures: dict[str, str] = {}
        self.loaded: dict[str, str] = {}
        self.sent = 0
        self.started = time.monotonic()

    def call(self, method: Callable[[NodeImagePort], T], *, abort: bool = True) -> dict[str, T]:
        """``method`` on every live node in parallel; a node that raises fails (and is aborted)."""
        futures: dict[str, Future[T]] = {node: self.pool.submit(method, port) for node, port in self.live.items()}
        answers: dict[str, T] = {}
        for node, future in futures.items():
            try:
                answers[node] = future.result()
            except Exception as exc:  # a node's failure is data: it leaves the fan-out, the rest go on
                self.fail(node, _cause(exc), abort=abort)
        return answers

    def fail(self, node: str, cause: str, *, abort: bool = True, quiet: bool = False) -> None:
        port = self.live.pop(node, None)
        self.failures[node] = cause
        if port is not None and abort:
            with contextlib.suppress(Exception):  # the node is failed already; its receiver times out anyway
                port.abort()
        if not quiet:
            self.emit(ImageProgress(node, self.name, self.sent, self.total, "failed", cause, self.elapsed()))

    def fail_all(self, cause: str, *, abort: bool = True, quiet: bool = False) -> None:
        for node in list(self.live):
            self.fail(node, cause, abort=abort, quiet=quiet)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


class ImageArchive(Protocol):
    """The ``docker save`` archive of one image: its exact size, and its bytes in chunks."""

    image_id: str

    def size(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...


class DockerSave:
    """``docker save`` of an image by id on the local engine (so the archive carries no tag)."""

    def __init__(self, client: docker.DockerClient, image_id: str, *, chunk_bytes: int = CHUNK_BYTES) -> None:
        self.image_id = image_id
        self._client = client
        self._chunk_bytes = chunk_bytes

    def size(self) -> int:
        return archive_size(self._client, self.image_id, chunk_bytes=self._chunk_bytes)

    def chunks(self) -> Iterator[bytes]:
        stream: Iterator[bytes] = self._client.api.get_image(self.image_id, chunk_size=self._chunk_bytes)
        return stream


def sync_image(name: str, local_client: docker.DockerClient, nodes: Mapping[str, NodeImagePort],
               progress: Callable[[ImageProgress], None] | None = None, *,
               chunk_bytes: int = CHUNK_BYTES) -> dict[str, str]:
    """Make every node's ``name`` the harness's image: node -> "current" (it had it) or "loaded".

    Nodes whose ``name`` is missing or has another id are loaded from one ``docker save`` stream.
    ``progress`` is called on the calling thread. ImageNotFound when the harness lacks the image;
    ImageSyncError naming the nodes that failed (the others are synced) otherwise.
    """
    local = local_image(local_client, name)
    return sync_archive(name, DockerSave(local_client, local.id, chunk_bytes=chunk_bytes), nodes, progress)


def sync_archive(name: str, archive: ImageArchive, nodes: Mapping[str, NodeImagePort],
                 progress: Callable[[ImageProgress], None] | None = None) -> dict[str, str]:
    """:func:`sync_image` from any archive: the comparison, the fan-out and the verdicts."""
    emit = progress or (lambda _event: None)
    results: dict[str, str] = {}
    if not nodes:
        return results
    with ThreadPoolExecutor(max_workers=min(len(nodes), MAX_WORKERS), thread_name_prefix="callbox-image") as pool:
        fan = _FanOut(name, archive.image_id, 0, nodes, pool, emit)
        digests = fan.call(lambda port: port.image_digest(name), abort=False)
        stale = {node: nodes[node] for node in fan.live if digests.get(node) != archive.image_id}
        for node in fan.live:
            if node not in stale:
                results[node] = "current"
                emit(ImageProgress(node, name, 0, 0, "current"))
        if stale:
            fan.live = stale
            try:
                _send(fan, archive)
            finally:
                # Nodes are still open only when an exception is on its way out: abort them, without events.
                fan.fail_all("the transfer was interrupted", quiet=True)
            results.update(fan.loaded)
    if fan.failures:
        raise ImageSyncError(name, fan.failures, results)
    return results


def _chunk(seq: int, data: bytes) -> Callable[[NodeImagePort], None]:
    return lambda port: port.chunk(seq, data)


def _send(fan: _FanOut, archive: ImageArchive) -> None:
    """The archive, chunk by chunk to every live node, then ``finish``; fills ``fan.loaded``."""
    try:
        fan.total = archive.size()
    except Exception as exc:  # the local engine failed: no node can be sent anything
        fan.fail_all(f"reading the harness's image failed: {_cause(exc)}", abort=False)
        return
    fan.started = time.monotonic()
    fan.call(lambda port: port.begin(fan.name, fan.image_id, fan.total))
    if not fan.live:
        return
    stream = archive.chunks()
    try:
        seq = 0
        while fan.live:
            try:
                data = next(stream)
            except StopIteration:
                break
            except Exception as exc:  # the local docker save broke off
                fan.fail_all(f"reading the harness's image failed: {_cause(exc)}")
                break
            fan.call(_chunk(seq, data))
            seq += 1
            fan.sent += len(data)
            for node in fan.live:
                fan.emit(ImageProgress(node, fan.name, fan.sent, fan.total, "sending", None, fan.elapsed()))
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    if fan.live and fan.sent != fan.total:
        fan.fail_all(f"docker save gave {fan.sent} bytes, not the {fan.total} counted before (the image changed?)")
    for node, loaded_id in fan.call(lambda port: port.finish()).items():
        if loaded_id != fan.image_id:
            fan.fail(node, f"the node loaded {loaded_id}, not {fan.image_id}")
            continue
        fan.live.pop(node)
        fan.loaded[node] = "loaded"
        fan.emit(ImageProgress(node, fan.name, fan.sent, fan.total, "loaded", None, fan.elapsed()))


class ProgressPrinter:
    """A terminal view of :func:`sync_image`: per node a line when sending starts, one per ``step``
    percent, and one at the end (with the time and rate)."""

    def __init__(self, stream: TextIO | None = None, *, step: int = 10) -> None:
        self._stream = stream
        self._step = step
        self._shown: dict[str, int] = {}

    def __call__(self, event: ImageProgress) -> None:
        if event.state == "current":
            self._line(f"{event.node}: {event.image} is current")
        elif event.state == "failed":
            self._line(f"{event.node}: {event.image} failed: {event.error}")
        elif event.state == "loaded":
            rate = event.bytes_sent / event.seconds / 1e6 if event.seconds > 0 else 0.0
            self._line(f"{event.node}: {event.image} loaded ({_mb(event.bytes_sent)} in {event.seconds:.1f} s, "
                       f"{rate:.0f} MB/s)")
        elif event.total > 0:
            percent = min(100, event.bytes_sent * 100 // event.total)
            mark = percent - percent % self._step
            if self._shown.get(event.node, -1) < mark:
                self._shown[event.node] = mark
                self._line(f"{event.node}: sending {event.image} {mark}% ({_mb(event.bytes_sent)} of "
                           f"{_mb(event.total)})")

    def _line(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(text + "\n")
        stream.flush()


def _mb(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count < 10_000_000 else f"{count / 1e6:.0f} MB"
