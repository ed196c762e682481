"""Per-client quotas: the keeper's windows, totals, releases and refusals, how a client's
quotas merge, fair shares, and exact counts under concurrent use."""

from __future__ import annotations

import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from harness.cli.server_config import parse_config
from harness.core.policy import PolicyError, parse_policy
from harness.doors.grpc.errors import quota_refused
from harness.doors.profiles import ClientPolicies
from harness.doors.quota_ledger import CALL_RETRY_S, SANDBOX_RETRY_S, QuotaExceeded, QuotaKeeper, fair_share
from harness.doors.quotas import Quotas
from harness.telemetry import metrics
from harness.tools import builtin_registry

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def keeper_with(clock: Clock | None = None, **quotas: object) -> QuotaKeeper:
    fixed = Quotas.model_validate(quotas)
    return QuotaKeeper(lambda _client: fixed, clock=clock or Clock())


def refusals(client: str, quota: str, door: str) -> float:
    value = metrics.REGISTRY.get_sample_value("callbox_quota_refusals_total",
                                              {"client": client, "quota": quota, "door": door})
    return value or 0.0


# ---- live totals ------------------------------------------------------------------------------


def test_live_sandboxes_refused_at_the_quota_and_free_again_when_one_ends() -> None:
    keeper = keeper_with(live_sandboxes=2)
    first = keeper.reserve_sandbox("alice", door="grpc")
    keeper.reserve_sandbox("alice", door="grpc")
    before = refusals("alice", "live_sandboxes", "grpc")
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", door="grpc")
    error = refused.value
    assert (error.quota, error.limit, error.used, error.client) == ("live_sandboxes", 2, 2, "alice")
    assert "live_sandboxes" in error.message and "when one of its sandboxes ends" in error.message
    assert error.frees_in_s is None and error.retry_after_s == SANDBOX_RETRY_S and error.retryable
    assert refusals("alice", "live_sandboxes", "grpc") == before + 1
    keeper.reserve_sandbox("bob", door="grpc")  # another client's books are its own
    first.release()
    first.release()  # idempotent: frees one place, not two
    keeper.reserve_sandbox("alice", door="grpc")
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("alice", door="grpc")
    assert keeper.usage("alice").live_sandboxes == 2


def test_cpus_and_memory_add_up_over_live_sandboxes() -> None:
    keeper = keeper_with(cpus=2, memory="1g")
    one = keeper.reserve_sandbox("alice", cpus=1.5, memory=256 << 20, door="e2b")
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", cpus=1, memory=256 << 20, door="e2b")
    assert refused.value.quota == "cpus" and refused.value.retryable
    assert "2.5" in refused.value.message and "quota cpus = 2" in refused.value.message
    two = keeper.reserve_sandbox("alice", cpus=0.5, memory=512 << 20, door="e2b")  # exactly 2 CPUs
    assert keeper.usage("alice").cpus == 2.0
    two.release()
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", cpus=0.1, memory=GIB, door="e2b")
    assert refused.value.quota == "memory" and "quota memory = 1" in refused.value.message
    one.release()
    assert keeper.usage("alice").memory == 0 and keeper.usage("alice").cpus == 0
    keeper.reserve_sandbox("alice", cpus=0.1, memory=GIB, door="e2b")


def test_a_sandbox_bigger_than_the_quota_alone_is_not_retryable() -> None:
    keeper = keeper_with(cpus=1, memory="512m")
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", cpus=2, door="grpc")
    assert refused.value.quota == "cpus" and not refused.value.retryable
    assert "never fits" in refused.value.message
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", memory=GIB, door="grpc")
    assert refused.value.quota == "memory" and not refused.value.retryable


# ---- windows ------------------------------------------------------------------------------------


def test_sandboxes_per_hour_frees_up_as_the_oldest_create_leaves_the_hour() -> None:
    clock = Clock()
    keeper = keeper_with(clock, sandboxes_per_hour=2)
    keeper.reserve_sandbox("alice", door="grpc").release()
    clock.now += 100
    keeper.reserve_sandbox("alice", door="grpc").release()  # ended: still counts in the hour
    clock.now += 100
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", door="grpc")
    assert refused.value.quota == "sandboxes_per_hour"
    assert refused.value.frees_in_s == pytest.approx(3400) and refused.value.retry_after == 3400
    assert "frees up in 3400 s" in refused.value.message
    clock.now += 3399.5
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", door="grpc")
    assert refused.value.frees_in_s == pytest.approx(0.5) and refused.value.retry_after == 1
    clock.now += 0.5  # the first create is now an hour old
    keeper.reserve_sandbox("alice", door="grpc")
    assert keeper.usage("alice").sandboxes_last_hour == 2


def test_a_sandbox_that_never_started_is_refunded_from_the_hour() -> None:
    keeper = keeper_with(sandboxes_per_hour=1)
    failed = keeper.reserve_sandbox("alice", door="grpc")
    failed.release()
    failed.refund()
    failed.refund()
    kept = keeper.reserve_sandbox("alice", door="grpc")
    assert not kept.released
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("alice", door="grpc")


def test_calls_per_minute_window() -> None:
    clock = Clock()
    keeper = keeper_with(clock, calls_per_minute=3)
    for _ in range(3):
        keeper.start_call("alice", door="mcp")
        clock.now += 10
    before = refusals("alice", "calls_per_minute", "mcp")
    with pytest.raises(QuotaExceeded) as refused:
        keeper.start_call("alice", door="mcp")
    error = refused.value
    assert (error.quota, error.limit, error.used) == ("calls_per_minute", 3, 3)
    assert error.frees_in_s == pytest.approx(30) and "frees up in 30 s" in error.message
    assert refusals("alice", "calls_per_minute", "mcp") == before + 1
    keeper.start_call("bob", door="mcp")
    clock.now += 30
    keeper.start_call("alice", door="mcp")
    assert keeper.usage("alice").calls_last_minute == 3


def test_no_quota_is_no_limit_but_the_use_is_counted() -> None:
    keeper = QuotaKeeper()
    for _ in range(100):
        keeper.start_call("alice", door="grpc")
        keeper.reserve_sandbox("alice", cpus=4, memory=GIB, door="grpc")
    usage = keeper.usage("alice")
    assert (usage.live_sandboxes, usage.cpus, usage.calls_last_minute) == (100, 400, 100)


def test_configure_applies_new_limits_and_keeps_the_use() -> None:
    keeper = keeper_with(live_sandboxes=4)
    held = [keeper.reserve_sandbox("alice", door="grpc") for _ in range(3)]
    keeper.configure(lambda _client: Quotas(live_sandboxes=2))
    with pytest.raises(QuotaExceeded) as refused:
        keeper.reserve_sandbox("alice", door="grpc")
    assert refused.value.used == 3 and refused.value.limit == 2
    held[0].release()
    held[1].release()
    keeper.reserve_sandbox("alice", door="grpc")


def test_adopted_sandboxes_count_without_a_check() -> None:
    keeper = keeper_with(live_sandboxes=1)
    keeper.adopt_sandbox("alice", cpus=1, memory=GIB)
    adopted = keeper.adopt_sandbox("alice")
    assert keeper.usage("alice").live_sandboxes == 2
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("alice", door="grpc")
    adopted.release()
    assert keeper.usage("alice").live_sandboxes == 1


# ---- fair shares ---------------------------------------------------------------------------------


def test_fair_share_bounds_requests_in_flight_per_client_and_door() -> None:
    assert fair_share(128) == 32 and fair_share(2) == 1 and fair_share(256) == 64
    keeper = QuotaKeeper()
    keeper.enter("alice", door="grpc", share=2)
    keeper.enter("alice", door="grpc", share=2)
    with pytest.raises(QuotaExceeded) as refused:
        keeper.enter("alice", door="grpc", share=2)
    assert refused.value.quota == "concurrent_calls" and refused.value.retry_after_s == CALL_RETRY_S
    assert "when one of them ends" in refused.value.message and "concurrent_calls = 2" in refused.value.message
    keeper.enter("alice", door="e2b", share=2)  # another door's threads
    keeper.enter("bob", door="grpc", share=2)
    keeper.leave("alice", door="grpc")
    with keeper.in_flight("alice", door="grpc", share=2):
        assert keeper.usage("alice").in_flight == {"grpc": 2, "e2b": 1}
    assert keeper.usage("alice").in_flight == {"grpc": 1, "e2b": 1}


def test_concurrent_calls_quota_lowers_the_share() -> None:
    keeper = keeper_with(concurrent_calls=1)
    keeper.enter("alice", door="grpc", share=32)
    with pytest.raises(QuotaExceeded) as refused:
        keeper.enter("alice", door="grpc", share=32)
    assert refused.value.limit == 1


# ---- concurrency -----------------------------------------------------------------------------------


def test_exact_counts_under_concurrent_use() -> None:
    keeper = keeper_with(calls_per_minute=5000, live_sandboxes=50)
    accepted = 0
    refused = 0
    lock = threading.Lock()

    def calls(_n: int) -> None:
        nonlocal accepted, refused
        for _ in range(1000):
            try:
                keeper.start_call("alice", door="grpc")
                outcome = True
            except QuotaExceeded:
                outcome = False
            with lock:
                if outcome:
                    accepted += 1
                else:
                    refused += 1

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(calls, range(8)))
    assert (accepted, refused) == (5000, 3000)

    def reserve(_n: int) -> object:
        try:
            return keeper.reserve_sandbox("alice", cpus=0.5, memory=1 << 20, door="grpc")
        except QuotaExceeded:
            return None

    with ThreadPoolExecutor(max_workers=8) as pool:
        held = [r for r in pool.map(reserve, range(200)) if r is not None]
    assert len(held) == 50
    assert keeper.usage("alice").live_sandboxes == 50 and keeper.usage("alice").cpus == 25
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda r: r.release(), held * 2))  # type: ignore[attr-defined]
    usage = keeper.usage("alice")
    assert (usage.live_sandboxes, usage.cpus, usage.memory) == (0, 0, 0)

    def enter_leave(_n: int) -> int:
        entered = 0
        for _ in range(500):
            try:
                keeper.enter("bob", door="grpc", share=4)
            except QuotaExceeded:
                continue
            entered += 1
            keeper.leave("bob", door="grpc")
        return entered

    with ThreadPoolExecutor(max_workers=8) as pool:
        assert sum(pool.map(enter_leave, range(8))) > 0
    assert keeper.usage("bob").in_flight == {}


# ---- merging and the doors' refusals -------------------------------------------------------------------


def test_client_quotas_merge_client_over_profile_over_default(tmp_path: Path) -> None:
    config = parse_config(textwrap.dedent("""
        [doors.grpc]
        listen = ""
        [limits]
        max_per_client = 7
        [quotas]
        calls_per_minute = 600
        memory = "16g"
        [profiles.ci.quotas]
        live_sandboxes = 4
        calls_per_minute = 100
        [clients.builder]
        profile = "ci"
        [clients.builder.quotas]
        calls_per_minute = 50
        sandboxes_per_hour = 10
        [clients.other]
        profile = "ci"
    """), source="test", base=tmp_path)
    builder = config.client_quotas("builder")
    assert (builder.calls_per_minute, builder.live_sandboxes, builder.sandboxes_per_hour, builder.memory) == (
        50, 4, 10, 16 * GIB)
    other = config.client_quotas("other")
    assert (other.calls_per_minute, other.live_sandboxes, other.sandboxes_per_hour) == (100, 4, None)
    anyone = config.client_quotas("anyone")
    assert (anyone.calls_per_minute, anyone.live_sandboxes, anyone.memory) == (600, 7, 16 * GIB)
    keeper = QuotaKeeper(config.client_quotas)
    for _ in range(4):
        keeper.reserve_sandbox("builder", door="grpc")
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("builder", door="grpc")
    for _ in range(7):
        keeper.reserve_sandbox("anyone", door="grpc")
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("anyone", door="grpc")


def test_grpc_refusal_is_resource_exhausted_with_the_retry_time() -> None:
    clock = Clock()
    keeper = keeper_with(clock, calls_per_minute=1)
    keeper.start_call("alice", door="grpc")
    clock.now += 15
    with pytest.raises(QuotaExceeded) as refused:
        keeper.start_call("alice", door="grpc")
    error = quota_refused(refused.value)
    assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retryable
    assert error.retry_after_s == pytest.approx(45) and "calls_per_minute" in error.detail().message


def test_client_policies_serve_a_profile_policy_checked_against_the_registry() -> None:
    registry = builtin_registry()
    default = parse_policy("")
    strict = parse_policy('[tools.shell]\ndecision = "deny"\n')
    policies = ClientPolicies(default, registry, lambda client: strict if client == "bob" else default)
    assert policies.of("bob") is strict and policies.of("alice") is default
    assert policies.exposed("bob") == registry.exposed_names(strict)
    narrow = parse_policy('allowed_tools = ["shell"]\n')
    policies.configure(lambda _client: narrow)
    assert policies.of("bob") is narrow and policies.exposed("alice") == ["shell"]
    broken = parse_policy('allowed_tools = ["no_such_tool"]\n')
    policies.configure(lambda _client: broken)
    with pytest.raises(PolicyError):
        policies.of("alice")
    assert ClientPolicies(default, registry).of("anyone") is default


def test_serve_wiring_from_a_configuration_file_and_its_reload(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from harness.cli.serve_quotas import apply_live, door_quotas, profile_policies

    (tmp_path / "ci.toml").write_text('[tools.shell]\ndecision = "deny"\n')
    text = textwrap.dedent("""
        [doors.grpc]
        listen = ""
        [quotas]
        calls_per_minute = 2
        [profiles.ci]
        policy = "ci.toml"
        [profiles.ci.quotas]
        live_sandboxes = 1
        [clients.builder]
        profile = "ci"
    """)
    config = parse_config(text, source="test", base=tmp_path)
    keeper = door_quotas(config, max_per_client=3)
    keeper.reserve_sandbox("builder", door="grpc")
    with pytest.raises(QuotaExceeded):
        keeper.reserve_sandbox("builder", door="grpc")
    assert keeper.limits("anyone").live_sandboxes == 3  # the flag over limits.max_per_client
    policies = profile_policies(config)
    assert policies is not None and policies("anyone") is None
    ci = policies("builder")
    assert ci is not None and ci.tools["shell"].decision == "deny"
    assert door_quotas(None).limits("anyone") == Quotas() and profile_policies(None) is None

    default = parse_policy("")
    served = ClientPolicies(default, builtin_registry(), policies)
    assert served.of("builder") is ci and served.of("anyone") is default
    lowered = parse_config(text.replace("calls_per_minute = 2", "calls_per_minute = 1")
                           .replace('policy = "ci.toml"\n', ""), source="test", base=tmp_path)
    notes = apply_live([SimpleNamespace(service=SimpleNamespace(quotas=keeper, profiles=served))], lowered)
    assert notes and keeper.limits("anyone").calls_per_minute == 1
    assert served.of("builder") is default  # the profile lost its policy: the door's own
