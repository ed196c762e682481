"""`callbox doctor --config FILE` on the real engine: what the server configuration needs to start,
each failure named by its key with the fix (a port taken, a token file others may read, an expired
certificate, a key of another certificate), and a good file whose doors a running `callbox serve`
holds passes, saying so."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.certs import write_pair

pytestmark = pytest.mark.docker

TOKEN = "d" * 32


def _doctor(config: Path) -> tuple[int, dict[str, dict[str, str]]]:
    done = subprocess.run([sys.executable, "-m", "harness.cli.main", "doctor", "--config", str(config), "--json"],
                          capture_output=True, text=True, timeout=180, check=False, env={**os.environ})
    assert done.stderr == "", done.stderr
    return done.returncode, {r["id"]: r for r in json.loads(done.stdout)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _tokens(directory: Path, mode: int) -> Path:
    path = directory / "tokens"
    path.write_text(f"builder:{TOKEN}\n")
    path.chmod(mode)
    return path


def test_each_problem_is_named_by_its_key_with_the_fix(engine: Any, tmp_path: Path) -> None:
    write_pair(tmp_path, "old", valid_from_days=-30, valid_to_days=-3)
    write_pair(tmp_path, "other")
    _tokens(tmp_path, 0o644)
    taken = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    config = tmp_path / "callbox.toml"
    config.write_text(f'[doors.grpc]\nlisten = "127.0.0.1:{port}"\n[tls]\ncert = "old.crt"\nkey = "other.key"\n'
                      '[auth]\ntoken_file = "tokens"\n[audit]\ndb = "state/audit.sqlite3"\n')
    try:
        code, results = _doctor(config)
    finally:
        taken.close()
    assert code == 1
    file = results["config.file"]  # what `callbox config check` says: its loader stops at the first problem
    assert file["status"] == "FAIL" and "[tls] cert" in file["reason"]  # its first problem: the key is not the cert's
    grpc = results["config.grpc"]
    assert grpc["status"] == "FAIL", grpc
    assert grpc["reason"].startswith(f"[doors.grpc] listen = '127.0.0.1:{port}': port {port} is in use by pid "
                                     f"{os.getpid()}: ")
    assert grpc["reason"].endswith("stop that or choose another address")
    tokens = results["config.tokens"]
    assert tokens["status"] == "FAIL" and tokens["reason"].startswith(f"[auth] token_file = '{tmp_path}/tokens': ")
    assert "(mode 0644)" in tokens["reason"] and f"run `chmod 600 {tmp_path}/tokens`" in tokens["reason"]
    cert = results["config.tls-cert"]
    assert cert["status"] == "FAIL" and cert["reason"].startswith(f"[tls] cert = '{tmp_path}/old.crt' expired 3 days "
                                                                  "ago, on ")
    assert cert["reason"].endswith("renew it and point [tls] cert at the new one")
    key = results["config.tls-key"]
    assert key["status"] == "FAIL"
    assert key["reason"].startswith(f"[tls] key = '{tmp_path}/other.key' does not belong to [tls] cert = "
                                    f"'{tmp_path}/old.crt'")
    assert key["reason"].endswith("give the key the certificate was issued for")
    assert results["config.audit"]["status"] == "PASS"
    assert results["engine.reachable"]["status"] == "PASS"  # then the engine, as before
    assert results["engine.sandbox"]["status"] == "PASS"


def _line_with(stream: Any, text: str) -> str:
    """The next line of ``stream`` holding ``text``; the last line read if the stream ends first."""
    line = stream.readline()
    while line and text not in line:
        line = stream.readline()
    return str(line)


def test_a_good_file_whose_doors_a_running_serve_holds_passes(engine: Any, tmp_path: Path) -> None:
    write_pair(tmp_path, "server")
    _tokens(tmp_path, 0o600)
    grpc_port, http_port = _free_port(), _free_port()
    config = tmp_path / "callbox.toml"
    config.write_text(f'[doors.grpc]\nlisten = "127.0.0.1:{grpc_port}"\n[http]\nlisten = "127.0.0.1:{http_port}"\n'
                      '[tls]\ncert = "server.crt"\nkey = "server.key"\n[auth]\ntoken_file = "tokens"\n'
                      '[audit]\ndb = "state/audit.sqlite3"\n[service]\nkeep_sandboxes = false\n')
    code, before = _doctor(config)
    items = ("config.file", "config.grpc", "config.http", "config.tokens", "config.tls-cert", "config.tls-key",
             "config.audit")
    assert [before[item]["status"] for item in items] == ["PASS"] * len(items), [before[item] for item in items]
    assert "expires in 364 days" in before["config.tls-cert"]["reason"]
    assert before["config.log"]["status"] == "SKIP"
    assert code == (1 if any(r["status"] == "FAIL" for r in before.values()) else 0)
    proc = subprocess.Popen([sys.executable, "-m", "harness.cli.main", "serve", "--config", str(config)],
                            stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert "HTTP endpoint" in _line_with(proc.stderr, "HTTP endpoint"), "the server did not start"
        _, during = _doctor(config)
        for check_id, key, port in (("config.grpc", "[doors.grpc] listen", grpc_port),
                                    ("config.http", "[http] listen", http_port)):
            held = during[check_id]
            assert held["status"] == "PASS", held
            assert held["reason"].startswith(f"{key} = '127.0.0.1:{port}': 127.0.0.1:{port} is held by a running "
                                             f"callbox serve (pid {proc.pid}: ")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
