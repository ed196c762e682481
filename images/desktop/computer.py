"""The desktop's one implementation of the `computer` actions: run as a command, stdlib only.

``python3 /opt/callbox/desktop/computer.py '<json>'`` performs one action on the display ``:1``
and prints one JSON line: ``{"ok": true, ...}`` with, for the actions that look at the screen, the
PNG as ``png_base64`` and its ``width``/``height``; or ``{"ok": false, "error": "..."}`` (exit 2) for
an action it cannot do, with ``"display_down": true`` (exit 3) when the display is not running.

The display stack (Xvfb :1 at 1280x800x24, openbox, and Chromium in one maximized window on a blank
page) is started by the action ``start_display``,
which the harness runs as a sandbox job that leaves its processes running (a command's processes
end with the command): it starts them unless the display answers already (a lock file keeps two
from racing), and returns once the display accepts connections. It stays up for the sandbox's life.

Actions, named as Anthropic's computer tool names them: ``screenshot``, ``left_click``,
``right_click``, ``middle_click``, ``double_click``, ``triple_click`` (``coordinate`` [x, y],
optional: the current position; ``text``, optional: modifier keys held meanwhile, ``shift``,
``ctrl+alt``), ``left_click_drag`` (``start_coordinate``, ``coordinate``), ``mouse_move``
(``coordinate``), ``left_mouse_down``, ``left_mouse_up`` (optional ``coordinate``), ``type``
(``text``), ``key`` (``text``: xdotool key names, ``ctrl+l``, several separated by spaces),
``hold_key`` (``text``, ``duration``), ``scroll`` (``scroll_direction`` up/down/left/right,
``scroll_amount`` wheel clicks, optional ``coordinate`` and modifier ``text``), ``wait``
(``duration`` seconds), ``zoom`` (``region`` [x1, y1, x2, y2]: that part of the screen at its own
resolution), ``cursor_position``.
Every action but ``cursor_position`` returns a screenshot taken after it; input actions first give
the display ``SETTLE_S`` to repaint. ``open_url`` (``text``) opens a URL in a Chromium app window
(no address bar), to be run as a job too; it is the image's convenience, not one of the tool's
actions.

Screenshots: ``xwd -root`` (one XGetImage of the root window) decoded here, and encoded as an
8-bit RGB PNG with zlib at level 1 (speed over size: a screenshot is read once).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib
from typing import Any

DISPLAY = ":1"
WIDTH, HEIGHT = 1280, 800
X_SOCKET = "/tmp/.X11-unix/X1"
VNC_PORT = 5900
STATE_DIR = "/tmp/callbox-desktop"
SETTLE_S = 0.15
START_TIMEOUT_S = 15.0
MAX_WAIT_S = 60.0
XDOTOOL_TYPE_DELAY_MS = 8
CLICKS = {"left_click": ("1", 1), "right_click": ("3", 1), "middle_click": ("2", 1),
          "double_click": ("1", 2), "triple_click": ("1", 3)}
SCROLL_BUTTONS = {"up": "4", "down": "5", "left": "6", "right": "7"}
# Chromium without its sandbox: a container has no user namespaces for its namespace sandbox, and
# no-new-privileges (kept on) makes the setuid sandbox impossible; the container is the boundary.
# /dev/shm is a few MiB here, so shared memory goes to /tmp; no GPU, no first-run or keyring prompts;
# --test-type keeps the "unsupported command-line flag: --no-sandbox" bar off the page the model reads.
CHROMIUM_FLAGS = ("--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--no-first-run",
                  "--no-default-browser-check", "--password-store=basic", "--disable-background-networking",
                  "--disable-component-update", "--disable-features=Translate,MediaRouter",
                  "--disable-session-crashed-bubble", f"--window-size={WIDTH},{HEIGHT}", "--window-position=0,0",
                  "--user-data-dir=/tmp/callbox-desktop/chromium", "--test-type")


class ActionError(Exception):
    """An action that cannot be done as asked: reported as ``{"ok": false, "error": ...}``."""


class DisplayDown(ActionError):
    """The display is not running: the caller starts it (``start_display``) and asks again."""


def _env() -> dict[str, str]:
    return {**os.environ, "DISPLAY": DISPLAY, "HOME": os.environ.get("HOME") or "/tmp"}


def _display_up() -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(X_SOCKET)
        return True
    except OSError:
        return False
    finally:
        probe.close()


def _spawn(argv: list[str], log: str) -> subprocess.Popen[bytes]:
    with open(os.path.join(STATE_DIR, log), "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=_env(),
                                start_new_session=True, close_fds=True)


def ensure_display() -> None:
    """Start Xvfb :1, openbox and Chromium unless the display answers already."""
    if _display_up():
        return
    os.makedirs(STATE_DIR, exist_ok=True)
    with open(os.path.join(STATE_DIR, "start.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _display_up():
            return
        xvfb = _spawn(["Xvfb", DISPLAY, "-screen", "0", f"{WIDTH}x{HEIGHT}x24", "-nolisten", "tcp",
                       "-dpi", "96", "-noreset"], "xvfb.log")
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _display_up():
            if xvfb.poll() is not None:
                raise ActionError(f"Xvfb exited with {xvfb.returncode}: {_log_tail('xvfb.log')}")
            if time.monotonic() > deadline:
                raise ActionError(f"the display did not come up in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.01)
        _spawn(["openbox", "--sm-disable"], "openbox.log")
        start_vnc()
        # A browser is what a model drives on this desktop: Chromium starts with the display, one
        # maximized window on a blank page (ctrl+l, a URL and Return open a page).
        chromium = shutil.which("chromium")
        if chromium is not None:
            _spawn(chromium_argv(chromium, "--start-maximized", "about:blank"), "chromium.log")


def chromium_argv(chromium: str, *args: str) -> list[str]:
    """Chromium's command line: the flags above, DevTools on a loopback port Chromium picks and
    writes to ``DevToolsActivePort`` in its profile (the browser tools connect there), and the
    sandbox's egress proxy when it has one (``allowlist``), so its rules and audit apply to the
    browser too; loopback stays direct, so the sandbox's own servers are reached either way."""
    proxy = os.environ.get("HTTPS_PROXY") or os.environ.get("HTTP_PROXY")
    return [chromium, *CHROMIUM_FLAGS, "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
            *([f"--proxy-server={proxy}"] if proxy else []), *args]


def start_vnc() -> None:
    """x11vnc on the sandbox's loopback (``VNC_PORT``) for the console's live view, which reaches
    it over the agent's port tunnel; it takes input, and the console's proxy lets only an
    operator who took over send any."""
    if shutil.which("x11vnc") is not None:
        _spawn(["x11vnc", "-display", DISPLAY, "-localhost", "-rfbport", str(VNC_PORT), "-forever", "-shared",
                "-nopw", "-noipv6", "-quiet"], "x11vnc.log")


def _log_tail(name: str) -> str:
    try:
        with open(os.path.join(STATE_DIR, name), "rb") as f:
            return f.read()[-400:].decode("utf-8", "replace").strip()
    except OSError:
        return ""


def xdotool(*args: str) -> str:
    done = subprocess.run(["xdotool", *args], env=_env(), capture_output=True, timeout=30, check=False)
    stderr = done.stderr.decode("utf-8", "replace").strip()
    # xdotool skips a key name it does not know with a warning and exits 0: a model must hear of it.
    if done.returncode != 0 or "No such key name" in stderr:
        raise ActionError(f"xdotool {args[0]} failed: {stderr[-300:]}")
    return done.stdout.decode("utf-8", "replace")


# ---- screenshots --------------------------------------------------------------------------------


def _channel_offset(mask: int, lsb_first: bool) -> int:
    """The byte of a 32-bit pixel holding the 8-bit channel of ``mask``."""
    byte = (mask.bit_length() - 8) // 8
    return byte if lsb_first else 3 - byte


def xwd_to_rgb(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and packed RGB of a 24/32-bit TrueColor xwd dump."""
    fields = struct.unpack(">25I", data[:100])
    header_size, _, _, depth, width, height = fields[:6]
    byte_order, bits_per_pixel, bytes_per_line = fields[7], fields[11], fields[12]
    red_mask, green_mask, blue_mask, ncolors = fields[14], fields[15], fields[16], fields[19]
    if bits_per_pixel != 32 or depth < 24:
        raise ActionError(f"unsupported screen format: depth {depth}, {bits_per_pixel} bits per pixel")
    start = header_size + ncolors * 12
    pixels = data[start:start + bytes_per_line * height]
    if bytes_per_line != width * 4:
        pixels = b"".join(pixels[row * bytes_per_line:row * bytes_per_line + width * 4] for row in range(height))
    lsb = byte_order == 0
    rgb = bytearray(width * height * 3)
    for channel, mask in enumerate((red_mask, green_mask, blue_mask)):
        rgb[channel::3] = pixels[_channel_offset(mask, lsb)::4]
    return width, height, bytes(rgb)


def crop(width: int, rgb: bytes, region: tuple[int, int, int, int]) -> bytes:
    x1, y1, x2, y2 = region
    return b"".join(rgb[(y * width + x1) * 3:(y * width + x2) * 3] for y in range(y1, y2))


def encode_png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG (filter 0 on every row)."""
    stride = width * 3
    raw = b"".join(b"\x00" + rgb[row * stride:(row + 1) * stride] for row in range(height))

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1))
            + chunk(b"IEND", b""))


# xwd walks the root's child windows for their visuals; a window that closes during that walk (Chromium
# opens and closes a few while it starts) fails the capture with BadWindow. The screen itself is fine, so
# the capture is taken again.
GRAB_ATTEMPTS = 5
"""How many times a capture is taken when a window vanished during it."""


def grab() -> tuple[int, int, bytes]:
    for _ in range(GRAB_ATTEMPTS):
        done = subprocess.run(["xwd", "-root", "-silent", "-display", DISPLAY], env=_env(), capture_output=True,
                              timeout=30, check=False)
        if done.returncode == 0:
            return xwd_to_rgb(done.stdout)
        if b"BadWindow" not in done.stderr:
            break
    raise ActionError(f"xwd failed: {done.stderr.decode('utf-8', 'replace').strip()[-300:]}")


def screenshot(region: tuple[int, int, int, int] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    width, height, rgb = grab()
    if region is not None:
        x1, y1, x2, y2 = region
        if not (0 <= x1 < x2 <= width and 0 <= y1 < y2 <= height):
            raise ActionError(f"region {list(region)} is not inside the {width}x{height} screen "
                              "(x1 < x2, y1 < y2)")
        rgb, width, height = crop(width, rgb, region), x2 - x1, y2 - y1
    png = encode_png(width, height, rgb)
    return {"png_base64": base64.b64encode(png).decode("ascii"), "width": width, "height": height,
            "capture_ms": round((time.monotonic() - started) * 1000, 1)}


# ---- actions ------------------------------------------------------------------------------------


def _point(args: dict[str, Any], key: str = "coordinate", *, required: bool = True) -> tuple[str, str] | None:
    value = args.get(key)
    if value is None:
        if required:
            raise ActionError(f"{args['action']} needs {key} [x, y]")
        return None
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)):
        raise ActionError(f"{key} must be [x, y], two integers; got {value!r}")
    x, y = value
    if not (0 <= x < WIDTH and 0 <= y < HEIGHT):
        raise ActionError(f"{key} {value} is outside the {WIDTH}x{HEIGHT} screen")
    return str(x), str(y)


def _text(args: dict[str, Any]) -> str:
    text = args.get("text")
    if not isinstance(text, str) or not text:
        raise ActionError(f"{args['action']} needs text")
    return text


def _duration(args: dict[str, Any], default: float) -> float:
    duration = args.get("duration", default)
    if not isinstance(duration, (int, float)) or isinstance(duration, bool) or not 0 <= duration <= MAX_WAIT_S:
        raise ActionError(f"duration must be a number of seconds from 0 to {MAX_WAIT_S:.0f}; got {duration!r}")
    return float(duration)


def _held(args: dict[str, Any], steps: list[str]) -> list[str]:
    """``steps`` with the modifier keys of ``text`` (``shift``, ``ctrl+alt``) held down around them."""
    keys = str(args.get("text") or "").replace("+", " ").split()
    if not keys:
        return steps
    return ["keydown", *keys, *steps, "keyup", *reversed(keys)]


def _move(args: dict[str, Any]) -> list[str]:
    # No `mousemove --sync`: it waits for the pointer to move, which it never does when it is there
    # already (15 s each time, in xdotool 3.20160805). XTEST events are handled in order anyway.
    point = _point(args, required=False)
    return ["mousemove", *point] if point else []


def pointer_action(action: str, args: dict[str, Any]) -> None:
    """The actions that move, press or turn the mouse, at ``coordinate`` or where it is."""
    if action in CLICKS:
        button, repeat = CLICKS[action]
        xdotool(*_move(args), *_held(args, ["click", "--repeat", str(repeat), "--delay", "80", button]))
    elif action == "left_click_drag":
        start, end = _point(args, "start_coordinate"), _point(args, "coordinate")
        assert start and end
        xdotool("mousemove", *start, "mousedown", "1", "sleep", "0.05", "mousemove", *end, "sleep", "0.05",
                "mouseup", "1")
    elif action == "mouse_move":
        point = _point(args)
        assert point
        xdotool("mousemove", *point)
    elif action in ("left_mouse_down", "left_mouse_up"):
        xdotool(*_move(args), "mousedown" if action == "left_mouse_down" else "mouseup", "1")
    else:  # scroll
        direction = args.get("scroll_direction")
        if direction not in SCROLL_BUTTONS:
            raise ActionError(f"scroll_direction must be one of {', '.join(SCROLL_BUTTONS)}; got {direction!r}")
        amount = args.get("scroll_amount", 3)
        if not isinstance(amount, int) or not 1 <= amount <= 100:
            raise ActionError(f"scroll_amount must be an integer from 1 to 100; got {amount!r}")
        xdotool(*_move(args), *_held(args, ["click", "--repeat", str(amount), "--delay", "20",
                                            SCROLL_BUTTONS[direction]]))


POINTER_ACTIONS = (*CLICKS, "left_click_drag", "mouse_move", "left_mouse_down", "left_mouse_up", "scroll")


def perform(args: dict[str, Any]) -> dict[str, Any]:
    action = args.get("action")
    if not isinstance(action, str):
        raise ActionError("no action")
    if action == "start_display":
        ensure_display()
        return {"ok": True}
    if not _display_up():
        raise DisplayDown(f"the display {DISPLAY} is not running (start it with the action start_display)")
    settle = True
    if action == "screenshot":
        settle = False
    elif action in POINTER_ACTIONS:
        pointer_action(action, args)
    elif action == "type":
        xdotool("type", "--delay", str(XDOTOOL_TYPE_DELAY_MS), "--", _text(args))
    elif action == "key":
        xdotool("key", "--", *_text(args).split())
    elif action == "hold_key":
        keys = _text(args).split()
        xdotool("keydown", *keys, "sleep", str(_duration(args, 1)), "keyup", *reversed(keys))
    elif action == "wait":
        time.sleep(_duration(args, 1))
        settle = False
    elif action == "zoom":
        region = args.get("region")
        if (not isinstance(region, list) or len(region) != 4
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in region)):
            raise ActionError(f"zoom needs region [x1, y1, x2, y2], four integers; got {region!r}")
        return {"ok": True, **screenshot((region[0], region[1], region[2], region[3]))}
    elif action == "cursor_position":
        where = dict(line.split("=", 1) for line in xdotool("getmouselocation", "--shell").split())
        return {"ok": True, "x": int(where["X"]), "y": int(where["Y"])}
    elif action == "open_url":
        url = _text(args)
        chromium = shutil.which("chromium")
        if chromium is None:
            raise ActionError("chromium is not installed in this image")
        os.makedirs(STATE_DIR, exist_ok=True)
        _spawn(chromium_argv(chromium, f"--app={url}"), "chromium.log")
        return {"ok": True}
    else:
        raise ActionError(f"unknown action {action!r}")
    if settle:
        time.sleep(SETTLE_S)
    return {"ok": True, **screenshot()}


def main(argv: list[str]) -> int:
    try:
        if len(argv) != 2:
            raise ActionError("usage: computer.py '<json object with an action>'")
        try:
            args = json.loads(argv[1])
        except ValueError as exc:
            raise ActionError(f"the argument is not JSON: {exc}") from None
        if not isinstance(args, dict):
            raise ActionError("the argument must be a JSON object")
        result = perform(args)
    except DisplayDown as exc:
        print(json.dumps({"ok": False, "error": str(exc), "display_down": True}))
        return 3
    except ActionError as exc:
        print(json.dumps({"ok": False, "error": str(exc)}))
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
