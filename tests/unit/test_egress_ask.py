"""The harness's side of held egress, without Docker: the watch a running call keeps (a real
audit store, the real file channel on a temporary directory standing in for the proxy's),
egress approvals' scopes in the store, and the console's three answers."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from harness.audit.errors import AuditError
from harness.audit.store import AuditStore
from harness.core.egress_ask import EgressAskWatch, asks_egress, egress_meta
from harness.doors.http.console import Console, PendingApproval
from harness.doors.http.pages import approvals_page
from harness.engine.docker.egress_asks import EgressAskChannel
from harness.engine.spec import SandboxSpec
from sandbox.egress_hold import APPROVED_FILE


class Box:
    """A sandbox as the watch sees it: its channel."""

    def __init__(self, channel: EgressAskChannel) -> None:
        self.channel = channel

    def egress_ask_channel(self) -> EgressAskChannel:
        return self.channel


def _hold(directory: Path, hold: str, host: str = "api.example.com", timeout_s: float = 30.0) -> None:
    """What the proxy appends when it holds a connection."""
    line = {"ts": time.time(), "event": "hold", "sandbox_id": "sb1", "hold": hold, "method": "CONNECT",
            "host": host, "port": 443, "client": "10.0.0.2", "timeout_s": timeout_s}
    with open(directory / "events.jsonl", "a") as handle:
        handle.write(json.dumps(line) + "\n")


def _answer(directory: Path, hold: str) -> dict[str, object]:
    return dict(json.loads((directory / f"answer-{hold}.json").read_text()))


class Stream:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, stream: str, data: bytes) -> None:
        assert stream == "stderr"
        with self.cond:
            self.lines.append(data.decode())
            self.cond.notify_all()

    def wait_for(self, text: str) -> str:
        with self.cond:
            assert self.cond.wait_for(lambda: any(text in line for line in self.lines), 10), self.lines
            return next(line for line in self.lines if text in line)


def test_only_an_allowlist_with_an_ask_entry_is_watched() -> None:
    assert asks_egress(SandboxSpec(network="allowlist", allow_hosts=("ask a.com", "b.com")))
    assert not asks_egress(SandboxSpec(network="allowlist", allow_hosts=("a.com",)))
    assert not asks_egress(SandboxSpec())
    with pytest.raises(ValueError, match="only allow_hosts entries take an action"):
        SandboxSpec(network="allowlist", allow_hosts=("a.com",), egress_allow=("ask a.com",))


def test_holds_become_approvals_and_answers_reach_the_proxy(tmp_path: Path) -> None:
    channel = EgressAskChannel("sb1", tmp_path, "events.jsonl")
    stream = Stream()
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        with EgressAskWatch(audit, "run-1", "call-7", "shell", lambda: Box(channel), stream, 60.0, poll_s=0.01):
            _hold(tmp_path, "h" + "1" * 16)
            line = stream.wait_for("waiting for a person")
            [approval] = audit.list_approvals("pending")
            assert approval.id in line and "api.example.com:443 (CONNECT)" in line
            assert approval.tool == "egress" and approval.call_id == "egress-h" + "1" * 16
            assert json.loads(approval.arguments) == {"sandbox_id": "sb1", "destination": "api.example.com:443",
                                                      "method": "CONNECT", "call_id": "call-7", "tool": "shell"}
            audit.resolve_approval(approval.id, True, by="ann", reason=None, scope="sandbox")
            stream.wait_for("allowed for this sandbox by ann")
            assert _answer(tmp_path, "h" + "1" * 16)["scope"] == "sandbox"
            assert json.loads((tmp_path / APPROVED_FILE).read_text()) == {"allow": ["api.example.com:443"]}
            assert audit.get_approval(approval.id).state == "consumed"  # delivered once

            _hold(tmp_path, "h" + "2" * 16, "other.example.com", timeout_s=0.05)  # nobody answers
            stream.wait_for("refused: no answer in time")
            assert _answer(tmp_path, "h" + "2" * 16)["decision"] == "deny"

            _hold(tmp_path, "h" + "3" * 16, "late.example.com")  # still held when the call ends
            stream.wait_for("late.example.com:443 (CONNECT) is held")
        ended = _answer(tmp_path, "h" + "3" * 16)
        assert (ended["decision"], ended["scope"], ended["by"]) == ("deny", "ended", "callbox")
        states = {json.loads(a.arguments)["destination"]: (a.state, a.resolved_by)
                  for a in audit.list_approvals(None)}
        assert states == {"api.example.com:443": ("consumed", "ann"),
                          "other.example.com:443": ("denied", "callbox"),
                          "late.example.com:443": ("denied", "callbox")}


def test_only_an_egress_approval_takes_a_scope(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        call = audit.create_approval("run-1", "call-1", "shell", {"command": "ls"}, "rule", "why")
        with pytest.raises(AuditError, match="only an egress approval takes a scope"):
            audit.resolve_approval(call.id, True, by="ann", reason=None, scope="sandbox")
        assert audit.resolve_approval(call.id, True, by="ann", reason=None).scope is None
        egress = audit.create_approval("run-1", "egress-h1", "egress", {"destination": "a.com:443"}, "rule", "why")
        with pytest.raises(AuditError, match="unknown scope"):
            audit.resolve_approval(egress.id, True, by="ann", reason=None, scope="forever")
        assert audit.resolve_approval(egress.id, True, by="ann", reason=None).scope == "once"


def test_the_console_offers_three_answers_for_held_egress(tmp_path: Path) -> None:
    with AuditStore(tmp_path / "audit.sqlite3") as audit:
        egress = audit.create_approval("run-1", "egress-h1", "egress", {"destination": "a.com:443"}, "rule", "why")
        call = audit.create_approval("run-1", "call-1", "shell", {"command": "ls"}, "rule", "why")
        console = Console(audit, None)
        items, _ = console.pending()
        page = str(approvals_page(items, 2, csrf="x"))
        egress_part, call_part = page.split(f'id="approval-{call.id}"')
        assert 'value="approve-sandbox">Allow for this sandbox</button>' in egress_part
        assert ">Allow once</button>" in egress_part and ">Deny</button>" in egress_part
        assert "approve-sandbox" not in call_part
        resolved, said = console.resolve(egress.id, True, client="operator", reason=None, scope="sandbox")
        assert (resolved.scope, resolved.resolved_by) == ("sandbox", "console:operator")
        assert "later ones to the same destination go through" in said
        assert isinstance(items[0], PendingApproval)


def test_the_result_meta_lists_the_calls_decisions() -> None:
    records = [{"decision": "allow", "method": "CONNECT", "host": "a.com", "port": 443, "reason": None, "ts": 1.0},
               {"decision": "deny", "method": "GET", "host": "b.com", "port": 80, "reason": "approval x: denied"}]
    assert egress_meta(records) == [
        {"decision": "allow", "method": "CONNECT", "host": "a.com", "port": 443},
        {"decision": "deny", "method": "GET", "host": "b.com", "port": 80, "reason": "approval x: denied"},
    ]
