"""The one exception of the image builder."""

from __future__ import annotations

from harness.core.errors import CallboxError


class ImageBuildError(CallboxError):
    """The image could not be built; the message says why and what to do."""
