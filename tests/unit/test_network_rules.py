"""A sandbox's network rules: CIDR and deny entries in the proxy's syntax, the proxy reading
its rules file again when it changes, and a client's request granted within the policy."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import pytest

from harness.core.errors import CallboxError, ErrorCode
from harness.core.network_request import NetworkRequest, grant_network, live_rules, update_network
from harness.core.policy import SandboxSettings
from harness.engine.spec import SandboxSpec
from sandbox.egress import Config, EgressProxy, read_rules
from sandbox.egress_policy import UNRESOLVED, Allowlist, Rules

DEST = [ipaddress.ip_address("198.18.77.2")]


def test_cidr_entries_parse_print_and_match_literals_and_resolved_names() -> None:
    entries = Allowlist.parse(["198.18.77.0/24:8080", "[2001:db8::/32]:443", "10.0.0.0/8"])
    assert str(entries) == "198.18.77.0/24:8080, [2001:db8::/32]:443, 10.0.0.0/8"
    assert entries.permits("198.18.77.9", 8080) is None
    assert entries.permits("dest.example", 8080) == UNRESOLVED  # only its addresses can tell
    assert entries.permits("dest.example", 8080, DEST) is None
    assert entries.permits("dest.example", 8081, DEST) is not None
    with pytest.raises(ValueError, match=r"bad CIDR network '198\.18\.77\.1/24'"):
        Allowlist.parse(["198.18.77.1/24"])


def test_allow_wins_over_deny_within_the_ceiling() -> None:
    rules = Rules.parse(["*.callbox.test:8080"], allow=["dest.callbox.test:8080"], deny=["0.0.0.0/0"])
    assert rules.refusal("dest.callbox.test", 8080) is None
    assert "denied by this sandbox's network rules" in str(rules.refusal("api.callbox.test", 8080))
    assert "not in this sandbox's allowlist" in str(rules.refusal("example.org", 443))  # the ceiling first
    only_deny = Rules.parse(["*.callbox.test:8080"], deny=["api.callbox.test"])  # portless: every port
    assert only_deny.refusal("dest.callbox.test", 8080) is None
    assert only_deny.refusal("api.callbox.test", 8080) is not None
    by_address = Rules.parse(["*.callbox.test:8080"], allow=["198.18.77.0/24:8080"], deny=["0.0.0.0/0"])
    assert by_address.refusal("dest.callbox.test", 8080) == UNRESOLVED
    assert by_address.refusal("dest.callbox.test", 8080, DEST) is None


def test_the_proxy_reads_its_rules_file_again_when_it_changes(tmp_path: Path) -> None:
    rules_file = tmp_path / "rules.json"
    proxy = EgressProxy(Config(listen=("127.0.0.1", 0), sandbox_id="sb", allowlist=Allowlist.parse(["*.t:80"]),
                               rules_file=str(rules_file)))
    try:
        assert proxy.rules().refusal("a.t", 80) is None  # no file: no narrowing
        rules_file.write_text(json.dumps({"allow": ["b.t"], "deny": ["0.0.0.0/0"]}))
        assert proxy.rules().refusal("a.t", 80) is not None
        assert proxy.rules().refusal("b.t", 80) is None
        rules_file.write_text("{not json")
        assert "cannot be read" in str(proxy.rules().refusal("b.t", 80))  # fail closed
    finally:
        proxy.close()
    assert "invalid" in str(read_rules(Allowlist(()), str(_write(tmp_path, {"allow": ["*bad*"]}))).broken)


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data))
    return path


ALLOWLIST = SandboxSettings(network="allowlist", allow_hosts=("*.callbox.test:8080",))


def test_a_request_narrows_an_allowlist_and_internet_gets_the_policy_with_a_note() -> None:
    granted = grant_network(ALLOWLIST, NetworkRequest(allow=("dest.callbox.test:8080",), deny=("0.0.0.0/0",)))
    assert granted.updates() == {"network": "allowlist", "allow_hosts": ("*.callbox.test:8080",),
                                 "egress_allow": ("dest.callbox.test:8080",), "egress_deny": ("0.0.0.0/0",)}
    assert granted.note is None
    internet = grant_network(ALLOWLIST, NetworkRequest(internet=True))
    assert internet.network == "allowlist" and internet.egress_deny == ()
    assert internet.note and "sandbox.network = 'allowlist'" in internet.note
    off = grant_network(ALLOWLIST, NetworkRequest(internet=False))
    assert off.egress_deny == ("0.0.0.0/0",)  # the proxy stays, so an update can open it again
    none = grant_network(SandboxSettings(), NetworkRequest(internet=True))
    assert none.network == "none" and none.note and "gives sandboxes no network" in none.note


def test_refuse_names_the_policy_key() -> None:
    with pytest.raises(CallboxError, match=r"sandbox\.on_internet_request = 'refuse'") as caught:
        grant_network(SandboxSettings(), NetworkRequest(internet=True), "refuse")
    assert caught.value.code is ErrorCode.PERMISSION_DENIED


def test_open_narrows_to_none_or_an_allowlist_and_refuses_partial_denies() -> None:
    open_ = SandboxSettings(network="open")
    assert grant_network(open_, NetworkRequest(internet=True)).network == "open"
    assert grant_network(open_, NetworkRequest(internet=False)).network == "none"
    listed = grant_network(open_, NetworkRequest(allow=("api.example.com",), deny=("0.0.0.0/0",)))
    assert (listed.network, listed.allow_hosts, listed.egress_allow) == ("allowlist", ("api.example.com",), ())
    with pytest.raises(CallboxError, match="needs the egress proxy") as caught:
        grant_network(open_, NetworkRequest(deny=("203.0.113.0/24",)))
    assert caught.value.code is ErrorCode.NOT_SUPPORTED


def test_a_running_sandbox_is_never_widened() -> None:
    with pytest.raises(CallboxError, match="has no network") as caught:
        live_rules(SandboxSpec(), NetworkRequest(allow=("example.com",)))
    assert caught.value.code is ErrorCode.PERMISSION_DENIED
    assert live_rules(SandboxSpec(), NetworkRequest(internet=False)) == ((), ())
    with pytest.raises(CallboxError, match="network 'open'"):
        live_rules(SandboxSpec(network="open"), NetworkRequest(internet=False))
    with pytest.raises(CallboxError, match="network 'open'"):
        live_rules(SandboxSpec(network="open"), NetworkRequest(deny=("10.0.0.0/8",)))
    # An open sandbox asked to deny nothing (Harbor's update_network({}) between its phases)
    # stays as it is: nothing to change, nothing refused.
    for request in (NetworkRequest(), NetworkRequest(internet=True), NetworkRequest(allow=("example.com",))):
        assert live_rules(SandboxSpec(network="open"), request) == ((), ())
        assert update_network(object(), SandboxSpec(network="open"), request) == SandboxSpec(network="open")
    spec = SandboxSpec(network="allowlist", allow_hosts=("*.callbox.test:8080",))
    assert live_rules(spec, NetworkRequest(allow=("a.callbox.test:8080",), internet=False)) == (
        ("a.callbox.test:8080",), ("0.0.0.0/0",))
    with pytest.raises(CallboxError, match="on_internet_request"):
        live_rules(spec, NetworkRequest(internet=True), "refuse")


def test_the_spec_refuses_rules_without_the_proxy() -> None:
    with pytest.raises(ValueError, match="egress_allow and egress_deny narrow network 'allowlist'"):
        SandboxSpec(network="open", egress_deny=("0.0.0.0/0",))
    spec = SandboxSpec(network="allowlist", allow_hosts=("a.t",), egress_allow=("a.t",), egress_deny=("0.0.0.0/0",))
    assert spec.network_summary() == "allowlist (a.t) narrowed to allow: a.t; deny: 0.0.0.0/0"
