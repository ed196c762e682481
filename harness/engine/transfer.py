"""Files both ways between the host and a sandbox's agent: streamed tar download, copy in and out, move, watch.

Everything streams: an archive travels in messages of at most 1 MiB and neither side ever holds
it whole, so copying a gigabyte costs a few megabytes of memory on each side.

* :meth:`TransferClient.download` yields the raw tar chunks of ``Filesystem.Download``.
* :meth:`TransferClient.copy_out` unpacks that stream on the host with ``tarfile`` in stream
  mode (``r|``) through :class:`harness.engine.tarstream.Extractor`, which never writes outside
  the destination nor through a symlink, refuses a hostile archive (:class:`UnsafeArchive`) and
  leaves out symlinks that lead out of the copy (listed in ``CopyResult.skipped``). Existing
  files are replaced and existing directories merged, as ``docker cp`` does; a failure leaves
  what was already unpacked.
* :meth:`TransferClient.copy_in` writes a tar of a host file or directory as it walks it
  (:class:`harness.engine.tarstream.HostTar`) straight into ``Upload`` messages.
  The agent's Upload accepts only regular files and directories, so symlinks and special files
  on the host are left out and listed in ``CopyResult.skipped`` (a symlink given as the source
  itself is followed). Upload is all or nothing: a refusal writes nothing in the sandbox.

Destinations work like ``docker cp``: ``copy_out("/workspace/src", Path("out"))`` gives
``out/src/...`` when ``out`` is an existing directory, else ``out/...`` (``out``'s parent must
exist); ``copy_in(Path("proj"), "/workspace")`` gives ``/workspace/proj/...`` likewise, and a
file copied onto an existing file replaces it (with ``overwrite`` in the sandbox).

Errors: the agent's refusals are :class:`harness.core.errors.AgentCallError`; problems on the
host (a missing or unwritable destination, an unreadable source) are
:class:`harness.core.errors.UsageError` naming the fix.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import stat
import threading
import time
from collections.abc import Generator, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import grpc

from harness.core.errors import UsageError
from harness.engine.tarstream import (
    ChunkReader,
    Extractor,
    HostTar,
    chunked,
    host_destination,
    unreadable,
)
from sandbox.v1 import filesystem_pb2, filesystem_pb2_grpc

UPLOAD_TIMEOUT_S = 3600.0
_KINDS = {
    filesystem_pb2.WATCH_EVENT_KIND_CREATED: "created",
    filesystem_pb2.WATCH_EVENT_KIND_MODIFIED: "modified",
    filesystem_pb2.WATCH_EVENT_KIND_ATTRIB: "attrib",
    filesystem_pb2.WATCH_EVENT_KIND_REMOVED: "removed",
    filesystem_pb2.WATCH_EVENT_KIND_MOVED_FROM: "moved_from",
    filesystem_pb2.WATCH_EVENT_KIND_MOVED_TO: "moved_to",
    filesystem_pb2.WATCH_EVENT_KIND_OVERFLOW: "overflow",
}


@dataclass(frozen=True)
class CopyResult:
    """What a copy moved: counts, file content bytes, what was left out, and how long it took."""

    files: int
    dirs: int
    symlinks: int
    bytes: int
    skipped: list[str]
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {"files": self.files, "dirs": self.dirs, "symlinks": self.symlinks, "bytes": self.bytes,
                "skipped": list(self.skipped), "seconds": round(self.seconds, 3)}


@dataclass(frozen=True)
class WatchChange:
    """One change under a watched directory; ``kind`` is created, modified (content), attrib
    (metadata: a chmod), removed, moved_from, moved_to or overflow (events were lost: rescan)."""

    kind: str
    path: str
    is_dir: bool


# --- the client -------------------------------------------------------------------------------------------


@dataclass
class _Outcome:
    summary: filesystem_pb2.DownloadSummary | None = None


class TransferClient:
    """One sandbox agent's transfer operations, over the AgentClient's channel."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self._stub = filesystem_pb2_grpc.FilesystemStub(channel)

    def download(self, path: str, *, max_bytes: int = 0) -> Iterator[bytes]:
        """The tar archive of ``path`` in the sandbox, as raw chunks of at most 1 MiB, streamed.

        Members are named relative to the path's parent; ``max_bytes`` of file content at most
        (AgentCallError TOO_LARGE beyond). Close the iterator to cancel the download."""
        with contextlib.closing(self._download(path, max_bytes, _Outcome())) as messages:
            for message in messages:
                if message.data:
                    yield message.data

    def _download(
        self, path: str, max_bytes: int, outcome: _Outcome
    ) -> Generator[filesystem_pb2.DownloadChunk, None, None]:
        from harness.engine.agent_errors import translate

        call = self._stub.Download(filesystem_pb2.DownloadRequest(path=path, max_bytes=max_bytes))
        try:
            for message in call:
                if message.HasField("summary"):
                    outcome.summary = message.summary
                yield message
        except grpc.RpcError as error:
            raise translate(error) from None
        finally:
            call.cancel()

    def copy_out(self, sandbox_path: str, host_dest: Path) -> CopyResult:
        """Copy a file or directory out of the sandbox to the host (``docker cp`` destinations)."""
        started = time.monotonic()
        root, rename = host_destination(host_dest)
        try:
            root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise UsageError(f"cannot open {root} ({exc.strerror}); copy to a directory you can write to.") from None
        outcome = _Outcome()
        messages = self._download(sandbox_path, 0, outcome)
        reader = ChunkReader(message.data for message in messages)
        extractor = Extractor(root_fd, root, rename=rename)
        try:
            extractor.run(reader)
            reader.drain()  # the summary comes with the last message, after the end of the archive
        finally:
            messages.close()
            os.close(root_fd)
        skipped = list(outcome.summary.skipped_paths) if outcome.summary else []
        if outcome.summary and outcome.summary.skipped > len(skipped):
            skipped.append(f"... and {outcome.summary.skipped - len(skipped)} more left out in the sandbox")
        return CopyResult(extractor.files, extractor.dirs, extractor.symlinks, extractor.bytes,
                          skipped + extractor.skipped, time.monotonic() - started)

    def copy_in(self, host_src: Path, sandbox_dest: str, *, overwrite: bool = False) -> CopyResult:
        """Copy a host file or directory into the sandbox (``docker cp`` destinations)."""
        started = time.monotonic()
        try:
            st = os.stat(host_src)
        except FileNotFoundError:
            raise UsageError(f"{host_src} does not exist; give an existing file or directory to copy.") from None
        except OSError as exc:
            raise unreadable(host_src, exc) from None
        if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise UsageError(f"{host_src} is not a file or a directory; only those can be copied in.")
        dest_dir, top = self._sandbox_target(host_src, sandbox_dest, is_dir=stat.S_ISDIR(st.st_mode))
        tar = HostTar(host_src, top)
        result = self.upload_tar_stream(dest_dir, chunked(tar.pieces()), overwrite=overwrite)
        return CopyResult(result.files, result.dirs, 0, result.bytes, tar.skipped, time.monotonic() - started)

    def _sandbox_target(self, host_src: Path, sandbox_dest: str, *, is_dir: bool) -> tuple[str, str]:
        """The existing sandbox directory to upload into and the name the copy gets there."""
        from harness.engine.agent_errors import translate

        dest = sandbox_dest.rstrip("/") or "/"
        try:
            info = self._stub.Stat(filesystem_pb2.StatRequest(path=dest), timeout=30).info
            kind = info.type
            if kind == filesystem_pb2.FILE_TYPE_SYMLINK:
                try:
                    self._stub.List(filesystem_pb2.ListRequest(path=dest, limit=1), timeout=30)
                    kind = filesystem_pb2.FILE_TYPE_DIRECTORY
                except grpc.RpcError:
                    kind = filesystem_pb2.FILE_TYPE_FILE
        except grpc.RpcError as error:
            failure = translate(error)
            if failure.reason != "NOT_FOUND":
                raise failure from None
            kind = filesystem_pb2.FILE_TYPE_UNSPECIFIED
        if kind == filesystem_pb2.FILE_TYPE_DIRECTORY:
            return dest, host_src.resolve().name if host_src.name in ("", ".", "..") else host_src.name
        if kind != filesystem_pb2.FILE_TYPE_UNSPECIFIED and is_dir:
            raise UsageError(f"{sandbox_dest} exists in the sandbox and is not a directory; a directory cannot "
                             "be copied onto it: remove it or copy somewhere else.")
        return posixpath.dirname(dest) or ".", posixpath.basename(dest)

    def upload_tar_stream(self, dest: str, chunks: Iterable[bytes], *, overwrite: bool = False) -> CopyResult:
        """Stream a tar archive (chunks of any size, at most 32 MiB each) into the existing sandbox
        directory ``dest``; the agent unpacks it all or nothing (``sandbox/upload.py``).

        If ``chunks`` raises, the upload is cancelled (so the agent writes nothing) and that
        exception is raised here."""
        from harness.engine.agent_errors import translate

        started = time.monotonic()
        failure: list[BaseException] = []
        calls: list[grpc.Future] = []
        started_call = threading.Event()

        def messages() -> Iterator[filesystem_pb2.UploadChunk]:
            yield filesystem_pb2.UploadChunk(dest=dest, overwrite=overwrite)
            try:
                for piece in chunks:
                    yield filesystem_pb2.UploadChunk(data=piece)
            except Exception as exc:
                # Ending the stream here would look like a complete archive if it stopped at a
                # member boundary: cancel the call instead, and the agent rolls back.
                failure.append(exc)
                started_call.wait()
                calls[0].cancel()

        call = self._stub.Upload.future(messages(), timeout=UPLOAD_TIMEOUT_S)
        calls.append(call)
        started_call.set()
        try:
            response = call.result()
        except (grpc.RpcError, grpc.FutureCancelledError) as error:
            if failure:
                raise failure[0] from None
            if isinstance(error, grpc.RpcError):
                raise translate(error) from None
            raise
        except BaseException:
            call.cancel()
            raise
        return CopyResult(response.files_written, response.dirs_created, 0, response.bytes_written, [],
                          time.monotonic() - started)

    def move(self, source: str, destination: str, *, overwrite: bool = False) -> None:
        """Rename or move ``source`` to ``destination`` in the sandbox (the new path, not a directory
        to move into); without ``overwrite`` an existing destination is ALREADY_EXISTS."""
        from harness.engine.agent_errors import translate

        request = filesystem_pb2.MoveRequest(source=source, destination=destination, overwrite=overwrite)
        try:
            self._stub.Move(request, timeout=300)
        except grpc.RpcError as error:
            raise translate(error) from None

    def watch(self, path: str, *, recursive: bool = False) -> Watch:
        """Watch a sandbox directory; returns once the agent's watches are in place (READY), so
        every change made after this call is reported. Iterate it for WatchChange; close it to stop."""
        return Watch(self._stub, path, recursive=recursive)


class Watch(Iterator[WatchChange]):
    """A running Filesystem.Watch: an iterator of changes; ``close()`` (or ``with``) cancels it."""

    def __init__(self, stub: filesystem_pb2_grpc.FilesystemStub, path: str, *, recursive: bool) -> None:
        self._cancelled = False
        self._call = stub.Watch(filesystem_pb2.WatchRequest(path=path, recursive=recursive))
        first = self._next_event()
        if first is None or not first.ready:
            self.close()
            raise UsageError(f"the watch of {path} ended before it was ready; try again.")

    def _next_event(self) -> filesystem_pb2.WatchEvent | None:
        from harness.engine.agent_errors import translate

        try:
            return next(self._call, None)
        except grpc.RpcError as error:
            # A cancelled Watch (close(), or the CallScope it was started in) is its normal end.
            if self._cancelled or (isinstance(error, grpc.Call) and error.code() == grpc.StatusCode.CANCELLED):
                return None
            raise translate(error) from None

    def __next__(self) -> WatchChange:
        event = self._next_event()
        if event is None:
            raise StopIteration
        return WatchChange(_KINDS.get(event.kind, "overflow"), event.path, event.is_dir)

    def close(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

