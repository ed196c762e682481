"""``callbox serve --e2b`` as a user starts it: it prints its URL, refuses a non-loopback
address without ``--insecure``, shares one executor with ``--grpc``, and on SIGTERM stops
and destroys the sandboxes it made."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from harness.client import ExecutorClient
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

KEY = "e2b-key-" + "a" * 24
URL = re.compile(r"^callbox: E2B API on (http://127\.0\.0\.1:\d+)$")
STOP_S = 60


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice:{KEY}\n")
    tokens.chmod(0o600)
    (tmp_path / "policy.toml").write_text(f'[sandbox]\nimage = "{IMAGE}"\n')
    return tmp_path


def serve(workdir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "harness.cli.main", "serve", *args, "--token-file", str(workdir / "tokens"),
         "--policy", str(workdir / "policy.toml"), "--audit-db", str(workdir / "audit.sqlite3")],
        stderr=subprocess.PIPE, text=True, env={k: v for k, v in os.environ.items() if not k.startswith("E2B_")},
    )


def lines(proc: subprocess.Popen[str], count: int) -> Iterator[str]:
    assert proc.stderr is not None
    for _ in range(count):
        line = proc.stderr.readline()
        assert line, f"callbox serve ended early (exit {proc.poll()})"
        yield line.rstrip("\n")


def create(url: str) -> httpx.Response:
    return httpx.post(f"{url}/v2/sandboxes", json={"templateID": "base", "timeout": 300},
                      headers={"X-API-KEY": KEY}, timeout=120)


def stop(proc: subprocess.Popen[str]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(STOP_S)


def test_serve_e2b_prints_its_url_serves_and_sigterm_destroys_its_sandboxes(engine, workdir):
    proc = serve(workdir, "--e2b", "127.0.0.1:0")
    try:
        (line,) = lines(proc, 1)
        match = URL.match(line)
        assert match, line
        url = match.group(1)
        created = create(url)
        assert created.status_code == 201, created.text
        box = created.json()
        envd = {"E2b-Sandbox-Id": box["sandboxID"], "X-Access-Token": box["envdAccessToken"]}
        assert httpx.get(f"{url}/health", headers=envd).is_success
        assert httpx.get(f"{url}/sandboxes/{box['sandboxID']}", headers={"X-API-KEY": "wrong" * 5}).status_code == 401
        assert len(_owned_by(engine, proc.pid)) == 1
        # Only the main thread may take SIGTERM/SIGINT (the server's threads block them),
        # else a signal the kernel gave another thread would not wake the main thread.
        blocked = _stop_signals_blocked(proc.pid)
        assert blocked.pop(proc.pid) is False
        assert blocked and all(blocked.values()), blocked
        assert stop(proc) == 0
        assert _owned_by(engine, proc.pid) == []
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", headers=envd, timeout=5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_non_loopback_address_needs_insecure_or_tls(workdir):
    proc = serve(workdir, "--e2b", "0.0.0.0:0")
    try:
        assert proc.wait(STOP_S) == 2
        assert proc.stderr is not None
        said = proc.stderr.read()
        assert "refusing to serve the E2B API on 0.0.0.0:0 without TLS" in said and "--insecure" in said, said
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_beside_grpc_one_executor_counts_both_doors(engine, workdir):
    sock = workdir / "executor.sock"
    proc = serve(workdir, "--grpc", f"unix:{sock}", "--e2b", "127.0.0.1:0", "--max-per-client", "1")
    try:
        said = list(lines(proc, 2))
        assert any("gRPC executor listening" in line for line in said), said
        url = next(m.group(1) for m in map(URL.match, said) if m)
        with ExecutorClient(f"unix:{sock}", token=KEY) as client:
            client.create_sandbox()
        refused = create(url)
        assert refused.status_code == 429, refused.text
        assert refused.json()["code"] == 429 and "the most one client may have" in refused.json()["message"]
        assert len(_owned_by(engine, proc.pid)) == 1
        assert stop(proc) == 0
        assert _owned_by(engine, proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _owned_by(engine, pid: int) -> list[str]:  # type: ignore[no-untyped-def]
    return [c["Id"] for c in engine.client.api.containers(all=True, filters={"label": "callbox.managed=1"})
            if f"/{pid}/" in c["Labels"].get("callbox.owner", "")]


def _stop_signals_blocked(pid: int) -> dict[int, bool]:
    """Per thread of ``pid``: whether it blocks both SIGTERM and SIGINT."""
    wanted = (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGINT - 1))
    found = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/status") as status:
            mask = next(int(line.split()[1], 16) for line in status if line.startswith("SigBlk:"))
        found[int(task)] = mask & wanted == wanted
    return found
