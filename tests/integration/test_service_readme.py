"""The README's build-server configuration, as an operator runs it: the very file the README
shows (its paths moved to a temporary directory and its ports to free ones), checked by
``callbox config check``, served by ``callbox serve --config`` as a real process, used by a
client, restarted with SIGTERM, and found again after the restart.

systemd is not on the test machines, so ``systemctl`` is the one step of the README's list
this does not take; the server is told where to send its readiness (``NOTIFY_SOCKET``) as
systemd would, and ``callbox service install`` is tested on its own (test_service_unit.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.audit.store import AuditStore
from harness.client import ExecutorClient, ExecutorError
from harness.engine.docker.engine import DockerEngine
from tests.doc_examples import block_between

pytestmark = pytest.mark.docker

ROOT = Path(__file__).resolve().parents[2]
START, END = "<!-- README: service-config start -->", "<!-- README: service-config end -->"
CI_TOKEN = "ci-token-of-the-readme-service-0123"
OPS_TOKEN = "ops-token-of-the-readme-service-0123"


def readme_config() -> str:
    """The TOML block between the service-config markers, on whichever page holds them."""
    return block_between(START, END)


def readme_token_lines() -> str:
    """The token file the README's ``printf`` line writes, with the test's two tokens."""
    text = (ROOT / "docs" / "service.md").read_text()
    match = re.search(r"^printf '(ci:%s\\nops:%s[^']*)' ", text, re.M)
    assert match is not None, "the README no longer writes the ci and ops tokens with printf; update this test"
    return match[1].replace("\\n", "\n") % (CI_TOKEN, OPS_TOKEN)


def moved(config: str, tmp_path: Path) -> str:
    """The README's file with its machine-wide places replaced by the test's own."""
    replacements = {
        '"unix:/run/callbox/executor.sock"': f'"unix:{tmp_path / "executor.sock"}"',
        '"127.0.0.1:49999"': '"127.0.0.1:0"',
        '"127.0.0.1:9464"': '"127.0.0.1:0"',
        '"/var/lib/callbox/audit.db"': f'"{tmp_path / "audit.db"}"',
    }
    for old, new in replacements.items():
        assert old in config, f"the README's config no longer says {old}; update this test's replacements"
        config = config.replace(old, new)
    return config


@pytest.fixture
def etc(tmp_path: Path) -> Path:
    """/etc/callbox as the README's steps leave it (tokens 0600, the packaged policy copied)."""
    tokens = tmp_path / "tokens"
    tokens.write_text(readme_token_lines())
    tokens.chmod(0o600)
    asks = ('\n[tools.shell]\n[[tools.shell.rules]]\naction = "ask"\ncommand = "*deploy*"\n'
            'reason = "deploys ask a person"\n')
    (tmp_path / "policy.toml").write_text((ROOT / "harness" / "data" / "default-policy.toml").read_text() + asks)
    (tmp_path / "callbox.toml").write_text(moved(readme_config(), tmp_path))
    return tmp_path


def callbox(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "harness.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False, **kwargs)  # type: ignore[call-overload, no-any-return]


class Served:
    """One ``callbox serve --config`` process, its JSON log lines, and the URLs it printed."""

    def __init__(self, etc: Path) -> None:
        self.notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify_path = etc / f"notify-{os.getpid()}-{id(self)}.sock"
        self.notify.bind(str(notify_path))
        self.notify.settimeout(120)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "harness.cli.main", "serve", "--config", str(etc / "callbox.toml")],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "NOTIFY_SOCKET": str(notify_path)})
        self.lines: list[dict[str, object]] = []
        assert self.notify.recv(4096).decode().split("\n") == ["READY=1", "STATUS=serving"]
        self.http = self.url_after("HTTP endpoint (/metrics, /healthz, console) on ")
        self.e2b = self.url_after("E2B API on ")

    def line(self) -> dict[str, object]:
        stream: IO[str] | None = self.proc.stderr
        assert stream is not None
        text = stream.readline()
        assert text, f"the server ended; its log: {self.lines}"
        entry = json.loads(text)  # format = "json": every line is one JSON object
        assert {"time", "level", "logger", "message"} <= set(entry), entry
        self.lines.append(entry)
        return entry  # type: ignore[no-any-return]

    def url_after(self, prefix: str) -> str:
        seen = [str(entry["message"]) for entry in self.lines]
        while not any(message.startswith(prefix) for message in seen):
            seen.append(str(self.line()["message"]))
        return next(message for message in seen if message.startswith(prefix))[len(prefix):]

    def stop(self) -> list[str]:
        """SIGTERM, as systemctl stop sends it; the messages of its last lines."""
        self.proc.send_signal(signal.SIGTERM)
        assert self.notify.recv(4096) == b"STOPPING=1"
        stream = self.proc.stderr
        assert stream is not None
        rest = [json.loads(line)["message"] for line in stream.read().splitlines()]
        assert self.proc.wait(60) == 0
        return rest

    def close(self) -> None:
        self.notify.close()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def served(etc: Path) -> Iterator[Served]:
    server = Served(etc)
    try:
        yield server
    finally:
        server.close()


def get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def post(url: str, token: str, form: dict[str, str]) -> tuple[int, str]:
    data = urllib.parse.urlencode(form).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def calls_counted(metrics_text: str, tool: str) -> float:
    for family in text_string_to_metric_families(metrics_text):
        if family.name == "callbox_calls":
            return sum(s.value for s in family.samples
                       if s.name == "callbox_calls_total" and s.labels.get("tool") == tool
                       and s.labels.get("door") == "grpc" and s.labels.get("outcome") == "ok")
    return 0.0


def test_the_readme_config_passes_config_check(etc: Path) -> None:
    checked = callbox("config", "check", str(etc / "callbox.toml"), "--json")
    assert checked.returncode == 0, checked.stderr
    effective = json.loads(checked.stdout)
    assert effective["service"]["keep_sandboxes"] is True
    assert effective["clients"]["ci"]["profile"] == "untrusted"
    assert effective["profiles"]["untrusted"]["quotas"]["live_sandboxes"] == 4


def test_the_readme_service_serves_restarts_and_keeps_the_clients_sandbox(etc: Path, engine: DockerEngine) -> None:
    audit_path = etc / "audit.db"
    sandbox_ids: list[str] = []
    target = f"unix:{etc / 'executor.sock'}"
    try:
        with served(etc) as first:
            status, body = get(f"{first.http}/healthz")
            assert (status, json.loads(body)["status"]) == (200, "ok")
            with ExecutorClient(target, token=CI_TOKEN) as client:
                box = client.create_sandbox()
                sandbox_ids.append(box)
                result = client.call(box, "shell", {"command": "echo kept > /workspace/note && echo made"},
                                     call_id="readme-1", timeout=120)
                assert "made" in result.text and not result.is_error, result.text
            assert calls_counted(get(f"{first.http}/metrics")[1], "shell") >= 1
            assert get(f"{first.http}/")[0] == 401  # the console needs a token ...
            status, page = get(f"{first.http}/", OPS_TOKEN)  # ... and the operator's opens it
            assert status == 200 and "approval" in page.lower()
            # the agent's own token approves no call of its own, by any route; the operator's does
            with ExecutorClient(target, token=CI_TOKEN) as client:
                pending = client.call(box, "shell", {"command": "echo make deploy"}, call_id="readme-ask")
                assert pending.approval_id, pending.text
                resolve = f"{first.http}/approvals/{pending.approval_id}/resolve"
                assert post(resolve, CI_TOKEN, {"decision": "approve"})[0] == 403
                with pytest.raises(ExecutorError) as refused:
                    client.resolve_approval(pending.approval_id, True)
                assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
                assert post(resolve, OPS_TOKEN, {"decision": "approve"})[0] == 200
                assert "make deploy" in client.call(box, "shell", {"command": "echo make deploy"},
                                                    call_id="readme-ask").text
            last = first.stop()
        assert any("stay for the next start" in message for message in last), last
        with served(etc) as second:  # systemctl restart callbox
            with ExecutorClient(target, token=CI_TOKEN) as client:
                runs = {run.run_id: run for run in client.list_runs()}
                assert runs[box].live, runs[box]
                again = client.call(box, "shell", {"command": "cat /workspace/note"}, call_id="readme-2",
                                    timeout=120)
                assert "kept" in again.text and not again.is_error, again.text
                client.delete_sandbox(box)
            last = second.stop()
        with AuditStore(audit_path) as audit:
            assert audit.get_run(box).ended is not None
    finally:
        with AuditStore(audit_path) as audit:
            containers = [str(run.meta.get("container")) for run in audit.list_runs(limit=100)
                          if run.meta.get("container")]
        for container in containers:
            with contextlib.suppress(Exception):
                engine.client.api.remove_container(container, force=True)
