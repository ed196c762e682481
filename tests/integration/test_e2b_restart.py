"""The E2B door with ``keep_sandboxes`` hands its sandboxes to the next server on the same
audit store, as the e2b SDK (unmodified) sees it: ``Sandbox.connect(id)`` finds a sandbox
with its files, envs and metadata, ``Sandbox.list()`` lists it, a paused one is still paused
(and connect resumes it), and a ``Sandbox`` object made before the restart keeps working with
its access token. The audit store holds only the tokens' digests. Without keep nothing is
left. Beside the gRPC door (one executor, as ``callbox serve --grpc --e2b`` runs them) each
door adopts its own sandboxes.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from e2b import Sandbox, SandboxInfo, SandboxNotFoundException, SandboxQuery

from harness.audit.store import AuditStore
from harness.client import ExecutorClient
from harness.core.policy import parse_policy
from harness.doors.e2b.access_tokens import ENVD_TOKENS, token_digest
from harness.doors.e2b.server import E2bServer, serve_e2b
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

KEY = "e2b-restart-alice-" + "k" * 16
POLICY = f'[sandbox]\nimage = "{IMAGE}"\nmemory = "256m"\nttl_seconds = 900\n'
NOTE = "/home/user/note.txt"
WAIT_S = 60.0


def _serve(audit: AuditStore, *, keep: bool, addr: str = "127.0.0.1:0") -> E2bServer:
    return serve_e2b(addr, tokens=TokenSet({"alice": KEY}, source="test tokens"), policy=parse_policy(POLICY),
                     audit=audit, announce=None, reaper_interval_s=3600, keep_sandboxes=keep)


@pytest.fixture
def sdk(monkeypatch: pytest.MonkeyPatch) -> Callable[[E2bServer], None]:
    """Point the SDK at a server: exactly what a user of E2B sets, no other E2B_* variable."""
    import os

    for name in [k for k in os.environ if k.startswith("E2B_")]:
        monkeypatch.delenv(name)

    def point(server: E2bServer) -> None:
        monkeypatch.setenv("E2B_API_URL", server.url)
        monkeypatch.setenv("E2B_SANDBOX_URL", server.url)
        monkeypatch.setenv("E2B_API_KEY", KEY)

    return point


def _listed(suite: str) -> dict[str, str]:
    """sandbox id -> state, of the sandboxes ``Sandbox.list`` shows with metadata ``suite``."""
    paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": suite}))
    found: dict[str, str] = {}
    while paginator.has_next:
        found.update({info.sandbox_id: str(info.state.value) for info in paginator.next_items()})
    return found


def _info(suite: str) -> dict[str, SandboxInfo]:
    return {info.sandbox_id: info for info in Sandbox.list(query=SandboxQuery(metadata={"suite": suite})).next_items()}


def _detail(server: E2bServer, sandbox_id: str) -> dict[str, object]:
    answer = httpx.get(f"{server.url}/sandboxes/{sandbox_id}", headers={"X-API-KEY": KEY}, timeout=30)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def _envd_read(server: E2bServer, sandbox_id: str, token: str) -> httpx.Response:
    return httpx.get(f"{server.url}/files", params={"path": NOTE},
                     headers={"E2b-Sandbox-Id": sandbox_id, "X-Access-Token": token}, timeout=30)


def _containers(engine: DockerEngine, audit_path: Path) -> list[str]:
    """The containers, existing now, of every sandbox a run of this audit store recorded."""
    with AuditStore(audit_path) as audit:
        engine_ids = [str(r.meta["container"]) for r in audit.list_runs(100) if "container" in r.meta]
    found = []
    for engine_id in engine_ids:
        found += [c["Id"] for c in engine.client.api.containers(
            all=True, filters={"label": f"callbox.sandbox-id={engine_id}"})]
    return found


def _remove_all(engine: DockerEngine, audit_path: Path) -> None:
    with AuditStore(audit_path) as audit:
        engine_ids = [str(r.meta["container"]) for r in audit.list_runs(100) if "container" in r.meta]
    for engine_id in engine_ids:
        with contextlib.suppress(Exception):
            engine.remove(engine_id)
    engine.drain(30)
    for container in _containers(engine, audit_path):
        with contextlib.suppress(Exception):
            engine.client.api.remove_container(container, force=True)


def _wait_until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


@pytest.fixture
def audit_path(engine: DockerEngine, tmp_path: Path) -> Iterator[Path]:
    """The audit store both servers use; every container its runs name is removed afterwards."""
    path = tmp_path / "audit.sqlite3"
    AuditStore(path).close()
    try:
        yield path
    finally:
        _remove_all(engine, path)


def test_a_restarted_e2b_door_adopts_its_sandboxes_for_the_sdk(engine, audit_path, sdk):
    suite = f"e2b-restart-{uuid.uuid4().hex[:8]}"
    first_audit, second_audit = AuditStore(audit_path), AuditStore(audit_path)
    first = _serve(first_audit, keep=True)
    second: E2bServer | None = None
    try:
        sdk(first)
        box = Sandbox.create(timeout=600, metadata={"suite": suite, "role": "work"}, envs={"GREETING": "hello"})
        idle = Sandbox.create(timeout=600, metadata={"suite": suite, "role": "idle"})
        box.files.write(NOTE, "kept across the restart\n")
        assert idle.pause() is True
        token = str(_detail(first, box.sandbox_id)["envdAccessToken"])
        before = _info(suite)[box.sandbox_id]
        assert sorted(first.stop()) == []
        assert sorted(first.left_running) == sorted([box.sandbox_id, idle.sandbox_id])
        assert len(_containers(engine, audit_path)) == 2  # still there, between the two servers
        meta = first_audit.get_run(box.sandbox_id).meta
        assert token not in json.dumps(meta) and meta[ENVD_TOKENS] == [token_digest(token)]

        second = _serve(second_audit, keep=True, addr=f"127.0.0.1:{first.port}")  # where the SDK objects point
        assert _listed(suite) == {box.sandbox_id: "running", idle.sandbox_id: "paused"}
        after = _info(suite)[box.sandbox_id]
        assert after.metadata == {"suite": suite, "role": "work"} and after.template_id == "base"
        assert after.started_at == before.started_at and after.end_at == before.end_at

        again = Sandbox.connect(box.sandbox_id)
        assert again.files.read(NOTE) == "kept across the restart\n"
        ran = again.commands.run(f"echo $GREETING; cat {NOTE}")
        assert ran.exit_code == 0 and ran.stdout == "hello\nkept across the restart\n"
        # a new access token was handed out; the old one still works (the object made before)
        renewed = str(_detail(second, box.sandbox_id)["envdAccessToken"])
        assert renewed != token
        assert box.commands.run("echo old object").stdout == "old object\n"
        assert _envd_read(second, box.sandbox_id, token).status_code == 200
        assert _envd_read(second, box.sandbox_id, "not-" + token).status_code == 401
        meta = second_audit.get_run(box.sandbox_id).meta
        assert renewed not in json.dumps(meta) and meta[ENVD_TOKENS] == [token_digest(token), token_digest(renewed)]

        # the paused one: still paused; connect resumes it, and its commands run
        resumed = Sandbox.connect(idle.sandbox_id)
        assert resumed.commands.run("echo resumed").stdout == "resumed\n"
        assert _listed(suite)[idle.sandbox_id] == "running"

        Sandbox.kill(box.sandbox_id)
        Sandbox.kill(idle.sandbox_id)
        assert _listed(suite) == {}
        assert second.stop() == []
        _wait_until(lambda: _containers(engine, audit_path) == [])
    finally:
        first.stop()
        if second is not None:
            second.stop()
        first_audit.close()
        second_audit.close()


def test_without_keep_sandboxes_nothing_is_left_and_nothing_adopted(engine, audit_path, sdk):
    suite = f"e2b-nokeep-{uuid.uuid4().hex[:8]}"
    first_audit, second_audit = AuditStore(audit_path), AuditStore(audit_path)
    first = _serve(first_audit, keep=False)
    second: E2bServer | None = None
    try:
        sdk(first)
        box = Sandbox.create(timeout=600, metadata={"suite": suite})
        assert first.stop() == [box.sandbox_id] and first.left_running == []
        _wait_until(lambda: _containers(engine, audit_path) == [])
        assert first_audit.get_run(box.sandbox_id).end_reason == "server_shutdown"
        second = _serve(second_audit, keep=True)  # a keeping server finds nothing to adopt
        sdk(second)
        assert _listed(suite) == {}
        with pytest.raises(SandboxNotFoundException):
            Sandbox.connect(box.sandbox_id)
    finally:
        first.stop()
        if second is not None:
            second.stop()
        first_audit.close()
        second_audit.close()


def test_beside_the_grpc_door_each_door_adopts_its_own(engine, audit_path, sdk):
    place = Path(tempfile.mkdtemp(prefix="cbx-e2r-", dir="/tmp"))  # unix socket paths are short
    target = f"unix:{place / 'x.sock'}"
    audits = [AuditStore(audit_path), AuditStore(audit_path)]
    started: list[GrpcServer | E2bServer] = []

    def serve_both(audit: AuditStore) -> tuple[GrpcServer, E2bServer]:
        grpc_server = serve_grpc(target, policy=parse_policy(POLICY), audit=audit,
                                 tokens=TokenSet({"alice": KEY}, source="test tokens"), announce=None,
                                 reaper_interval_s=3600, keep_sandboxes=True)
        started.append(grpc_server)
        e2b_server = serve_e2b("127.0.0.1:0", executor=grpc_server.service)  # takes the executor's setting
        started.append(e2b_server)
        sdk(e2b_server)
        return grpc_server, e2b_server

    try:
        grpc_server, e2b_server = serve_both(audits[0])
        with ExecutorClient(target, token=KEY) as client:
            grpc_box = client.create_sandbox()
            assert not client.call(grpc_box, "shell", {"command": "echo g > /workspace/g"}, timeout=120).is_error
        box = Sandbox.create(timeout=600)
        box.files.write(NOTE, "e2b\n")
        assert e2b_server.stop() == []  # a shared executor: its owner stops the sandboxes
        assert grpc_server.stop() == []
        assert sorted(grpc_server.service.left_running) == sorted([grpc_box, box.sandbox_id])

        grpc_server, e2b_server = serve_both(audits[1])
        assert Sandbox.connect(box.sandbox_id).files.read(NOTE) == "e2b\n"
        with ExecutorClient(target, token=KEY) as client:
            assert "g" in client.call(grpc_box, "shell", {"command": "cat /workspace/g"}, timeout=120).text
            assert {r.run_id for r in client.list_runs() if r.live} == {grpc_box}  # gRPC lists only its own
            client.delete_sandbox(grpc_box)
        Sandbox.kill(box.sandbox_id)
        e2b_server.stop()
        assert grpc_server.stop() == []
        _wait_until(lambda: _containers(engine, audit_path) == [])
    finally:
        for server in reversed(started):
            server.stop()
        for audit in audits:
            audit.close()
        shutil.rmtree(place, ignore_errors=True)
