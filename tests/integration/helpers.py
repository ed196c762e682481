"""Small helpers shared by the integration tests."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from harness.engine.exec_result import ExecResult, collect


def run(box: Any, command: Any, **options: Any) -> ExecResult:
    """Run a command in a live sandbox and collect its result."""
    return collect(box.agent.exec(command, **options))


def callbox(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
    """Run the real CLI in a child process, exactly as a user would."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "harness.cli.main", *args],
        input=stdin if stdin is not None else b"",
        capture_output=True, env=full_env, timeout=timeout, check=False,
    )
