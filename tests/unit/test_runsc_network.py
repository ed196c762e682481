"""The network stack of the engine's runsc registration, and the refusal of a networked
sandbox when that registration has none (an older ``make runsc``'s --network=none)."""

from __future__ import annotations

import pytest

from harness.engine.runsc_network import engine_runsc_stack, network_stack
from harness.engine.spec import HostLimits, SandboxSpec, SpecError

NEW = {"path": "/usr/local/libexec/callbox-runsc", "runtimeArgs": ["--host-uds=create", "--network=sandbox",
                                                                   "--oci-seccomp"]}
OLD = {"path": "/usr/bin/runsc", "runtimeArgs": ["--host-uds=create", "--network=none", "--oci-seccomp"]}


@pytest.mark.parametrize(("args", "stack"), [
    (["--host-uds=create", "--network=sandbox"], "sandbox"),
    (["--network=none"], "none"),
    (["-network", "host"], "host"),
    (["--oci-seccomp"], "sandbox"),  # runsc's default
    (["--network=none", "--network=sandbox"], "sandbox"),  # the last one wins
    (["--networkx=none"], "sandbox"),
])
def test_network_stack_reads_the_flag(args: list[str], stack: str) -> None:
    assert network_stack(args) == stack


def test_the_engines_stack_comes_from_docker_info() -> None:
    assert engine_runsc_stack({"Runtimes": {"runc": {"path": "runc"}, "runsc": NEW}}) == "sandbox"
    assert engine_runsc_stack({"Runtimes": {"runsc": OLD}}) == "none"
    assert engine_runsc_stack({"Runtimes": {"runsc": {"path": "/usr/bin/runsc"}}}) == "sandbox"
    assert engine_runsc_stack({"Runtimes": {"runc": {"path": "runc"}}}) is None
    assert engine_runsc_stack({}) is None


@pytest.mark.parametrize("network", ["open", "allowlist"])
def test_an_older_registration_refuses_a_networked_runsc_sandbox(network: str) -> None:
    allow = ("pypi.org",) if network == "allowlist" else ()
    spec = SandboxSpec(runtime="runsc", network=network, allow_hosts=allow)
    with pytest.raises(SpecError, match=r"registered with --network=none .*make runsc") as refused:
        spec.for_host(HostLimits(runsc_network="none"))
    assert refused.value.key == "runtime"
    assert spec.for_host(HostLimits(runsc_network="sandbox")).network == network
    assert spec.for_host(HostLimits()).network == network  # not known: the engine did not say


def test_network_none_runs_under_any_registration() -> None:
    assert SandboxSpec(runtime="runsc").for_host(HostLimits(runsc_network="none")).network == "none"
    assert SandboxSpec(network="open").for_host(HostLimits(runsc_network="none")).runtime == "runc"


@pytest.mark.parametrize(("entry", "status", "says"), [
    (NEW, "PASS", "--network=sandbox"),
    (OLD, "WARN", "make runsc"),
    ({"path": "/usr/bin/runsc", "runtimeArgs": ["--network=host", "--oci-seccomp"]}, "WARN", "host kernel"),
])
def test_the_doctor_says_which_network_stack_runsc_has(entry: dict[str, object], status: str, says: str) -> None:
    from harness.doctor.runtimes import check_runsc_network, runtime_checks

    result = check_runsc_network({"Runtimes": {"runsc": entry}})
    assert result.status == status and says in result.reason, result
    assert check_runsc_network({"Runtimes": {"runc": {"path": "runc"}}}).status == "SKIP"
    assert [r.id for r in runtime_checks({"Runtimes": {"runsc": entry}})][-1] == "daemon.runsc_network"
