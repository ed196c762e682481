"""Stopping a server the tests or benchmarks started as a child process."""

from __future__ import annotations

import signal
import subprocess
from typing import Any


def stop_child(proc: subprocess.Popen[Any], grace_s: float = 60.0) -> None:
    """SIGTERM (a callbox server then removes its sandboxes) and wait; SIGKILL if it hangs."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
