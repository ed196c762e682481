"""``callbox doctor``'s count of the networks the daemon can still give networked sandboxes.

Every ``open`` or ``allowlist`` sandbox gets a bridge network of its own, and Docker gives
each new network one subnet cut from its default address pools (``default-address-pools``
in daemon.json, ``--default-address-pool`` on dockerd's command line, else Docker's built-in
172.17-31.0.0/16 and 192.168.0.0/16 in /20s: 31 subnets). A subnet is taken when it overlaps
an existing network's subnet, and Docker also skips one that overlaps a route or a
nameserver of the daemon's host. When none is left, creating a networked sandbox fails.

Everything here is a pure function of the evidence: the pools' configuration, the
networks' IPAM subnets and the host's routes and nameservers.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.doctor.evidence import DAEMON_JSON, Evidence
from harness.doctor.report import CheckResult, result_maker

WARN_BELOW = 5
"""Fewer networks than this left for networked sandboxes is a warning."""
EGRESS_NETWORK = "callbox-egress"
"""The shared network every allowlist sandbox's proxy joins (created with the first one)."""
LIFT = ('to lift the limit give dockerd more, smaller pools in /etc/docker/daemon.json, e.g. '
        '"default-address-pools": [{"base": "10.200.0.0/16", "size": 24}] (256 networks of 254 addresses; '
        'a sandbox needs 3), restart dockerd, and remove unused networks (`callbox gc`, `docker network prune`)')


@dataclass(frozen=True)
class Pool:
    """One entry of the default address pools: ``base`` is cut into subnets of prefix ``size``."""

    base: ipaddress.IPv4Network
    size: int

    @property
    def count(self) -> int:
        return 1 << (self.size - self.base.prefixlen)

    def describe(self) -> str:
        return f"{self.base}/{self.size}"


def _pool(base: str, size: int) -> Pool:
    return Pool(ipaddress.IPv4Network(base), size)


DOCKER_DEFAULT_POOLS = (
    _pool("172.17.0.0/16", 16), _pool("172.18.0.0/16", 16), _pool("172.19.0.0/16", 16),
    _pool("172.20.0.0/14", 16), _pool("172.24.0.0/14", 16), _pool("172.28.0.0/14", 16),
    _pool("192.168.0.0/16", 20),
)
"""Docker's built-in local-scope pools (libnetwork's ipamutils): 15 /16s and 16 /20s."""


class PoolConfigError(ValueError):
    """Pools dockerd itself would refuse (it does not start with them)."""


def parse_pools(entries: object) -> tuple[Pool, ...]:
    """The IPv4 pools of daemon.json's ``default-address-pools`` (``[{"base": cidr, "size": n}]``)
    or docker info's ``DefaultAddressPools`` (``Base``/``Size``). IPv6 pools are left out:
    sandbox networks are IPv4 only. Host bits of a base are ignored, as dockerd does."""
    if not isinstance(entries, Sequence) or isinstance(entries, str | bytes):
        raise PoolConfigError(f"default-address-pools is not a list: {entries!r}")
    pools: list[Pool] = []
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise PoolConfigError(f"pool {entry!r} is not an object with base and size")
        base = entry.get("base", entry.get("Base"))
        size = entry.get("size", entry.get("Size"))
        try:
            network = ipaddress.ip_network(str(base), strict=False)
        except ValueError:
            raise PoolConfigError(f"pool base {base!r} is not a CIDR network") from None
        if not isinstance(size, int) or isinstance(size, bool) or not (
                network.prefixlen <= size <= network.max_prefixlen):
            raise PoolConfigError(f"pool {network} has an invalid size {size!r}")
        if isinstance(network, ipaddress.IPv4Network):
            candidate = Pool(network, size)
            if candidate not in pools:
                pools.append(candidate)
    return tuple(pools)


def dockerd_flag_pools(args: Sequence[str]) -> list[dict[str, object]]:
    """``--default-address-pool base=CIDR,size=N`` options of a dockerd command line, as
    daemon.json entries (an unparsable option gives an entry ``parse_pools`` refuses)."""
    values: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--default-address-pool" and i + 1 < len(args):
            values.append(args[i + 1])
        elif arg.startswith("--default-address-pool="):
            values.append(arg.partition("=")[2])
    entries: list[dict[str, object]] = []
    for value in values:
        fields = dict(part.partition("=")[::2] for part in value.split(","))
        size = fields.get("size", "")
        entries.append({"base": fields.get("base", ""), "size": int(size) if size.isdigit() else size})
    return entries


@dataclass(frozen=True)
class PoolUsage:
    total: int
    """Subnets the pools give."""
    used: int
    """Of them, those an existing network or the host's routes and nameservers overlap."""
    host_blocked: int = 0
    """Of ``used``, those only the host's routes or nameservers overlap."""

    @property
    def free(self) -> int:
        return self.total - self.used


def _blocks(pool: Pool, networks: Iterable[ipaddress.IPv4Network]) -> int:
    """How many of the pool's subnets overlap at least one of the networks."""
    first, last = int(pool.base.network_address), int(pool.base.broadcast_address)
    width = 1 << (32 - pool.size)
    spans = []
    for net in networks:
        low, high = max(first, int(net.network_address)), min(last, int(net.broadcast_address))
        if low <= high:
            spans.append(((low - first) // width, (high - first) // width + 1))
    count, reach = 0, 0
    for start, end in sorted(spans):
        fresh = max(start, reach)
        if end > fresh:
            count += end - fresh
            reach = end
    return count


def usage(pools: Iterable[Pool], allocated: Iterable[ipaddress.IPv4Network],
          host: Iterable[ipaddress.IPv4Network] = ()) -> PoolUsage:
    """The pools' subnets, and how many of them ``allocated`` (existing networks' subnets)
    and ``host`` (the host's routes and nameservers) leave no longer available."""
    items = list(pools)
    taken = list(allocated)
    both = taken + list(host)
    by_networks = sum(_blocks(p, taken) for p in items)
    used = sum(_blocks(p, both) for p in items)
    return PoolUsage(total=sum(p.count for p in items), used=used, host_blocked=used - by_networks)


def network_subnets(networks: Iterable[Mapping[str, Any]]) -> list[ipaddress.IPv4Network]:
    """The IPv4 subnets of the local-scope networks of a ``docker network ls`` listing (swarm
    networks come from other pools)."""
    subnets = []
    for net in networks:
        if str(net.get("Scope") or "local") != "local":
            continue
        for config in (net.get("IPAM") or {}).get("Config") or []:
            try:
                subnet = ipaddress.ip_network(str((config or {}).get("Subnet") or ""), strict=False)
            except ValueError:
                continue
            if isinstance(subnet, ipaddress.IPv4Network):
                subnets.append(subnet)
    return subnets


def host_networks(routes: Iterable[str]) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks of the host's routes and nameservers Docker avoids (the default
    route, 0.0.0.0/0, does not count)."""
    found = []
    for text in routes:
        try:
            net = ipaddress.ip_network(text, strict=False)
        except ValueError:
            continue
        if isinstance(net, ipaddress.IPv4Network) and net.prefixlen > 0:
            found.append(net)
    return found


def configured_pools(ev: Evidence) -> tuple[tuple[Pool, ...] | None, str]:
    """(pools, where they come from); pools is None when they cannot be known, and the text
    then says why. Raises ``PoolConfigError`` for pools dockerd would refuse."""
    listed = ev.info.get("DefaultAddressPools")
    if listed:
        return parse_pools(listed), "docker info"
    flags = dockerd_flag_pools(ev.dockerd_args or ())
    if flags:
        return parse_pools(flags), "dockerd's --default-address-pool options"
    if ev.daemon_config is None:
        return None, ev.daemon_config_note or f"{DAEMON_JSON} not readable"
    entries = ev.daemon_config.get("default-address-pools")
    if entries:
        return parse_pools(entries), f"{DAEMON_JSON} default-address-pools"
    why = ev.daemon_config_note or f"{DAEMON_JSON} sets no default-address-pools"
    return DOCKER_DEFAULT_POOLS, f"Docker's defaults ({why.partition(':')[0]})"


def check_address_pools(ev: Evidence) -> CheckResult:
    make = result_maker("daemon.address-pools")
    try:
        pools, source = configured_pools(ev)
    except PoolConfigError as exc:
        return make("WARN", f"unknown: the configured pools are not valid ({exc}); dockerd refuses to start with them")
    if pools is None:
        return make("WARN", f"unknown: the daemon's default-address-pools cannot be read ({source}; this engine's "
                            "docker info does not list them); each open or allowlist sandbox needs one of them")
    if ev.networks is None:
        return make("WARN", f"unknown: the engine's networks could not be listed ({ev.networks_note or 'no listing'})")
    found = usage(pools, network_subnets(ev.networks), host_networks(ev.host_networks or ()))
    free = found.free
    if found.total and not any(str(n.get("Name")) == EGRESS_NETWORK for n in ev.networks):
        # The first allowlist sandbox also creates the shared egress network.
        egress = "; the first allowlist sandbox takes one more, for the shared egress network"
    else:
        egress = ""
    host = f", {found.host_blocked} of them by this host's own routes or nameservers" if found.host_blocked else ""
    reason = (f"{free} more can start ({found.used} of {found.total} address pools in use{host}; "
              f"source: {source}{egress})")
    if free < WARN_BELOW:
        return make("WARN", f"{reason}: a networked sandbox needs a network of its own, and creating one fails "
                            f"once none is left; {LIFT}")
    return make("PASS", reason)
