"""The console's live view of a desktop sandbox in a real browser (Debian's headless Chromium
driven by Playwright, as tests/interop/test_console_chromium.py drives it).

One desktop sandbox for the module, created through the gRPC door by a client's token, its
display started by one ``computer`` call; the console runs on the door's executor. In the
page, noVNC (served from the sandbox's image) draws the desktop in its canvas; the pointer the
browser moves over it reaches the desktop only after an operator took over, which the audit
records, as it records giving back; a client's token cannot take over.

The image is ``$CALLBOX_TEST_DESKTOP_IMAGE`` (default callbox-sandbox-desktop:latest).
``$CALLBOX_LIVEVIEW_SHOT``, when set, is where a screenshot of the page is saved.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import tempfile
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http import HttpServer, serve_http
from tests.browser import chromium
from tests.conftest import unavailable
from tests.integration.helpers import callbox

pytestmark = [pytest.mark.interop, pytest.mark.docker]

DESKTOP_IMAGE = os.environ.get("CALLBOX_TEST_DESKTOP_IMAGE", "callbox-sandbox-desktop:latest")
OPERATOR_TOKEN = "liveview-operator-token-0123456789"
AGENT_TOKEN = "liveview-agent-token-0123456789abc"
TOKENS = TokenSet({"operator": OPERATOR_TOKEN, "agent": AGENT_TOKEN}, source="test tokens", operators=["operator"])
PAGE_TIMEOUT_MS = 30_000

# The canvas's pixels: how many of a sample differ from the first one (a blank canvas: none).
CANVAS_VARIETY = """() => {
  const canvas = document.querySelector('#live-screen canvas');
  const ctx = canvas.getContext('2d');
  const data = ctx.getImageData(0, 0, canvas.width, canvas.height).data;
  let differing = 0;
  for (let i = 0; i < data.length; i += 4 * 97) {
    if (data[i] !== data[0] || data[i + 1] !== data[1] || data[i + 2] !== data[2]) differing++;
  }
  return {width: canvas.width, height: canvas.height, differing: differing};
}"""
CANVAS_DRAWN = CANVAS_VARIETY.replace("return {width: canvas.width, height: canvas.height, differing: differing};",
                                      "return differing > 100;")
"""True once noVNC has drawn the desktop (a function, not an expression: the page's CSP forbids eval)."""


@dataclass
class Stack:
    grpc: GrpcServer
    http: HttpServer
    audit: AuditStore
    agent: ExecutorClient
    sandbox_id: str


@pytest.fixture(scope="module")
def stack(engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The gRPC door on the desktop image, the console on its executor, one desktop sandbox
    whose display a screenshot started."""
    try:
        engine.client.images.get(DESKTOP_IMAGE)
    except Exception:
        unavailable(f"image {DESKTOP_IMAGE} is missing (run `make image-desktop`)", module=True)
    short = Path(tempfile.mkdtemp(prefix="cbx-live-", dir="/tmp"))  # sun_path is 108 bytes
    audit = AuditStore(tmp_path_factory.mktemp("live") / "audit.sqlite3")
    policy = parse_policy(textwrap.dedent(f"""
        [sandbox]
        image = "{DESKTOP_IMAGE}"

        [tools.computer]
        decision = "allow"
    """))
    door = serve_grpc(str(short / "executor.sock"), policy=policy, audit=audit, tokens=TOKENS, announce=None)
    try:
        http = serve_http("127.0.0.1:0", tokens=TOKENS, executor=door.service, audit=audit)
        try:
            with ExecutorClient(door.target, AGENT_TOKEN) as agent:
                box = agent.create_sandbox()
                started = agent.call(box, "computer", {"action": "screenshot"})
                assert not started.is_error, started.text
                try:
                    yield Stack(door, http, audit, agent, box)
                finally:
                    agent.delete_sandbox(box)
        finally:
            http.stop()
    finally:
        door.stop(grace=1)
        audit.close()
        shutil.rmtree(short, ignore_errors=True)


@pytest.fixture(scope="module")
def page(stack: Stack) -> Iterator[Any]:
    """An operator's page, logged in."""
    with chromium() as browser:
        context = browser.new_context(viewport={"width": 1400, "height": 1100})
        context.set_default_timeout(PAGE_TIMEOUT_MS)
        try:
            opened = context.new_page()
            opened.goto(f"{stack.http.url}/login")
            opened.get_by_label("Token").fill(OPERATOR_TOKEN)
            opened.get_by_role("button", name="Log in").click()
            yield opened
        finally:
            context.close()


def _pointer(stack: Stack) -> tuple[int, int]:
    result = stack.agent.call(stack.sandbox_id, "computer", {"action": "cursor_position"})
    assert not result.is_error, result.text
    found = re.match(r"X=(\d+),Y=(\d+)", result.text)
    assert found is not None, result.text
    return int(found[1]), int(found[2])


def _connected(page: Any, stack: Stack) -> Any:
    page.goto(f"{stack.http.url}/sandboxes/{stack.sandbox_id}/view")
    screen = page.locator("#live-screen[data-state=connected]")
    screen.wait_for()
    page.wait_for_function(CANVAS_DRAWN)
    return screen


def test_the_live_view_draws_the_desktop(page: Any, stack: Stack) -> None:
    page.goto(f"{stack.http.url}/sandboxes")
    page.get_by_role("link", name=f"Live view of {stack.sandbox_id}").click()
    page.locator("#live-screen[data-state=connected]").wait_for()
    page.wait_for_function(CANVAS_DRAWN)
    drawn = page.evaluate(CANVAS_VARIETY)
    assert (drawn["width"], drawn["height"]) == (1280, 800)  # the desktop's own size
    assert "view-only" in page.locator("#live-status").inner_text()
    shot = os.environ.get("CALLBOX_LIVEVIEW_SHOT")
    if shot:
        Path(shot).parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=shot, full_page=True)


def test_a_client_token_cannot_take_over(stack: Stack) -> None:
    refused = httpx.post(f"{stack.http.url}/sandboxes/{stack.sandbox_id}/control", data={"control": "take"},
                         headers={"authorization": f"Bearer {AGENT_TOKEN}"})
    assert refused.status_code == 403, refused.text
    assert "operator" in refused.text
    tools = [c["tool"] for c in stack.audit.calls_for_run(stack.sandbox_id)]
    assert "sandbox.take_over" not in tools


def test_input_reaches_the_desktop_only_after_an_operator_took_over(page: Any, stack: Stack) -> None:
    screen = _connected(page, stack)
    box = screen.bounding_box()
    before = _pointer(stack)
    assert abs(before[0] - 320) > 20 or abs(before[1] - 200) > 20  # not where the take-over moves it
    page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.25)
    page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] * 0.75)
    # A view-only page sends no pointer events; the proxy would drop them if it did.
    assert _pointer(stack) == before

    page.get_by_role("button", name="Take over mouse and keyboard").click()
    page.get_by_role("button", name="Give back").wait_for()
    screen = page.locator("#live-screen[data-state=connected]")
    screen.wait_for()
    box = screen.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.75, box["y"] + box["height"] * 0.75)
    page.mouse.move(box["x"] + box["width"] * 0.25, box["y"] + box["height"] * 0.25)
    # The desktop's pointer follows (a quarter of 1280x800), once the events have gone through.
    near = False
    for _ in range(50):
        x, y = _pointer(stack)
        near = abs(x - 320) <= 20 and abs(y - 200) <= 20
        if near:
            break
    assert near, (x, y, before)

    page.get_by_role("button", name="Give back").click()
    page.get_by_role("button", name="Take over mouse and keyboard").wait_for()
    records = [c for c in stack.audit.calls_for_run(stack.sandbox_id) if c["tool"].startswith("sandbox.")]
    assert [c["tool"] for c in records] == ["sandbox.take_over", "sandbox.give_back"]
    assert all(json.loads(c["arguments"]) == {"actor": "console:operator"} if isinstance(c["arguments"], str)
               else c["arguments"] == {"actor": "console:operator"} for c in records)


class _Rfb:
    """A minimal RFB viewer over the console's WebSocket, as a script would be."""

    def __init__(self, url: str, token: str) -> None:
        from websockets.sync.client import connect

        self.socket = connect(url, additional_headers={"authorization": f"Bearer {token}"}, subprotocols=["binary"],
                              open_timeout=30)
        self.pending = b""

    def read(self, count: int) -> bytes:
        while len(self.pending) < count:
            message = self.socket.recv(timeout=30)
            assert isinstance(message, bytes)
            self.pending += message
        taken, self.pending = self.pending[:count], self.pending[count:]
        return taken

    def handshake(self) -> None:
        assert self.read(12).startswith(b"RFB 003.")
        self.socket.send(b"RFB 003.008\n")
        types = self.read(self.read(1)[0])
        assert 1 in types  # None: the console's login is the gate
        self.socket.send(b"\x01")
        assert self.read(4) == b"\0\0\0\0"
        self.socket.send(b"\x01")  # shared
        width, height = struct.unpack(">HH", self.read(4))
        assert (width, height) == (1280, 800)
        self.read(16)
        self.read(struct.unpack(">I", self.read(4))[0])

    def point_and_sync(self, x: int, y: int) -> None:
        """A pointer event, then a full update request answered: the server has read both by then."""
        self.socket.send(struct.pack(">BBHH", 5, 0, x, y) + struct.pack(">BBHHHH", 3, 0, 0, 0, 1280, 800))
        while self.read(1) != b"\x00":  # skip anything before the FramebufferUpdate
            pass


def test_a_client_viewer_sends_no_input_whatever_it_sends(stack: Stack) -> None:
    """A script with the client's token speaks RFB itself: its pointer event is dropped by the proxy."""
    before = _pointer(stack)
    target = (before[0] + 300) % 1280, (before[1] + 200) % 800
    viewer = _Rfb(f"{stack.http.url.replace('http://', 'ws://')}/sandboxes/{stack.sandbox_id}/vnc", AGENT_TOKEN)
    try:
        viewer.handshake()
        viewer.point_and_sync(*target)
    finally:
        viewer.socket.close()
    assert _pointer(stack) == before


def test_callbox_sandbox_view_prints_the_live_views_url(stack: Stack) -> None:
    shown = callbox("sandbox", "view", stack.sandbox_id, "--console", stack.http.url, "--json")
    assert shown.returncode == 0, shown.stderr
    url = json.loads(shown.stdout)["url"]
    assert url == f"{stack.http.url}/sandboxes/{stack.sandbox_id}/view"
    page = httpx.get(url, headers={"authorization": f"Bearer {OPERATOR_TOKEN}"})
    assert page.status_code == 200 and 'id="live-screen"' in page.text
    missing = callbox("sandbox", "view", "no-such-sandbox-here", "--console", stack.http.url)
    assert missing.returncode == 4 and b"no sandbox named no-such-sandbox-here" in missing.stderr
