"""envd's filesystem.Filesystem and its /files and /health routes, the handlers called directly
on the real engine (an ExecutorService and E2bSandboxes as ``callbox serve --e2b`` builds them).

Writes and reads (octet-stream, multipart with several files, binary content, 50 MB both ways
with the sha256 checked and this process's allocations bounded), uploads cut short leaving the
old file whole, list/stat/exists/remove/rename/make_dir with envd's answers, WatchDir events and
a polled watcher (bounded, removed with its sandbox), errors for missing paths and other users,
and the copy_in/copy_out actions: a deny of copy_in in another template, and the audit records."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import textwrap
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from harness.audit.store import AuditStore
from harness.doors.e2b.boxes import E2bSandbox, E2bSandboxes
from harness.doors.e2b.envd import filesystem_pb2 as pb
from harness.doors.e2b.envd_files import http_routes
from harness.doors.e2b.envd_filesystem import MAX_WATCHERS, FilesystemHandlers
from harness.doors.e2b.errors import E2bError
from harness.doors.e2b.rpc import EnvdCall, HttpRequest, HttpResponse
from tests.conftest import IMAGE
from tests.integration.e2b_door import e2b_sandboxes

pytestmark = pytest.mark.docker

WAIT_S = 60.0
BIG = 50 * 1024 * 1024
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "512m"
    ttl_seconds = 900
""")
NO_COPY_IN = POLICY + textwrap.dedent("""
    [actions.copy_in]
    decision = "allow"

    [[actions.copy_in.rules]]
    action = "deny"
    path = "/workspace/secret/**"
    reason = "nothing may be planted in secret"
""")


@dataclass
class Door:
    sandboxes: E2bSandboxes
    fs: FilesystemHandlers
    routes: dict[tuple[str, str], Callable[[HttpRequest, EnvdCall], HttpResponse]]
    audit: AuditStore
    box: E2bSandbox


@pytest.fixture(scope="module")
def door(engine: Any) -> Iterator[Door]:
    with e2b_sandboxes(engine, POLICY, prefix="cbx-e2b-fs-", keys={"alice": "token-of-e2b-alice-0123456"},
                       templates={"no-copy-in": NO_COPY_IN}) as state:
        sandboxes = state.sandboxes
        box = sandboxes.create("alice")
        routes = {(method, path): handler for method, path, handler in http_routes(sandboxes)}
        yield Door(sandboxes, FilesystemHandlers(sandboxes), routes, state.audit, box)


def call_of(box: E2bSandbox, *, user: str | None = None) -> EnvdCall:
    """An envd call whose scope is cancelled after WAIT_S at the latest (a test fails, never hangs)."""
    call = EnvdCall(sandbox=box, headers={}, user=user)
    guard = threading.Timer(WAIT_S, call.scope.cancel)
    guard.daemon = True
    guard.start()
    return call


def request(method: str, query: dict[str, str], body: Iterator[bytes] | bytes = b"",
            headers: dict[str, str] | None = None) -> HttpRequest:
    chunks = iter([body]) if isinstance(body, bytes) else body
    return HttpRequest(method, "/files", {k: [v] for k, v in query.items()}, headers or {}, chunks)


def upload(door: Door, path: str, data: bytes | Iterator[bytes], box: E2bSandbox | None = None,
           **query: str) -> HttpResponse:
    headers = {"content-type": "application/octet-stream"}
    if isinstance(data, bytes):
        headers["content-length"] = str(len(data))
    return door.routes["POST", "/files"](request("POST", {"path": path, **query}, data, headers),
                                         call_of(box or door.box))


def download(door: Door, path: str, **query: str) -> tuple[HttpResponse, bytes]:
    response = door.routes["GET", "/files"](request("GET", {"path": path, **query}), call_of(door.box))
    body = response.body if isinstance(response.body, bytes) else b"".join(response.body)
    return response, body


def multipart(files: list[tuple[str, bytes]], chunk: int = 65536) -> tuple[dict[str, str], Iterator[bytes]]:
    """What the SDK's files.write_files sends (httpx builds the body), in chunks of ``chunk``."""
    built = httpx.Request("POST", "http://sandbox/files", files=[("file", (p, d)) for p, d in files])
    body = built.read()
    return dict(built.headers), (body[i:i + chunk] for i in range(0, len(body), chunk))


def json_of(response: HttpResponse) -> Any:
    assert isinstance(response.body, bytes)
    return json.loads(response.body)


def error_of(response: HttpResponse) -> dict[str, Any]:
    return dict(json_of(response))


# ---- writes and reads ------------------------------------------------------------------------------


def test_octet_stream_round_trip_with_binary_content(door: Door) -> None:
    data = bytes(range(256)) * 1000 + b"\0\r\n--boundary--\r\n"
    response = upload(door, "/workspace/bin/data.bin", data)
    assert response.status == 200
    assert json_of(response) == [{"name": "data.bin", "type": "file", "path": "/workspace/bin/data.bin"}]
    got, body = download(door, "/workspace/bin/data.bin")
    assert got.status == 200 and body == data
    assert ("content-length", str(len(data))) in got.headers
    # Relative paths start in the workdir, ~ is HOME: both /home/user, as in E2B.
    assert upload(door, "rel.txt", b"relative").status == 200
    assert download(door, "/home/user/rel.txt")[1] == b"relative"
    assert upload(door, "~/home.txt", b"home").status == 200
    assert download(door, "/home/user/home.txt")[1] == b"home"
    # An empty file, and an existing file replaced keeping its mode.
    assert upload(door, "/workspace/empty", b"").status == 200
    assert download(door, "/workspace/empty")[1] == b""


def test_multipart_with_several_files(door: Door) -> None:
    files = [("/workspace/multi/a.txt", b"alpha"), ("multi/deep/b.bin", os.urandom(300_000)),
             ("/tmp/c.txt", b"gamma\r\n--not-a-boundary")]
    headers, body = multipart(files, chunk=777)
    response = door.routes["POST", "/files"](request("POST", {}, body, headers), call_of(door.box))
    assert response.status == 200, response.body
    assert [e["path"] for e in json_of(response)] == [
        "/workspace/multi/a.txt", "/home/user/multi/deep/b.bin", "/tmp/c.txt"]
    for (_, data), entry in zip(files, json_of(response), strict=True):
        assert download(door, entry["path"])[1] == data
    # One file with ?path=: the part's filename is not used.
    headers, body = multipart([("ignored-name", b"by query")])
    response = door.routes["POST", "/files"](request("POST", {"path": "/workspace/multi/q.txt"}, body, headers),
                                             call_of(door.box))
    assert response.status == 200 and download(door, "/workspace/multi/q.txt")[1] == b"by query"


def test_an_upload_cut_short_leaves_the_old_file_whole(door: Door) -> None:
    assert upload(door, "/workspace/keep.txt", b"old content").status == 200
    headers = {"content-type": "application/octet-stream", "content-length": str(10 << 20)}
    response = door.routes["POST", "/files"](
        request("POST", {"path": "/workspace/keep.txt"}, iter([b"x" * (5 << 20)]), headers), call_of(door.box))
    assert response.status == 400 and "cut short" in error_of(response)["message"]
    headers, body = multipart([("/workspace/keep.txt", b"n" * 100_000)])
    cut = b"".join(body)[:-200]
    response = door.routes["POST", "/files"](request("POST", {}, cut, headers), call_of(door.box))
    assert response.status == 400 and "cut short" in error_of(response)["message"]
    assert download(door, "/workspace/keep.txt")[1] == b"old content"
    names = [e.name for e in door.fs.list_dir(pb.ListDirRequest(path="/workspace"), call_of(door.box)).entries]
    assert not [n for n in names if n.startswith(".callbox-")], names


def test_fifty_megabytes_up_and_down_stream_with_bounded_memory(door: Door) -> None:
    block = os.urandom(1 << 20)
    want = hashlib.sha256(block * 50).hexdigest()

    def produce() -> Iterator[bytes]:
        for i in range(BIG // 65536):
            offset = (i * 65536) % len(block)
            yield block[offset:offset + 65536]

    headers, _ = multipart([("x", b"")])  # the boundary httpx chose
    boundary = headers["content-type"].split("boundary=")[1]
    head = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"/workspace/big.bin\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    tail = f"\r\n--{boundary}--\r\n".encode()

    def body() -> Iterator[bytes]:
        yield head
        yield from produce()
        yield tail

    tracemalloc.start()
    try:
        started = time.perf_counter()
        response = door.routes["POST", "/files"](request("POST", {}, body(), headers), call_of(door.box))
        up_s = time.perf_counter() - started
        assert response.status == 200, response.body
        _, up_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        started = time.perf_counter()
        got = door.routes["GET", "/files"](request("GET", {"path": "/workspace/big.bin"}), call_of(door.box))
        digest, size = hashlib.sha256(), 0
        assert not isinstance(got.body, bytes)
        for piece in got.body:
            digest.update(piece)
            size += len(piece)
        down_s = time.perf_counter() - started
        _, down_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size == BIG and digest.hexdigest() == want
    assert ("content-length", str(BIG)) in got.headers
    assert up_peak < 24 << 20 and down_peak < 24 << 20, (up_peak, down_peak)
    print(f"\n50 MB through the handlers: write {BIG / up_s / 1e6:.0f} MB/s ({up_s:.2f} s, peak "
          f"{up_peak / 1e6:.1f} MB traced), read {BIG / down_s / 1e6:.0f} MB/s ({down_s:.2f} s, peak "
          f"{down_peak / 1e6:.1f} MB traced)")
    door.fs.remove(pb.RemoveRequest(path="/workspace/big.bin"), call_of(door.box))


# ---- listing, stat, make_dir, move, remove -----------------------------------------------------------


def test_list_stat_make_dir_rename_remove(door: Door) -> None:
    fs, call = door.fs, call_of(door.box)
    assert fs.make_dir(pb.MakeDirRequest(path="/workspace/tree/sub/deeper"), call).entry.type == \
        pb.FILE_TYPE_DIRECTORY
    with pytest.raises(E2bError) as exists:
        fs.make_dir(pb.MakeDirRequest(path="/workspace/tree/sub"), call)
    assert exists.value.connect_code == "already_exists"  # the SDK's make_dir returns False
    assert upload(door, "/workspace/tree/sub/f.txt", b"12345").status == 200
    assert upload(door, "/workspace/tree/.hidden", b"h").status == 200
    with pytest.raises(E2bError) as not_dir:
        fs.make_dir(pb.MakeDirRequest(path="/workspace/tree/sub/f.txt"), call)
    assert not_dir.value.connect_code == "invalid_argument"

    entry = fs.stat(pb.StatRequest(path="/workspace/tree/sub/f.txt"), call).entry
    assert (entry.name, entry.type, entry.path, entry.size) == ("f.txt", pb.FILE_TYPE_FILE,
                                                                "/workspace/tree/sub/f.txt", 5)
    assert entry.permissions == "-rw-r--r--" and entry.mode == 0o644
    assert (entry.owner, entry.group) == ("user", "user")
    assert abs(entry.modified_time.seconds - time.time()) < 300

    one = fs.list_dir(pb.ListDirRequest(path="/workspace/tree", depth=1), call).entries
    assert sorted(e.path for e in one) == ["/workspace/tree/.hidden", "/workspace/tree/sub"]
    two = fs.list_dir(pb.ListDirRequest(path="/workspace/tree", depth=2), call).entries
    assert {e.path for e in two} == {"/workspace/tree/.hidden", "/workspace/tree/sub", "/workspace/tree/sub/deeper",
                                     "/workspace/tree/sub/f.txt"}
    assert next(e for e in two if e.name == "sub").permissions.startswith("d")

    moved = fs.move(pb.MoveRequest(source="/workspace/tree/sub/f.txt", destination="/workspace/tree/new/g.txt"),
                    call).entry
    assert (moved.path, moved.size) == ("/workspace/tree/new/g.txt", 5)
    with pytest.raises(E2bError) as gone:
        fs.stat(pb.StatRequest(path="/workspace/tree/sub/f.txt"), call)
    assert gone.value.connect_code == "not_found"  # the SDK's exists() says False
    with pytest.raises(E2bError) as missing:
        fs.move(pb.MoveRequest(source="/workspace/tree/nope", destination="/workspace/tree/x"), call)
    assert missing.value.connect_code == "not_found"
    with pytest.raises(E2bError) as not_listable:
        fs.list_dir(pb.ListDirRequest(path="/workspace/tree/new/g.txt"), call)
    assert not_listable.value.connect_code == "invalid_argument"

    fs.remove(pb.RemoveRequest(path="/workspace/tree"), call)
    fs.remove(pb.RemoveRequest(path="/workspace/tree"), call)  # already gone: fine, as in envd
    with pytest.raises(E2bError) as removed:
        fs.stat(pb.StatRequest(path="/workspace/tree"), call)
    assert removed.value.connect_code == "not_found"


def test_errors_for_missing_paths_other_users_and_places_outside(door: Door) -> None:
    response, _ = download(door, "/workspace/does-not-exist")
    assert response.status == 404 and error_of(response)["code"] == 404
    assert "does not exist" in error_of(response)["message"]
    response, _ = download(door, "/workspace")
    assert response.status == 400 and "directory" in error_of(response)["message"]
    response, _ = download(door, "/workspace/rel.txt", username="root")
    assert response.status == 403 and "root" in error_of(response)["message"]
    assert upload(door, "/workspace/u.txt", b"u", username="user").status == 200  # E2B's default user
    with pytest.raises(E2bError) as root:
        door.fs.stat(pb.StatRequest(path="/workspace"), call_of(door.box, user="root"))
    assert root.value.connect_code == "permission_denied" and "unprivileged" in root.value.message
    with pytest.raises(E2bError) as outside:
        door.fs.stat(pb.StatRequest(path="/etc/passwd"), call_of(door.box))
    assert outside.value.connect_code == "permission_denied"
    response = upload(door, "/etc/planted", b"x")
    assert response.status == 403
    headers = {"content-type": "application/octet-stream", "x-metadata-owner": "me"}
    response = door.routes["POST", "/files"](request("POST", {"path": "/workspace/m"}, b"x", headers),
                                             call_of(door.box))
    assert response.status == 400 and "metadata" in error_of(response)["message"]
    assert door.routes["GET", "/health"](request("GET", {}), call_of(door.box)).status == 204


# ---- watching ------------------------------------------------------------------------------------------


def test_watch_dir_streams_envd_events(door: Door) -> None:
    fs, call = door.fs, call_of(door.box)
    fs.make_dir(pb.MakeDirRequest(path="/workspace/watched"), call)
    stream = fs.watch_dir(pb.WatchDirRequest(path="/workspace/watched", include_entry=True), call)
    events: queue.Queue[pb.WatchDirResponse | None] = queue.Queue()

    def pump() -> None:
        try:
            for message in stream:
                events.put(message)
        finally:
            events.put(None)

    threading.Thread(target=pump, daemon=True).start()
    first = events.get(timeout=WAIT_S)
    assert first is not None and first.WhichOneof("event") == "start"
    assert upload(door, "/workspace/watched/a.txt", b"hello").status == 200
    seen: list[tuple[str, int]] = []

    def until(wanted: tuple[str, int]) -> None:
        while wanted not in seen:
            message = events.get(timeout=WAIT_S)
            assert message is not None, seen
            event = message.filesystem
            seen.append((event.name, event.type))
            if (event.name, event.type) == ("a.txt", pb.EVENT_TYPE_WRITE):
                assert event.entry.size == 5 and event.entry.path == "/workspace/watched/a.txt"

    # The entry of an event is read when the event is: the file is moved only after its write
    # was reported, or the entry could be of a file already gone.
    until(("a.txt", pb.EVENT_TYPE_WRITE))
    fs.move(pb.MoveRequest(source="/workspace/watched/a.txt", destination="/workspace/watched/b.txt"), call)
    fs.remove(pb.RemoveRequest(path="/workspace/watched/b.txt"), call)
    until(("b.txt", pb.EVENT_TYPE_REMOVE))
    assert seen == [("a.txt", pb.EVENT_TYPE_CREATE), ("a.txt", pb.EVENT_TYPE_WRITE),
                    ("a.txt", pb.EVENT_TYPE_RENAME), ("b.txt", pb.EVENT_TYPE_CREATE),
                    ("b.txt", pb.EVENT_TYPE_REMOVE)], seen
    call.scope.cancel()  # the client goes away: the stream ends
    while events.get(timeout=WAIT_S) is not None:
        pass


def test_polled_watcher_bounded_and_removed_with_its_sandbox(door: Door) -> None:
    fs, call = door.fs, call_of(door.box)
    fs.make_dir(pb.MakeDirRequest(path="/workspace/polled"), call)
    watcher = fs.create_watcher(pb.CreateWatcherRequest(path="/workspace/polled", recursive=True), call).watcher_id
    assert upload(door, "/workspace/polled/x/y.txt", b"y").status == 200
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + WAIT_S
    while ("x/y.txt", pb.EVENT_TYPE_WRITE) not in seen and time.monotonic() < deadline:
        batch = fs.get_watcher_events(pb.GetWatcherEventsRequest(watcher_id=watcher), call).events
        seen += [(e.name, e.type) for e in batch]
        if not batch:
            time.sleep(0.05)  # polling is the API under test
    assert ("x", pb.EVENT_TYPE_CREATE) in seen and ("x/y.txt", pb.EVENT_TYPE_WRITE) in seen, seen
    assert not [name for name, _ in seen if ".callbox-" in name], seen
    fs.remove_watcher(pb.RemoveWatcherRequest(watcher_id=watcher), call)
    with pytest.raises(E2bError) as unknown:
        fs.get_watcher_events(pb.GetWatcherEventsRequest(watcher_id=watcher), call)
    assert unknown.value.connect_code == "not_found"
    with pytest.raises(E2bError):
        fs.create_watcher(pb.CreateWatcherRequest(path="/workspace/nope"), call)

    other = door.sandboxes.create("alice")
    try:
        ids = [fs.create_watcher(pb.CreateWatcherRequest(path="/workspace"), call_of(other)).watcher_id
               for _ in range(MAX_WATCHERS)]
        with pytest.raises(E2bError) as bounded:
            fs.create_watcher(pb.CreateWatcherRequest(path="/workspace"), call_of(other))
        assert bounded.value.connect_code == "resource_exhausted"
        with pytest.raises(E2bError):  # another sandbox's watcher is unknown here
            fs.get_watcher_events(pb.GetWatcherEventsRequest(watcher_id=ids[0]), call)
        assert fs.watchers_of(other.sandbox_id) == sorted(ids)
    finally:
        door.sandboxes.kill("alice", other.sandbox_id)
    deadline = time.monotonic() + WAIT_S
    while fs.watchers_of(other.sandbox_id) and time.monotonic() < deadline:
        time.sleep(0.05)  # the watchers' threads end when the sandbox's agent channel closes
    assert fs.watchers_of(other.sandbox_id) == []


# ---- policy and audit --------------------------------------------------------------------------------


def test_copy_in_denied_by_policy_and_both_actions_audited(door: Door) -> None:
    guarded = door.sandboxes.create("alice", template_id="no-copy-in")
    try:
        assert upload(door, "/workspace/open.txt", b"fine", box=guarded).status == 200
        response = upload(door, "/workspace/secret/key", b"planted", box=guarded)
        assert response.status == 403
        assert "nothing may be planted in secret" in error_of(response)["message"]
        with pytest.raises(E2bError) as gone:
            door.fs.stat(pb.StatRequest(path="/workspace/secret/key"), call_of(guarded))
        assert gone.value.connect_code == "not_found"
        records = json.dumps(door.audit.calls_for_run(guarded.sandbox_id), default=str)
        assert "sandbox.copy_in" in records and "/workspace/secret/key" in records
    finally:
        door.sandboxes.kill("alice", guarded.sandbox_id)
    download(door, "/home/user/rel.txt")
    records = json.dumps(door.audit.calls_for_run(door.box.sandbox_id), default=str)
    assert "sandbox.copy_out" in records and "/home/user/rel.txt" in records


# ---- through the unmodified SDK ------------------------------------------------------------------------


def test_the_sdk_files_calls_through_the_door(door: Door, monkeypatch: pytest.MonkeyPatch) -> None:
    from e2b import FilesystemEventType, Sandbox
    from e2b.exceptions import FileNotFoundException

    from harness.doors.e2b.server import serve_e2b

    server = serve_e2b("127.0.0.1:0", sandboxes=door.sandboxes, announce=None)
    try:
        for name in [n for n in os.environ if n.startswith("E2B_")]:
            monkeypatch.delenv(name)
        monkeypatch.setenv("E2B_API_URL", server.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
        monkeypatch.setenv("E2B_API_KEY", "token-of-e2b-alice-0123456")
        sbx = Sandbox.create(timeout=300)
        try:
            assert sbx.files.write("notes/hello.txt", "hello").path == "/home/user/notes/hello.txt"
            assert sbx.files.read("/home/user/notes/hello.txt") == "hello"
            written = sbx.files.write_files([{"path": "/home/user/notes/a", "data": b"\0A"},
                                             {"path": "/home/user/notes/b", "data": "B"}])
            assert [w.path for w in written] == ["/home/user/notes/a", "/home/user/notes/b"]
            assert sbx.files.read("/home/user/notes/a", format="bytes") == bytearray(b"\0A")
            assert sorted(e.name for e in sbx.files.list("/home/user/notes")) == ["a", "b", "hello.txt"]
            assert sbx.files.exists("/home/user/notes/a") and not sbx.files.exists("/home/user/notes/zz")
            assert sbx.files.make_dir("/home/user/notes/sub") is True
            assert sbx.files.make_dir("/home/user/notes/sub") is False
            assert sbx.files.rename("/home/user/notes/a", "/home/user/notes/sub/a").path == "/home/user/notes/sub/a"
            handle = sbx.files.watch_dir("/home/user/notes/sub")
            sbx.files.write("/home/user/notes/sub/w.txt", "w")
            seen: list[tuple[str, FilesystemEventType]] = []
            deadline = time.monotonic() + WAIT_S
            while ("w.txt", FilesystemEventType.WRITE) not in seen and time.monotonic() < deadline:
                seen += [(e.name, e.type) for e in handle.get_new_events()]
                time.sleep(0.05)  # watch_dir of the sync SDK is polled
            handle.stop()
            assert seen[:2] == [("w.txt", FilesystemEventType.CREATE), ("w.txt", FilesystemEventType.WRITE)], seen
            sbx.files.remove("/home/user/notes")
            assert not sbx.files.exists("/home/user/notes")
            with pytest.raises(FileNotFoundException):
                sbx.files.read("/home/user/notes/hello.txt")
        finally:
            sbx.kill()
    finally:
        server.stop()
