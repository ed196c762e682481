"""envd's plain HTTP routes: ``GET /files`` (download), ``POST /files`` (upload), ``GET /health``.

Everything streams; no file is ever held whole here:

* **Download** (the ``copy_out`` action): the agent's ``Filesystem.Download`` streams the file
  as a one-member tar archive; its header gives the size (sent as ``Content-Length``) and the
  member's data is passed on in pieces as it arrives. A final symlink is followed (envd
  serves the file behind it); a directory is 400, a missing path 404 (the SDK's
  ``FileNotFoundException``), with envd's JSON error body ``{"code", "message"}``. A stream
  that breaks midway raises, so the client sees a connection cut short of its
  ``Content-Length``, never a short file. ``Accept-Encoding`` is ignored (identity), which
  HTTP allows.
* **Upload** (the ``copy_in`` action, once per file): ``application/octet-stream`` (one file,
  ``?path=``, gzip ``Content-Encoding`` allowed) or ``multipart/form-data`` with one or more
  ``file`` parts (the part's filename is its path; with ``?path=`` only one file), parsed
  as it arrives by :func:`multipart_parts`. Each file goes to the agent in pieces of
  :data:`WRITE_BYTES` (appended to a temporary ``.callbox-e2b-*.tmp`` beside it, which
  creates the parent directories), then is renamed over the path in one step, so it lands
  whole or not at all: a body cut short (a missing closing boundary, fewer bytes than its
  ``Content-Length``), a refusal or a full disk removes the temporary file and answers an
  error. An existing file keeps its permission bits; a symlink is written through, like
  envd's ``O_TRUNC`` open. The answer is envd's ``[{"name", "type": "file", "path"}]``.
  File metadata (``X-Metadata-*``, extended attributes) is refused rather than dropped.
* **Health**: 204, no access token needed (the SDK probes it after a failed request).

Users and relative paths are resolved as in :mod:`harness.doors.e2b.envd_filesystem`; a
copy asked for as root (where the policy allows it) is recorded with ``"user": "root"``, and
a download as root that the sandbox's user may not do is done with root's rights
(:mod:`harness.doors.e2b.root_reads`).
"""

from __future__ import annotations

import contextlib
import email.utils
import posixpath
import secrets
import tarfile
import zlib
from collections.abc import Iterator
from itertools import chain
from typing import Any

from harness.core.errors import AgentCallError, CallboxError, ErrorCode
from harness.core.root_commands import ROOT_USER
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.envd_filesystem import (
    MAX_SYMLINK_HOPS,
    ROOT_FILES,
    USER,
    check_user,
    fs_errors,
    link_target,
    root_allowed,
    sandbox_path,
)
from harness.doors.e2b.errors import E2bError, invalid
from harness.doors.e2b.root_reads import ROOT_ONLY, read_as_root
from harness.doors.e2b.rpc import EnvdCall, EnvdRoute, HttpRequest, HttpResponse, json_response
from harness.doors.e2b.signing import Operation
from harness.engine.base import LivingSandbox
from harness.engine.cancel import current_scope
from harness.engine.tarstream import ChunkReader
from sandbox.v1 import filesystem_pb2 as agent_pb

__all__ = ["READ_BYTES", "WRITE_BYTES", "Part", "http_routes", "multipart_parts"]

WRITE_BYTES = 4 << 20
"""How much of an upload is sent to the agent per Write (what this side holds of it at once)."""
READ_BYTES = 1 << 20
"""How much of a download is passed on per piece."""
MAX_PART_HEADERS = 16 << 10
_STATUS = {"resource_exhausted": 507}
"""envd's status where it differs from the Connect code's (a full disk: the SDK's NotEnoughSpaceException)."""


def _error(error: E2bError) -> HttpResponse:
    status = _STATUS.get(error.connect_code, error.status)
    return json_response(status, {"code": status, "message": error.message})


# ---- streaming multipart/form-data ---------------------------------------------------------------


class _Source:
    """The body's chunks with a buffer in front: what has been read but not consumed yet."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self.buf = bytearray()

    def fill(self) -> bool:
        """Read one more chunk into the buffer; False at the end of the body."""
        for chunk in self._chunks:
            if chunk:
                self.buf += chunk
                return True
        return False


def _cut_short(what: str) -> E2bError:
    return invalid(f"the multipart body ended {what}: the upload was cut short, and the unfinished file was "
                   "not written; send it again")


class Part:
    """One part of a multipart body: its headers (names in lower case), then its data in pieces."""

    def __init__(self, headers: dict[str, str], data: Iterator[bytes]) -> None:
        self.headers = headers
        self.data = data
        disposition = _header_params(headers.get("content-disposition", ""))
        self.name = disposition.get("name")
        self.filename = disposition.get("filename")

    def drain(self) -> None:
        for _ in self.data:
            pass


def multipart_parts(chunks: Iterator[bytes], boundary: str) -> Iterator[Part]:
    """The parts of a ``multipart/*`` body as it arrives; read each part's data before the next
    (what is left unread is skipped). Raises ``invalid_argument`` for a body that is not
    well formed or ends before its closing boundary."""
    source = _Source(chain([b"\r\n"], chunks))  # the first boundary then looks like every other
    delimiter = b"\r\n--" + boundary.encode("latin-1")
    for _ in _data_until(source, delimiter, "before its first boundary"):
        pass  # the preamble
    while True:
        while len(source.buf) < 2 and source.fill():
            pass
        if source.buf[:2] == b"--":
            return  # the closing boundary; an epilogue is ignored
        part = Part(_part_headers(source), _data_until(source, delimiter, "inside a part"))
        yield part
        part.drain()


def _data_until(source: _Source, delimiter: bytes, where: str) -> Iterator[bytes]:
    """The bytes before the next ``delimiter`` (consumed with it), in pieces as they arrive."""
    keep = len(delimiter) - 1
    while True:
        at = source.buf.find(delimiter)
        if at >= 0:
            if at:
                yield bytes(source.buf[:at])
            del source.buf[: at + len(delimiter)]
            return
        if len(source.buf) > keep:
            piece = bytes(source.buf[:-keep])
            del source.buf[:-keep]
            yield piece
        if not source.fill():
            raise _cut_short(where)


def _part_headers(source: _Source) -> dict[str, str]:
    """A part's header lines, from the rest of its boundary line to the blank line."""
    while (end := source.buf.find(b"\r\n\r\n")) < 0:
        if len(source.buf) > MAX_PART_HEADERS:
            raise invalid(f"a multipart part's headers are over {MAX_PART_HEADERS} bytes")
        if not source.fill():
            raise _cut_short("inside a part's headers")
    block = bytes(source.buf[:end]).decode("utf-8", "replace")
    del source.buf[: end + 4]
    headers: dict[str, str] = {}
    for line in block.split("\r\n")[1:]:  # the first is what followed the boundary (transport padding)
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return headers


def _header_params(value: str) -> dict[str, str]:
    """The ``key=value`` parameters of a header such as ``form-data; name="file"; filename="a b"``
    (quoted strings with backslash escapes; ``filename*=utf-8''...`` percent-decoded)."""
    params: dict[str, str] = {}
    i, n = value.find(";"), len(value)
    while 0 <= i < n:
        i += 1
        eq = value.find("=", i)
        if eq < 0:
            break
        key = value[i:eq].strip().lower()
        i = eq + 1
        while i < n and value[i] == " ":
            i += 1
        if i < n and value[i] == '"':
            out, i = [], i + 1
            while i < n and value[i] != '"':
                if value[i] == "\\" and i + 1 < n:
                    i += 1
                out.append(value[i])
                i += 1
            text = "".join(out)
            i = value.find(";", i)
        else:
            end = value.find(";", i)
            text = value[i:] if end < 0 else value[i:end]
            text, i = text.strip(), end
        if key.endswith("*"):
            key, text = key[:-1], email.utils.collapse_rfc2231_value(email.utils.decode_rfc2231(text))
        params[key] = text.replace("%22", '"') if key == "filename" else text
    return params


def _media_type(value: str) -> tuple[str, dict[str, str]]:
    media, _, _ = value.partition(";")
    return media.strip().lower(), _header_params(value)


# ---- the request body ----------------------------------------------------------------------------


def _body(request: HttpRequest) -> Iterator[bytes]:
    """The request body, decoded (gzip ``Content-Encoding``), checked against its ``Content-Length``."""
    chunks: Iterator[bytes] = _counted(request.body, request.headers.get("content-length"))
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding == "gzip":
        return _gunzip(chunks)
    if encoding not in ("", "identity"):
        raise invalid(f"Content-Encoding {encoding!r} is not supported; send gzip or no encoding")
    return chunks


def _counted(chunks: Iterator[bytes], length: str | None) -> Iterator[bytes]:
    expected = int(length) if length and length.strip().isdigit() else None
    received = 0
    for chunk in chunks:
        received += len(chunk)
        yield chunk
    if expected is not None and received < expected:
        raise invalid(f"the request body ended after {received} of its {expected} bytes: the upload was cut "
                      "short, and the unfinished file was not written; send it again")


def _gunzip(chunks: Iterator[bytes]) -> Iterator[bytes]:
    decoder = zlib.decompressobj(wbits=31)
    try:
        for chunk in chunks:
            data = chunk
            while data:
                piece = decoder.decompress(data, READ_BYTES)
                if piece:
                    yield piece
                data = decoder.unconsumed_tail
        if rest := decoder.flush():
            yield rest
    except zlib.error as error:
        raise invalid(f"the gzip body is not valid ({error}); the file was not written") from None
    if not decoder.eof:
        raise invalid("the gzip body ended before its end: the upload was cut short, and the file was not written")


# ---- writing one file ----------------------------------------------------------------------------


def _final(box: LivingSandbox, path: str) -> tuple[str, agent_pb.FileInfo | None]:
    """Where ``path`` leads (a final symlink chain followed, as envd's ``open`` does) and what
    is there now (None: nothing)."""
    real = path
    for _ in range(MAX_SYMLINK_HOPS):
        try:
            info = box.agent.stat(real)
        except AgentCallError as error:
            if error.reason == "NOT_FOUND":
                return real, None
            raise
        if info.type != agent_pb.FILE_TYPE_SYMLINK:
            return real, info
        real = link_target(real, info.link_target)
    raise E2bError(ErrorCode.CONFLICT, f"{path} is a chain of more than {MAX_SYMLINK_HOPS} symlinks (a loop?)")


def _readable(info: agent_pb.FileInfo, box: LivingSandbox) -> bool:
    """Whether the sandbox's user may read a file of ``info`` by its owner, group and mode bits."""
    if info.uid == box.tool_uid:
        return bool(info.mode & 0o400)
    return bool(info.mode & (0o040 if info.gid == box.tool_gid else 0o004))


def write_file(sandboxes: E2bSandboxes, sandbox: E2bSandbox, box: LivingSandbox, path: str,
               data: Iterator[bytes], *, as_root: bool = False) -> int:
    """Stream ``data`` into the file ``path`` (the ``copy_in`` action): whole, or not at all
    (``as_root``: asked for as root, served as the sandbox's user and recorded so)."""
    with sandboxes.acting(sandbox, "copy_in", _arguments(path, as_root)) as ticket, \
            fs_errors(sandbox, as_root=as_root):
        real, existing = _final(box, path)
        if existing is not None and existing.type == agent_pb.FILE_TYPE_DIRECTORY:
            raise invalid(f"path {path!r} is a directory; a file cannot be written over it")
        mode = existing.mode & 0o777 if existing is not None else 0
        temp = posixpath.join(posixpath.dirname(real), f".callbox-e2b-{secrets.token_hex(8)}.tmp")
        written = 0
        pending = bytearray()
        created = False
        try:
            for chunk in chain(data, [b""]):
                pending += chunk
                if len(pending) < WRITE_BYTES and chunk:
                    continue
                # The first piece creates the temporary file (and the parents) and must find
                # nothing there; the next ones append to it.
                box.agent.write_file(temp, bytes(pending), mode=mode, append=True, make_parents=not created,
                                     no_overwrite=not created)
                created = True
                written += len(pending)
                pending.clear()
            box.transfer.move(temp, real, overwrite=True)
        except AgentCallError as error:
            if created:
                with contextlib.suppress(CallboxError):
                    box.agent.remove(temp)
            ticket.outcome["bytes"] = written
            if error.reason == "TOO_LARGE":  # the agent names the temporary file; say what was written where
                raise E2bError(ErrorCode.TOO_LARGE, f"no space left to write {path} ({written + len(pending)} bytes "
                               f"sent so far, nothing of it kept): {box.spec.space_for(real)}") from None
            raise
        except BaseException:
            if created:
                with contextlib.suppress(CallboxError):
                    box.agent.remove(temp)
            ticket.outcome["bytes"] = written
            raise
        ticket.outcome["bytes"] = written
        return written


# ---- the routes ----------------------------------------------------------------------------------


def _users(request: HttpRequest, call: EnvdCall, operation: Operation) -> bool:
    """Whether the request is root's (see ``check_user``); any user but these is refused."""
    # A request without the access token had its URL's signature checked by the door's router.
    allowed = root_allowed(call.sandbox)
    named = check_user(request.first("username"), root_allowed=allowed)
    return check_user(call.user, root_allowed=allowed) or named


def _arguments(path: str, as_root: bool) -> dict[str, str]:
    """A copy's recorded arguments: its path, and the user when it was asked for as root."""
    return {"path": path, "user": ROOT_USER} if as_root else {"path": path}


class _FileBody:
    """A download's body: the tar member's data in pieces; the action's record ends with it."""

    def __init__(self, record: contextlib.ExitStack, chunks: Iterator[bytes], tar: tarfile.TarFile,
                 member: tarfile.TarInfo, reader: ChunkReader, outcome: dict[str, Any]) -> None:
        self._record = record
        self._chunks = chunks
        self._tar = tar
        self._file = tar.extractfile(member)
        self._size = member.size
        self._reader = reader
        self._outcome = outcome
        self._sent = 0

    def __iter__(self) -> _FileBody:
        return self

    def __next__(self) -> bytes:
        if self._file is None:
            raise StopIteration
        try:
            piece = self._file.read(min(READ_BYTES, self._size - self._sent)) if self._sent < self._size else b""
            if not piece and self._sent < self._size:
                raise E2bError(ErrorCode.DATA_LOST, f"the download ended after {self._sent} of {self._size} bytes")
        except BaseException as error:
            self._end(error)
            raise
        if not piece:
            self._end(None)
            raise StopIteration
        self._sent += len(piece)
        self._outcome["bytes"] = self._sent
        return piece

    def _end(self, error: BaseException | None) -> None:
        self._file = None
        try:
            if error is None:
                self._reader.drain()  # the agent's summary follows the archive
        finally:
            with contextlib.suppress(Exception):
                self._chunks.close()  # type: ignore[attr-defined]
            if error is None:
                self._record.close()
            else:
                self._record.__exit__(type(error), error, error.__traceback__)

    def close(self) -> None:
        """The client went away before the end: cancel the agent's stream; recorded as cancelled."""
        if self._file is not None:
            self._end(GeneratorExit())


def http_routes(sandboxes: E2bSandboxes) -> list[EnvdRoute]:
    """envd's ``GET /files``, ``POST /files`` and ``GET /health`` for the door's sandboxes."""

    def get_files(request: HttpRequest, call: EnvdCall) -> HttpResponse:
        record = contextlib.ExitStack()
        as_root, path = False, ""
        try:
            as_root = _users(request, call, "read")
            box = call.sandbox.running()
            path = sandbox_path(request.first("path") or "", box.spec)
            with fs_errors(call.sandbox, as_root=as_root):
                real, info = _final(box, path)
                if info is None:
                    raise E2bError(ErrorCode.NOT_FOUND, f"path {path!r} does not exist")
                if info.type == agent_pb.FILE_TYPE_DIRECTORY:
                    raise invalid(f"path {path!r} is a directory; read the files in it one by one")
                if info.type != agent_pb.FILE_TYPE_FILE:
                    raise invalid(f"path {path!r} is not a regular file; only files can be read")
                ticket = record.enter_context(sandboxes.acting(call.sandbox, "copy_out", _arguments(path, as_root)))
                with current_scope(call.scope), fs_errors(call.sandbox, as_root=as_root):
                    chunks = box.transfer.download(real)
                    reader = ChunkReader(chunks)
                    tar = tarfile.open(  # type: ignore[call-overload]  # noqa: SIM115 - read by the body
                        fileobj=reader, mode="r|", bufsize=READ_BYTES)
                    member = tar.next()
                if member is None and not _readable(info, box):  # the agent skips what its user cannot read
                    raise E2bError(ErrorCode.PERMISSION_DENIED, f"permission denied for {path}: the sandbox's user "
                                   f"{USER!r} cannot read it" + (f" {ROOT_FILES}" if as_root else ""))
                if member is None or not member.isfile():
                    raise E2bError(ErrorCode.CONFLICT, f"{path} changed while it was being read; read it again")
                body = _FileBody(record, chunks, tar, member, reader, ticket.outcome)
        except E2bError as error:
            record.__exit__(type(error), error, error.__traceback__)
            if as_root and path and error.error in ROOT_ONLY:  # what only root may read: read as root
                try:
                    data = read_as_root(sandboxes, call.sandbox, path)
                except E2bError as refused:
                    return _error(refused)
                return HttpResponse(200, [("content-type", "application/octet-stream"),
                                          ("content-length", str(len(data)))], data)
            return _error(error)
        except BaseException as error:
            record.__exit__(type(error), error, error.__traceback__)
            raise
        headers = [("content-type", "application/octet-stream"), ("content-length", str(member.size))]
        return HttpResponse(200, headers, body)

    def post_files(request: HttpRequest, call: EnvdCall) -> HttpResponse:
        written: list[dict[str, str]] = []
        try:
            as_root = _users(request, call, "write")
            if keys := sorted(name[len("x-metadata-"):] for name in request.headers if name.startswith("x-metadata-")):
                raise invalid(f"file metadata ({', '.join(map(repr, keys))}: write(..., metadata=...), sent as "
                              "X-Metadata-* headers and kept by E2B as user.e2b.* extended attributes) is not "
                              "supported by this server, so the file was not written; write it without metadata")
            media, params = _media_type(request.headers.get("content-type", ""))
            query_path = request.first("path")
            box = call.sandbox.running()
            if media == "application/octet-stream":
                if not query_path:
                    raise invalid("an application/octet-stream upload needs the path query parameter")
                path = sandbox_path(query_path, box.spec)
                write_file(sandboxes, call.sandbox, box, path, _body(request), as_root=as_root)
                written.append(_written(path))
            elif media.startswith("multipart/"):
                if not params.get("boundary"):
                    raise invalid("the multipart Content-Type has no boundary parameter")
                for part in multipart_parts(_body(request), params["boundary"]):
                    if part.name != "file":
                        continue  # other form fields are ignored, as envd does
                    given = query_path or part.filename
                    if not given:
                        raise invalid("a file part has no filename and the request no path query parameter: "
                                      "name the path of each file")
                    path = sandbox_path(given, box.spec)
                    if any(entry["path"] == path for entry in written):
                        raise invalid(f"you cannot upload several files to the same path {path!r} in one request")
                    write_file(sandboxes, call.sandbox, box, path, part.data, as_root=as_root)
                    written.append(_written(path))
            else:
                raise invalid(f"unsupported content type {media or 'none'!r}; send multipart/form-data or "
                              "application/octet-stream")
        except E2bError as error:
            if written:
                done = ", ".join(entry["path"] for entry in written)
                error = E2bError(error.error, f"{error.message} (written before this error: {done})",
                                 status=error.status)
            return _error(error)
        return json_response(200, written)

    def health(request: HttpRequest, call: EnvdCall) -> HttpResponse:
        return HttpResponse(204)

    return [("GET", "/files", get_files), ("POST", "/files", post_files), ("GET", "/health", health)]


def _written(path: str) -> dict[str, str]:
    return {"name": posixpath.basename(path), "type": "file", "path": path}
