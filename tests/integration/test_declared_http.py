"""``kind = "http"`` declared tools against a server this test session owns, through the
egress proxy of a real allowlist sandbox.

The server runs in the network namespace of the ``destination`` fixture (tests/netdest.py)
on a port of its own, and answers every request with what it received (method, path,
headers, body) as JSON, so the test sees exactly what left the sandbox. The egress proxy
reaches it through the test-only override of ``net_engine``.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.audit.store import AuditStore
from harness.core.calls import ErrorCode, ToolCall
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.engine.docker.engine import DockerEngine
from harness.engine.spec import HostLimits
from harness.tools import registry_for
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

PORT = 8090
TOKEN_VAR = "CALLBOX_TEST_API_TOKEN"

ECHO_SERVER = f"""
import hashlib, http.server, json, sys, threading

class Echo(http.server.BaseHTTPRequestHandler):
    def answer(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0)).decode()
        auth = self.headers.get("Authorization", "")
        data = json.dumps({{"method": self.command, "path": self.path, "headers": dict(self.headers), "body": body,
                           "auth_sha256": hashlib.sha256(auth.encode()).hexdigest()}}).encode()
        self.send_response(404 if self.path.startswith("/missing") else 200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Set-Cookie", "session=" + auth)
        self.end_headers()
        self.wfile.write(data)
    do_GET = do_POST = do_PUT = answer
    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("0.0.0.0", {PORT}), Echo)
threading.Thread(target=server.serve_forever, daemon=True).start()
print("ready", flush=True)
sys.stdin.read()  # runs until the test closes our stdin
"""

POLICY = f"""
[sandbox]
network = "allowlist"
allow_hosts = ["dest.callbox.test:{PORT}", "api.callbox.test:{PORT}"]

[[tool]]
name = "create_issue"
kind = "http"
method = "POST"
url = "http://dest.callbox.test:{PORT}/repos/{{owner}}/issues"
query = {{ state = "{{state}}" }}
headers = {{ Authorization = {{ env = "{TOKEN_VAR}", prefix = "Bearer " }}, Accept = "application/json" }}
body = {{ json = {{ title = "{{title}}", labels = "{{labels}}" }} }}
[tool.arguments.owner]
required = true
[tool.arguments.title]
required = true
[tool.arguments.state]
[tool.arguments.labels]
type = "array"

[[tool]]
name = "missing"
kind = "http"
url = "http://dest.callbox.test:{PORT}/missing"

[[tool]]
name = "other_api"
kind = "http"
url = "http://api.callbox.test:{PORT}/x"
"""


@pytest.fixture(scope="module")
def echo_server(destination: Any) -> Iterator[None]:
    """The echo server, inside the destination's network namespace, until the module ends."""
    server = subprocess.Popen(["ip", "netns", "exec", destination.namespace, sys.executable, "-u", "-c", ECHO_SERVER],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"  # blocks until the server is bound
        yield
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "tok-" + secrets.token_hex(16)  # no built-in token format: only the http tool knows it
    monkeypatch.setenv(TOKEN_VAR, value)
    return value


def call(harness: Session, name: str, args: dict[str, Any], call_id: str) -> Any:
    return harness.call(ToolCall(name, args, call_id))


def test_an_http_tool_sends_the_secret_header_and_never_shows_it(
    net_engine: DockerEngine, echo_server: None, secret: str, tmp_path: Path,
) -> None:
    policy = parse_policy(POLICY, source="test.toml", base_dir=tmp_path, host=HostLimits(cpus=None, memory=None))
    # The sandbox this run gets allows only dest.callbox.test (as `--allow-host` narrows a policy).
    spec = policy.sandbox_spec().model_copy(update={"image": IMAGE, "allow_hosts": (f"dest.callbox.test:{PORT}",)})
    audit_path = tmp_path / "audit.sqlite3"
    with AuditStore(audit_path) as audit:
        with Session(registry_for(policy), policy, audit, spec=spec, engine_factory=lambda: net_engine) as harness:
            ok = call(harness, "create_issue", {"owner": "../admin", "title": "Bug #1 ünï", "labels": ["a b", "c"]},
                      "c1")
            missing = call(harness, "missing", {}, "c2")
            refused = call(harness, "other_api", {}, "c3")
            sandbox_id = harness.active_sandbox.id  # type: ignore[union-attr]
            run_id = harness.run_id
        rows = audit.egress(run_id)

    assert not ok.is_error, ok.text
    echoed = ok.structured["json"]
    # what the server received: the path argument inside its segment, the query, the body, the secret
    assert echoed["method"] == "POST"
    assert echoed["path"] == "/repos/..%2Fadmin/issues"  # no state: the optional parameter is left out
    assert json.loads(echoed["body"]) == {"title": "Bug #1 ünï", "labels": ["a b", "c"]}
    assert echoed["auth_sha256"] == hashlib.sha256(f"Bearer {secret}".encode()).hexdigest()
    assert echoed["headers"]["Accept"] == "application/json"
    # ... and what the model gets: the echoed header redacted, no cookie header shown
    assert echoed["headers"]["Authorization"] == f"Bearer [redacted: env:{TOKEN_VAR}]"
    assert ok.structured["status"] == 200 and ok.structured["secrets_redacted"] >= 1
    assert ok.text.startswith("HTTP 200 OK\ncontent-type: application/json")
    assert "set-cookie" not in ok.structured["headers"]
    assert secret not in ok.text and secret not in json.dumps(ok.structured)

    assert missing.is_error and missing.error is ErrorCode.TOOL_FAILED
    assert missing.text.startswith("HTTP 404") and missing.structured["status"] == 404

    assert refused.is_error and refused.error is ErrorCode.TOOL_FAILED
    assert f"callbox egress proxy refused api.callbox.test:{PORT}" in refused.text
    assert "the host is not allowed: list it in sandbox.allow_hosts" in refused.text

    # the egress log has each request, tied to its call
    assert [(r["call_id"], r["decision"], r["host"], r["port"], r["sandbox_id"]) for r in rows] == [
        ("c1", "allow", "dest.callbox.test", PORT, sandbox_id),
        ("c2", "allow", "dest.callbox.test", PORT, sandbox_id),
        ("c3", "deny", "api.callbox.test", PORT, sandbox_id),
    ]
    # the audit database (with its journal files, if any are left) never held the secret
    stored = [p for p in tmp_path.iterdir() if p.name.startswith(audit_path.name)]
    assert audit_path in stored
    for path in stored:
        data = path.read_bytes()
        assert secret.encode() not in data, path
    assert b"..%2Fadmin" in audit_path.read_bytes() or b"../admin" in audit_path.read_bytes()


def test_a_missing_secret_variable_is_an_error_naming_it_and_sends_nothing(
    net_engine: DockerEngine, echo_server: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    monkeypatch.delenv(TOKEN_VAR, raising=False)
    policy = parse_policy(POLICY, source="test.toml", base_dir=tmp_path, host=HostLimits(cpus=None, memory=None))
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        with Session(registry_for(policy), policy, audit, spec=policy.sandbox_spec().model_copy(
                update={"image": IMAGE}), engine_factory=lambda: net_engine) as harness:
            result = call(harness, "create_issue", {"owner": "o", "title": "t"}, "c1")
            started = harness.active_sandbox is not None
            run_id = harness.run_id
        rows = audit.egress(run_id)
    assert result.is_error and result.error is ErrorCode.TOOL_FAILED
    assert f"environment variable {TOKEN_VAR} of the harness, which is not set" in result.text
    assert rows == [] and not started  # nothing was sent; no sandbox was even needed
