"""Where callbox keeps its state on this host, when no path is given for it.

``$XDG_STATE_HOME/callbox``, else ``~/.local/state/callbox``. A relative ``XDG_STATE_HOME``
is ignored, as the XDG Base Directory specification requires. The audit store, the gRPC
door's token file, snapshots and templates each live under it unless their own setting
names another place. The system service sets ``XDG_STATE_HOME=/var/lib``, so its state is in
``/var/lib/callbox``.

A leaf: the engine and the gRPC client import it, so it imports nothing from ``harness``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["state_dir"]


def state_dir() -> Path:
    """``$XDG_STATE_HOME/callbox`` (absolute only), else ``~/.local/state/callbox``."""
    xdg = os.environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".local" / "state"
    return base / "callbox"
