"""The call path redacts what a tool produced (text, structured content, streamed chunks)
before it is bounded, returned and recorded; the audit store has the findings, never the
secrets; ``callbox audit`` shows that a redaction happened. No sandbox: the tool is a
function in this process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pydantic
import pytest

from harness.audit.store import AuditStore
from harness.cli.main import main
from harness.core.calls import ToolCall, ToolOutput
from harness.core.policy import parse_policy
from harness.core.registry import Tool, ToolDefinition, ToolRegistry
from harness.core.session import Session

GITHUB = "ghp_" + "Zz09" * 9
ENV_VALUE = "host-" + "secret-" + "value-123"
KEY = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----"


class Args(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    text: str


SECRETS = f"gh {GITHUB}\n{KEY}\nenv {ENV_VALUE} id corp_123456 end"
"""What the tool prints for ``{"text": "secrets"}``: the call's arguments (recorded as the model
sent them) never hold a secret, only its output does."""


def leaky(ctx: Any, args: Args) -> ToolOutput:
    text = SECRETS if args.text == "secrets" else args.text
    data = text.encode()
    if ctx.on_output is not None:
        for i in range(0, len(data), 5):  # secrets split across chunks
            ctx.on_output("stdout", data[i:i + 5])
    return ToolOutput(text=f"\x1b[31m{text}\x1b[0m", structured={"stdout": text, "exit_code": 0},
                      raw_bytes=len(data))


def no_engine() -> Any:
    raise AssertionError("these tests never start a sandbox")


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "audit.sqlite3"


@pytest.fixture
def session(db: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Session]:
    monkeypatch.setenv("MY_API_KEY", ENV_VALUE)
    policy = parse_policy('[redaction]\nsecret_env = ["MY_API_KEY"]\npatterns = ["corp_[0-9]{6}"]\n')
    registry = ToolRegistry([Tool(ToolDefinition("leaky", "Prints what it is given.", Args), leaky)])
    with AuditStore(db) as audit, Session(registry, policy, audit, run_id="r1", engine_factory=no_engine) as made:
        yield made


def test_text_structured_and_stream_are_redacted_and_the_audit_keeps_only_where(session: Session, db: Path,
                                                                                 capsys: pytest.CaptureFixture[str]):
    text = "secrets"
    chunks: list[bytes] = []
    result = session.call(ToolCall("leaky", {"text": text}, "c1"), on_output=lambda _s, c: chunks.append(c))
    expected = ("gh [redacted: github_token]\n[redacted: private_key]\nenv [redacted: env:MY_API_KEY] "
                "id [redacted: pattern:0] end")
    assert result.text == expected  # terminal codes removed first, then redacted
    assert result.structured == {"stdout": expected, "exit_code": 0}
    assert b"".join(chunks).decode() == expected
    redactions = result.meta["redactions"]
    assert redactions["count"] == 8 and redactions["kinds"] == {
        "github_token": 2, "private_key": 2, "env:MY_API_KEY": 2, "pattern:0": 2}
    first = redactions["findings"][0]
    assert first == {"kind": "github_token", "field": "text", "start": 3, "end": 3 + len(GITHUB), "line": 1}
    assert {f["field"] for f in redactions["findings"]} == {"text", "structured.stdout"}

    replay = session.call(ToolCall("leaky", {"text": text}, "c1"))
    assert replay.text == expected and replay.meta["redactions"] == redactions
    record = session.audit.get_call("r1", "c1")
    assert record is not None and record.redactions == redactions
    assert record.to_dict()["redactions"] == redactions
    session.audit.close()
    stored = b"".join(p.read_bytes() for p in db.parent.glob("audit.sqlite3*"))
    assert b"[redacted: github_token]" in stored
    for secret in (GITHUB, ENV_VALUE, "MIIEvQIBADANBgkqhkiG9w0", "corp_123456"):
        assert secret.encode() not in stored

    assert main(["audit", "--audit-db", str(db), "--run", "r1"]) == 0
    table = capsys.readouterr().out
    header, row = table.splitlines()[:2]
    assert "REDACTED" in header and row.startswith("c1 ")
    assert row[header.index("REDACTED"):].split()[0] == "8"


def test_a_result_without_secrets_has_no_redactions_and_passes_unchanged(session: Session) -> None:
    chunks: list[bytes] = []
    result = session.call(ToolCall("leaky", {"text": "all fine 3f786850e387550fdab836ed7e6dc881de23001b"}, "c2"),
                          on_output=lambda _s, c: chunks.append(c))
    assert result.text == "all fine 3f786850e387550fdab836ed7e6dc881de23001b"
    assert "redactions" not in result.meta
    assert b"".join(chunks) == result.text.encode()
    record = session.audit.get_call("r1", "c2")
    assert record is not None and record.redactions is None
