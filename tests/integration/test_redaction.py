"""Secrets a real shell call prints in a real sandbox (a GitHub token, a private key block,
a secret env value passed in through the sandbox's env) never reach the caller: not in the
result through ``Session.call``, nor in its streamed chunks, nor through the MCP door (the
official client over streamable HTTP, progress notifications included); the audit store
holds the findings and not the secrets (the SQLite file's bytes are read).

The command builds each secret from pieces, so the call's arguments (recorded as the model
sent them) never hold one; only the output does."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client

from harness.audit.store import AuditStore
from harness.core.calls import ToolCall
from harness.core.policy import parse_policy
from harness.core.session import Session
from harness.doors.mcp.http import serve_mcp_http
from harness.engine.spec import SandboxSpec
from harness.tools import builtin_registry
from tests.conftest import IMAGE

pytestmark = pytest.mark.docker

GITHUB = "ghp_" + "Zq7X" * 9
KEY_BODY = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC7VJTUt9Us8cKjMzEfYyjiWA4R4"
ENV_VALUE = "deploy-" + "token-" + "5f1e2d3c4b5a"
# The secrets, assembled by the shell: no argument holds one whole.
COMMAND = (
    "printf 'token: ghp_%s\\n' \"$(printf 'Zq7X%.0s' 1 2 3 4 5 6 7 8 9)\"; "
    "printf -- '-----BEGIN %s-----\\n%s%s\\n-----END %s-----\\n' 'PRIVATE KEY' "
    f"'{KEY_BODY[:30]}' '{KEY_BODY[30:]}' 'PRIVATE KEY'; "
    "echo \"env: $DEPLOY_TOKEN\"; echo 'sha 3f786850e387550fdab836ed7e6dc881de23001b'"
)
SECRETS = (GITHUB, KEY_BODY, ENV_VALUE, "BEGIN PRIVATE KEY")
EXPECTED_TEXT = ("token: [redacted: github_token]\n[redacted: private_key]\nenv: [redacted: env:DEPLOY_TOKEN]\n"
                 "sha 3f786850e387550fdab836ed7e6dc881de23001b")
KINDS = {"github_token": 1, "private_key": 1, "env:DEPLOY_TOKEN": 1}
POLICY = '[redaction]\nsecret_env = ["DEPLOY_TOKEN"]\n'


def _stored_bytes(db: Path) -> bytes:
    """The audit database's bytes, its write-ahead log included."""
    return b"".join(path.read_bytes() for path in sorted(db.parent.glob(db.name + "*")))


def _assert_no_secret(data: bytes) -> None:
    for secret in SECRETS:
        assert secret.encode() not in data, secret


def test_a_shell_call_through_the_session_gets_its_secrets_redacted(engine, tmp_path):
    db = tmp_path / "audit.sqlite3"
    policy = parse_policy(POLICY)
    spec = SandboxSpec(image=IMAGE, env={"DEPLOY_TOKEN": ENV_VALUE})
    chunks: list[bytes] = []
    with AuditStore(db) as audit, Session(builtin_registry(), policy, audit, run_id="redact-1", spec=spec,
                                          engine_factory=lambda: engine) as harness:
        result = harness.call(ToolCall("shell", {"command": COMMAND}, "c1"),
                              on_output=lambda _stream, chunk: chunks.append(chunk))
        assert not result.is_error, result.text
        assert EXPECTED_TEXT in result.text
        _assert_no_secret(result.text.encode() + repr(result.structured).encode() + repr(result.meta).encode())
        assert b"".join(chunks).decode().strip() == EXPECTED_TEXT
        redactions = result.meta["redactions"]
        assert redactions["count"] == 3 and redactions["kinds"] == KINDS
        assert [f["line"] for f in redactions["findings"]] == [4, 5, 8]  # after "Exit code, Wall time, Output"
        (call,) = audit.calls_for_run("redact-1")
        assert call["redactions"] == redactions and "[redacted: github_token]" in call["result_text"]
    _assert_no_secret(_stored_bytes(db))


def test_the_mcp_door_gets_results_and_progress_without_the_secrets(engine, tmp_path):
    db = tmp_path / "audit.sqlite3"
    policy = tmp_path / "policy.toml"
    policy.write_text(textwrap.dedent(f"""\
        {POLICY}
        [sandbox]
        image = "{IMAGE}"
        [sandbox.env]
        DEPLOY_TOKEN = "{ENV_VALUE}"
    """))
    progress: list[str] = []

    async def on_progress(_progress: float, _total: float | None, message: str | None) -> None:
        progress.append(message or "")

    async def flow() -> Any:
        with anyio.fail_after(120):
            async with Client(server.url) as client:
                return await client.call_tool("shell", {"command": COMMAND}, progress_callback=on_progress)

    server = serve_mcp_http("127.0.0.1:0", policy_path=policy, audit_path=db)
    try:
        result = anyio.run(flow)
    finally:
        server.stop()
    text = "".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, text
    assert EXPECTED_TEXT in text
    _assert_no_secret(text.encode() + repr(result.structured_content).encode() + "".join(progress).encode())
    with AuditStore(db) as audit:
        (run,) = audit.list_runs()
        (call,) = audit.calls_for_run(run.id)
        assert call["redactions"]["kinds"] == KINDS
    _assert_no_secret(_stored_bytes(db))
