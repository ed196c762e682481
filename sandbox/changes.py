"""The Changes gRPC service: what changed in the writable places since the previous scan.

The harness asks, after each tool call that may change files, what the call changed. The agent
keeps an index of the places between scans (:class:`sandbox.change_index.PlaceIndex`, one per
distinct set of places, refreshed from inotify); a Scan refreshes it, reports each entry whose
key differs from the index (removed entries one by one, each path on its own), the content
following each new or changed regular file, and commits the index once the stream has
completed: a Scan cut short makes the next one walk everything again, so it reports the same
changes. The first Scan, and one with ``reset``, reports every entry: the harness's baseline.

It runs as the tool user, so it sees what the tool user sees: a directory that user cannot
read is skipped and counted, a file it cannot read is reported ``unreadable`` without content.
The identity is held only while touching the filesystem, never across a ``yield``: a file's fd
is opened as the tool user and read after.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import threading
from collections.abc import Callable, Iterator

import grpc

from sandbox.change_index import Key, PlaceIndex
from sandbox.errors import BUSY, INTERNAL, INVALID_ARGUMENT, TOO_LARGE, AgentError, abort
from sandbox.fs import FilesystemService
from sandbox.paths import os_error
from sandbox.v1 import changes_pb2, changes_pb2_grpc, filesystem_pb2

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20
LOCK_WAIT_S = 60.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC



def _type(mode: int) -> filesystem_pb2.FileType.ValueType:
    if stat.S_ISREG(mode):
        return filesystem_pb2.FILE_TYPE_FILE
    if stat.S_ISDIR(mode):
        return filesystem_pb2.FILE_TYPE_DIRECTORY
    if stat.S_ISLNK(mode):
        return filesystem_pb2.FILE_TYPE_SYMLINK
    return filesystem_pb2.FILE_TYPE_OTHER


class ChangesService(changes_pb2_grpc.ChangesServicer):
    """sandbox.v1.Changes over the Filesystem service's roots, as the tool user."""

    def __init__(self, files: FilesystemService) -> None:
        self._files = files
        self._resolver = files.resolver
        self._acting: Callable[[], contextlib.AbstractContextManager[None]] = files.acting
        self._indexes: dict[tuple[str, ...], PlaceIndex] = {}
        self._lock = threading.Lock()
        """One Scan at a time: a second one would compare against an index the first has not committed."""

    def Scan(self, request: changes_pb2.ScanRequest, context: grpc.ServicerContext) -> Iterator[changes_pb2.ScanChunk]:
        try:
            yield from self.scan(request)
        except AgentError as exc:
            abort(context, exc)
        except OSError as exc:
            abort(context, AgentError(INTERNAL, f"Scan failed: {exc.strerror}."))
        except Exception:
            log.exception("Changes.Scan failed unexpectedly")
            abort(context, AgentError(INTERNAL, "The agent failed internally during Scan."))

    def Apply(self, request: changes_pb2.ApplyRequest, context: grpc.ServicerContext) -> changes_pb2.ApplyResponse:
        path = ""
        try:
            with self._acting():
                for op in request.ops:
                    path = op.path
                    self.apply(op)
            return changes_pb2.ApplyResponse(applied=len(request.ops))
        except AgentError as exc:
            abort(context, exc)
        except OSError as exc:
            abort(context, os_error(exc, path))
        except Exception:
            log.exception("Changes.Apply failed unexpectedly")
            abort(context, AgentError(INTERNAL, "The agent failed internally during Apply."))

    def apply(self, op: changes_pb2.ApplyOp) -> None:
        """One operation (run inside the tool user's identity)."""
        kind = op.kind
        if kind == changes_pb2.ApplyOp.REMOVE:
            self._files.remove(filesystem_pb2.RemoveRequest(path=op.path, recursive=True))
        elif kind == changes_pb2.ApplyOp.MAKE_DIR:
            self._files.make_dir(filesystem_pb2.MakeDirRequest(path=op.path, exist_ok=True))
        elif kind == changes_pb2.ApplyOp.WRITE:
            self._files.write(filesystem_pb2.WriteRequest(path=op.path, data=op.data, mode=op.mode or 0o600,
                                                          append=op.append))
        elif kind == changes_pb2.ApplyOp.SYMLINK:
            with self._resolver.resolve(op.path, follow_final=False) as res:
                os.symlink(op.link_target, res.name, dir_fd=res.dir_fd)
        elif kind == changes_pb2.ApplyOp.CHMOD:
            with self._resolver.resolve(op.path, follow_final=False) as res:
                fd = os.open(res.name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=res.dir_fd)
                try:
                    if not stat.S_ISLNK(os.fstat(fd).st_mode):
                        os.chmod(f"/proc/self/fd/{fd}", op.mode & 0o7777)
                finally:
                    os.close(fd)
        else:
            raise AgentError(INVALID_ARGUMENT, f"Unknown operation {kind} for {op.path}.")

    def scan(self, request: changes_pb2.ScanRequest) -> Iterator[changes_pb2.ScanChunk]:
        places = tuple(sorted(set(request.places)))
        if not places:
            raise AgentError(INVALID_ARGUMENT, "Scan needs at least one place.")
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise AgentError(BUSY, "Another Scan has been running for a minute; try again.")
        try:
            yield from self._scan(places, request)
        finally:
            self._lock.release()

    def _scan(self, places: tuple[str, ...], request: changes_pb2.ScanRequest) -> Iterator[changes_pb2.ScanChunk]:
        index = self._indexes.get(places)
        if index is None or request.reset:
            if index is not None:
                index.close()
            index = self._indexes[places] = PlaceIndex(places, tuple(request.skip_prefixes))
        with self._acting():
            old = {} if request.reset else index.entries
            entries, touched = index.refresh(self._open_place)
        index.invalidate()  # until the report is complete
        sent = reported = 0
        for path in sorted(touched):
            key = entries.get(path)
            if key == old.get(path):
                continue
            reported += 1
            if key is None:
                yield changes_pb2.ScanChunk(entry=changes_pb2.ScanEntry(path=path, removed=True))
                continue
            for chunk in self._entry(path, key):
                sent += len(chunk.data)
                if request.max_bytes and sent > request.max_bytes:
                    raise AgentError(TOO_LARGE, f"The changed content passes {request.max_bytes} bytes.")
                yield chunk
        index.commit(entries)
        yield changes_pb2.ScanChunk(summary=changes_pb2.ScanSummary(
            entries=len(entries), reported=reported, bytes=sent, unreadable_dirs=index.unreadable_dirs))

    def _entry(self, path: str, key: Key) -> Iterator[changes_pb2.ScanChunk]:
        """The entry's message, followed by its content for a regular file."""
        mode = key[0]
        entry = changes_pb2.ScanEntry(path=path, type=_type(mode), mode=stat.S_IMODE(mode), size=key[1],
                                      link_target=key[5])
        fd = self._open_file(path) if stat.S_ISREG(mode) else None
        if fd is None:
            entry.unreadable = stat.S_ISREG(mode)
            yield changes_pb2.ScanChunk(entry=entry)
            return
        try:
            data = os.read(fd, CHUNK_BYTES)
            yield changes_pb2.ScanChunk(entry=entry, data=data)
            while data:
                data = os.read(fd, CHUNK_BYTES)
                if data:
                    yield changes_pb2.ScanChunk(data=data)
        finally:
            os.close(fd)

    def _open_place(self, place: str) -> int:
        with self._resolver.resolve(place, follow_final=False) as res:
            try:
                return os.open(res.name, _DIR_FLAGS, dir_fd=res.dir_fd)
            except OSError as exc:
                raise AgentError(INVALID_ARGUMENT, f"{place} is not a directory the tool user can read.") from exc

    def _open_file(self, path: str) -> int | None:
        """An fd of the regular file at ``path`` opened as the tool user (None: not readable, or gone)."""
        with self._acting(), contextlib.suppress(AgentError, OSError), \
                self._resolver.resolve(path, follow_final=False) as res:
            fd = os.open(res.name, _FILE_FLAGS, dir_fd=res.dir_fd)
            if stat.S_ISREG(os.fstat(fd).st_mode):
                return fd
            os.close(fd)
        return None
