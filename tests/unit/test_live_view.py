"""The console's live view without a sandbox: the RFB input filter's framing, the relay between
a WebSocket and a tunnel, who may take over, and the audit of taking over and giving back."""

from __future__ import annotations

import json
import queue
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from harness.audit.store import AuditStore
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http.app import console_app
from harness.doors.http.auth import Sessions
from harness.doors.http.console import Console
from harness.doors.http.live_view import ControlDesk, relay_vnc
from harness.doors.http.novnc_files import NovncFiles
from harness.doors.http.rfb import CLIENT_CUT_TEXT_MAX, RfbError, RfbInputFilter

HANDSHAKE = b"RFB 003.008\n" + b"\x01" + b"\x01"
SET_ENCODINGS = struct.pack(">BBH", 2, 0, 2) + struct.pack(">ii", 0, -223)
UPDATE_REQUEST = struct.pack(">BBHHHH", 3, 1, 0, 0, 1280, 800)
POINTER = struct.pack(">BBHH", 5, 1, 10, 20)
KEY = struct.pack(">BBxxI", 4, 1, 0x61)
CUT_TEXT = struct.pack(">BxxxI", 6, 5) + b"hello"

OPERATOR_TOKEN = "unit-live-operator-token-0123456789"
CLIENT_TOKEN = "unit-live-client-token-0123456789ab"
TOKENS = TokenSet({"operator": OPERATOR_TOKEN, "agent": CLIENT_TOKEN}, source="unit tokens", operators=["operator"])


def _filter(control: bool) -> RfbInputFilter:
    viewer = RfbInputFilter(lambda: control)
    assert viewer.feed(HANDSHAKE) == HANDSHAKE
    return viewer


# ---- the input filter ------------------------------------------------------------------------------------


def test_a_viewer_not_in_control_sends_requests_but_no_input():
    viewer = _filter(control=False)
    stream = SET_ENCODINGS + POINTER + UPDATE_REQUEST + KEY + CUT_TEXT + UPDATE_REQUEST
    assert viewer.feed(stream) == SET_ENCODINGS + UPDATE_REQUEST + UPDATE_REQUEST
    assert viewer.dropped == 3


def test_a_viewer_in_control_sends_everything_as_it_came():
    viewer = _filter(control=True)
    stream = SET_ENCODINGS + POINTER + KEY + CUT_TEXT + UPDATE_REQUEST
    assert viewer.feed(stream) == stream
    assert viewer.dropped == 0


def test_control_is_asked_at_each_message():
    allowed = [False]
    viewer = RfbInputFilter(lambda: allowed[0])
    viewer.feed(HANDSHAKE)
    assert viewer.feed(POINTER) == b""
    allowed[0] = True
    assert viewer.feed(POINTER) == POINTER
    allowed[0] = False
    assert viewer.feed(KEY) == b""


def test_messages_split_anywhere_are_framed_whole():
    viewer = RfbInputFilter(lambda: False)
    stream = HANDSHAKE + SET_ENCODINGS + POINTER + CUT_TEXT + UPDATE_REQUEST
    passed = b"".join(viewer.feed(stream[i:i + 1]) for i in range(len(stream)))
    assert passed == HANDSHAKE + SET_ENCODINGS + UPDATE_REQUEST


def test_the_extensions_noVNC_may_send_are_framed():
    viewer = _filter(control=False)
    fence = struct.pack(">BxxxIB", 248, 0, 3) + b"abc"
    continuous = struct.pack(">BBHHHH", 150, 1, 0, 0, 1280, 800)
    qemu_key = struct.pack(">BBHII", 255, 0, 1, 0x61, 30)
    desktop_size = struct.pack(">BxHHBx", 251, 800, 600, 1) + bytes(16)
    extended_cut = struct.pack(">Bxxxi", 6, -4) + b"\x00\x00\x00\x01"
    assert viewer.feed(fence + continuous + qemu_key + desktop_size + extended_cut) == fence + continuous
    assert viewer.dropped == 3


@pytest.mark.parametrize("stream, says", [
    (b"HTTP/1.1 200\r\n", "not an RFB protocol version"),
    (b"RFB 003.008\n\x02", "security type 2"),
    (HANDSHAKE + b"\x07", "message type 7"),
    (HANDSHAKE + b"\xff\x01", "QEMU message subtype 1"),
    (HANDSHAKE + struct.pack(">BxxxI", 6, CLIENT_CUT_TEXT_MAX + 1), "clipboard text"),
])
def test_what_cannot_be_framed_ends_the_connection(stream: bytes, says: str):
    with pytest.raises(RfbError, match=says):
        RfbInputFilter(lambda: True).feed(stream)


def test_protocol_3_3_has_no_security_choice_from_the_viewer():
    viewer = RfbInputFilter(lambda: False)
    assert viewer.feed(b"RFB 003.003\n" + b"\x01" + POINTER + UPDATE_REQUEST) == (
        b"RFB 003.003\n\x01" + UPDATE_REQUEST)


# ---- the relay -------------------------------------------------------------------------------------------


class _Tunnel:
    """A tunnel's shape (send, recv, close) over queues: the VNC server's side is the test's."""

    def __init__(self, server_bytes: list[bytes]) -> None:
        self.incoming: queue.Queue[bytes | None] = queue.Queue()
        for data in server_bytes:
            self.incoming.put(data)
        self.sent: queue.Queue[bytes] = queue.Queue()
        self.closed = False

    def send(self, data: bytes) -> None:
        self.sent.put(data)

    def recv(self) -> Iterator[bytes]:
        while (data := self.incoming.get()) is not None:
            yield data

    def close(self) -> None:
        self.closed = True
        self.incoming.put(None)


def _relay_app(tunnel: _Tunnel, control: list[bool]) -> Starlette:
    async def endpoint(websocket: WebSocket) -> None:
        await websocket.accept(subprotocol="binary")
        await relay_vnc(websocket, tunnel, lambda: control[0])  # type: ignore[arg-type]

    return Starlette(routes=[WebSocketRoute("/vnc", endpoint)])


def test_the_relay_carries_the_server_bytes_and_filters_the_viewers():
    tunnel = _Tunnel([b"RFB 003.008\n"])
    control = [False]
    with TestClient(_relay_app(tunnel, control)) as client, \
            client.websocket_connect("/vnc", subprotocols=["binary"]) as socket:
        assert socket.receive_bytes() == b"RFB 003.008\n"
        socket.send_bytes(HANDSHAKE + POINTER + UPDATE_REQUEST)
        assert tunnel.sent.get(timeout=5) == HANDSHAKE + UPDATE_REQUEST
        control[0] = True
        socket.send_bytes(POINTER)
        assert tunnel.sent.get(timeout=5) == POINTER
        tunnel.incoming.put(b"\x00update")
        assert socket.receive_bytes() == b"\x00update"
    assert tunnel.closed


def test_the_relay_closes_on_what_it_cannot_frame():
    tunnel = _Tunnel([])
    with TestClient(_relay_app(tunnel, [True])) as client, client.websocket_connect("/vnc") as socket:
        socket.send_bytes(b"GET / HTTP/1.1\r\n")
        with pytest.raises(WebSocketDisconnect) as closed:
            socket.receive_bytes()
    assert closed.value.code == 1008
    assert tunnel.closed and tunnel.sent.empty()


# ---- take-over: who, and the audit ------------------------------------------------------------------------


def test_taking_over_and_giving_back_are_recorded_in_the_sandboxs_run(tmp_path: Path):
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        desk = ControlDesk(audit)
        assert "view-only" not in desk.take("box-1", key="session-a", client="alice")
        assert desk.in_control("box-1", "session-a") and not desk.in_control("box-1", "session-b")
        assert "taken from console:alice" in desk.take("box-1", key="session-b", client="bob")
        assert "nothing to give back" in desk.give_back("box-1", key="session-a", client="alice")
        assert "view-only again" in desk.give_back("box-1", key="session-b", client="bob")
        assert desk.holder("box-1") is None
        calls = audit.calls_for_run("box-1")
    tools = [(c["tool"], c["arguments"], c["decision"]) for c in calls]
    assert [(t, json.loads(a) if isinstance(a, str) else a) for t, a, _ in tools] == [
        ("sandbox.take_over", {"actor": "console:alice"}), ("sandbox.take_over", {"actor": "console:bob"}),
        ("sandbox.give_back", {"actor": "console:bob"})]
    assert all(c["call_id"].startswith("action-") and c["state"] == "done" for c in calls)
    assert audit_budget_free(tmp_path)


def audit_budget_free(tmp_path: Path) -> bool:
    """Take-overs are sandbox actions: the run's tool-call budget does not count them."""
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        return audit.count_calls("box-1") == 0


@pytest.fixture
def console(tmp_path: Path) -> Iterator[TestClient]:
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        app = console_app(Console(audit, None), Sessions(TOKENS), engine_ping=lambda: None, tls=False, loopback=True,
                          novnc=NovncFiles(client=_no_engine))
        with TestClient(app, base_url="http://127.0.0.1") as client:
            yield client


def _no_engine() -> Any:
    raise AssertionError("no image is read in these tests")


def test_a_client_token_cannot_take_over(console: TestClient):
    refused = console.post("/sandboxes/box-1/control", data={"control": "take"},
                           headers={"authorization": f"Bearer {CLIENT_TOKEN}"})
    assert refused.status_code == 403
    assert "operator" in refused.text
    missing = console.post("/sandboxes/box-1/control", data={"control": "take"},
                           headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert missing.status_code == 404  # an operator is refused only because no such sandbox lives here


@pytest.mark.parametrize("headers", [
    {},  # no token
    {"authorization": "Bearer not-a-token-of-this-server"},
    {"authorization": f"Bearer {OPERATOR_TOKEN}", "origin": "http://attacker.test"},  # another site's page
    {"authorization": f"Bearer {OPERATOR_TOKEN}"},  # no such sandbox
])
def test_the_live_views_socket_is_refused_before_it_opens(console: TestClient, headers: dict[str, str]):
    with pytest.raises(WebSocketDisconnect) as refused, console.websocket_connect("/sandboxes/box-1/vnc",
                                                                                  headers=headers):
        pass
    assert refused.value.code == 1008


def test_the_live_view_page_and_novnc_need_a_token(console: TestClient):
    assert console.get("/sandboxes/box-1/view").status_code == 401
    assert console.get("/sandboxes/box-1/novnc/core/rfb.js").status_code == 401
    page = console.get("/sandboxes/box-1/view", headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert page.status_code == 404 and "no live sandbox box-1" in page.text
    script = console.get("/static/liveview.js")
    assert script.status_code == 200 and "core/rfb.js" in script.text


def test_callbox_sandbox_view_takes_the_consoles_url_from_the_flag_the_environment_or_the_default(
        monkeypatch: pytest.MonkeyPatch):
    from harness.cli.sandbox_view import DEFAULT_CONSOLE, _console_base
    from harness.core.errors import UsageError

    monkeypatch.delenv("CALLBOX_CONSOLE_URL", raising=False)
    assert _console_base(None) == DEFAULT_CONSOLE
    monkeypatch.setenv("CALLBOX_CONSOLE_URL", "https://console.example:8443/")
    assert _console_base(None) == "https://console.example:8443"
    assert _console_base("http://127.0.0.1:9000") == "http://127.0.0.1:9000"
    with pytest.raises(UsageError, match="not an http"):
        _console_base("127.0.0.1:9464")
