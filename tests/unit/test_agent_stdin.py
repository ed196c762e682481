"""An Exec whose stdin stays open: keep_stdin_open plus WriteStdin, on the real ProcessRunner
and through the agent's real gRPC server (in this process, on a unix socket) with AgentClient.

Waits are on the command's own output (a queue of events), each bounded, never sleeps.
"""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.core.errors import AgentCallError
from harness.engine.agent_client import AgentClient
from sandbox.errors import AgentError
from sandbox.process import MAX_PENDING_STDIN, ProcessRunner
from sandbox.server import AgentConfig, build_server
from sandbox.spawner import Spawner
from sandbox.v1 import errors_pb2, process_pb2


@pytest.fixture
def runner(tmp_path: Path) -> ProcessRunner:
    return ProcessRunner(user=None, workspace=str(tmp_path))


class Lines:
    """Consume an Exec's events in a thread; hand stdout over line by line."""

    def __init__(self, events: Iterator[process_pb2.ExecEvent]) -> None:
        self.items: queue.Queue[process_pb2.ExecEvent | BaseException | None] = queue.Queue()
        self.buffer = b""
        self.exited: process_pb2.Exited | None = None
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._consume, args=(events,), daemon=True)
        self._thread.start()

    def _consume(self, events: Iterator[process_pb2.ExecEvent]) -> None:
        try:
            for event in events:
                if event.WhichOneof("event") == "started":
                    self.started.set()
                self.items.put(event)
        except BaseException as exc:  # handed to the test thread
            self.items.put(exc)
        finally:
            self.items.put(None)

    def _next(self, timeout: float) -> bool:
        item = self.items.get(timeout=timeout)
        if isinstance(item, BaseException):
            raise item
        if item is None:
            return False
        kind = item.WhichOneof("event")
        if kind == "output":
            self.buffer += item.output.stdout
        elif kind == "exited":
            self.exited = item.exited
        return True

    def line(self, timeout: float = 10.0) -> bytes:
        while b"\n" not in self.buffer:
            assert self._next(timeout), f"the stream ended before a line; got {self.buffer!r}"
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def finish(self, timeout: float = 10.0) -> process_pb2.Exited:
        while self._next(timeout):
            pass
        assert self.exited is not None, "the stream ended without Exited"
        return self.exited


def exec_request(exec_id: str, *args: str, **kwargs: object) -> process_pb2.ExecRequest:
    return process_pb2.ExecRequest(argv=process_pb2.Argv(args=list(args)), exec_id=exec_id,  # type: ignore[arg-type]
                                   **kwargs)


def test_stdin_stays_open_and_each_write_is_answered(runner: ProcessRunner) -> None:
    # A line-by-line echo: every answer arrives before the next write, so the pipe stayed open.
    request = exec_request("echo", "python3", "-u", "-c",
                           "import sys\nfor l in sys.stdin: print('got ' + l.strip())\nprint('eof')",
                           keep_stdin_open=True, stdin=b"first\n")
    lines = Lines(runner.run(request))
    assert lines.line() == b"got first"
    for word in (b"second", b"third"):
        runner.write_stdin("echo", word + b"\n", close=False)
        assert lines.line() == b"got " + word
    runner.write_stdin("echo", b"last\n", close=True)
    assert lines.line() == b"got last"
    assert lines.line() == b"eof"
    assert lines.finish().exit_code == 0


def test_close_without_data_gives_end_of_file(runner: ProcessRunner) -> None:
    lines = Lines(runner.run(exec_request("cat", "sh", "-c", "echo ready; cat; echo rc=$?", keep_stdin_open=True)))
    assert lines.line() == b"ready"
    runner.write_stdin("cat", b"", close=True)
    assert lines.line() == b"rc=0"
    assert lines.finish().exit_code == 0


def test_large_writes_arrive_whole_and_in_order(runner: ProcessRunner) -> None:
    lines = Lines(runner.run(exec_request("wc", "sh", "-c", "echo ready; wc -c", keep_stdin_open=True)))
    assert lines.line() == b"ready"
    total = 0
    for i in range(8):
        chunk = bytes([65 + i]) * (300_000 + i)
        runner.write_stdin("wc", chunk, close=False)
        total += len(chunk)
    runner.write_stdin("wc", b"", close=True)
    assert lines.line().strip() == str(total).encode()
    lines.finish()


def test_write_stdin_refusals(runner: ProcessRunner) -> None:
    with pytest.raises(AgentError) as unknown:
        runner.write_stdin("nobody", b"x", close=False)
    assert unknown.value.reason == errors_pb2.ERROR_REASON_NO_SUCH_PROCESS

    lines = Lines(runner.run(exec_request("plain", "sh", "-c", "echo ready; sleep 30")))
    assert lines.line() == b"ready"
    with pytest.raises(AgentError, match="not started with keep_stdin_open"):
        runner.write_stdin("plain", b"x", close=False)
    runner.cancel_all()
    lines.finish()

    lines = Lines(runner.run(exec_request("open", "sh", "-c", "echo ready; sleep 30", keep_stdin_open=True)))
    assert lines.line() == b"ready"
    with pytest.raises(AgentError, match="retry once the command reads") as busy:
        runner.write_stdin("open", b"x" * (MAX_PENDING_STDIN + 1), close=False)
    assert busy.value.reason == errors_pb2.ERROR_REASON_BUSY
    runner.write_stdin("open", b"", close=True)
    with pytest.raises(AgentError, match="already closed"):
        runner.write_stdin("open", b"more", close=False)
    runner.cancel_all()
    lines.finish()


def test_without_the_flag_stdin_is_closed_after_the_request_data(runner: ProcessRunner) -> None:
    lines = Lines(runner.run(exec_request("old", "sh", "-c", "cat; echo done", stdin=b"x\n")))
    assert lines.line() == b"x"
    assert lines.line() == b"done"
    assert lines.finish().exit_code == 0


def test_write_stdin_through_the_agent_server(tmp_path: Path) -> None:
    socket = str(tmp_path / "agent.sock")
    # As in the agent: commands start from a pre-forked spawner, never by forking a process
    # that runs gRPC's threads.
    spawner = Spawner(fresh=True)
    agent = build_server(AgentConfig(socket=socket, workspace=str(tmp_path), roots=[str(tmp_path)], user=None,
                                     max_concurrent=4, spawner=spawner))
    server, runner = agent.server, agent.runner
    server.add_insecure_port(f"unix:{socket}")
    server.start()
    try:
        with AgentClient(socket) as client:
            exec_id = uuid.uuid4().hex
            upper = "import sys\nfor l in sys.stdin: print(l.upper(), end='')"
            lines = Lines(client.exec(["python3", "-u", "-c", upper],
                                      exec_id=exec_id, keep_stdin_open=True, timeout_ms=20_000))
            assert lines.started.wait(10)
            assert client.write_stdin(exec_id, b"hello\n") >= 0
            assert lines.line() == b"HELLO"
            client.write_stdin(exec_id, b"bye\n", close=True)
            assert lines.line() == b"BYE"
            assert lines.finish().exit_code == 0
            with pytest.raises(AgentCallError) as gone:
                client.write_stdin(exec_id, b"late\n")
            assert gone.value.reason == "NO_SUCH_PROCESS"
    finally:
        runner.stop("the test ended")
        server.stop(grace=1).wait()
        spawner.close()
