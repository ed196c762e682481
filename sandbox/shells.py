"""Which shell runs a command given as one string: bash where the image has it, else ``sh``.

callbox's own image has bash. Other images (BusyBox, Alpine, distroless with a shell) may
have only a POSIX ``/bin/sh``; such commands then run there instead of failing to start.
"""

from __future__ import annotations

import functools
import os

BASH = "/bin/bash"
POSIX_SH = "/bin/sh"


@functools.cache
def command_shell() -> str:
    """``/bin/bash`` if it is an executable in this container, else ``/bin/sh``."""
    return BASH if os.access(BASH, os.X_OK) or not os.access(POSIX_SH, os.X_OK) else POSIX_SH
