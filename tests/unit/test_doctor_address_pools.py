"""The doctor's count of the address pools left for networked sandboxes (pure arithmetic on
hand-written pools, networks and routes), its readers of this host's files, and the error a
user sees when dockerd has none left."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

import docker.errors
import pytest

from harness.core.errors import SandboxStartError
from harness.doctor.address_pools import (
    DOCKER_DEFAULT_POOLS,
    WARN_BELOW,
    Pool,
    PoolConfigError,
    check_address_pools,
    configured_pools,
    dockerd_flag_pools,
    host_networks,
    network_subnets,
    parse_pools,
    usage,
)
from harness.doctor.evidence import Evidence, read_dockerd_args, read_host_networks
from harness.engine.docker.networks import network_create_error

NO_DAEMON_JSON = "no /etc/docker/daemon.json: the daemon runs on its defaults"
BRIDGE = {"Name": "bridge", "Scope": "local", "IPAM": {"Config": [{"Subnet": "172.17.0.0/16",
                                                                    "Gateway": "172.17.0.1"}]}}
HOST = {"Name": "host", "Scope": "local", "IPAM": {"Config": []}}
NONE = {"Name": "none", "Scope": "local", "IPAM": {"Config": None}}


def net(cidr: str) -> ipaddress.IPv4Network:
    return ipaddress.IPv4Network(cidr)


def network(name: str, *subnets: str, scope: str = "local") -> dict[str, Any]:
    return {"Name": name, "Scope": scope, "IPAM": {"Config": [{"Subnet": s} for s in subnets]}}


def evidence(**fields: Any) -> Evidence:
    values: dict[str, Any] = {"container": {}, "info": {}, "version": {}, "daemon_config": {},
                              "daemon_config_note": NO_DAEMON_JSON, "networks": (BRIDGE, HOST, NONE),
                              "host_networks": ("0.0.0.0/0", "172.17.0.0/16", "192.0.2.0/24")}
    values.update(fields)
    return Evidence(**values)


# ---- pools -> subnets ---------------------------------------------------------------------------


def test_docker_defaults_give_31_networks() -> None:
    assert [p.count for p in DOCKER_DEFAULT_POOLS] == [1, 1, 1, 4, 4, 4, 16]
    assert usage(DOCKER_DEFAULT_POOLS, []).total == 31


def test_daemon_json_pools() -> None:
    pools = parse_pools([{"base": "10.200.0.0/16", "size": 24}, {"base": "10.201.0.0/16", "size": 28}])
    assert pools == (Pool(net("10.200.0.0/16"), 24), Pool(net("10.201.0.0/16"), 28))
    assert [p.count for p in pools] == [256, 4096]
    # docker info's spelling (newer engines), host bits ignored as dockerd does, IPv6 left out, duplicates once.
    listed = parse_pools([{"Base": "10.200.3.4/16", "Size": 24}, {"Base": "fd00::/48", "Size": 64},
                          {"Base": "10.200.0.0/16", "Size": 24}])
    assert listed == (Pool(net("10.200.0.0/16"), 24),)


@pytest.mark.parametrize("entries", [
    {"base": "10.0.0.0/8", "size": 24},
    [{"base": "10.0.0.0/33", "size": 24}],
    [{"base": "nonsense", "size": 24}],
    [{"base": "10.0.0.0/16", "size": 8}],
    [{"base": "10.0.0.0/16", "size": 33}],
    [{"base": "10.0.0.0/16", "size": "24"}],
    [{"base": "10.0.0.0/16"}],
    ["10.0.0.0/16"],
])
def test_pools_dockerd_refuses(entries: object) -> None:
    with pytest.raises(PoolConfigError):
        parse_pools(entries)


def test_dockerd_command_line_pools() -> None:
    args = ["/usr/bin/dockerd", "-H", "fd://", "--default-address-pool", "base=10.10.0.0/16,size=24",
            "--default-address-pool=base=10.11.0.0/16,size=26"]
    assert dockerd_flag_pools(args) == [{"base": "10.10.0.0/16", "size": 24}, {"base": "10.11.0.0/16", "size": 26}]
    assert [p.count for p in parse_pools(dockerd_flag_pools(args))] == [256, 1024]
    assert dockerd_flag_pools(["dockerd"]) == []
    with pytest.raises(PoolConfigError):
        parse_pools(dockerd_flag_pools(["dockerd", "--default-address-pool", "base=10.10.0.0/16,size=x"]))


# ---- minus what is in use -----------------------------------------------------------------------


def test_networks_inside_the_pools_are_subtracted() -> None:
    allocated = [net("172.17.0.0/16"), net("172.21.0.0/16"), net("192.168.16.0/20"), net("10.9.0.0/24")]
    found = usage(DOCKER_DEFAULT_POOLS, allocated)
    assert (found.total, found.used, found.free, found.host_blocked) == (31, 3, 28, 0)


def test_a_network_counts_once_per_subnet_it_touches() -> None:
    pools = [Pool(net("10.200.0.0/16"), 24)]
    # Two small networks inside one /24 take one subnet; a /23 takes two (one of them again taken
    # by a /24 inside it); one larger than the pool takes only the pool's subnets.
    assert usage(pools, [net("10.200.0.0/28"), net("10.200.0.16/28")]).used == 1
    assert usage(pools, [net("10.200.4.0/23"), net("10.200.5.0/24")]).used == 2
    assert usage([Pool(net("10.200.0.0/17"), 24)], [net("10.200.0.0/16")]).used == 128
    assert usage(pools, [net("10.0.0.0/8")]).free == 0
    assert usage([Pool(net("10.200.0.0/16"), 24), Pool(net("10.201.0.0/16"), 24)], [net("10.200.0.0/15")]).used == 512


def test_huge_pools_are_counted_without_listing_their_subnets() -> None:
    found = usage([Pool(net("10.0.0.0/8"), 30)], [net("10.0.0.0/9"), net("10.200.0.0/24")])
    assert (found.total, found.used) == (1 << 22, (1 << 21) + 64)


def test_host_routes_and_nameservers_block_subnets() -> None:
    routes = host_networks(["0.0.0.0/0", "172.17.0.0/16", "192.168.1.0/24", "192.168.1.53/32", "fe80::/64", "junk"])
    assert routes == [net("172.17.0.0/16"), net("192.168.1.0/24"), net("192.168.1.53/32")]
    found = usage(DOCKER_DEFAULT_POOLS, [net("172.17.0.0/16")], routes)
    # docker0's route is the bridge network's own subnet: counted once, as a network's.
    assert (found.used, found.host_blocked, found.free) == (2, 1, 29)


def test_network_subnets_of_a_listing() -> None:
    listing = [BRIDGE, HOST, NONE, network("ipv6", "fd00:1::/64", "172.30.0.0/16"),
               network("swarm", "10.0.1.0/24", scope="swarm"), {"Name": "odd", "IPAM": {"Config": [{}]}}]
    assert network_subnets(listing) == [net("172.17.0.0/16"), net("172.30.0.0/16")]


# ---- the check ----------------------------------------------------------------------------------


def test_fresh_host_on_docker_defaults() -> None:
    result = check_address_pools(evidence())
    assert (result.id, result.status, result.scope) == ("daemon.address-pools", "PASS", "daemon")
    assert result.line() == (
        "PASS  daemon.address-pools  networked sandboxes: 30 more can start (1 of 31 address pools in use; source: "
        "Docker's defaults (no /etc/docker/daemon.json); the first allowlist sandbox takes one more, for the "
        "shared egress network)"
    )


def test_few_left_warns_and_says_how_to_lift_it() -> None:
    taken = [network(f"callbox-net-{i}", f"172.{18 + i}.0.0/16") for i in range(14)]
    taken += [network(f"other-{i}", f"192.168.{16 * i}.0/20") for i in range(16 - WARN_BELOW + 1)]
    taken.append(network("callbox-egress", "192.168.240.0/20"))
    result = check_address_pools(evidence(networks=(BRIDGE, *taken)))
    assert result.status == "WARN"
    assert result.reason.startswith("3 more can start (28 of 31 address pools in use; source: Docker's defaults")
    assert "egress" not in result.reason.partition(")")[0]
    assert '"default-address-pools": [{"base": "10.200.0.0/16", "size": 24}] (256 networks' in result.reason
    none_left = check_address_pools(evidence(networks=(BRIDGE, network("all", "172.16.0.0/12", "192.168.0.0/16"))))
    assert none_left.status == "WARN" and none_left.reason.startswith("0 more can start (31 of 31")


def test_configured_pools_and_their_source() -> None:
    assert configured_pools(evidence()) == (DOCKER_DEFAULT_POOLS, "Docker's defaults (no /etc/docker/daemon.json)")
    assert configured_pools(evidence(daemon_config={"live-restore": True}, daemon_config_note="")) == (
        DOCKER_DEFAULT_POOLS, "Docker's defaults (/etc/docker/daemon.json sets no default-address-pools)")
    custom = {"default-address-pools": [{"base": "10.200.0.0/16", "size": 24}]}
    result = check_address_pools(evidence(daemon_config=custom, daemon_config_note="",
                                          networks=(BRIDGE, network("a", "10.200.0.0/24"))))
    assert result.status == "PASS" and result.reason.startswith(
        "255 more can start (1 of 256 address pools in use; source: /etc/docker/daemon.json default-address-pools")
    listed = evidence(info={"DefaultAddressPools": [{"Base": "10.50.0.0/16", "Size": 24}]}, daemon_config=None,
                      daemon_config_note="not readable: the engine is remote", host_networks=None)
    assert check_address_pools(listed).reason.startswith("256 more can start (0 of 256 address pools in use; "
                                                         "source: docker info")
    flags = evidence(dockerd_args=("dockerd", "--default-address-pool", "base=10.60.0.0/16,size=20"))
    assert "(0 of 16 address pools in use; source: dockerd's --default-address-pool options" in \
        check_address_pools(flags).reason


def test_unknown_never_crashes() -> None:
    remote = check_address_pools(evidence(daemon_config=None, daemon_config_note="not readable: the engine is remote",
                                          host_networks=None, remote_engine=True))
    assert remote.status == "WARN" and remote.reason.startswith(
        "unknown: the daemon's default-address-pools cannot be read (not readable: the engine is remote;")
    unreadable = check_address_pools(evidence(daemon_config=None,
                                              daemon_config_note="/etc/docker/daemon.json not readable: Permission "
                                                                 "denied"))
    assert unreadable.status == "WARN" and "Permission denied" in unreadable.reason
    unlisted = check_address_pools(evidence(networks=None, networks_note="docker network ls failed: 500"))
    assert unlisted.status == "WARN" and unlisted.reason == (
        "unknown: the engine's networks could not be listed (docker network ls failed: 500)")
    broken = check_address_pools(evidence(daemon_config={"default-address-pools": [{"base": "x", "size": 24}]}))
    assert broken.status == "WARN" and broken.reason.startswith("unknown: the configured pools are not valid")
    # Evidence gathered without any of the new fields (the defaults) reads as unknown too.
    bare = Evidence(container={}, info={}, version={}, daemon_config={})
    assert check_address_pools(bare).status == "WARN"


# ---- readers of this host's files ---------------------------------------------------------------


def test_read_host_networks(tmp_path: Path) -> None:
    (tmp_path / "net").mkdir()
    (tmp_path / "net" / "route").write_text(
        "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT\n"
        "eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0\n"
        "docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0\n"
        "eth0\t0001A8C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0\n"
        "bad\tzz\n"
    )
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("# comment\nnameserver 10.255.255.53\nnameserver ::1\nsearch example\n")
    assert read_host_networks(tmp_path, resolv) == ("0.0.0.0/0", "172.17.0.0/16", "192.168.1.0/24",
                                                    "10.255.255.53/32")
    assert read_host_networks(tmp_path / "missing", tmp_path / "missing") == ()


def test_read_dockerd_args(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "cmdline").write_bytes(b"/sbin/init\0")
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cmdline").write_bytes(b"/usr/bin/dockerd\0-H\0fd://\0")
    (tmp_path / "self").mkdir()
    assert read_dockerd_args(tmp_path) == ("/usr/bin/dockerd", "-H", "fd://")
    assert read_dockerd_args(tmp_path / "missing") is None


# ---- what a user sees when the pools run out ----------------------------------------------------


@pytest.mark.parametrize("docker_says", [
    "could not find an available, non-overlapping IPv4 address pool among the defaults to assign to the network",
    "all predefined address pools have been fully subnetted",
])
def test_pool_exhaustion_names_the_cause_and_the_fix(docker_says: str) -> None:
    error = network_create_error("callbox-net-abc", docker.errors.APIError("400 Client Error", explanation=docker_says))
    assert isinstance(error, SandboxStartError)
    assert "no free address pool for network callbox-net-abc" in error.message
    assert "each open or allowlist sandbox gets a bridge network of its own" in error.message
    assert '"default-address-pools": [{"base": "10.200.0.0/16", "size": 24}] (256 networks)' in error.message
    assert "/etc/docker/daemon.json" in error.message and "`callbox doctor`" in error.message
    assert docker_says in error.message


def test_other_network_errors_pass_through() -> None:
    error = network_create_error("callbox-net-abc", docker.errors.APIError("409 Client Error",
                                                                           explanation="network exists"))
    assert error.message.startswith("the Docker engine could not create network callbox-net-abc: ")
    assert "address pool" not in error.message
