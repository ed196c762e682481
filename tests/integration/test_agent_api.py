"""The agent's gRPC API in a real sandbox: Signal, cancellation, files, health, errors."""

from __future__ import annotations

import threading

import grpc
import pytest

from harness.core.errors import AgentCallError
from harness.engine.exec_result import collect
from sandbox import health
from tests.integration.helpers import run

pytestmark = pytest.mark.docker


def _started(events):  # type: ignore[no-untyped-def]
    first = next(events)
    assert first.WhichOneof("event") == "started"
    return first.started


def test_signal_reaches_a_running_command(sandbox):
    events = sandbox.agent.exec(["sleep", "100"], exec_id="sleeper", timeout_ms=60_000)
    started = _started(events)
    assert started.exec_id == "sleeper"
    assert sandbox.agent.signal("sleeper", 15) >= 1
    result = collect(events)
    assert result.signal == 15
    assert not result.timed_out


def test_signal_to_unknown_exec_is_a_structured_error(sandbox):
    with pytest.raises(AgentCallError) as info:
        sandbox.agent.signal("nope", 15)
    assert info.value.reason == "NO_SUCH_PROCESS"
    assert info.value.grpc_code == "NOT_FOUND"
    assert info.value.retryable is False


def test_cancelling_the_stream_kills_the_command(sandbox):
    events = sandbox.agent.exec("echo $$ > /tmp/leader.pid; exec sleep 100", timeout_ms=60_000)
    _started(events)
    events.close()  # the client goes away: the RPC is cancelled
    gone = threading.Event()
    for _ in range(200):  # bounded: each probe is a real round trip, not a sleep
        probe = run(sandbox, "pid=$(cat /tmp/leader.pid 2>/dev/null) && kill -0 $pid 2>/dev/null && echo alive")
        if probe.stdout.data() != b"alive\n":
            gone.set()
            break
    assert gone.is_set(), "the command outlived its cancelled call"


def test_spawn_failure_is_an_error_not_an_exit(sandbox):
    with pytest.raises(AgentCallError) as info:
        run(sandbox, ["/no/such/binary"])
    assert info.value.reason == "SPAWN_FAILED"
    assert info.value.message == "/no/such/binary: no such file or directory"  # a path to nothing, as a shell says it
    assert info.value.code == "command_not_found"  # exit 127 from `callbox exec`


def test_file_roundtrip_owned_by_the_tool_user(sandbox):
    assert sandbox.agent.write_file("dir/a.txt", b"hello\n", make_parents=True) == 6
    assert sandbox.agent.read_file("/workspace/dir/a.txt").data == b"hello\n"
    info = sandbox.agent.stat("dir/a.txt")
    assert (info.uid, info.gid, info.size) == (1000, 1000, 6)
    listing = [e.path for e in sandbox.agent.list_dir(".", depth=2).entries]
    assert "dir" in listing and "dir/a.txt" in listing
    assert run(sandbox, ["cat", "dir/a.txt"]).stdout.data() == b"hello\n"


def test_file_operations_cannot_escape_the_roots(sandbox):
    run(sandbox, "ln -s /etc /workspace/etc-link")
    for path in ("/etc/passwd", "../etc/passwd", "etc-link/passwd", "/opt/callbox/agent.py"):
        with pytest.raises(AgentCallError) as info:
            sandbox.agent.read_file(path)
        assert info.value.reason == "PATH_ESCAPE", path
    with pytest.raises(AgentCallError) as info:
        sandbox.agent.write_file("etc-link/evil", b"x")
    assert info.value.reason == "PATH_ESCAPE"


def test_standard_health_service_answers(sandbox):
    assert sandbox.agent.health() == health.SERVING
    with pytest.raises(grpc.RpcError) as info:
        health.check(sandbox.agent.channel, timeout=2, service="no.such.Service")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
