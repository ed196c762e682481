"""exec_command and write_stdin in a real sandbox, on its background jobs (harness/tools/unified_exec.py).

The handlers run with a real ToolContext whose provider returns one sandbox shared by the module
(each test has its own sessions), and once through the MCP door. Waiting is on output: a poll
(write_stdin with no chars) blocks in the agent for its yield time, and loops stop at what they
wait for or a deadline.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from harness.core.context import ToolContext
from harness.core.validation import validate_call
from harness.engine.spec import SandboxSpec
from harness.tools.unified_exec import EXEC_COMMAND, WRITE_STDIN
from tests.conftest import IMAGE
from tests.integration.helpers import run

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0
RUNNING = re.compile(r"^Process running with session ID (\d+)$", re.M)
EXITED = re.compile(r"^Process exited with code (-?\d+)$", re.M)
REPL = (
    "python3 -u -c 'import sys\n"
    "print(\"ready\")\n"
    "for line in sys.stdin:\n"
    "    if line.strip() == \"quit\": break\n"
    "    print(\"answer\", eval(line))\n'"
)


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


@pytest.fixture(scope="module")
def box(engine):  # type: ignore[no-untyped-def]
    sandbox = engine.create(SandboxSpec(image=IMAGE))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def _ctx(box: Any) -> ToolContext:
    return ToolContext(run_id="unified-exec", call_id="c", provider=_Provider(box), default_timeout_s=60.0,
                       timeout_ceiling_s=120.0, output_budget=30_000)


def exec_command(box: Any, **arguments: Any) -> Any:
    return EXEC_COMMAND.handler(_ctx(box), validate_call(EXEC_COMMAND.definition, arguments))


def write_stdin(box: Any, **arguments: Any) -> Any:
    return WRITE_STDIN.handler(_ctx(box), validate_call(WRITE_STDIN.definition, arguments))


def output_of(result: Any) -> str:
    return str(result.text).split("\nOutput:\n", 1)[1]


def session_of(result: Any) -> int:
    found = RUNNING.search(result.text)
    assert found is not None, result.text
    return int(found.group(1))


def poll_until(box: Any, session_id: int, wanted: str | None, *, seen: list[str]) -> Any:
    """Poll the session (each poll waits in the agent) until its output so far holds ``wanted``
    (None: until it exits) or it exits; every output goes to ``seen``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = write_stdin(box, session_id=session_id, yield_time_ms=500)
        seen.append(output_of(result))
        if (wanted is not None and wanted in "".join(seen)) or EXITED.search(result.text):
            return result
        assert time.monotonic() < deadline, f"no {wanted or 'exit'!r} in {WAIT_S} s: {''.join(seen)!r}"


def test_a_quick_command_returns_its_exit_code_and_output(box):
    result = exec_command(box, cmd="echo hi; echo oops >&2")
    assert not result.is_error, result.text
    # stdout and stderr as they arrived (two pipes: either may be read first)
    assert re.fullmatch(r"Chunk ID: [0-9a-f]{6}\nWall time: \d+\.\d{4} seconds\nProcess exited with code 0\n"
                        r"Original token count: 2\nOutput:\n(hi\noops\n|oops\nhi\n)", result.text), result.text
    assert result.structured["session_id"] is None

    failed = exec_command(box, cmd="cd /tmp && pwd && exit 3", login=False)
    assert failed.is_error and failed.error == "nonzero_exit"
    assert EXITED.search(failed.text).group(1) == "3" and output_of(failed) == "/tmp\n"


def test_a_running_repl_gets_a_session_and_answers_write_stdin(box):
    started = exec_command(box, cmd=REPL, yield_time_ms=250)
    assert not started.is_error, started.text
    session_id = session_of(started)
    seen = [output_of(started)]
    poll_until(box, session_id, "ready", seen=seen)

    answered = write_stdin(box, session_id=session_id, chars="6*7\n", yield_time_ms=1000)
    seen.append(output_of(answered))
    if "answer 42" not in answered.text:
        poll_until(box, session_id, "answer 42", seen=seen)
    assert "".join(seen).count("ready") == 1  # each output is returned once

    ended = write_stdin(box, session_id=session_id, chars="quit\n", yield_time_ms=1000)
    if not EXITED.search(ended.text):
        ended = poll_until(box, session_id, None, seen=seen)
    assert EXITED.search(ended.text).group(1) == "0" and not ended.is_error

    again = write_stdin(box, session_id=session_id)
    assert again.is_error and f"Unknown session ID {session_id}" in again.text


def test_a_tty_session_is_on_a_terminal(box):
    started = exec_command(box, cmd="bash -i", tty=True, yield_time_ms=250)
    session_id = session_of(started)
    assert started.structured["tty"] is True
    seen = [output_of(started), output_of(write_stdin(box, session_id=session_id, chars="tty\n"))]
    if "/dev/pts/" not in "".join(seen):
        poll_until(box, session_id, "/dev/pts/", seen=seen)
    assert "\x1b" not in "".join(seen) and "\r" not in "".join(seen)  # terminal codes are stripped
    ended = write_stdin(box, session_id=session_id, chars="exit 5\n", yield_time_ms=1000)
    if not EXITED.search(ended.text):
        ended = poll_until(box, session_id, None, seen=seen)
    assert EXITED.search(ended.text).group(1) == "5"


def test_ctrl_c_interrupts_a_command_without_a_tty(box):
    session_id = session_of(exec_command(box, cmd="sleep 600", yield_time_ms=250))
    interrupted = write_stdin(box, session_id=session_id, chars="\u0003", yield_time_ms=5000)
    assert EXITED.search(interrupted.text).group(1) == "130", interrupted.text


def test_output_dropped_between_polls_is_stated(box):
    cmd = ("while [ ! -e /tmp/ue-go ]; do sleep 0.05; done; head -c 3000000 /dev/zero | tr '\\0' a; "
           "echo; echo END; touch /tmp/ue-done; exec sleep 600")
    session_id = session_of(exec_command(box, cmd=cmd, yield_time_ms=250))
    try:
        assert run(box, "touch /tmp/ue-go && for i in $(seq 600); do [ -e /tmp/ue-done ] && exit 0; sleep 0.05; done; "
                        "exit 1").exit_code == 0
        polled = write_stdin(box, session_id=session_id)
        assert "bytes of output dropped ...]" in polled.text and polled.text.endswith("END\n")
        assert polled.structured["dropped_bytes"] > 1_000_000 and polled.structured["truncated"]
        assert len(polled.text.encode()) <= 30_000
    finally:
        write_stdin(box, session_id=session_id, chars="\u0003", yield_time_ms=5000)


def test_an_unknown_session_id_is_an_error_result(box):
    result = write_stdin(box, session_id=999_999, chars="x")
    assert result.is_error and result.error == "invalid_arguments"
    assert "Unknown session ID 999999" in result.text and "exec_command" in result.text


# ---- the MCP door ---------------------------------------------------------------------------------


@pytest.fixture
def mcp_params(engine, tmp_path: Path) -> Iterator[StdioServerParameters]:  # type: ignore[no-untyped-def]
    policy = tmp_path / "policy.toml"
    policy.write_text(f'[sandbox]\nimage = "{IMAGE}"\n')
    code = f"from pathlib import Path; from harness.doors.mcp.stdio import run_mcp_stdio; " \
           f"run_mcp_stdio(policy_path=Path({str(policy)!r}))"
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(tmp_path / "audit.sqlite3")}
    yield StdioServerParameters(command=sys.executable, args=["-c", code], env=env, cwd=str(ROOT))


def test_the_mcp_door_lists_and_calls_exec_command(mcp_params):
    async def flow() -> None:
        with anyio.fail_after(120):
            async with Client(mcp_params) as client:
                names = [tool.name for tool in (await client.list_tools()).tools]
                assert {"exec_command", "write_stdin"} <= set(names)
                result = await client.call_tool("exec_command", {"cmd": "echo via-mcp"})
                text = "".join(getattr(block, "text", "") for block in result.content)
                assert result.is_error is False, text
                assert "Process exited with code 0" in text and text.endswith("Output:\nvia-mcp\n")

    anyio.run(flow)
