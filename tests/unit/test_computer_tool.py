"""The ``computer`` tool without a sandbox: its arguments checked before anything runs, and the
desktop image's screenshot path (images/desktop/computer.py: an xwd dump to PNG) on this host."""

from __future__ import annotations

import importlib.util
import struct
import sys
import zlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.core.calls import ErrorCode
from harness.core.images import read_header
from harness.core.validation import CallRejected, validate_call
from harness.tools.computer import COMPUTER, ComputerArgs


def _desktop_module() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "images" / "desktop" / "computer.py"
    spec = importlib.util.spec_from_file_location("desktop_computer", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["desktop_computer"] = module
    spec.loader.exec_module(module)
    return module


desktop = _desktop_module()


def rejected(args: dict[str, Any]) -> str:
    with pytest.raises(CallRejected) as info:
        validate_call(COMPUTER.definition, args)
    assert info.value.code is ErrorCode.INVALID_ARGUMENTS
    return info.value.message


@pytest.mark.parametrize(("args", "message"), [
    ({"action": "type"}, "action 'type' needs text"),
    ({"action": "left_click_drag", "coordinate": [1, 1]}, "action 'left_click_drag' needs start_coordinate"),
    ({"action": "zoom"}, "action 'zoom' needs region"),
    ({"action": "scroll"}, "action 'scroll' needs scroll_direction"),
    ({"action": "left_click", "coordinate": [1280, 10]}, "coordinate [1280, 10] is outside the 1280x800 screen"),
    ({"action": "left_click", "coordinate": [-1, 10]}, "coordinate"),
    ({"action": "zoom", "region": [10, 10, 5, 20]}, "region [10, 10, 5, 20] must lie inside"),
    ({"action": "fly"}, "action"),
    ({"action": "wait", "duration": 61}, "duration"),
])
def test_wrong_arguments_are_refused_before_anything_runs(args: dict[str, Any], message: str) -> None:
    assert message in rejected(args)


def test_fields_an_action_does_not_use_are_named() -> None:
    args = ComputerArgs(action="type", text="hi", duration=2, coordinate=[1, 2])
    assert args.unused() == ["coordinate", "duration"]
    assert ComputerArgs(action="scroll", scroll_direction="up", coordinate=[1, 2]).unused() == []


def _xwd(width: int, height: int, pixels: list[tuple[int, int, int]], *, lsb: bool, pad: int = 0) -> bytes:
    """A 32-bit TrueColor xwd dump as xwd writes it (header big-endian, pixels in ``byte_order``)."""
    name = b"xwdump\x00"
    header_size = 100 + len(name)
    bytes_per_line = width * 4 + pad
    fields = [header_size, 7, 2, 24, width, height, 0, 0 if lsb else 1, 32, 0 if lsb else 1, 32, 32,
              bytes_per_line, 4, 0xFF0000, 0x00FF00, 0x0000FF, 8, 256, 0, width, height, 0, 0, 0]
    rows = []
    for y in range(height):
        row = b"".join(struct.pack("<I" if lsb else ">I", (r << 16) | (g << 8) | b)
                       for r, g, b in pixels[y * width:(y + 1) * width])
        rows.append(row + b"\xee" * pad)
    return struct.pack(">25I", *fields) + name + b"".join(rows)


@pytest.mark.parametrize("lsb", [True, False])
@pytest.mark.parametrize("pad", [0, 8])
def test_an_xwd_dump_becomes_a_png_with_the_same_pixels(lsb: bool, pad: int) -> None:
    width, height = 3, 2
    pixels = [(255, 0, 0), (0, 255, 0), (0, 0, 255), (1, 2, 3), (200, 100, 50), (0, 0, 0)]
    w, h, rgb = desktop.xwd_to_rgb(_xwd(width, height, pixels, lsb=lsb, pad=pad))
    assert (w, h) == (width, height)
    assert rgb == bytes(v for pixel in pixels for v in pixel)
    png = desktop.encode_png(w, h, rgb)
    assert read_header(png) == ("image/png", 3, 2)
    idat = png[png.index(b"IDAT") + 4:png.index(b"IEND") - 8]
    assert zlib.decompress(idat) == b"\x00" + rgb[:9] + b"\x00" + rgb[9:]
    assert desktop.crop(w, rgb, (1, 0, 3, 2)) == rgb[3:9] + rgb[12:18]


def test_a_screen_of_another_depth_is_refused_by_name() -> None:
    dump = bytearray(_xwd(1, 1, [(0, 0, 0)], lsb=True))
    dump[44:48] = struct.pack(">I", 16)  # bits_per_pixel
    with pytest.raises(desktop.ActionError, match="unsupported screen format: depth 24, 16 bits per pixel"):
        desktop.xwd_to_rgb(bytes(dump))


def test_modifier_keys_are_held_around_a_click_and_released_in_reverse() -> None:
    click = ["click", "1"]
    held = desktop._held({"text": "ctrl+shift"}, click)
    assert held == ["keydown", "ctrl", "shift", *click, "keyup", "shift", "ctrl"]
    assert desktop._held({}, click) == click
