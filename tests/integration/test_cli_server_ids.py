"""The operator's ``callbox sandbox`` on a gRPC server's sandboxes, by their sandbox id (the
run id the server's clients know), and what the server does when the operator removes one:
NOT_FOUND at once, and the reaper's next round ends the session (run ``removed``). One
in-process executor on the real engine; the CLI is the installed script, on the same host
and audit store."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode
from harness.core.policy import parse_policy
from harness.doors.grpc.errors import ServiceError
from harness.doors.grpc.overrides import SandboxOverrides
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.tools import registry_for
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

CALLBOX = str(Path(sys.executable).parent / "callbox")


@pytest.fixture(scope="module")
def executor(engine: Any) -> Iterator[ExecutorService]:
    state = Path(tempfile.mkdtemp(prefix="cbx-cli-ids-"))
    docker_engine = DockerEngine(engine.client, reap_on_start=False)
    audit = AuditStore(state / "audit.sqlite3")
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n')
    service = ExecutorService(registry=registry_for(policy), policy=policy, audit=audit,
                              tokens=TokenSet({"alice": "a" * 32}, source="test tokens"),
                              engine_factory=lambda: docker_engine)
    try:
        yield service
    finally:
        service.shutdown()
        audit.close()
        shutil.rmtree(state, ignore_errors=True)


def callbox(executor: ExecutorService, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "CALLBOX_AUDIT_DB": str(executor.audit.path)}
    return subprocess.run([CALLBOX, *args], capture_output=True, env=env, timeout=120, check=False)


def test_exec_reaches_a_grpc_sandbox_by_its_id_and_rm_ends_its_session(executor: ExecutorService) -> None:
    session = executor.create_session("alice", SandboxOverrides())
    sid = session.sandbox_id
    try:
        proc = callbox(executor, "sandbox", "exec", sid, "--", "echo", "hi")
        assert (proc.returncode, proc.stdout) == (0, b"hi\n"), proc.stderr
        assert executor.session_of(sid, "alice") is session
        assert executor.reap_expired() == []

        proc = callbox(executor, "sandbox", "rm", sid)
        assert proc.returncode == 0, proc.stderr
        with pytest.raises(ServiceError) as refused:  # at once, as for a deleted sandbox
            executor.session_of(sid, "alice")
        assert refused.value.error is ErrorCode.NOT_FOUND
        assert executor.reap_expired() == [sid]  # the reaper's next round ends the session
        assert session.closed and sid not in executor.live_sandboxes()
        assert executor.audit.get_run(sid).end_reason == "removed"
    finally:
        executor.delete_session(session)
