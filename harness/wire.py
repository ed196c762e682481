"""Facts of the gRPC wire that both ends of a callbox channel must agree on.

The harness's agent client, the gRPC door and the Python client import them from here; the
in-container agent (``sandbox/``), which never imports the harness, keeps its own copy.
"""

import os
from pathlib import Path

DETAIL_METADATA_KEY = "callbox-error-bin"
"""Trailing metadata key of a serialized ``ErrorDetail`` (sandbox.v1 and harness.v1 alike)."""

MAX_MESSAGE_BYTES = 64 << 20
"""The largest gRPC message either end sends or accepts (file contents travel in one message)."""

EXECUTOR_SOCKET_NAME = "executor.sock"
"""The gRPC door's Unix socket, in the run root, where ``callbox serve`` listens by default."""


def default_run_root() -> Path:
    """Host directory for callbox's sockets: one directory per sandbox, and the gRPC door's
    socket. Kept short (a socket path may be at most 108 bytes)."""
    if os.geteuid() == 0:
        return Path("/run/callbox")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "callbox" if runtime else Path(f"/tmp/callbox-{os.getuid()}")


def default_executor_socket() -> Path:
    """Where ``callbox serve`` listens and the Python client connects when given no address."""
    return default_run_root() / EXECUTOR_SOCKET_NAME
