"""Pictures in tool results: what an image is (its format and size, read from its header)
and whether a result may carry it (the policy's image bounds).

Only PNG, JPEG, GIF and WebP are images here (:data:`~harness.core.calls.IMAGE_MEDIA_TYPES`,
the formats every model dialect accepts); anything else is refused with :class:`NotAnImage`.
The header is read with the standard library alone: nothing is decoded, so a picture's
size is known without trusting a decoder with untrusted bytes.

:func:`bound_images` checks a result's pictures against ``[budgets]``: at most
``max_images_per_result`` pictures, each at most ``max_image_bytes`` bytes and
``max_image_pixels`` pixels. A picture over a bound is never dropped silently: it is left
out of the result and the result's text says which picture, its size and the bound
(:func:`refusal`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.core.calls import ImagePart

__all__ = ["BoundedImages", "ImageBounds", "NotAnImage", "bound_images", "describe", "image_meta", "image_part",
           "over_bound", "read_header", "refusal"]

_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (they hold the size); C4, C8 and CC are other segments.
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# JPEG markers without a length: TEM, RST0..7, SOI, EOI.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xDA)})


class NotAnImage(ValueError):
    """The bytes are not a PNG, JPEG, GIF or WebP whose header gives its size."""


def read_header(data: bytes) -> tuple[str, int, int]:
    """``(media_type, width, height)`` of an encoded image, read from its header.
    NotAnImage says why when ``data`` is not one of the four formats or its header is cut."""
    if data.startswith(_PNG):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise NotAnImage("a PNG file without its IHDR header")
        width, height = struct.unpack(">II", data[16:24])
        return _sized("image/png", width, height)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        if len(data) < 10:
            raise NotAnImage("a GIF file cut inside its header")
        width, height = struct.unpack("<HH", data[6:10])
        return _sized("image/gif", width, height)
    if data.startswith(b"\xff\xd8"):
        return _sized("image/jpeg", *_jpeg_size(data))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _sized("image/webp", *_webp_size(data))
    raise NotAnImage("not a PNG, JPEG, GIF or WebP image")


def _sized(media_type: str, width: int, height: int) -> tuple[str, int, int]:
    if width <= 0 or height <= 0:
        raise NotAnImage(f"an {media_type} header with a size of {width}x{height}")
    return media_type, width, height


def _jpeg_size(data: bytes) -> tuple[int, int]:
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise NotAnImage(f"a JPEG file with a broken segment at byte {pos}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
            continue
        if marker in _JPEG_STANDALONE:
            pos += 2
            continue
        (length,) = struct.unpack(">H", data[pos + 2:pos + 4])
        if marker in _JPEG_SOF:
            if pos + 9 > len(data):
                break
            height, width = struct.unpack(">HH", data[pos + 5:pos + 9])
            return width, height
        if marker == 0xDA or length < 2:  # image data before any frame header
            break
        pos += 2 + length
    raise NotAnImage("a JPEG file without a frame header giving its size")


def _webp_size(data: bytes) -> tuple[int, int]:
    chunk = data[12:16]
    if chunk == b"VP8 " and len(data) >= 30 and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25 and data[20] == 0x2F:
        (bits,) = struct.unpack("<I", data[21:25])
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    raise NotAnImage("a WebP file without a VP8, VP8L or VP8X header giving its size")


def image_part(data: bytes, label: str = "") -> ImagePart:
    """``data`` as an image part, its media type and size read from its header (NotAnImage otherwise)."""
    media_type, width, height = read_header(data)
    return ImagePart(media_type=media_type, data=data, width=width, height=height, label=label)


def image_meta(image: ImagePart) -> dict[str, Any]:
    """What a result's meta (and its audit record) says of a picture: everything but its bytes,
    and their sha256 (hex), under which the audit store keeps them."""
    return {"media_type": image.media_type, "width": image.width, "height": image.height,
            "bytes": len(image.data), "label": image.label, "sha256": hashlib.sha256(image.data).hexdigest()}


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} bytes"
    if n < 1 << 20:
        return f"{n / 1024:.1f} KiB"
    return f"{n / (1 << 20):.1f} MiB"


def describe(image: ImagePart) -> str:
    """``image/png 640x480, 12.3 KiB (/workspace/chart.png)``: what a placeholder or a refusal names."""
    where = f" ({image.label})" if image.label else ""
    return f"{image.media_type} {image.width}x{image.height}, {_size(len(image.data))}{where}"


@dataclass(frozen=True)
class ImageBounds:
    """What one result may carry (``[budgets]``: ``max_image_bytes``, ``max_image_pixels``,
    ``max_images_per_result``)."""

    max_bytes: int
    max_pixels: int
    max_count: int


def over_bound(image: ImagePart, bounds: ImageBounds, index: int = 0) -> str | None:
    """Which bound ``image`` (the ``index``-th kept picture of its result) is over, in words
    (``it is 12000000 pixels, above budgets.max_image_pixels = 4194304``), or None."""
    pixels = image.width * image.height
    if index >= bounds.max_count:
        return (f"it is picture {index + 1} of this result, above budgets.max_images_per_result = "
                f"{bounds.max_count}")
    if len(image.data) > bounds.max_bytes:
        return (f"it is {len(image.data)} bytes, above budgets.max_image_bytes = {bounds.max_bytes} "
                f"({_size(bounds.max_bytes)})")
    if pixels > bounds.max_pixels:
        return f"it is {pixels} pixels, above budgets.max_image_pixels = {bounds.max_pixels}"
    return None


def refusal(image: ImagePart, bounds: ImageBounds, index: int = 0) -> str | None:
    """The line of the result's text saying ``image`` was left out, or None when it is within
    the bounds: ``[image left out: image/png 4000x3000, 1.2 MiB (big.png): it is 12000000
    pixels, above budgets.max_image_pixels = 4194304]``."""
    why = over_bound(image, bounds, index)
    return f"[image left out: {describe(image)}: {why}]" if why else None


@dataclass(frozen=True)
class BoundedImages:
    """A result's pictures within the bounds, and one sentence per picture left out."""

    kept: tuple[ImagePart, ...]
    refused: tuple[str, ...]

    def note(self) -> str:
        """The refusals, one per line ("" when none)."""
        return "\n".join(self.refused)


def bound_images(images: Sequence[ImagePart], bounds: ImageBounds) -> BoundedImages:
    """The pictures of one result that are within ``bounds``, in order, and why each other one is not."""
    kept: list[ImagePart] = []
    refused: list[str] = []
    for image in images:
        why = refusal(image, bounds, len(kept))
        if why is None:
            kept.append(image)
        else:
            refused.append(why)
    return BoundedImages(tuple(kept), tuple(refused))
