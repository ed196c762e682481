"""The README's Ray configuration, served: ``callbox config check`` passes it, ``callbox serve
--config`` places a client's sandbox on a worker of the real test cluster, and after a restart
(SIGTERM, then a new server) the server re-attaches to that remote sandbox and its files."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from harness.client import ExecutorClient
from tests.doc_examples import block_between

if TYPE_CHECKING:
    from tests.ray.cluster import RayTestCluster

pytestmark = [pytest.mark.docker]

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- README: ray-config start -->", "<!-- README: ray-config end -->"
TOKEN = "ci-token-of-the-ray-readme-0123456789"


def readme_ray_config() -> str:
    """The TOML block between the ray-config markers, on whichever page holds them."""
    return block_between(START, END)


@pytest.fixture
def etc(tmp_path: Path, ray_cluster: RayTestCluster) -> Path:
    """The README's files, its addresses moved to the test cluster's and its places to tmp_path."""
    config = readme_ray_config()
    replacements = {
        '"10.0.0.1:6379"': f'"{ray_cluster.address}"',
        'node_ip = "10.0.0.1"': f'node_ip = "{ray_cluster.node_ip}"',
        '"unix:/run/callbox/executor.sock"': f'"unix:{tmp_path / "executor.sock"}"',
    }
    for old, new in replacements.items():
        assert old in config, f"the README's Ray config no longer says {old}; update this test"
        config = config.replace(old, new)
    config += f'\n[audit]\ndb = "{tmp_path / "audit.db"}"\n'
    shutil.copy(ray_cluster.token_file, tmp_path / "ray-token")
    (tmp_path / "ray-token").chmod(0o600)
    (tmp_path / "tokens").write_text(f"ci:{TOKEN}\n")
    (tmp_path / "tokens").chmod(0o600)
    shutil.copy(ROOT / "harness" / "data" / "default-policy.toml", tmp_path / "policy.toml")
    (tmp_path / "callbox.toml").write_text(config)
    return tmp_path


class Server:
    """``callbox serve --config`` as a process, ready once it says so on NOTIFY_SOCKET."""

    def __init__(self, etc: Path) -> None:
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = etc / f"notify-{id(self)}.sock"
        self.notify.bind(str(path))
        self.notify.settimeout(240)
        self.log = open(etc / f"serve-{id(self)}.log", "w+")  # noqa: SIM115 (closed in close)
        self.proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "serve", "--config",
                                      str(etc / "callbox.toml")], stderr=self.log, stdout=self.log,
                                     env={**os.environ, "NOTIFY_SOCKET": str(path)})
        try:
            ready = self.notify.recv(4096).decode()
        except TimeoutError:
            ready = "(nothing)"
        assert ready.startswith("READY=1"), f"not ready ({ready}): {self.output()}"

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        assert self.proc.wait(120) == 0, self.output()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.notify.close()
        self.log.close()


def test_the_readme_ray_config_passes_config_check(etc: Path) -> None:
    checked = subprocess.run([sys.executable, "-m", "harness.cli.main", "config", "check", str(etc / "callbox.toml")],
                             capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stderr
    assert 'engine = "ray"' in checked.stdout


def test_the_readme_ray_service_places_a_sandbox_remotely_and_reattaches_after_a_restart(etc: Path) -> None:
    target = f"unix:{etc / 'executor.sock'}"
    box = None
    first = Server(etc)
    try:
        with ExecutorClient(target, token=TOKEN) as client:
            box = client.create_sandbox()
            made = client.call(box, "shell", {"command": 'echo "$CALLBOX_NODE" | tee /workspace/node'},
                               call_id="ray-1", timeout=120)
            assert not made.is_error, made.text
            node = made.text.split("Output:")[-1].strip() if "Output:" in made.text else made.text.strip()
            assert node in ("w1", "w2"), made.text
        first.stop()
    finally:
        first.close()
    second = Server(etc)
    try:
        with ExecutorClient(target, token=TOKEN) as client:
            runs = {run.run_id: run for run in client.list_runs()}
            assert runs[box].live, runs[box]
            again = client.call(box, "shell", {"command": "cat /workspace/node"}, call_id="ray-2", timeout=120)
            assert not again.is_error and node in again.text, again.text
            client.delete_sandbox(box)
        second.stop()
    finally:
        second.close()


def test_snapshots_and_forks_through_the_grpc_door_on_the_cluster(etc: Path) -> None:
    from harness.v1 import sandboxes_pb2, sandboxes_pb2_grpc

    metadata = (("authorization", f"Bearer {TOKEN}"),)
    made: list[str] = []
    server = Server(etc)
    try:
        with ExecutorClient(f"unix:{etc / 'executor.sock'}", token=TOKEN) as client:
            stub = sandboxes_pb2_grpc.SandboxesStub(client.channel)
            box = client.create_sandbox()
            made.append(box)
            wrote = client.call(box, "shell", {"command": "echo kept > /workspace/note.txt"}, timeout=120)
            assert not wrote.is_error, wrote.text
            snap = stub.Snapshot(sandboxes_pb2.SnapshotRequest(sandbox_id=box, name="base"), metadata=metadata,
                                 timeout=120)
            # The source is read back from the door's note, kept with the snapshot on its node.
            assert (snap.name, snap.source_sandbox_id) == ("base", box) and "/workspace" in snap.captured
            listed = stub.ListSnapshots(sandboxes_pb2.ListSnapshotsRequest(), metadata=metadata, timeout=60)
            assert [(s.name, s.source_sandbox_id) for s in listed.snapshots] == [("base", box)]
            nodes = set()
            for request in (sandboxes_pb2.ForkRequest(snapshot="base"), sandboxes_pb2.ForkRequest(sandbox_id=box)):
                fork = stub.Fork(request, metadata=metadata, timeout=180)
                made.append(fork.sandbox_id)
                command = 'cat /workspace/note.txt; echo "$CALLBOX_NODE"'
                shown = client.call(fork.sandbox_id, "shell", {"command": command}, timeout=120)
                assert not shown.is_error and shown.text.split()[-2] == "kept", shown.text
                nodes.add(shown.text.split()[-1])
            assert nodes <= {"w1", "w2"}, nodes
            stub.DeleteSnapshot(sandboxes_pb2.DeleteSnapshotRequest(name="base"), metadata=metadata, timeout=60)
            assert not stub.ListSnapshots(sandboxes_pb2.ListSnapshotsRequest(), metadata=metadata).snapshots
            for sandbox_id in reversed(made):
                client.delete_sandbox(sandbox_id)
            made.clear()
        server.stop()
    finally:
        if made:
            with ExecutorClient(f"unix:{etc / 'executor.sock'}", token=TOKEN) as client:
                for sandbox_id in made:
                    with contextlib.suppress(Exception):
                        client.delete_sandbox(sandbox_id)
        server.close()


def test_the_e2b_sdk_runs_its_sandbox_on_a_worker(etc: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The E2B door, unchanged, on the Ray engine: the e2b SDK (a client nobody here wrote)
    creates a sandbox, runs a command in it and kills it; the sandbox was on a worker node."""
    from e2b import Sandbox

    with (etc / "callbox.toml").open("a") as config:
        config.write('\n[doors.e2b]\nlisten = "127.0.0.1:0"\n')
    server = Server(etc)
    try:
        found = re.search(r"E2B API on (https?://[^\s/]+)", server.output())
        assert found is not None, server.output()
        for key in [k for k in os.environ if k.startswith("E2B_")]:
            monkeypatch.delenv(key)
        monkeypatch.setenv("E2B_API_URL", found.group(1))
        monkeypatch.setenv("E2B_SANDBOX_URL", found.group(1))
        monkeypatch.setenv("E2B_API_KEY", TOKEN)
        sandbox = Sandbox.create(timeout=120)
        try:
            ran = sandbox.commands.run('echo "$CALLBOX_NODE"; uname -n >/dev/null')
            assert ran.exit_code == 0 and ran.stdout.strip() in ("w1", "w2"), ran
            sandbox.files.write("/workspace/hello.txt", "from e2b")
            assert sandbox.files.read("/workspace/hello.txt") == "from e2b"
        finally:
            sandbox.kill()
        server.stop()
    finally:
        server.close()
