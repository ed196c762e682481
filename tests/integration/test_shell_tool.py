"""The ``shell`` tool in a real sandbox: Codex result text, truncation, timeout, streaming."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.context import OutputSink, ToolContext
from harness.core.policy import Budgets, Policy
from harness.core.registry import ToolRegistry
from harness.core.session import Session
from harness.core.shaping import dropped_marker
from harness.engine.spec import SandboxSpec
from harness.tools.shell import SHELL, ShellArgs
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

HEADER = re.compile(r"Exit code: (-?\d+)\nWall time: (\d+(?:\.\d)?) seconds\n(?:Total output lines: (\d+)\n)?Output:\n")
MARKER = re.compile(r"…(\d+) chars truncated…")


class _Provider:
    def __init__(self, box: Any) -> None:
        self.box = box

    def sandbox(self) -> Any:
        return self.box


def _ctx(box: Any, *, budget: int = 30_000, on_output: OutputSink | None = None) -> ToolContext:
    return ToolContext(run_id="shell-tool", call_id="c1", provider=_Provider(box), default_timeout_s=30.0,
                       timeout_ceiling_s=60.0, output_budget=budget, on_output=on_output)


def _shell(box: Any, command: str, **kwargs: Any) -> Any:
    timeout_ms = kwargs.pop("timeout_ms", None)
    return SHELL.handler(_ctx(box, **kwargs), ShellArgs(command=command, timeout_ms=timeout_ms))


def _split(text: str) -> tuple[re.Match[str], str]:
    match = HEADER.match(text)
    assert match is not None, text
    return match, text[match.end():]


@pytest.fixture
def sandbox(clean_sandbox: Any) -> Any:
    """The module's shared sandbox (reset before each test): these tests read what one command
    printed. Those that go through a Session start the Session's own."""
    return clean_sandbox


def test_success_is_codex_text(sandbox):
    out = _shell(sandbox, "echo hello; echo world")
    match, body = _split(out.text)
    assert match.group(1) == "0" and match.group(3) is None
    assert body == "hello\nworld\n"
    assert (out.is_error, out.error) == (False, None)
    assert out.structured["exit_code"] == 0 and out.structured["truncated"] is False


def test_nonzero_exit_and_stderr_are_in_the_text(sandbox):
    out = _shell(sandbox, "echo to-out; echo to-err >&2; exit 3")
    match, body = _split(out.text)
    assert match.group(1) == "3"
    assert "to-out\n" in body and "to-err\n" in body
    assert (out.is_error, out.error) == (True, ErrorCode.NONZERO_EXIT)


def test_signal_gives_128_plus_n(sandbox):
    out = _shell(sandbox, "kill -TERM $$")
    assert _split(out.text)[0].group(1) == "143"


def test_timeout_says_so_in_codex_words(sandbox):
    started = time.monotonic()
    out = _shell(sandbox, "echo before; sleep 30", timeout_ms=700)
    elapsed = time.monotonic() - started
    match, body = _split(out.text)
    assert match.group(1) == "124"
    timed = re.match(r"command timed out after (\d+) milliseconds\nbefore\n$", body)
    assert timed is not None, body
    assert 700 <= int(timed.group(1)) < 10_000
    assert elapsed < 15
    assert (out.is_error, out.error) == (True, ErrorCode.TIMED_OUT)
    assert out.structured["timed_out"] is True


def test_long_output_keeps_head_and_tail_within_the_budget(sandbox):
    budget = 4000
    out = _shell(sandbox, "seq 1 200000", budget=budget)
    assert len(out.text.encode()) <= budget
    match, body = _split(out.text)
    assert match.group(3) == "200000"
    marker = MARKER.search(body)
    assert marker is not None
    head, tail = body[: marker.start()], body[marker.end():]
    full = "".join(f"{i}\n" for i in range(1, 200001))
    assert full.startswith(head) and full.endswith(tail)
    assert head.startswith("1\n2\n3\n") and tail.endswith("199999\n200000\n")
    assert int(marker.group(1)) == len(full) - len(head) - len(tail)
    assert out.structured["truncated"] is True and out.structured["total_output_lines"] == 200000
    assert out.structured["total_output_lines_exact"] is True


def test_output_beyond_the_sandbox_cap_is_counted_in_the_marker(sandbox):
    # 12 MB of one stream: the sandbox keeps 8 MiB (head + tail) and drops the rest unseen.
    out = _shell(sandbox, "head -c 12000000 /dev/zero | tr '\\0' a; echo", budget=2000)
    assert len(out.text.encode()) <= 2000
    _, body = _split(out.text)
    marker = MARKER.search(body)
    assert marker is not None
    head, tail = body[: marker.start()], body[marker.end():]
    assert set(head) == {"a"} and tail.endswith("a\n")
    assert int(marker.group(1)) == 12_000_001 - len(head) - len(tail)
    assert out.structured["total_output_lines_exact"] is False


def test_non_utf8_and_terminal_codes_are_cleaned(sandbox):
    out = _shell(sandbox, r"printf 'caf\xe9 \033[31mred\033[0m\n'")
    assert _split(out.text)[1] == "caf\ufffd red\n"


def test_chunks_stream_while_the_command_runs(sandbox):
    chunks: list[tuple[float, str, bytes]] = []
    lock = threading.Lock()

    def sink(stream: str, data: bytes) -> None:
        with lock:
            chunks.append((time.monotonic(), stream, data))

    out = SHELL.handler(_ctx(sandbox, on_output=sink),
                        ShellArgs(command="echo first; sleep 2; echo second >&2"))
    finished = time.monotonic()
    assert _split(out.text)[1] == "first\nsecond\n"
    first = next(c for c in chunks if b"first" in c[2])
    assert first[1] == "stdout"
    assert finished - first[0] > 1.5  # it arrived while the command was still sleeping
    assert any(c[1] == "stderr" and b"second" in c[2] for c in chunks)


def test_a_timeout_above_the_ceiling_is_lowered_and_the_model_is_told(engine, tmp_path):
    policy = Policy(budgets=Budgets(call_timeout_ceiling_s=2, default_call_timeout_s=1))
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry([SHELL]), policy, audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as harness:
        quick = harness.call(ToolCall("shell", {"command": "echo hi", "timeout_ms": 99999999}, "c1"))
        slow = harness.call(ToolCall("shell", {"command": "sleep 30", "timeout_ms": 99999999}, "c2"))
        within = harness.call(ToolCall("shell", {"command": "true", "timeout_ms": 1500}, "c3"))
        recorded = audit.calls_for_run(harness.run_id)
    note = ("Timeout lowered: timeout_ms 99999999 is above this sandbox's ceiling; the command got timeout_ms 2000 "
            "(2 s).")
    assert re.fullmatch(rf"Exit code: 0\nWall time: [\d.]+ seconds\n{re.escape(note)}\nOutput:\nhi\n", quick.text)
    clamped = {"requested_s": 99999.999, "ceiling_s": 2}
    assert quick.structured["timeout_clamped"] == clamped and quick.meta["timeout_clamped"] == clamped
    assert not quick.is_error
    assert slow.error is ErrorCode.TIMED_OUT and f"{note}\nOutput:\ncommand timed out after" in slow.text
    assert "Timeout lowered" not in within.text and "timeout_clamped" not in within.structured
    assert "timeout_clamped" not in within.meta
    assert note in recorded[0]["result_text"]  # the audit store keeps what the model read


def test_through_the_dispatcher_the_budget_is_never_hit(engine, tmp_path):
    policy = Policy(budgets=Budgets(max_output_bytes=3000))
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        ToolRegistry([SHELL]), policy, audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as harness:
        streamed: list[bytes] = []
        result = harness.call(ToolCall("shell", {"command": "seq 1 50000"}, "c1"),
                              on_output=lambda _stream, data: streamed.append(data))
    assert len(result.text.encode()) <= 3000
    assert result.meta["truncated"] is False  # the tool's own cut fit: no dispatcher marker
    assert "bytes of output dropped" not in result.text and dropped_marker(0)[:5] not in result.text
    assert "Total output lines: 50000\n" in result.text and MARKER.search(result.text)
    assert b"".join(streamed) == "".join(f"{i}\n" for i in range(1, 50001)).encode()


@pytest.mark.parametrize("tool", ["shell", "bash", "read_file"])
def test_a_sandbox_destroyed_under_the_harness_is_sandbox_unavailable(engine, tmp_path, tool):
    """shell and bash say what the file tools say when the sandbox is gone: the retryable
    ``sandbox_unavailable``, with the agent's reason and whether the command had started."""
    from harness.tools import builtin_registry

    arguments = {"read_file": {"path": "/workspace/a.txt"}}.get(tool, {"command": "echo never"})
    with AuditStore(tmp_path / "audit.sqlite3") as audit, Session(
        builtin_registry(), Policy(), audit, spec=SandboxSpec(image=IMAGE), engine_factory=lambda: engine
    ) as harness:
        first = harness.call(ToolCall("write_file", {"path": "/workspace/a.txt", "content": "x"}, "c0"))
        assert not first.is_error, first.text
        box = harness.active_sandbox
        assert box is not None
        engine.client.containers.get(box.container_id).remove(force=True)  # gone under the harness
        result = harness.call(ToolCall(tool, arguments, "c1"))
    assert (result.is_error, result.error) == (True, ErrorCode.SANDBOX_UNAVAILABLE), result.text
    assert result.error.retryable
    assert result.text.lower().startswith("the sandbox did not answer"), result.text
    assert "stopped answering" in result.text, result.text
    assert result.structured is not None and result.structured["reason"] == "UNSPECIFIED"
    if tool == "shell":
        assert result.structured["command_started"] is False  # nothing ran: safe to send again
