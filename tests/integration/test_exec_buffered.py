"""ExecBuffered (``AgentClient.exec_buffered``) in a real sandbox: the same result as Exec, nothing
outlives its call, a cancelled call kills its command, and a cap too big for one answer is refused."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from harness.core.errors import AgentCallError
from harness.engine.cancel import CallScope, current_scope
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from tests.conftest import IMAGE, RUNTIME

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def box(engine: Any) -> Iterator[Any]:
    sandbox = engine.create(SandboxSpec(image=IMAGE, runtime=RUNTIME))
    try:
        yield sandbox
    finally:
        sandbox.destroy()


def _alive(box: Any, pid_file: str) -> bool:
    probe = collect(box.agent.exec_buffered(f"kill -0 $(cat {pid_file}) 2>/dev/null && echo alive"))
    return probe.stdout.data() == b"alive\n"


def test_the_result_is_the_streamed_exec_s(box: Any) -> None:
    command = "printf 'out\\n'; printf 'err\\n' >&2; exit 7"
    buffered = collect(box.agent.exec_buffered(command, env={"X": "1"}, stdin=b"ignored"))
    streamed = collect(box.agent.exec(command, env={"X": "1"}, stdin=b"ignored"))
    for result in (buffered, streamed):
        assert (result.exit_code, result.signal, result.timed_out, result.oom_killed) == (7, 0, False, False)
        assert result.stdout.data() == b"out\n"
        assert result.stderr.data() == b"err\n"
    assert collect(box.agent.exec_buffered(["id", "-u"])).stdout.data() == b"1000\n"


def test_what_the_command_left_behind_is_killed_at_its_end(box: Any) -> None:
    result = collect(box.agent.exec_buffered("setsid sleep 300 & echo $! > /tmp/left.pid"))
    assert result.exit_code == 0
    assert not _alive(box, "/tmp/left.pid"), "a process outlived its ExecBuffered call"


def test_cancelling_the_calls_scope_kills_the_command(box: Any) -> None:
    scope = CallScope()
    failure: list[AgentCallError] = []

    def call() -> None:
        with current_scope(scope):
            try:
                collect(box.agent.exec_buffered("echo $$ > /tmp/held.pid; exec sleep 300", timeout_ms=120_000))
            except AgentCallError as error:
                failure.append(error)

    thread = threading.Thread(target=call)
    thread.start()
    try:
        for _ in range(500):  # bounded: each probe is a real round trip, not a sleep
            if _alive(box, "/tmp/held.pid"):
                break
        else:
            pytest.fail("the command never started")
        scope.cancel()
        thread.join(30)
        assert not thread.is_alive()
        assert failure and failure[0].grpc_code == "CANCELLED"
        for _ in range(500):
            if not _alive(box, "/tmp/held.pid"):
                break
        else:
            pytest.fail("the command outlived its cancelled call")
    finally:
        scope.cancel()
        thread.join(30)


def test_a_cap_too_big_for_one_answer_is_refused(box: Any) -> None:
    with pytest.raises(AgentCallError) as info:
        box.agent.exec_buffered(["true"], output_cap_bytes=64 << 20)
    assert info.value.reason == "INVALID_ARGUMENT"
    assert "use Exec" in info.value.message
