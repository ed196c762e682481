"""The ``computer`` tool on a real desktop sandbox: in the Chromium the display starts with, the
model's keys open a page served in the sandbox, a click on its button changes it, and the change
is seen in the screenshot's pixels.

One desktop sandbox for the module, with every hardening default and limit unchanged.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.core.calls import ErrorCode
from harness.core.context import ToolContext
from harness.engine.desktop import DESKTOP_SCRIPT
from harness.engine.docker.engine import DockerEngine
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from harness.tools.computer import COMPUTER, DESKTOP_IMAGE, ComputerArgs
from tests.conftest import IMAGE, RUNTIME, unavailable

pytestmark = pytest.mark.docker

BLUE, GREEN, WHITE = (0, 0, 200), (0, 160, 0), (255, 255, 255)
PAGE = """<!doctype html><html><body style="margin:0;background:#fff">
<button id="b" style="position:absolute;left:200px;top:150px;width:400px;height:200px;border:0;
background:rgb(0,0,200);color:#fff;font-size:40px"
onclick="this.style.background='rgb(0,160,0)';this.textContent='Clicked'">Click me</button>
</body></html>"""


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def decode_png(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and RGB rows of an 8-bit RGB PNG whose rows all use filter 0 (what the desktop writes)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, color = struct.unpack(">IIBB", body[:10])
            assert (depth, color) == (8, 2)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * 3 + 1
    assert all(raw[row * stride] == 0 for row in range(height))
    return width, height, b"".join(raw[row * stride + 1:(row + 1) * stride] for row in range(height))


def pixels_of(rgb: bytes, width: int, color: tuple[int, int, int]) -> list[tuple[int, int]]:
    """Where ``color`` is (within a small tolerance), sampling every 4th pixel."""
    found = []
    for index in range(0, len(rgb) // 3, 4):
        r, g, b = rgb[index * 3:index * 3 + 3]
        if abs(r - color[0]) + abs(g - color[1]) + abs(b - color[2]) < 30:
            found.append((index % width, index // width))
    return found


@pytest.fixture(scope="module")
def desktop(engine: Any) -> Iterator[Any]:
    try:
        engine.client.images.get(DESKTOP_IMAGE)
    except Exception:
        unavailable(f"image {DESKTOP_IMAGE} is missing (run `make image-desktop`)", module=True)
    # Every default limit (512m, 256 pids): Chromium on this page takes about 230 MB and 170 pids.
    box = engine.create(SandboxSpec(image=DESKTOP_IMAGE, runtime=RUNTIME))
    try:
        yield box
    finally:
        box.destroy()


def _computer(box: Any, **args: Any) -> Any:
    ctx = ToolContext(run_id="computer", call_id="c1", provider=_Provider(box), default_timeout_s=30.0,
                      timeout_ceiling_s=60.0, output_budget=30_000)
    return COMPUTER.handler(ctx, ComputerArgs(**args))


def _screen(box: Any, **args: Any) -> tuple[Any, int, int, bytes]:
    out = _computer(box, **args)
    assert not out.is_error, out.text
    (image,) = out.images
    width, height, rgb = decode_png(image.data)
    assert (image.media_type, image.width, image.height) == ("image/png", width, height)
    return out, width, height, rgb


def _until(box: Any, seen: Any, what: str, timeout_s: float = 60.0) -> tuple[int, bytes]:
    """Screenshots until ``seen(width, rgb)`` holds: Chromium paints when it is ready."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, width, _, rgb = _screen(box, action="screenshot")
        if seen(width, rgb):
            return width, rgb
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not seen on the screen within {timeout_s:.0f} s")


def test_a_click_on_a_page_in_chromium_is_seen_in_the_pixels(desktop: Any) -> None:
    # The page's server runs as a job: a command's processes end with the command.
    desktop.agent.write_file("/workspace/page.html", PAGE.encode())
    desktop.agent.jobs.start(["python3", "-m", "http.server", "8765", "--bind", "127.0.0.1"], cwd="/workspace")
    out, width, height, _ = _screen(desktop, action="screenshot")  # starts the display, with Chromium
    assert (width, height) == (1280, 800) and out.images[0].label == "screenshot"
    assert out.structured["capture_ms"] > 0
    # As a model would: Chromium's blank page fills the screen, then ctrl+l, the URL, Return.
    _until(desktop, lambda w, rgb: len(pixels_of(rgb, w, WHITE)) > 0.5 * len(rgb) / 12, "Chromium's blank page")
    for args in ({"action": "key", "text": "ctrl+l"}, {"action": "type", "text": "127.0.0.1:8765/page.html"},
                 {"action": "key", "text": "Return"}):
        assert not _computer(desktop, **args).is_error
    width, rgb = _until(desktop, lambda w, rgb: len(pixels_of(rgb, w, BLUE)) > 1000, "the blue button")
    blue = pixels_of(rgb, width, BLUE)
    assert not pixels_of(rgb, width, GREEN)
    xs, ys = [x for x, _ in blue], [y for _, y in blue]
    center = [(min(xs) + max(xs)) // 2, (min(ys) + max(ys)) // 2]
    assert 380 <= max(xs) - min(xs) <= 400  # the button, 400 px wide, sampled every 4th pixel

    clicked = _computer(desktop, action="left_click", coordinate=center)
    assert not clicked.is_error and clicked.text.startswith("left_click done; screenshot (1280x800 PNG)")
    _until(desktop, lambda w, rgb: len(pixels_of(rgb, w, GREEN)) > 0.9 * len(blue), "the button turned green")

    where = _computer(desktop, action="cursor_position")
    assert (where.structured["x"], where.structured["y"]) == tuple(center) and not where.images
    region = [center[0] - 50, center[1] - 20, center[0] + 50, center[1] + 20]
    zoom = _computer(desktop, action="zoom", region=region)
    (part,) = zoom.images
    zw, zh, zrgb = decode_png(part.data)
    assert (zw, zh, part.label) == (100, 40, "zoom " + ",".join(map(str, region)))
    assert len(pixels_of(zrgb, zw, GREEN)) > 0.5 * (zw * zh / 4)


def test_key_type_and_wrong_actions_answer_readably(desktop: Any) -> None:
    typed = _computer(desktop, action="type", text="hello", duration=3)
    assert not typed.is_error and "duration not used by type: ignored" in typed.text
    whole = _computer(desktop, action="screenshot", region=[0, 0, 10, 10])
    assert "(region not used by screenshot: ignored)" in whole.text
    assert (whole.images[0].width, whole.images[0].label) == (1280, "screenshot")
    for args in ({"action": "hold_key", "text": "shift", "duration": 0.1},
                 {"action": "left_mouse_down", "coordinate": [20, 30]}, {"action": "left_mouse_up"},
                 {"action": "right_click", "coordinate": [20, 30], "text": "ctrl"},
                 {"action": "scroll", "scroll_direction": "down", "scroll_amount": 2, "text": "shift"}):
        done = _computer(desktop, **args)
        assert not done.is_error and done.images, (args, done.text)
    where = _computer(desktop, action="cursor_position")
    assert (where.structured["x"], where.structured["y"]) == (20, 30)
    keyed = _computer(desktop, action="key", text="NoSuchKeyName")
    assert keyed.is_error and keyed.error is ErrorCode.TOOL_FAILED and "xdotool key failed" in keyed.text


def test_a_sandbox_without_a_desktop_is_told_which_image_to_use(make_sandbox: Any) -> None:
    out = _computer(make_sandbox(image=IMAGE), action="screenshot")
    assert out.is_error and out.error is ErrorCode.NOT_SUPPORTED and DESKTOP_IMAGE in out.text
    assert out.structured == {"action": "screenshot", "needs_image": DESKTOP_IMAGE, "policy_key": "sandbox.image"}


def test_a_pooled_desktop_sandbox_is_claimed_with_its_display_and_chromium_up(engine: Any, desktop: Any) -> None:
    root = Path(tempfile.mkdtemp(prefix="cbx-dpool-", dir="/tmp"))
    own = DockerEngine(engine.client, run_root=root, reap_on_start=False)
    spec = SandboxSpec(image=DESKTOP_IMAGE, runtime=RUNTIME)
    pool = own.enable_pool([spec], size=1)
    box = None
    try:
        assert pool.wait_filled(120.0), "the desktop pool did not fill"
        box = own.create(spec)
        assert pool.claims == 1
        # The image's own script, not the tool: the tool would start a display that is down.
        reply = collect(box.agent.exec(["python3", "-I", DESKTOP_SCRIPT, '{"action": "cursor_position"}']))
        assert reply.exit_code == 0, reply.stdout.data() + reply.stderr.data()
        assert json.loads(reply.stdout.data().decode().splitlines()[-1])["ok"] is True
        window = collect(box.agent.exec(["xdotool", "search", "--onlyvisible", "--class", "chromium"],
                                        env={"DISPLAY": ":1"}))
        assert window.exit_code == 0 and window.stdout.data().strip(), "Chromium's window is not up at the claim"
    finally:
        if box is not None:
            box.destroy()
        pool.close()
        shutil.rmtree(root, ignore_errors=True)
