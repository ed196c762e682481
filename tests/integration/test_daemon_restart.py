"""The Docker daemon stops in the middle of calls, then comes back.

``test_daemon_restart_during_calls`` stops dockerd (SIGTERM to the pid in its pidfile,
then waits for the process to be gone) while a low-level ``agent.exec`` stream and a
``Session`` shell call are running, and checks that:

- both calls fail with a structured error that says the sandbox went away (with live-restore
  off, dockerd stops every container when it stops);
- while the engine is down, destroying is an ``EngineUnavailable`` naming the engine, the
  run's next call says its sandbox stopped answering, and a new run fails closed;
- the daemon comes back with ``scripts/ensure-docker.sh`` (it started the daemon in the
  first place), the session's docker client reconnects by itself, the image is still there,
  and the next call (a new sandbox) works;
- after ``engine.gc()`` nothing of the dead sandboxes is left: no containers, no socket
  directories under the test's run root.

It stops every container on the engine, so it runs once, and it always brings the daemon
back (``finally``), checking the image survived. ``test_docker_stop_during_a_call`` is the
same shutdown path for one container (``docker stop``) without touching the daemon.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall, ToolResult
from harness.core.errors import AgentCallError, EngineUnavailable
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.agent_errors import SANDBOX_GONE
from harness.engine.docker import labels
from harness.engine.docker.engine import DockerEngine
from harness.engine.exec_result import collect
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from tests.conftest import IMAGE, unavailable
from tests.support.run_root import leftovers

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[2]
PIDFILE = Path("/var/run/docker.pid")
STOP_DEADLINE_S = 90.0  # dockerd gives each container its stop timeout (10 s) before killing it
START_DEADLINE_S = 120.0
STOPPING = "the sandbox is stopping (its container is being stopped: the Docker engine stopped or restarted"


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its parent counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _dockerd_pid() -> int:
    """The local dockerd this test may stop, or skip (fail in CI) saying why not."""
    if os.geteuid() != 0:
        unavailable("stopping dockerd needs root")
    host = os.environ.get("DOCKER_HOST", "")
    if host and host not in ("unix:///var/run/docker.sock", "unix:///run/docker.sock"):
        unavailable(f"DOCKER_HOST={host} is not the local daemon this test may restart")
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        unavailable(f"no dockerd pidfile at {PIDFILE}")
        raise
    if not _alive(pid) or Path(f"/proc/{pid}/comm").read_text().strip() != "dockerd":
        unavailable(f"{PIDFILE} names pid {pid}, which is not a running dockerd")
    return pid


def _under_systemd(pid: int) -> bool:
    return "docker.service" in Path(f"/proc/{pid}/cgroup").read_text()


def _wait_until(what: str, predicate, deadline_s: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {deadline_s:.0f} s")
        time.sleep(0.05)


def _answers(client: docker.DockerClient) -> bool:
    try:
        return bool(client.ping())
    except Exception:
        return False


def _start_daemon(systemd: bool) -> None:
    """Bring dockerd back the way it was started; in a new session, so it outlives pytest."""
    command = ["systemctl", "start", "docker.service"] if systemd else ["bash", "scripts/ensure-docker.sh"]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, timeout=START_DEADLINE_S,
                          start_new_session=True, check=False)
    assert proc.returncode == 0, f"{' '.join(command)} failed: {proc.stderr.decode(errors='replace')}"


@pytest.fixture
def run_root() -> Iterator[Path]:
    """A run root of this test's own (short: sun_path is 108 bytes), so leftovers are exact."""
    path = Path(tempfile.mkdtemp(prefix="cbx-restart-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _harness(engine: DockerEngine, audit: AuditStore, run_id: str) -> Session:
    policy = parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n')
    return Session(builtin_registry(), policy, audit, run_id=run_id, engine_factory=lambda: engine)


def _says_the_sandbox_went_away(text: str) -> bool:
    return STOPPING in text or SANDBOX_GONE in text


@pytest.mark.engine_restart  # stops dockerd: run alone (make test runs it after the rest)
def test_daemon_restart_during_calls(engine, run_root: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    client = engine.client
    if client.info().get("LiveRestoreEnabled"):
        unavailable("live-restore is on: sandboxes survive a daemon restart, so calls do not fail")
    pid = _dockerd_pid()
    systemd = _under_systemd(pid)
    image_id = client.images.get(IMAGE).id
    mine = DockerEngine(client, run_root=run_root, reap_on_start=False)
    audit = AuditStore(tmp_path / "audit.sqlite3")
    first_run = _harness(mine, audit, "restart-1")
    box = mine.create(SandboxSpec(image=IMAGE))
    dead = {box.id}
    stopped = False
    try:
        # a Session call and a low-level stream, both running when the daemon stops
        harness_started = threading.Event()
        results: list[ToolResult] = []

        def on_output(_stream: str, data: bytes) -> None:
            if b"started" in data:
                harness_started.set()

        caller = threading.Thread(target=lambda: results.append(first_run.call(
            ToolCall("shell", {"command": "echo started; sleep 120"}, "c1"), on_output=on_output)))
        caller.start()
        events = box.agent.exec("echo started; sleep 120", timeout_ms=300_000)
        assert next(e for e in events if e.WhichOneof("event") == "output").output.stdout == b"started\n"
        assert harness_started.wait(60), "the harness call did not start"
        harness_box = first_run.active_sandbox
        assert harness_box is not None
        dead.add(harness_box.id)

        os.kill(pid, signal.SIGTERM)
        stopped = True
        with pytest.raises(AgentCallError) as gone:
            for event in events:
                assert event.WhichOneof("event") != "exited", f"the call ended as if nothing happened: {event}"
        assert gone.value.grpc_code == "UNAVAILABLE"
        assert _says_the_sandbox_went_away(gone.value.message), gone.value.message
        caller.join(60)
        assert not caller.is_alive()
        (result,) = results
        assert result.is_error and _says_the_sandbox_went_away(result.text), result.text
        _wait_until("dockerd exiting", lambda: not _alive(pid), STOP_DEADLINE_S)

        # the engine is down: clear errors, nothing runs
        with pytest.raises(EngineUnavailable, match=r"lost the Docker engine at .*start dockerd"):
            box.destroy()
        again = first_run.call(ToolCall("shell", {"command": "echo hello"}, "c2"))
        assert again.is_error and SANDBOX_GONE in again.text, again.text
        with pytest.raises(EngineUnavailable, match="lost the Docker engine"):
            first_run.close()
        assert first_run.active_sandbox is None
        down = Session(builtin_registry(), parse_policy(f'[sandbox]\nimage = "{IMAGE}"\n'), audit, run_id="down")
        refused = down.call(ToolCall("shell", {"command": "echo hello"}, "c1"))
        assert refused.is_error and refused.error == ErrorCode.SANDBOX_UNAVAILABLE
        assert "cannot reach the Docker engine" in refused.text and "start dockerd" in refused.text

        # back: the session's client reconnects by itself, the image survived
        _start_daemon(systemd)
        stopped = False
        _wait_until("the engine answering the session's client", lambda: _answers(client), START_DEADLINE_S)
        assert client.images.get(IMAGE).id == image_id
        assert engine.list_sandboxes() is not None

        # the next call, in a new sandbox, works
        with _harness(mine, audit, "restart-2") as second_run:
            ok = second_run.call(ToolCall("shell", {"command": "echo back"}, "c1"))
            assert not ok.is_error and "back" in ok.text, ok.text
        with mine.create(SandboxSpec(image=IMAGE)) as fresh:
            assert collect(fresh.agent.exec(["echo", "fresh"])).stdout.data() == b"fresh\n"

        # nothing left behind once gc ran (their owner, this process, still lives)
        assert dead <= set(mine.gc())
        left = [c["Names"] for c in client.api.containers(all=True, filters={"label": f"{labels.MANAGED}=1"})
                if (c.get("Labels") or {}).get(labels.SANDBOX_ID) in dead
                or str((c.get("Labels") or {}).get(labels.SOCKET_DIR, "")).startswith(f"{run_root}/")]
        assert left == []
        assert leftovers(run_root) == []
    finally:
        if stopped or not _answers(client):
            _wait_until("dockerd exiting", lambda: not _alive(pid), STOP_DEADLINE_S)
            _start_daemon(systemd)
            _wait_until("the engine answering", lambda: _answers(client), START_DEADLINE_S)
        for sandbox_id in dead:
            mine.destroy(sandbox_id)
        audit.close()
        try:
            client.images.get(IMAGE)
        except docker.errors.ImageNotFound:
            subprocess.run([str(REPO / ".venv/bin/callbox"), "image", "build"], cwd=REPO, timeout=600, check=True)
            raise AssertionError(f"the image {IMAGE} was gone after the daemon restart (rebuilt)") from None


def test_docker_stop_during_a_call(engine, run_root: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The agent's side of a daemon shutdown, for one container: `docker stop` sends SIGTERM."""
    mine = DockerEngine(engine.client, run_root=run_root, reap_on_start=False)
    with AuditStore(tmp_path / "audit.sqlite3") as audit, _harness(mine, audit, "stop") as run:
        box = mine.create(SandboxSpec(image=IMAGE))
        try:
            events = box.agent.exec("echo started; sleep 120", timeout_ms=300_000)
            assert next(e for e in events if e.WhichOneof("event") == "output").output.stdout == b"started\n"
            engine.client.api.stop(box.container_id, timeout=10)
            with pytest.raises(AgentCallError) as stopping:
                list(events)
            assert stopping.value.grpc_code == "UNAVAILABLE"
            assert stopping.value.message.startswith(STOPPING), stopping.value.message
            assert stopping.value.message.endswith("; the command was killed")
            with pytest.raises(AgentCallError) as gone:
                collect(box.agent.exec(["true"]))
            assert gone.value.message.startswith(SANDBOX_GONE)
        finally:
            box.destroy()

        started = threading.Event()
        results: list[ToolResult] = []
        caller = threading.Thread(target=lambda: results.append(run.call(
            ToolCall("shell", {"command": "echo started; sleep 120"}, "c1"),
            on_output=lambda _s, data: started.set() if b"started" in data else None)))
        caller.start()
        assert started.wait(60)
        harness_box = run.active_sandbox
        assert harness_box is not None
        engine.client.api.stop(harness_box.container_id, timeout=10)
        caller.join(30)
        (result,) = results
        assert (result.is_error, result.error) == (True, ErrorCode.SANDBOX_UNAVAILABLE), result.text
        assert result.text == (f"{STOPPING}, or `docker stop`); the command was killed. "
                               "The command had started and may have had effects before it went away.")
        assert result.structured is not None and result.structured["command_started"] is True
        assert harness_box.id in mine.gc()  # stopped: gc reaps it although its owner lives
    assert leftovers(run_root) == []
