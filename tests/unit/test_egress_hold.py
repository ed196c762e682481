"""Egress rules with actions and the proxy's holding of ``ask`` connections, without Docker.

The proxy runs in a thread on 127.0.0.1 (the fixtures of test_egress_proxy.py) with a real
upstream HTTP server; the test plays the harness's part of the channel (reads the ``hold``
line, writes the answer file) as :mod:`harness.engine.docker.egress_asks` does.
"""

from __future__ import annotations

import ipaddress
import json
import socket
import threading
from pathlib import Path

import pytest

from sandbox.egress_hold import APPROVED_FILE, answer_path
from sandbox.egress_policy import ASK, UNRESOLVED, Allowlist, Entry, Rules
from tests.unit import test_egress_proxy as proxy_tests
from tests.unit.test_egress_proxy import TIMEOUT, body_of, exchange

servers = proxy_tests.servers  # the same fixtures
start_proxy = proxy_tests.start_proxy


# --- rules with actions ----------------------------------------------------------------------

def test_actions_parse_and_print_back() -> None:
    assert str(Entry.parse("ask *.Example.com")) == "ask *.example.com"
    assert str(Entry.parse("deny 10.0.0.0/8")) == "deny 10.0.0.0/8"
    assert str(Entry.parse("allow a.com:8080")) == "a.com:8080"
    for bad in ("ask  a.com", "ask ", "maybe a.com"):
        with pytest.raises(ValueError):
            Entry.parse(bad)


def test_the_first_entry_that_matches_decides() -> None:
    rules = Allowlist.parse(["deny secret.example.com", "ask *.example.com", "allow example.com", "pypi.org"])
    assert rules.permits("secret.example.com", 8443) == "denied by the allowlist entry 'deny secret.example.com'"
    assert rules.permits("api.example.com", 443) == ASK
    assert rules.permits("api.example.com", 22) is not None and rules.permits("api.example.com", 22) != ASK
    assert rules.permits("example.com", 80) is None
    assert rules.permits("pypi.org", 443) is None
    assert "not in this sandbox's allowlist" in str(rules.permits("other.org", 443))
    later = Allowlist.parse(["pypi.org", "ask 10.0.0.0/8"])
    assert later.permits("pypi.org", 443) is None
    assert later.permits("files.org", 443) == UNRESOLVED  # only its addresses can tell

    assert later.permits("files.org", 443, [ipaddress.ip_address("10.1.2.3")]) == ASK


def test_a_plain_allowlist_means_what_it_meant() -> None:
    plain = Allowlist.parse(["a.com", "*.b.com:8080"])
    assert not plain.has_actions
    assert plain.permits("a.com", 443) is None
    assert "not in this sandbox's allowlist" in str(plain.permits("c.com", 443))


def test_a_narrowing_never_answers_an_ask_and_takes_no_actions() -> None:
    rules = Rules.parse(["ask a.com"], allow=["a.com"])
    assert rules.refusal("a.com", 443) == ASK
    denied = Rules.parse(["ask a.com", "b.com"], deny=["a.com"])
    assert "denied by this sandbox's network rules" in str(denied.refusal("a.com", 443))
    with pytest.raises(ValueError, match="only allow_hosts entries take an action"):
        Rules.parse(["a.com"], allow=["ask a.com"])


# --- holding, end to end -----------------------------------------------------------------------

def _answer_when_held(log, directory: Path, count: int, answer: dict[str, object]) -> threading.Thread:
    """Answer the ``count``-th hold (in a thread) as the harness would: the file, renamed in."""
    def run() -> None:
        hold = str(log.wait_for("hold", count)[count - 1]["hold"])
        temporary = directory / ".answer.tmp"
        temporary.write_text(json.dumps(answer))
        temporary.replace(answer_path(str(directory), hold))
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_held_request_proceeds_once_then_waits_again_or_for_good(servers, start_proxy, tmp_path) -> None:
    web_port, _, seen = servers
    address, log = start_proxy(f"ask localhost:{web_port}", rules_file=str(tmp_path / "rules.json"),
                               ask_timeout=TIMEOUT)
    request = f"GET http://localhost:{web_port}/x HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    answering = _answer_when_held(log, tmp_path, 1, {"decision": "allow", "approval": "ap1", "by": "cli:ann",
                                                     "scope": "once"})
    assert exchange(address, request).endswith(b"hello from upstream ")
    answering.join(TIMEOUT)
    [hold] = log.of("hold")
    assert hold["host"] == "localhost" and hold["port"] == web_port and hold["timeout_s"] == TIMEOUT
    [decision] = log.of("decision")
    assert decision["decision"] == "allow" and decision["reason"] == "approval ap1: allowed once by cli:ann"
    assert [a["decision"] for a in log.of("answer")] == ["allow"]

    answering = _answer_when_held(log, tmp_path, 2, {"decision": "deny", "approval": "ap2", "by": "cli:ann",
                                                     "scope": "once", "reason": "not today"})
    refused = exchange(address, request)
    answering.join(TIMEOUT)
    assert refused.startswith(b"HTTP/1.1 403 ")
    assert f"approval ap2: localhost:{web_port} denied by cli:ann: not today" in body_of(refused)

    (tmp_path / APPROVED_FILE).write_text(json.dumps({"allow": [f"localhost:{web_port}"]}))
    assert exchange(address, request).endswith(b"hello from upstream ")
    assert len(log.of("hold")) == 2  # allowed for the sandbox: no third hold
    assert len(seen) == 2


def test_an_unanswered_hold_times_out_and_a_closed_client_ends_it(servers, start_proxy, tmp_path) -> None:
    web_port, _, seen = servers
    address, log = start_proxy(f"ask localhost:{web_port}", rules_file=str(tmp_path / "rules.json"),
                               ask_timeout=0.2)
    request = f"GET http://localhost:{web_port}/x HTTP/1.1\r\nHost: localhost\r\n\r\n".encode()
    refused = exchange(address, request)
    assert f"no approval: localhost:{web_port} denied by callbox: no answer within 0.2 s" in body_of(refused)
    [answer] = log.of("answer")
    assert answer["scope"] == "timeout"

    address, log = start_proxy(f"ask localhost:{web_port}", rules_file=str(tmp_path / "rules.json"),
                               ask_timeout=TIMEOUT)
    with socket.create_connection(address, timeout=TIMEOUT) as sock:
        sock.sendall(request)
        log.wait_for("hold", 1)
    [answer] = log.wait_for("answer", 1)
    assert answer["scope"] == "abandoned"
    assert not seen


def test_a_malformed_answer_refuses(servers, start_proxy, tmp_path) -> None:
    web_port, _, _ = servers
    address, log = start_proxy(f"ask localhost:{web_port}", rules_file=str(tmp_path / "rules.json"),
                               ask_timeout=TIMEOUT)
    answering = _answer_when_held(log, tmp_path, 1, {"decision": "yes please"})
    refused = exchange(address, f"CONNECT localhost:{web_port} HTTP/1.1\r\n\r\n".encode())
    answering.join(TIMEOUT)
    assert "the answer was malformed" in body_of(refused)
    assert not list(tmp_path.glob("answer-*"))  # taken and removed
