"""Small helpers shared by the integration tests."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
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


DOOR_TOKEN = "token-of-the-integration-tests-0123"


@contextlib.contextmanager
def grpc_door(policy: Any, audit: Any, **options: Any) -> Iterator[Any]:
    """An in-process gRPC door serving ``policy`` (``options`` go to ``serve_grpc``, e.g. a
    registry) on a short unix socket (a socket path is at most 108 bytes), and a client of it."""
    from harness.client import ExecutorClient
    from harness.doors.grpc.server import serve_grpc
    from harness.doors.grpc.tokens import TokenSet

    short = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    server = serve_grpc(str(short / "x.sock"), policy=policy, audit=audit,
                        tokens=TokenSet({"tester": DOOR_TOKEN}, source="test tokens"), announce=None, **options)
    try:
        with ExecutorClient(server.target, DOOR_TOKEN) as client:
            yield client
    finally:
        server.stop(grace=1)
        shutil.rmtree(short, ignore_errors=True)


def container_exists(engine: Any, sandbox_id: str) -> bool:
    """Whether the sandbox's container is still on the engine (in any state)."""
    import docker.errors

    try:
        engine.client.api.inspect_container(f"callbox-{sandbox_id}")
    except docker.errors.NotFound:
        return False
    return True
