"""A sandbox deleted or expired while a call runs stays gone: the call's handler, asking for
the sandbox only afterwards, gets an error instead of a new container no session owns.
Real engine, real image, an in-process gRPC server."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.client import CallResult, ExecutorClient
from harness.core.calls import ToolOutput
from harness.core.context import ToolContext
from harness.core.policy import parse_policy
from harness.core.registry import Tool, ToolDefinition
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker import labels
from harness.tools import builtin_registry
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN = "token-of-the-session-end-client-0123"
WAIT_S = 60.0


class NoArgs(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")


class Gate:
    """A tool handler that says it started, waits to be released, then asks for the sandbox."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()

    def handler(self, ctx: ToolContext, _args: NoArgs) -> ToolOutput:
        self.entered.set()
        if not self.release.wait(WAIT_S):
            return ToolOutput(text="never released", is_error=True)
        return ToolOutput(text=f"ran in sandbox {ctx.runtime().sandbox_id}")


def _mine(engine) -> set[str]:  # type: ignore[no-untyped-def]
    """Sandbox ids of the containers this test process owns (the in-process server's)."""
    me = labels.Owner.current().label()
    return {s.sandbox_id for s in engine.list_sandboxes() if s.process == me}


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def server(engine, tmp_path, gate) -> Iterator[GrpcServer]:  # type: ignore[no-untyped-def]
    registry = builtin_registry()
    registry.register(Tool(ToolDefinition(name="gated", description="Waits, then uses the sandbox.",
                                          input_model=NoArgs), gate.handler))
    policy = parse_policy(textwrap.dedent(f"""
        [sandbox]
        image = "{IMAGE}"
        memory = "512m"
    """))
    sockets = Path(tempfile.mkdtemp(prefix="cbx-", dir="/tmp"))
    handle = serve_grpc(str(sockets / "x.sock"), policy=policy, audit=AuditStore(tmp_path / "audit.sqlite3"),
                        registry=registry, tokens=TokenSet({"alice": TOKEN}, source="test tokens"), announce=None,
                        reaper_interval_s=3600)
    try:
        yield handle
    finally:
        gate.release.set()
        handle.stop(grace=1)
        shutil.rmtree(sockets, ignore_errors=True)


@pytest.mark.parametrize("ending", ["deleted", "expired"])
def test_a_call_whose_sandbox_ended_before_it_asked_for_it_starts_none(engine, server, gate, ending):
    before = _mine(engine)
    outcome: list[CallResult | BaseException] = []
    try:
        with ExecutorClient(server.target, TOKEN) as client:
            box = client.create_sandbox()
            container = server.service.audit.get_run(box).meta["container"]

            def call() -> None:
                try:
                    outcome.append(client.call(box, "gated", {}, call_id="gated-1", timeout=WAIT_S))
                except BaseException as exc:
                    outcome.append(exc)

            worker = threading.Thread(target=call)
            worker.start()
            assert gate.entered.wait(WAIT_S)
            if ending == "deleted":
                assert client.delete_sandbox(box) == 1
            else:
                assert server.service.reap_expired(now=time.time() + 3600 * 24 * 365) == [box]
            gate.release.set()
            worker.join(WAIT_S)
            assert not worker.is_alive()

            [result] = outcome
            assert isinstance(result, CallResult), result
            assert result.is_error, result.text
            assert result.error_code == "sandbox_unavailable"
            assert "ended" in result.text
            left = _mine(engine) - before
            assert container not in left
            assert not left, f"containers started after the sandbox {ending}: {left}"
            assert client.get_run(box).end_reason == ending
    finally:
        for leaked in _mine(engine) - before:
            engine.destroy(leaked)
