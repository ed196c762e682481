"""What both MCP transports do to the server process: logs to stderr (over stdio, stdout
carries JSON-RPC), and a second SIGTERM that must not cut the cleanup short.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["log_to_stderr", "terminate_ignored"]

def log_to_stderr() -> None:
    """Logs to stderr (never stdout: over stdio it carries JSON-RPC) unless logging is set up."""
    root = logging.getLogger()
    if not root.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("callbox mcp: %(levelname)s %(name)s: %(message)s"))
        root.addHandler(handler)
        root.setLevel(logging.WARNING)
        logging.getLogger("callbox").setLevel(logging.INFO)


@contextlib.contextmanager
def terminate_ignored() -> Iterator[None]:
    """While sessions are being closed, a second SIGTERM must not cut the cleanup short."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
