"""What the interop tests share: the callbox servers a third-party client talks to, started
as a user starts them (the .venv's ``callbox`` executable), and one scripted coding session.

The session is the same for every client: write a file, read it, fix it with ``apply_patch``,
edit it with the text editor, view it, run it with ``shell``, and one call whose argument has
the wrong type. Calls pass only their required arguments. Each step names the text the tool's
result must contain as the client hands it to the model.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.child_process import stop_child
from tests.conftest import IMAGE

ROOT = Path(__file__).resolve().parents[2]
CALLBOX = str(Path(sys.executable).with_name("callbox"))
"""The callbox the .venv installs: what a user's client configuration names."""
START_TIMEOUT_S = 60


@dataclass(frozen=True)
class Step:
    tool: str
    arguments: dict[str, Any]
    expect: str
    """Text the result the model receives must contain."""
    is_error: bool = False


STATS = "/workspace/proj/stats.py"
SESSION = [
    Step("write_file", {"path": STATS, "content": "def mean(xs):\n    return sum(xs) / (len(xs) + 1)\n"}, "stats.py"),
    Step("read_file", {"path": STATS}, "return sum(xs) / (len(xs) + 1)"),
    Step("apply_patch", {"patch": textwrap.dedent(f"""\
        *** Begin Patch
        *** Update File: {STATS}
        @@ def mean(xs):
        -    return sum(xs) / (len(xs) + 1)
        +    return sum(xs) / len(xs)
        *** End Patch
        """)}, f"M {STATS}"),
    Step("str_replace_based_edit_tool", {"command": "str_replace", "path": STATS, "old_str": "def mean(xs):",
                                         "new_str": "def mean(xs: list[float]) -> float:"}, "has been edited"),
    Step("str_replace_based_edit_tool", {"command": "view", "path": STATS},
         "1\tdef mean(xs: list[float]) -> float:"),
    Step("shell", {"command": "cd /workspace/proj && python3 -c 'import stats; print(stats.mean([1, 2, 6]))'"},
         "Output:\n3.0\n"),
    Step("shell", {"command": 5}, "invalid arguments for tool 'shell': argument 'command' must be a string, got 5",
         is_error=True),
]
FINAL_ANSWER = "mean is fixed"


def write_policy(directory: Path) -> Path:
    path = directory / "policy.toml"
    path.write_text(f'[sandbox]\nimage = "{IMAGE}"\n')
    return path


@pytest.fixture
def policy(engine, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    """A policy on the test image; asking for it needs the engine (the docker fixture)."""
    return write_policy(tmp_path)


@pytest.fixture
def callbox_env(tmp_path: Path) -> dict[str, str]:
    """The environment a client starts ``callbox`` with: its own audit store."""
    return {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}


class Served:
    """``callbox serve ...`` in a child process; its stderr lines are read by a thread, so a
    test waits for the line announcing the address (an event, with a deadline)."""

    def __init__(self, args: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([CALLBOX, *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.put(line)
        self.lines.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {pattern!r} from callbox serve in {START_TIMEOUT_S} s: {self.seen}") from None
            if line is None:
                raise AssertionError(f"callbox serve exited ({self.proc.wait()}) before {pattern!r}: {self.seen}")
            self.seen.append(line)
            if match := re.search(pattern, line):
                return match

    def stop(self) -> None:
        stop_child(self.proc)


@pytest.fixture
def mcp_http_url(policy: Path, callbox_env: dict[str, str]) -> Iterator[str]:
    """``callbox serve --mcp-http 127.0.0.1:0``: loopback, so no --insecure; the MCP door has
    no tokens. Yields the URL it announces."""
    served = Served(["serve", "--mcp-http", "127.0.0.1:0", "--policy", str(policy)], callbox_env)
    try:
        yield served.wait_for(r"MCP server \(streamable HTTP\) on (http://127\.0\.0\.1:\d+/mcp)")[1]
    finally:
        served.stop()


MCP_TOKEN = "interop-mcp-" + "m" * 32


@pytest.fixture
def mcp_http_token(policy: Path, callbox_env: dict[str, str], tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``callbox serve --mcp-http 127.0.0.1:0 --token-file FILE``: every request needs
    ``Authorization: Bearer TOKEN``, as on a server others reach. Yields (URL, TOKEN)."""
    tokens = tmp_path / "mcp-tokens"
    tokens.write_text(f"interop:{MCP_TOKEN}\n")
    tokens.chmod(0o600)
    served = Served(["serve", "--mcp-http", "127.0.0.1:0", "--token-file", str(tokens), "--policy", str(policy)],
                    callbox_env)
    try:
        yield served.wait_for(r"MCP server \(streamable HTTP\) on (http://127\.0\.0\.1:\d+/mcp)")[1], MCP_TOKEN
    finally:
        served.stop()


GRPC_TOKEN = "interop-" + "t" * 32


@pytest.fixture
def grpc_target(policy: Path, callbox_env: dict[str, str]) -> Iterator[tuple[str, str]]:
    """``callbox serve --grpc unix:SOCKET`` with a token file; yields (target, token)."""
    short = Path(tempfile.mkdtemp(prefix="cbx-interop-", dir="/tmp"))  # sun_path is 108 bytes
    tokens = short / "tokens"
    tokens.write_text(f"interop:{GRPC_TOKEN}\n")
    tokens.chmod(0o600)
    target = f"unix:{short / 'executor.sock'}"
    served = Served(["serve", "--grpc", target, "--token-file", str(tokens), "--policy", str(policy)], callbox_env)
    try:
        served.wait_for(r"gRPC executor listening on")
        yield target, GRPC_TOKEN
    finally:
        served.stop()
        shutil.rmtree(short, ignore_errors=True)
