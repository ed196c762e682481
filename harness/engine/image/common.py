"""Names the image builder's modules share: the image tags, labels, format version and progress callback."""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_TAG = "callbox-sandbox:latest"
IMAGE_REPO = "callbox-sandbox"
#: Bump when the image layout changes in a way the hashed inputs do not capture.
IMAGE_FORMAT_VERSION = 1
LABEL_HASH = "callbox.image.hash"
LABEL_VERSION = "callbox.image.version"
LABEL_BASE = "callbox.image.base"

Progress = Callable[[str], None]
