"""Small pictures made with the standard library, for tests of image results: a real PNG
(zlib-compressed rows) and headers of the other formats, as their files begin."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png(width: int, height: int, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A valid PNG of one colour (8-bit RGB), decodable by any reader."""
    row = b"\x00" + bytes(rgb) * width
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(row * height)) + _chunk(b"IEND", b""))


PNG_SCRIPT = (
    "import struct, sys, zlib\n"
    "def chunk(kind, body):\n"
    "    return struct.pack('>I', len(body)) + kind + body + struct.pack('>I', zlib.crc32(kind + body))\n"
    "w, h, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]\n"
    "row = b'\\x00' + b'\\xc8\\x1e\\x1e' * w\n"
    "data = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))\n"
    "        + chunk(b'IDAT', zlib.compress(row * h)) + chunk(b'IEND', b''))\n"
    "open(path, 'wb').write(data)\n"
)
"""The same PNG as :func:`png`'s default colour, written by a script a sandbox runs:
``python3 -c SCRIPT WIDTH HEIGHT PATH``."""


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00;"


def jpeg(width: int, height: int) -> bytes:
    """SOI, an APP0 (JFIF) segment, a fill byte, then a baseline frame header with the size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\x01\x22\x00\x02\x11\x01\x03\x11\x01"
    return b"\xff\xd8" + app0 + b"\xff" + sof0 + b"\xff\xd9"


def _riff(chunk: bytes, body: bytes) -> bytes:
    return b"RIFF" + struct.pack("<I", 4 + 8 + len(body)) + b"WEBP" + chunk + struct.pack("<I", len(body)) + body


def webp_lossy(width: int, height: int) -> bytes:
    return _riff(b"VP8 ", b"\x00\x00\x00\x9d\x01\x2a" + struct.pack("<HH", width, height))


def webp_lossless(width: int, height: int) -> bytes:
    return _riff(b"VP8L", b"\x2f" + struct.pack("<I", (width - 1) | ((height - 1) << 14)))


def webp_extended(width: int, height: int) -> bytes:
    return _riff(b"VP8X", b"\x00\x00\x00\x00" + (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little"))
