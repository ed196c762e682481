"""The E2B door's transport: the Connect protocol, routing and auth, streams and bodies, over
real HTTP against toy services.

The envd calls go through the e2b SDK's own generated client (``ProcessClientSync`` built the
way the SDK builds it: its JSON codec, compression off, its error transport), so these tests
check the wire the SDK speaks; raw httpx requests check what the SDK never sends (bad
headers, envelopes by hand, disconnects, big bodies). The sandbox registry is a stand-in
(these tests are about HTTP, not sandboxes); the door's own services have their own tests.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import statistics
import struct
import threading
import time
import tracemalloc
import types
from collections.abc import Iterator

import httpx
import pytest
from connectrpc.code import Code
from connectrpc.errors import ConnectError
from e2b.connection_config import ConnectionConfig
from e2b.envd.client_sync import create_rpc_client
from e2b.envd.process import process_connect, process_pb
from e2b.envd.rpc import handle_rpc_exception
from e2b.exceptions import NotFoundException, SandboxNotRunningException
from protobuf import Oneof

from harness.core.errors import ErrorCode
from harness.doors.e2b.bridge import OutputChannel
from harness.doors.e2b.connect import EnvelopeReader, envelope, read_head
from harness.doors.e2b.envd import process_pb2 as pb
from harness.doors.e2b.errors import E2bError, not_found
from harness.doors.e2b.rpc import HttpResponse, Method, Service, json_response
from harness.doors.e2b.server import serve_e2b
from harness.doors.grpc.tokens import TokenSet
from harness.doors.quota_ledger import QuotaKeeper

KEY = "k" * 24
SANDBOX = "e2b-toy"
TOKEN = "access-" + "t" * 20
ENVD = {"E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": "49983", "X-Access-Token": TOKEN}
WAIT_S = 10.0
MIB = 1 << 20


# ---- the toy services ------------------------------------------------------------------------


class Boxes:
    """A stand-in for E2bSandboxes: one sandbox, one access token."""

    executor = types.SimpleNamespace(quotas=QuotaKeeper())

    def __init__(self) -> None:
        self.box = types.SimpleNamespace(sandbox_id=SANDBOX, access_token=TOKEN, client="alice", public_ports=False)

    def for_envd(self, sandbox_id, token):
        if sandbox_id != SANDBOX:
            raise not_found("sandbox", sandbox_id)
        if token != TOKEN:
            raise E2bError("unauthenticated", "the X-Access-Token header is missing or wrong")
        return self.box

    def find(self, sandbox_id):
        return self.box if sandbox_id == SANDBOX else None

    def awake(self, sandbox):  # never paused
        pass


class Probe:
    """What a blocking handler saw: its scope cancelled, its stream closed, and by which thread."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.cancelled = threading.Event()
        self.closed = threading.Event()
        self.release = threading.Event()
        self.ran_in: int | None = None
        self.closed_in: int | None = None

    def cancel(self) -> None:  # CallScope.track: called when the call's scope is cancelled
        self.cancelled.set()
        self.release.set()


PROBES: dict[str, Probe] = {}


def probe(call, name: str) -> Probe:
    found = PROBES.setdefault(name, Probe())
    call.scope.track(found)
    found.entered.set()
    return found


def event(**fields) -> pb.StartResponse:
    return pb.StartResponse(event=pb.ProcessEvent(**fields))


def start(request, call) -> Iterator[pb.StartResponse]:
    cmd, args = request.process.cmd, list(request.process.args)
    # A blocking call's probe exists before its start event is sent: the test reads it then.
    seen = probe(call, args[0]) if cmd == "block" else None
    yield event(start=pb.ProcessEvent.StartEvent(pid=1))
    if cmd == "echo":
        for arg in args:
            yield event(data=pb.ProcessEvent.DataEvent(stdout=arg.encode()))
    elif seen is not None:
        seen.ran_in = threading.get_ident()
        try:
            seen.release.wait(WAIT_S)
        finally:
            seen.closed_in = threading.get_ident()
            seen.closed.set()
    elif cmd == "fail":
        raise E2bError("permission_denied", "the policy denies it: pushing changes leaves the sandbox")
    elif cmd == "crash":
        raise RuntimeError("secret internals")
    yield event(end=pb.ProcessEvent.EndEvent(exit_code=3, exited=True, status="exit status 3"))


def list_processes(request, call) -> pb.ListResponse:
    return pb.ListResponse(processes=[pb.ProcessInfo(pid=7, tag=call.user or "nobody")])


def send_input(request, call) -> pb.SendInputResponse:
    pid = request.process.pid
    if pid == 404:
        raise not_found("process", str(pid))
    if pid == 500:
        raise RuntimeError("secret internals")
    if pid == 1:
        probe(call, "unary").release.wait(WAIT_S)
    return pb.SendInputResponse()


def stream_input(requests, call) -> pb.StreamInputResponse:
    total = 0
    for request in requests:
        if request.HasField("data"):
            data = request.data.input.stdin
            if data == b"fail":
                raise E2bError(ErrorCode.CONFLICT, "stdin is closed")
            total += len(data)
    PROBES.setdefault("stream_input", Probe()).ran_in = total
    return pb.StreamInputResponse()


PROCESS = Service("process.Process", {
    "Start": Method("Start", "server_stream", pb.StartRequest, start,
                    keepalive=lambda: event(keepalive=pb.ProcessEvent.KeepAlive())),
    "List": Method("List", "unary", pb.ListRequest, list_processes),
    "SendInput": Method("SendInput", "unary", pb.SendInputRequest, send_input),
    "StreamInput": Method("StreamInput", "client_stream", pb.StreamInputRequest, stream_input),
})


def upload(request, call) -> HttpResponse:
    digest = hashlib.sha256()
    size = biggest = 0
    for chunk in request.body:
        digest.update(chunk)
        size += len(chunk)
        biggest = max(biggest, len(chunk))
    return json_response(200, {"size": size, "sha256": digest.hexdigest(), "biggest": biggest,
                               "user": call.user})


def download(request, call) -> HttpResponse:
    chunks = int(request.first("chunks", "1") or 1)
    fail_after = int(request.first("fail_after", "-1") or -1)

    def body() -> Iterator[bytes]:
        for number in range(chunks):
            if number == fail_after:
                raise E2bError(ErrorCode.DATA_LOST, "the file changed while it was read")
            yield bytes([number % 256]) * (64 << 10)  # a fresh chunk each time

    return HttpResponse(200, [("content-type", "application/octet-stream")], body())


def health(request, call) -> HttpResponse:
    return HttpResponse(204)


def get_sandbox(request, client) -> HttpResponse:
    return json_response(200, {"sandboxID": request.path_params["sandboxID"], "client": client})


@pytest.fixture(scope="module")
def server():
    handle = serve_e2b("127.0.0.1:0", sandboxes=Boxes(), tokens=TokenSet({"alice": KEY}, source="test"),
                       services=[PROCESS], rest_routes=[("GET", "/sandboxes/{sandboxID}", get_sandbox)],
                       envd_routes=[("POST", "/files", upload), ("GET", "/files", download),
                                    ("GET", "/health", health)])
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        yield client


def sdk_client(url: str, **headers: str) -> process_connect.ProcessClientSync:
    """The process client exactly as the e2b SDK builds it for a sandbox."""
    config = ConnectionConfig(api_key=KEY, extra_sandbox_headers={**ENVD, **headers})
    return create_rpc_client(process_connect.ProcessClientSync, url, config)


def frames(data: bytes) -> list[tuple[int, bytes]]:
    found = []
    while data:
        flags, length = struct.unpack(">BI", data[:5])
        found.append((flags, data[5:5 + length]))
        data = data[5 + length:]
    return found


def start_body(cmd: str, *args: str) -> bytes:
    return envelope(json.dumps({"process": {"cmd": cmd, "args": list(args)}}).encode())


STREAM = {**ENVD, "content-type": "application/connect+json"}
UNARY = {**ENVD, "content-type": "application/json"}


# ---- through the SDK's own client ---------------------------------------------------------------


def test_sdk_unary_and_the_user_of_basic_auth(server):
    client = sdk_client(server.url)
    assert client.list(process_pb.ListRequest()).processes[0].tag == "nobody"
    user = {"Authorization": "Basic " + base64.b64encode(b"user:").decode()}
    assert client.list(process_pb.ListRequest(), headers=user).processes[0].tag == "user"


def test_sdk_server_stream(server):
    events = list(sdk_client(server.url).start(process_pb.StartRequest(
        process=process_pb.ProcessConfig(cmd="echo", args=["hello", "world"]))))
    kinds = [e.event.event.field for e in events]
    assert kinds == ["start", "data", "data", "end"]
    assert [e.event.event.value.output.value for e in events[1:3]] == [b"hello", b"world"]
    assert events[-1].event.event.value.exit_code == 3


def test_sdk_client_stream(server):
    def requests():
        yield process_pb.StreamInputRequest(event=Oneof("start", process_pb.StreamInputRequest.StartEvent(
            process=process_pb.ProcessSelector(selector=Oneof("pid", 1)))))
        for piece in (b"abc", b"defg" * 1000):
            yield process_pb.StreamInputRequest(event=Oneof("data", process_pb.StreamInputRequest.DataEvent(
                input=process_pb.ProcessInput(input=Oneof("stdin", piece)))))

    sdk_client(server.url).stream_input(requests())
    assert PROBES["stream_input"].ran_in == 3 + 4000


def test_sdk_sees_handler_errors_with_their_code_and_words(server):
    client = sdk_client(server.url)
    selector = process_pb.ProcessSelector(selector=Oneof("pid", 404))
    with pytest.raises(ConnectError) as info:
        client.send_input(process_pb.SendInputRequest(process=selector))
    assert info.value.code is Code.NOT_FOUND and "process '404' not found" in info.value.message
    assert isinstance(handle_rpc_exception(info.value), NotFoundException)
    with pytest.raises(ConnectError) as info:
        client.send_input(process_pb.SendInputRequest(process=process_pb.ProcessSelector(selector=Oneof("pid", 500))))
    assert info.value.code is Code.INTERNAL and "secret" not in info.value.message
    stream = client.start(process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="fail")))
    with pytest.raises(ConnectError) as info:
        list(stream)
    assert info.value.code is Code.PERMISSION_DENIED and "pushing changes" in info.value.message


def test_sdk_unknown_sandbox_is_not_running_and_a_wrong_token_unauthenticated(server):
    gone = sdk_client(server.url, **{"E2b-Sandbox-Id": "e2b-gone"})
    with pytest.raises(ConnectError) as info:
        gone.list(process_pb.ListRequest())
    assert info.value.code is Code.UNAVAILABLE
    assert isinstance(handle_rpc_exception(info.value), SandboxNotRunningException)
    with pytest.raises(ConnectError) as info:
        list(gone.start(process_pb.StartRequest(process=process_pb.ProcessConfig(cmd="echo"))))
    assert isinstance(handle_rpc_exception(info.value), SandboxNotRunningException)
    with pytest.raises(ConnectError) as info:
        sdk_client(server.url, **{"X-Access-Token": "wrong"}).list(process_pb.ListRequest())
    assert info.value.code is Code.UNAUTHENTICATED


def test_unary_overhead_p50(server):
    """What the transport costs a unary call, client included (the SDK's client, a handler
    that does nothing): printed for the record, bounded loosely so a regression shows."""
    client = sdk_client(server.url)
    request = process_pb.ListRequest()
    for _ in range(50):
        client.list(request)
    times = []
    for _ in range(500):
        began = time.perf_counter()
        client.list(request)
        times.append(time.perf_counter() - began)
    p50 = statistics.median(times) * 1000
    print(f"unary round trip through the E2B transport: p50 {p50:.2f} ms, p90 {sorted(times)[449] * 1000:.2f} ms")
    assert p50 < 10, f"p50 {p50:.2f} ms"


# ---- the protocol by hand -------------------------------------------------------------------


def test_refusals_name_the_fix(http):
    r = http.post("/process.Process/Nope", content=b"{}", headers=UNARY)
    assert r.status_code == 404 and r.json()["code"] == "unimplemented"
    assert "/process.Process/Nope" in r.json()["message"]
    r = http.post("/process.Process/List", content=b"{}", headers={**ENVD, "content-type": "text/plain"})
    assert r.status_code == 415 and "application/json" in r.json()["message"]
    r = http.post("/process.Process/Start", content=start_body("echo"), headers=UNARY)
    assert r.status_code == 415 and "application/connect+json" in r.json()["message"]
    r = http.post("/process.Process/List", content=b"{}", headers={**UNARY, "content-encoding": "gzip"})
    assert r.status_code == 501 and r.json()["code"] == "unimplemented" and "identity" in r.json()["message"]
    r = http.post("/process.Process/Start", content=start_body("echo"),
                  headers={**STREAM, "connect-content-encoding": "gzip"})
    assert r.status_code == 501 and r.json()["code"] == "unimplemented"
    r = http.post("/process.Process/List", content=b"{}", headers={**UNARY, "connect-protocol-version": "2"})
    assert r.status_code == 400 and "connect-protocol-version" in r.json()["message"]
    r = http.post("/process.Process/List", content=b"{}", headers={**UNARY, "connect-timeout-ms": "soon"})
    assert r.status_code == 400 and "connect-timeout-ms" in r.json()["message"]
    r = http.get("/process.Process/List", headers=ENVD)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = http.post("/process.Process/List", content=b"{nope", headers=UNARY)
    assert r.status_code == 400 and r.json()["code"] == "invalid_argument"
    assert "process.ListRequest" in r.json()["message"]
    r = http.post("/process.Process/List", content=b"{}", headers={**UNARY, "authorization": "Bearer x"})
    assert r.status_code == 400 and "Basic" in r.json()["message"]
    r = http.get("/elsewhere", headers=ENVD)
    assert r.status_code == 404 and "/elsewhere" in r.json()["message"]


def test_unknown_route_rest_auth_and_health(http):
    r = http.get("/nowhere/at/all")
    assert r.status_code == 404 and r.json() == {"code": 404, "message": r.json()["message"]}
    assert "/nowhere/at/all" in r.json()["message"]
    r = http.get("/sandboxes/e2b-x")
    assert r.status_code == 401 and r.json()["code"] == 401 and "X-API-KEY" in r.json()["message"]
    r = http.get("/sandboxes/e2b-x", headers={"X-API-KEY": "not-a-key-of-this-server"})
    assert r.status_code == 401 and "not a key" in r.json()["message"]
    r = http.get("/sandboxes/e2b%2Fx", headers={"X-API-KEY": KEY})
    assert r.status_code == 200 and r.json() == {"sandboxID": "e2b/x", "client": "alice"}
    r = http.delete("/sandboxes/e2b-x", headers={"X-API-KEY": KEY})
    assert r.status_code == 405 and "GET" in r.json()["message"]
    assert http.get("/health", headers={"E2b-Sandbox-Id": SANDBOX}).status_code == 204
    r = http.get("/health", headers={"E2b-Sandbox-Id": "e2b-gone"})
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    # Another port is a port request (harness.doors.e2b.ports): refused without a credential.
    r = http.get("/health", headers={"E2b-Sandbox-Id": SANDBOX, "E2b-Sandbox-Port": "8080"})
    assert r.status_code == 403 and "e2b-traffic-access-token" in r.json()["message"]
    r = http.get("/health", headers={**ENVD, "E2b-Sandbox-Port": "not-a-port"})
    assert r.status_code == 400 and "not a TCP port" in r.json()["message"]
    r = http.post("/files", content=b"x", headers={"E2b-Sandbox-Id": SANDBOX})
    assert r.status_code == 401


def test_proto_codec(http):
    r = http.post("/process.Process/List", content=pb.ListRequest().SerializeToString(),
                  headers={**ENVD, "content-type": "application/proto"})
    assert r.status_code == 200 and r.headers["content-type"] == "application/proto"
    assert pb.ListResponse.FromString(r.content).processes[0].pid == 7


def test_stream_envelopes_and_end_of_stream(http):
    r = http.post("/process.Process/Start", content=start_body("echo", "a"), headers=STREAM)
    assert r.status_code == 200 and r.headers["content-type"] == "application/connect+json"
    found = frames(r.content)
    assert [flags for flags, _ in found] == [0, 0, 0, 2]
    assert json.loads(found[1][1]) == {"event": {"data": {"stdout": base64.b64encode(b"a").decode()}}}
    assert json.loads(found[-1][1]) == {}
    r = http.post("/process.Process/Start", content=start_body("crash"), headers=STREAM)
    end = json.loads(frames(r.content)[-1][1])
    assert end["error"]["code"] == "internal" and "secret" not in end["error"]["message"]
    r = http.post("/process.Process/Start", content=start_body("echo") * 2, headers=STREAM)
    assert json.loads(frames(r.content)[-1][1])["error"]["code"] == "invalid_argument"


def test_unary_deadline_cancels_the_scope(http):
    r = http.post("/process.Process/SendInput", content=json.dumps({"process": {"pid": 1}}).encode(),
                  headers={**UNARY, "connect-timeout-ms": "100"})
    assert r.status_code == 504 and r.json()["code"] == "deadline_exceeded"
    assert PROBES["unary"].cancelled.is_set()


def test_stream_deadline_cancels_the_scope_and_closes_the_stream_in_its_thread(http):
    r = http.post("/process.Process/Start", content=start_body("block", "deadline"),
                  headers={**STREAM, "connect-timeout-ms": "150"})
    assert r.status_code == 200
    end = json.loads(frames(r.content)[-1][1])
    assert end["error"]["code"] == "deadline_exceeded"
    seen = PROBES["deadline"]
    assert seen.cancelled.is_set()
    assert seen.closed.wait(WAIT_S) and seen.closed_in == seen.ran_in


def test_keepalives_while_a_stream_is_idle(http):
    got: list[dict] = []
    with http.stream("POST", "/process.Process/Start", content=start_body("block", "keepalive"),
                     headers={**STREAM, "keepalive-ping-interval": "0.05"}) as r:
        reader = EnvelopeReader()
        for chunk in r.iter_bytes():
            for payload in reader.feed(chunk):
                got.append(json.loads(payload))
                keepalives = sum(1 for m in got if "keepalive" in m.get("event", {}))
                if keepalives == 2:
                    PROBES["keepalive"].release.set()
    assert got[0] == {"event": {"start": {"pid": 1}}}
    assert sum(1 for m in got if "keepalive" in m.get("event", {})) >= 2
    assert "end" in got[-1]["event"]
    assert not PROBES["keepalive"].cancelled.is_set()


def test_client_disconnect_cancels_the_scope_and_closes_the_stream(server):
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client, client.stream(
            "POST", "/process.Process/Start", content=start_body("block", "disconnect"), headers=STREAM) as r:
        first = next(r.iter_bytes())
        assert json.loads(frames(first)[0][1]) == {"event": {"start": {"pid": 1}}}
        assert PROBES["disconnect"].entered.wait(WAIT_S)
    # leaving both blocks closed the connection mid-stream
    seen = PROBES["disconnect"]
    assert seen.cancelled.wait(WAIT_S), "the call's scope was not cancelled when the client went away"
    assert seen.closed.wait(WAIT_S) and seen.closed_in == seen.ran_in


def test_client_stream_error_and_an_envelope_cut_short(http):
    body = envelope(json.dumps({"data": {"input": {"stdin": base64.b64encode(b"fail").decode()}}}).encode())
    r = http.post("/process.Process/StreamInput", content=body, headers=STREAM)
    end = json.loads(frames(r.content)[-1][1])
    assert end["error"] == {"code": "failed_precondition", "message": "stdin is closed"}
    r = http.post("/process.Process/StreamInput", content=body[:-2], headers=STREAM)
    assert "ended inside an enveloped message" in json.loads(frames(r.content)[-1][1])["error"]["message"]


# ---- big bodies -----------------------------------------------------------------------------


def test_a_50_mib_upload_streams_through_in_chunks(http):
    digest = hashlib.sha256()

    def body() -> Iterator[bytes]:
        for number in range(50 * 16):
            chunk = bytes([number % 256]) * (64 << 10)
            digest.update(chunk)
            yield chunk

    tracemalloc.start()
    try:
        r = http.post("/files", content=body(), headers={**ENVD, "Authorization": "Basic " + base64.b64encode(
            b"root:").decode()})
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 200, r.text
    assert r.json() == {"size": 50 * MIB, "sha256": digest.hexdigest(), "biggest": r.json()["biggest"],
                        "user": "root"}
    assert peak < 16 * MIB, f"{peak / MIB:.1f} MiB held at once for a 50 MiB upload"


def test_a_50_mib_download_streams_and_a_failing_body_is_cut_off(http):
    tracemalloc.start()
    try:
        digest = hashlib.sha256()
        size = 0
        with http.stream("GET", "/files", params={"chunks": 800}, headers=ENVD) as r:
            for chunk in r.iter_bytes():
                digest.update(chunk)
                size += len(chunk)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    expected = hashlib.sha256(b"".join(bytes([n % 256]) * (64 << 10) for n in range(800))).hexdigest()
    assert r.status_code == 200 and size == 50 * MIB and digest.hexdigest() == expected
    assert peak < 16 * MIB, f"{peak / MIB:.1f} MiB held at once for a 50 MiB download"
    r = http.get("/files", params={"chunks": 5, "fail_after": 0}, headers=ENVD)
    assert r.status_code == 500 and "the file changed" in r.json()["message"]
    with pytest.raises(httpx.RemoteProtocolError):
        http.get("/files", params={"chunks": 5, "fail_after": 3}, headers=ENVD)


# ---- shutdown -----------------------------------------------------------------------------------


def test_stop_ends_open_streams_with_unavailable():
    handle = serve_e2b("127.0.0.1:0", sandboxes=Boxes(), tokens=TokenSet({"alice": KEY}, source="test"),
                       services=[PROCESS], rest_routes=[], envd_routes=[])
    stopper = None
    try:
        with httpx.Client(base_url=handle.url, timeout=WAIT_S) as client, client.stream(
                "POST", "/process.Process/Start", content=start_body("block", "shutdown"), headers=STREAM) as r:
            raw = b""
            for chunk in r.iter_bytes():
                raw += chunk
                if stopper is None and len(raw) >= 5 + struct.unpack(">I", raw[1:5])[0]:
                    assert PROBES["shutdown"].entered.wait(WAIT_S)
                    stopper = threading.Thread(target=handle.stop)
                    stopper.start()
        flags, last = frames(raw)[-1]
        end = json.loads(last)
        assert flags == 2 and end["error"]["code"] == "unavailable" and "shutting down" in end["error"]["message"]
        assert PROBES["shutdown"].cancelled.is_set()
    finally:
        if stopper is not None:
            stopper.join(WAIT_S)
        handle.stop()


# ---- pieces ---------------------------------------------------------------------------------------


def test_envelope_reader_splits_refuses_compressed_and_oversized():
    data = envelope(b"one") + envelope(b"", 2) + envelope(b"two")
    reader = EnvelopeReader()
    got = [m for i in range(len(data)) for m in reader.feed(data[i:i + 1])]
    assert got == [b"one", b"two"]
    reader.close()
    with pytest.raises(E2bError, match="uncompressed"):
        list(EnvelopeReader().feed(envelope(b"x", 1)))
    with pytest.raises(E2bError, match="over the limit"):
        list(EnvelopeReader(limit=4).feed(envelope(b"12345")))
    short = EnvelopeReader()
    list(short.feed(envelope(b"abc")[:-1]))
    with pytest.raises(E2bError, match="ended inside"):
        short.close()


def test_read_head_parses_the_deadline_and_keepalive():
    unary = PROCESS.methods["List"]
    head = read_head(unary, "POST", {"content-type": "application/json; charset=utf-8", "connect-timeout-ms": "250"},
                     now=100.0)
    assert head.codec.name == "json" and head.deadline == pytest.approx(100.25) and head.keepalive_s is None
    stream = PROCESS.methods["Start"]
    head = read_head(stream, "POST", {"content-type": "application/connect+proto", "keepalive-ping-interval": "50"})
    assert head.codec.name == "proto" and head.keepalive_s == 50
    for bad in ("0", "-1", "nan", "soon"):
        with pytest.raises(E2bError, match="keepalive-ping-interval"):
            read_head(stream, "POST", {"content-type": "application/connect+json", "keepalive-ping-interval": bad})
    with pytest.raises(E2bError, match="1 to 10 digits"):
        read_head(unary, "POST", {"content-type": "application/json", "connect-timeout-ms": "12345678901"})


def test_output_channel_holds_the_producer_back():
    loop = asyncio.new_event_loop()
    try:
        channel = OutputChannel(loop, window=2)
        returned = threading.Event()
        results: list[bool] = []

        def produce() -> None:
            for item in (b"1", b"2", b"3"):
                results.append(channel.put(item))
            returned.set()

        thread = threading.Thread(target=produce)
        thread.start()
        assert not returned.wait(0.3), "the third put did not wait for room"
        assert loop.run_until_complete(channel.get(WAIT_S)) == b"1"
        assert returned.wait(WAIT_S) and results == [True, True, True]
        thread.join(WAIT_S)
        channel.stop()
        assert channel.put(b"4") is False
    finally:
        loop.close()
