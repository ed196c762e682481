"""Pictures in results, on a terminal: each is saved to a file and shown as a line naming it.

``callbox call`` and ``callbox run`` cannot draw a picture; they save it under
``STATE/images/RUN/CALL-N.EXT`` (STATE: :func:`~harness.core.state_dirs.state_dir`; the
directory is the user's own, mode 0700) and print ``[image 1: image/png 320x200, 1.2 KiB
(chart.png) saved to PATH]``.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.core.calls import ToolResult
from harness.core.images import describe
from harness.core.state_dirs import state_dir

__all__ = ["picture_lines"]

_EXTENSIONS = {"image/png": "png", "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def picture_lines(result: ToolResult, run_id: str, root: Path | None = None) -> list[str]:
    """Save each picture of ``result`` (a call of run ``run_id``) under ``root`` (default:
    the state directory's ``images``) and return the line naming each, in order."""
    if not result.images:
        return []
    directory = (root or state_dir() / "images") / _UNSAFE.sub("_", run_id)
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    lines = []
    for n, image in enumerate(result.images, 1):
        path = directory / f"{_UNSAFE.sub('_', result.call_id)}-{n}.{_EXTENSIONS.get(image.media_type, 'bin')}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(image.data)
        lines.append(f"[image {n}: {describe(image)} saved to {path}]")
    return lines
