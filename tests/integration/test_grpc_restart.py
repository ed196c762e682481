"""A gRPC server with ``keep_sandboxes`` hands its sandboxes to the next server on the same
audit store: in process (stop, then serve again) and as ``callbox serve`` processes
restarted with SIGTERM and killed with SIGKILL in the middle of a call.

What a client sees after the restart, with the same token: its sandboxes live again (its
files still there, a paused one still paused and resumable), its pending approval still
pending and resolvable, the approved call run exactly once when re-sent, a call that was
running when its server was killed recorded as interrupted (a re-send returns that record,
the command does not run again), a sandbox removed while no server ran reported gone, and the
change records of a run go on where they were: a call after the restart records only what it
changed, and the diff holds the calls of both servers.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.audit.change_store import RunChanges, changes_root
from harness.audit.store import AuditStore
from harness.client import ExecutorClient, ExecutorError
from harness.core import undo
from harness.core.policy import parse_policy
from harness.doors.grpc.server import GrpcServer, serve_grpc
from harness.doors.grpc.tokens import TokenSet
from harness.engine.docker.engine import DockerEngine
from harness.v1 import sandboxes_pb2, sandboxes_pb2_grpc
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

TOKEN = "token-of-restart-alice-0123456"
TOKEN_B = "token-of-restart-bob-01234567"
POLICY = textwrap.dedent(f"""
    [sandbox]
    image = "{IMAGE}"
    memory = "256m"
    ttl_seconds = 900

    [tools.bash]
    decision = "ask"

    [checkpoints]
    mode = "changes"
""")
SIDE_EFFECT = '{"command": "echo ran >> /workspace/count"}'


def meta(token: str = TOKEN) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def shell(client: ExecutorClient, box: str, command: str, call_id: str | None = None) -> Any:
    return client.call(box, "shell", {"command": command}, call_id=call_id, timeout=120)


def container_of(audit_path: Path, sandbox_id: str) -> str:
    with AuditStore(audit_path) as audit:
        return str(audit.get_run(sandbox_id).meta["container"])


def containers(engine: DockerEngine, ids: list[str]) -> list[str]:
    """The containers of the engine sandboxes ``ids`` that exist."""
    found = []
    for sandbox_id in ids:
        found += [c["Id"] for c in engine.client.api.containers(
            all=True, filters={"label": f"callbox.sandbox-id={sandbox_id}"})]
    return found


def remove_all(engine: DockerEngine, ids: list[str]) -> None:
    for sandbox_id in ids:
        with contextlib.suppress(Exception):
            engine.remove(sandbox_id)
    engine.drain(30)


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Path]:
    """A short directory for the server's socket (unix socket paths are short)."""
    directory = Path(tempfile.mkdtemp(prefix="cbx-rs-", dir="/tmp"))
    try:
        yield directory
    finally:
        subprocess.run(["rm", "-rf", str(directory)], check=False)


# ---- in process: stop, then serve again on the same audit store -------------------------------------


def _serve(place: Path, audit: AuditStore, keep: bool = True) -> GrpcServer:
    return serve_grpc(str(place / "x.sock"), policy=parse_policy(POLICY), audit=audit,
                      tokens=TokenSet({"alice": TOKEN, "bob": TOKEN_B}, source="test tokens", operators=["alice"]),
                      announce=None,
                      reaper_interval_s=3600, keep_sandboxes=keep)


def test_a_restarted_server_adopts_files_approvals_and_a_paused_sandbox(engine, tmp_path, place):
    audit_path = tmp_path / "audit.sqlite3"
    kept: list[str] = []
    first_audit, second_audit = AuditStore(audit_path), AuditStore(audit_path)
    first = _serve(place, first_audit)
    second: GrpcServer | None = None
    try:
        with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN) as client:
            box = client.create_sandbox()
            idle = client.create_sandbox()
            kept += [container_of(audit_path, box), container_of(audit_path, idle)]
            assert not shell(client, box, "echo kept > /workspace/note").is_error
            pending = client.call(box, "bash", SIDE_EFFECT, call_id="c-ask")
            assert pending.error_code == "approval_pending" and pending.approval_id
            with grpc.insecure_channel(f"unix:{place / 'x.sock'}") as channel:
                stub = sandboxes_pb2_grpc.SandboxesStub(channel)
                assert stub.Pause(sandboxes_pb2.PauseRequest(sandbox_id=idle), metadata=meta()).state == "paused"
            # a call in flight when the server stops: cancelled, and recorded so
            ended: list[Any] = []
            caller = threading.Thread(target=lambda: ended.append(
                shell(client, box, "echo started >> /workspace/long; sleep 120", call_id="c-long")))
            caller.start()
            _wait_until(lambda: (c := first_audit.get_call(box, "c-long")) is not None and c.state == "running")
            # "running" in the ledger comes before the command starts: wait for what it wrote
            with grpc.insecure_channel(f"unix:{place / 'x.sock'}") as channel:
                stub = sandboxes_pb2_grpc.SandboxesStub(channel)
                _wait_until(lambda: b"started" in _file_in(stub, box, "/workspace/long"))
            assert first.stop() == []
            caller.join(60)
        assert ended and ended[0].error_code == "sandbox_unavailable"  # cancelled at the stop, as it ran
        assert ended[0].structured["command_started"] is True  # so a re-send never runs it again
        assert sorted(first.service.left_running) == sorted([box, idle])
        assert len(containers(engine, kept)) == 2  # still there, between the two servers

        second = _serve(place, second_audit)
        with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN) as client, \
                grpc.insecure_channel(f"unix:{place / 'x.sock'}") as channel:
            stub = sandboxes_pb2_grpc.SandboxesStub(channel)
            runs = {r.run_id: r for r in client.list_runs()}
            assert runs[box].live and runs[idle].live
            assert stub.GetStatus(sandboxes_pb2.GetStatusRequest(sandbox_id=idle), metadata=meta()).state == "paused"
            assert stub.GetStatus(sandboxes_pb2.GetStatusRequest(sandbox_id=box), metadata=meta()).state == "running"
            assert shell(client, box, "cat /workspace/note").text.count("kept") == 1
            assert not shell(client, box, "echo again >> /workspace/note", call_id="c-after").is_error
            changes = RunChanges(changes_root(audit_path), box)
            after = changes.call_record("c-after")
            assert after is not None and [e.path for e in after.entries] == ["/workspace/note"]
            assert after.before["/workspace/note"] is not None  # known from the first server's records
            shown = undo.diff(changes)
            assert "+kept" in shown and "+again" in shown and shown.count("/workspace/note") >= 2
            # the approval asked before the restart is still pending, and resolvable now
            approval = next(a for a in client.get_run(box).approvals if a.approval_id == pending.approval_id)
            assert approval.state == "pending"
            assert client.resolve_approval(pending.approval_id, True).state == "approved"
            ran = client.call(box, "bash", SIDE_EFFECT, call_id="c-ask")
            again = client.call(box, "bash", SIDE_EFFECT, call_id="c-ask")
            assert not ran.is_error and not again.is_error
            assert shell(client, box, "wc -l < /workspace/count").text.split("Output:")[-1].strip() == "1"
            assert shell(client, box, "echo started >> /workspace/long; sleep 120", call_id="c-long") == ended[0]
            assert shell(client, box, "wc -l < /workspace/long").text.split("Output:")[-1].strip() == "1"
            # the paused sandbox resumes, and works
            with pytest.raises(ExecutorError, match="paused"):
                shell(client, idle, "true")
            assert stub.Resume(sandboxes_pb2.ResumeRequest(sandbox_id=idle), metadata=meta()).state == "running"
            assert "alive" in shell(client, idle, "echo alive").text
            # another client sees none of it
            with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN_B) as bob:
                assert bob.list_runs() == []
                with pytest.raises(ExecutorError) as seen:
                    shell(bob, box, "true")
                assert seen.value.code == grpc.StatusCode.NOT_FOUND
            client.delete_sandbox(box)
            client.delete_sandbox(idle)
        assert second.stop() == []
        _wait_until(lambda: containers(engine, kept) == [])  # removed in the background
    finally:
        first.stop()
        if second is not None:
            second.stop()
        remove_all(engine, kept)
        first_audit.close()
        second_audit.close()


def test_a_sandbox_removed_while_no_server_ran_is_reported_gone(engine, tmp_path, place):
    audit_path = tmp_path / "audit.sqlite3"
    kept: list[str] = []
    first_audit, second_audit = AuditStore(audit_path), AuditStore(audit_path)
    first = _serve(place, first_audit)
    second: GrpcServer | None = None
    try:
        with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN) as client:
            box = client.create_sandbox()
            kept.append(container_of(audit_path, box))
        first.stop()
        for container in containers(engine, kept):  # `docker rm -f` while no server runs
            engine.client.api.remove_container(container, force=True)
        second = _serve(place, second_audit)
        with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN) as client:
            run = client.get_run(box)
            assert not run.live and run.end_reason == "sandbox_gone"
            with pytest.raises(ExecutorError) as seen:
                shell(client, box, "true")
            assert seen.value.code == grpc.StatusCode.NOT_FOUND
    finally:
        first.stop()
        if second is not None:
            second.stop()
        remove_all(engine, kept)
        first_audit.close()
        second_audit.close()


def test_without_keep_sandboxes_nothing_is_left_and_nothing_adopted(engine, tmp_path, place):
    audit_path = tmp_path / "audit.sqlite3"
    kept: list[str] = []
    with AuditStore(audit_path) as audit:
        server = _serve(place, audit, keep=False)
        try:
            with ExecutorClient(f"unix:{place / 'x.sock'}", token=TOKEN) as client:
                box = client.create_sandbox()
                kept.append(container_of(audit_path, box))
            assert server.stop() == [box]
            _wait_until(lambda: containers(engine, kept) == [])
            assert audit.get_run(box).end_reason == "server_shutdown"
        finally:
            server.stop()
            remove_all(engine, kept)


# ---- `callbox serve` processes: SIGTERM, then SIGKILL in the middle of a call --------------------------


class Served:
    """One `callbox serve --config FILE` process."""

    def __init__(self, config: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "serve", "--config", str(config)],
                                     stderr=subprocess.PIPE, text=True, env={**os.environ})
        assert self.proc.stderr is not None
        lines = []
        for line in self.proc.stderr:  # the server says where it listens once it serves
            lines.append(line)
            if "gRPC executor listening" in line:
                break
        else:
            raise AssertionError(f"the server did not start: {''.join(lines)}")
        self.log = lines
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(90)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def test_callbox_serve_restarted_by_sigterm_and_killed_mid_call(engine, tmp_path, place):
    sock = place / "x.sock"
    (tmp_path / "tokens").write_text(f"alice:{TOKEN} operator\n")  # an operator: it resolves approvals
    (tmp_path / "tokens").chmod(0o600)
    (tmp_path / "policy.toml").write_text(POLICY)
    config = tmp_path / "callbox.toml"
    config.write_text(f'[doors.grpc]\nlisten = "unix:{sock}"\n[auth]\ntoken_file = "tokens"\n'
                      '[audit]\ndb = "audit.sqlite3"\n[policy]\nfile = "policy.toml"\n'
                      '[service]\nkeep_sandboxes = true\n')
    audit_path = tmp_path / "audit.sqlite3"
    kept: list[str] = []
    servers: list[Served] = []
    try:
        servers.append(Served(config))
        with ExecutorClient(f"unix:{sock}", token=TOKEN) as client, grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = sandboxes_pb2_grpc.SandboxesStub(channel)
            box = client.create_sandbox()
            idle = client.create_sandbox()
            kept += [container_of(audit_path, box), container_of(audit_path, idle)]
            assert not shell(client, box, "echo kept > /workspace/note").is_error
            pending = client.call(box, "bash", SIDE_EFFECT, call_id="c-ask")
            assert pending.approval_id
            stub.Pause(sandboxes_pb2.PauseRequest(sandbox_id=idle), metadata=meta())
        assert servers[-1].stop() == 0
        assert len(containers(engine, kept)) == 2

        servers.append(Served(config))  # a real restart: a new process on the same state
        with ExecutorClient(f"unix:{sock}", token=TOKEN) as client, grpc.insecure_channel(f"unix:{sock}") as channel:
            stub = sandboxes_pb2_grpc.SandboxesStub(channel)
            assert {r.run_id for r in client.list_runs() if r.live} == {box, idle}
            assert stub.GetStatus(sandboxes_pb2.GetStatusRequest(sandbox_id=idle), metadata=meta()).state == "paused"
            assert "kept" in shell(client, box, "cat /workspace/note").text
            client.resolve_approval(pending.approval_id, True)
            assert not client.call(box, "bash", SIDE_EFFECT, call_id="c-ask").is_error
            assert stub.Resume(sandboxes_pb2.ResumeRequest(sandbox_id=idle), metadata=meta()).state == "running"
            # a call in flight when the server is killed
            seen: list[BaseException] = []

            def long_call() -> None:
                try:
                    shell(client, box, "echo started >> /workspace/long; sleep 120", call_id="c-long")
                except BaseException as exc:  # the server died under it
                    seen.append(exc)

            caller = threading.Thread(target=long_call)
            caller.start()
            with AuditStore(audit_path) as audit:
                _wait_until(lambda: (c := audit.get_call(box, "c-long")) is not None and c.state == "running")
            _wait_until(lambda: b"started" in _file_in(stub, box, "/workspace/long"))  # the command started
            servers[-1].kill()
            caller.join(60)
            assert seen and isinstance(seen[0], ExecutorError)
        for container in containers(engine, [kept[1]]):  # the idle one is removed while no server runs
            engine.client.api.remove_container(container, force=True)

        servers.append(Served(config))
        with ExecutorClient(f"unix:{sock}", token=TOKEN) as client:
            gone = client.get_run(idle)
            assert not gone.live and gone.end_reason == "sandbox_gone"
            interrupted = client.call(box, "shell", {"command": "echo started >> /workspace/long; sleep 120"},
                                      call_id="c-long", timeout=60)
            assert interrupted.is_error and "unknown" in interrupted.text
            assert (interrupted.structured or {}).get("interrupted") == "server_stopped"
            assert shell(client, box, "wc -l < /workspace/long; wc -l < /workspace/count").text.split(
                "Output:")[-1].split() == ["1", "1"]  # neither call ran twice
            assert not client.call(box, "bash", SIDE_EFFECT, call_id="c-ask").is_error  # a replay
            client.delete_sandbox(box)
        assert servers[-1].stop() == 0
        _wait_until(lambda: containers(engine, kept) == [])  # removed in the background
    finally:
        for served in servers:
            served.kill()
        remove_all(engine, kept)


def _file_in(stub: sandboxes_pb2_grpc.SandboxesStub, sandbox_id: str, path: str) -> bytes:
    """The archive the door sends of ``path`` (empty while the file does not exist)."""
    try:
        return b"".join(chunk.data for chunk in stub.Download(
            sandboxes_pb2.DownloadRequest(sandbox_id=sandbox_id, path=path), metadata=meta(), timeout=10))
    except grpc.RpcError:
        return b""


def _wait_until(condition: Any, timeout: float = 60.0) -> None:
    """Poll ``condition`` (the audit store or the engine, changed by another process or a
    background thread) until it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
