"""The pictures of recorded results, kept once each: a content-addressed table of image blobs.

A result's record (``result_json``) names each picture in its ``meta["images"]`` (media
type, size, label and the sha256 of its bytes); the bytes live in the ``image_blobs`` table,
keyed by that digest, so a screenshot recorded by a hundred calls is stored once. The
table is made on first use and joins the audit chain like the others. A replayed result
gets its pictures back from here (:meth:`Pictures.with_images`); the console serves them
by digest (:meth:`Pictures.image_blob`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import sqlite3
import time
from collections.abc import Iterable

from harness.audit.database import Database
from harness.audit.schema import table_exists
from harness.core.calls import ImagePart, ToolResult

__all__ = ["IMAGE_BLOBS_TABLE", "Pictures", "store_images"]

IMAGE_BLOBS_TABLE = """CREATE TABLE IF NOT EXISTS image_blobs (
    digest      TEXT PRIMARY KEY,
    media_type  TEXT NOT NULL,
    bytes       INTEGER NOT NULL,
    data        BLOB NOT NULL,
    stored      REAL NOT NULL
)"""
"""One row per distinct picture: ``digest`` is the sha256 of ``data`` (hex)."""


def store_images(c: sqlite3.Connection, images: Iterable[ImagePart]) -> None:
    """Keep each picture's bytes under its digest (once: a picture already kept is not written again)."""
    rows = [(hashlib.sha256(image.data).hexdigest(), image.media_type, len(image.data), image.data, time.time())
            for image in images]
    if not rows:
        return
    c.execute(IMAGE_BLOBS_TABLE)
    c.executemany("INSERT OR IGNORE INTO image_blobs (digest, media_type, bytes, data, stored) "
                  "VALUES (?, ?, ?, ?, ?)", rows)


class Pictures(Database):
    """The picture part of the audit store."""

    def image_blob(self, digest: str) -> tuple[str, bytes] | None:
        """``(media_type, data)`` of the picture kept under ``digest``, or None."""

        def body(c: sqlite3.Connection) -> tuple[str, bytes] | None:
            if not table_exists(c, "image_blobs"):
                return None
            row = c.execute("SELECT media_type, data FROM image_blobs WHERE digest = ?", (digest,)).fetchone()
            return None if row is None else (str(row[0]), bytes(row[1]))

        return self._read(body)

    def image_bytes(self) -> int:
        """Bytes of all the pictures kept (each counted once)."""

        def body(c: sqlite3.Connection) -> int:
            if not table_exists(c, "image_blobs"):
                return 0
            return int(c.execute("SELECT COALESCE(SUM(bytes), 0) FROM image_blobs").fetchone()[0])

        return self._read(body)

    def with_images(self, result: ToolResult) -> ToolResult:
        """A recorded ``result`` with the pictures its ``meta["images"]`` names. One no longer
        kept is not dropped silently: a line of the text says it is missing."""
        described = result.meta.get("images")
        if result.images or not isinstance(described, list) or not described:
            return result
        images: list[ImagePart] = []
        missing: list[str] = []
        for entry in described:
            digest = str(entry.get("sha256", "")) if isinstance(entry, dict) else ""
            found = self.image_blob(digest) if digest else None
            if found is None or not isinstance(entry, dict):
                missing.append(f"[image {len(images) + len(missing) + 1} of this result is no longer in the "
                               "audit store]")
                continue
            images.append(ImagePart(media_type=found[0], data=found[1], width=int(entry.get("width", 0)),
                                    height=int(entry.get("height", 0)), label=str(entry.get("label", ""))))
        text = "\n".join([result.text, *missing]) if missing else result.text
        return dataclasses.replace(result, images=tuple(images), text=text)
