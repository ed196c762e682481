"""Services built on their first call: the agent starts without importing them, and the first
call builds them once, whichever thread comes first."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from sandbox.later import Later, ServicerOnFirstCall, on_first_call

ROOT = Path(__file__).resolve().parents[2]


def test_a_value_is_built_once_by_whichever_thread_asks_first() -> None:
    built: list[int] = []
    gate = threading.Barrier(8)

    def build() -> object:
        built.append(1)
        return object()

    later: Later[object] = Later(build)
    assert not later.built
    seen: list[object] = []

    def ask() -> None:
        gate.wait()
        seen.append(later.value())

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(built) == 1 and later.built
    assert all(value is seen[0] for value in seen)


def test_a_failed_build_fails_that_call_and_the_next_call_tries_again() -> None:
    attempts: list[int] = []

    class Servicer:
        def Hello(self, request: str, context: object) -> str:
            return f"hello {request}"

    def build() -> Servicer:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("the first build fails")
        return Servicer()

    stand_in = on_first_call(Later(build))
    assert isinstance(stand_in, ServicerOnFirstCall)
    with pytest.raises(OSError, match="first build"):
        stand_in.Hello("you", None)
    assert stand_in.Hello("you", None) == "hello you"
    assert stand_in.Hello("again", None) == "hello again" and len(attempts) == 2
    with pytest.raises(AttributeError):
        stand_in.__deepcopy__  # noqa: B018 (private names are not RPC methods)


AGENT = textwrap.dedent("""
    import os, sys
    os.environ["GRPC_ENABLE_FORK_SUPPORT"] = "false"
    from sandbox.server import AgentConfig, build_server

    base, socket = sys.argv[1], sys.argv[2]
    agent = build_server(AgentConfig(socket=socket, workspace=base, roots=[base], user=None, max_concurrent=4))
    agent.server.add_insecure_port(f"unix:{socket}")
    agent.server.start()
    deferred = ("sandbox.jobs", "sandbox.changes", "sandbox.shell", "sandbox.ports", "sandbox.watch", "sandbox.move")
    print("serving:", [m for m in deferred if m in sys.modules], flush=True)
    sys.stdin.readline()
    print("after a Jobs call:", [m for m in deferred if m in sys.modules], flush=True)
    agent.jobs.value().stop("the test ended")
    agent.server.stop(None)
""")


def test_an_agent_serves_without_importing_the_services_it_builds_on_first_call(tmp_path: Path) -> None:
    from harness.engine.agent_client import AgentClient

    socket = str(tmp_path / "a.sock")
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(tmp_path), socket], cwd=ROOT, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert agent.stdout is not None and agent.stdin is not None
        assert agent.stdout.readline() == "serving: []\n"
        with AgentClient(socket) as client:
            assert client.jobs.list() == []
        agent.stdin.write("go on\n")
        agent.stdin.flush()
        assert agent.stdout.readline() == "after a Jobs call: ['sandbox.jobs']\n"
        assert agent.wait(30) == 0
    finally:
        agent.kill()
        agent.wait()
