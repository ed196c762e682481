"""What the egress proxy lets a sandbox reach: allowlist entries and destination addresses.

Standard library only, like ``sandbox/egress.py``, which imports it when run as a script in
the proxy's container. Allowlist entries are ``host``, ``host:port``, ``*.example.com[:port]``,
an IPv4 literal, ``[v6]:port``, a bare IPv6 literal, or a CIDR network (``10.1.0.0/16[:port]``,
``2001:db8::/32``, ``[2001:db8::/32]:port``); an entry without a port allows ports 80 and 443
only. A CIDR entry matches a destination whose addresses (an IP literal's, or those its name
resolves to) all lie in it. A destination address must be globally routable (``address_refusal``).

An entry may start with an action and a space: ``allow`` (what a bare entry means), ``ask`` (a
person decides while the connection waits: :mod:`sandbox.egress_hold`) or ``deny``. Once an
allowlist has an ``ask`` or ``deny`` entry its entries are tried in order and the first that
matches decides (a ``deny`` entry without a port matches every port); a destination no entry
matches is refused, as always.

:class:`Rules` is what one sandbox may reach: its ceiling (the policy's allowlist, fixed when
the sandbox starts) and, within it, a narrowing a client may set and change while the sandbox
runs (``allow`` and ``deny`` entries, same syntax; as in E2B's ``allow_out``/``deny_out``, an
allow entry wins over a deny entry, and a destination neither names is allowed; a deny entry
without a port denies every port; ``0.0.0.0/0`` or ``::/0`` in deny stands for all traffic).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = (80, 443)
ACTIONS = ("allow", "ask", "deny")
_LABEL = re.compile(r"(?!-)[a-z0-9_-]{1,63}(?<!-)")
_CGNAT = ipaddress.ip_network("100.64.0.0/10")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")


def ip_literal(text: str) -> IPAddress | None:
    """The IP address ``text`` spells (no zone index), else None."""
    try:
        return ipaddress.ip_address(text) if "%" not in text else None
    except ValueError:
        return None


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_port(text: str) -> int:
    if not (text.isascii() and text.isdigit() and 0 < int(text) < 65536):
        raise ValueError(f"bad port {text!r} (expected 1-65535)")
    return int(text)


def split_host_port(text: str) -> tuple[str, int | None]:
    """``host``, ``host:port``, ``[v6]``, ``[v6]:port`` or a bare IPv6 literal -> (host, port or None)."""
    if text.startswith("["):
        end = text.find("]")
        host, rest = text[: end + 1], text[end + 1 :]
        if end < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"bad bracketed IPv6 address in {text!r}")
        return host, parse_port(rest[1:]) if rest else None
    if text.count(":") == 1:
        host, port = text.split(":")
        return host, parse_port(port)
    return text, None


def normalize_host(text: str) -> str:
    """Lower case, no trailing dot, no brackets, IP literals in canonical form; ValueError if invalid."""
    if not text:
        raise ValueError("empty host")
    if not text.isascii():
        raise ValueError(f"non-ASCII host {text!r} (write internationalised names in their xn-- form)")
    host = text.lower()
    if host.startswith("["):
        literal = ip_literal(host[1:-1]) if host.endswith("]") else None
        if literal is None or literal.version != 6:
            raise ValueError(f"brackets must hold an IPv6 address: {text!r}")
        return str(literal)
    if (literal := ip_literal(host)) is not None:
        return str(literal)
    host = host.removesuffix(".")
    if len(host) > 253 or not all(_LABEL.fullmatch(label) for label in host.split(".")):
        raise ValueError(f"invalid host name {text!r}")
    if host.rsplit(".", 1)[-1].isdigit():
        raise ValueError(f"{text!r} is neither an IP address nor a host name")
    return host


def _cidr(text: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"bad CIDR network {text!r}: {exc}") from None


def _split_cidr(text: str) -> tuple[str, int | None]:
    """``net/len``, ``net/len:port`` (IPv4), ``v6net/len`` or ``[v6net/len]:port`` -> (network, port or None)."""
    if text.startswith("["):
        end = text.find("]")
        rest = text[end + 1:]
        if end < 0 or (rest and not rest.startswith(":")):
            raise ValueError(f"bad bracketed IPv6 network in {text!r}")
        return text[1:end], parse_port(rest[1:]) if rest else None
    if text.count(":") == 1:
        network, port = text.split(":")
        return network, parse_port(port)
    return text, None


@dataclass(frozen=True)
class Entry:
    """One allowlist entry: a name (``*.`` + name when ``wildcard``), an IP literal or a CIDR
    ``network``, with an optional port."""

    host: str
    port: int | None = None
    wildcard: bool = False
    network: IPNetwork | None = None
    action: str = "allow"
    """``allow``, ``ask`` or ``deny`` (written before the entry: ``ask *.github.com``)."""

    @classmethod
    def parse(cls, text: str) -> Entry:
        if not text.strip() or text != text.strip():
            raise ValueError("empty entry or surrounding whitespace")
        action, space, rest = text.partition(" ")
        if space and action in ACTIONS:
            if not rest or rest != rest.strip():
                raise ValueError(f"an action ({', '.join(ACTIONS)}) takes one space, then HOST[:PORT]")
            entry = cls.parse(rest)
            return cls(entry.host, entry.port, entry.wildcard, entry.network, action)
        if "/" in text:
            net_text, port = _split_cidr(text)
            network = _cidr(net_text)
            return cls(str(network), port, network=network)
        host, port = split_host_port(text)
        wildcard = host.startswith("*.")
        host = host.removeprefix("*.") if wildcard else host
        if "*" in host:
            raise ValueError("a wildcard must be '*.' followed by a name, e.g. *.example.com")
        host = normalize_host(host)
        if wildcard and ip_literal(host) is not None:
            raise ValueError("a wildcard must be followed by a name, not an IP address")
        return cls(host, port, wildcard)

    def matches_host(self, host: str) -> bool:
        if self.network is not None:
            literal = ip_literal(host)
            return literal is not None and self.holds(literal)
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    def holds(self, addr: IPAddress) -> bool:
        """Whether this CIDR entry's network holds ``addr`` (never, for a name or literal entry)."""
        return self.network is not None and addr.version == self.network.version and addr in self.network

    @property
    def all_traffic(self) -> bool:
        """A ``/0`` network: every destination, whatever its name resolves to."""
        return self.network is not None and self.network.prefixlen == 0

    def allows_port(self, port: int) -> bool:
        return port in DEFAULT_PORTS if self.port is None else port == self.port

    def denies_port(self, port: int) -> bool:
        """As a deny entry: without a port it denies every port."""
        return self.port is None or port == self.port

    def matches(self, host: str, port: int, addresses: Sequence[IPAddress] | None) -> bool | None:
        """As an entry of an allowlist with actions: whether it names ``host`` (normalized)
        on ``port``; None when only ``addresses`` (not given) can tell. A ``deny`` entry
        without a port names every port, and one address in its network suffices."""
        deny = self.action == "deny"
        if not (self.denies_port(port) if deny else self.allows_port(port)):
            return False
        if self.matches_host(host) or (deny and self.all_traffic):
            return True
        if self.network is None or ip_literal(host) is not None:
            return False
        if addresses is None:
            return None
        held = [self.holds(addr) for addr in addresses]
        return bool(held) and (any(held) if deny else all(held))

    def __str__(self) -> str:
        host = "*." + self.host if self.wildcard else self.host
        prefix = "" if self.action == "allow" else self.action + " "
        if self.port is None:
            return prefix + host
        return prefix + (f"[{host}]:{self.port}" if self.network is not None and self.network.version == 6 else
                         hostport(host, self.port))


UNRESOLVED: Final = "the destination's addresses are needed"
"""What a check answers when only the addresses a name resolves to can decide (a CIDR entry)."""
ASK: Final = "an ask entry names it: a person decides"
"""What a check answers when the first entry naming the destination is an ``ask`` entry."""


class Allowlist:
    """The parsed ``--allow`` entries; ``permits(host, port)`` gives a refusal reason or None."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries = tuple(dict.fromkeys(entries))

    @classmethod
    def parse(cls, texts: Iterable[str]) -> Allowlist:
        entries = []
        for text in texts:
            try:
                entries.append(Entry.parse(text))
            except ValueError as exc:
                raise ValueError(f"invalid allowlist entry {text!r}: {exc}") from None
        return cls(entries)

    def __str__(self) -> str:
        return ", ".join(map(str, self.entries)) or "nothing"

    def __bool__(self) -> bool:
        return bool(self.entries)

    @property
    def has_actions(self) -> bool:
        """Whether an entry asks or denies (then the first entry that matches decides)."""
        return any(entry.action != "allow" for entry in self.entries)

    def first_match(self, host: str, port: int, addresses: Sequence[IPAddress] | None) -> Entry | str | None:
        """The first entry naming ``host`` (normalized) on ``port``; None if none does;
        :data:`UNRESOLVED` when an entry before any match needs ``addresses`` (not given)."""
        for entry in self.entries:
            hit = entry.matches(host, port, addresses)
            if hit is None:
                return UNRESOLVED
            if hit:
                return entry
        return None

    def without_actions(self) -> Allowlist:
        """The entries as written without their actions (what a narrowing takes); ValueError
        naming the first entry that has one."""
        for entry in self.entries:
            if entry.action != "allow":
                raise ValueError(f"{entry}: only allow_hosts entries take an action (ask, deny)")
        return self

    def match(self, host: str, port: int, addresses: Sequence[IPAddress] | None, *, deny: bool = False) -> bool | None:
        """Whether an entry names ``host`` (normalized) on ``port``; None when only
        ``addresses`` (not given) can tell. As an allowlist, CIDR entries must hold every
        address; as a denylist (``deny``), one address suffices and a portless entry denies
        every port."""
        def port_ok(entry: Entry) -> bool:
            return entry.denies_port(port) if deny else entry.allows_port(port)

        if any(port_ok(e) and (e.matches_host(host) or (deny and e.all_traffic)) for e in self.entries):
            return True
        networks = [e for e in self.entries if e.network is not None and port_ok(e)]
        if not networks or ip_literal(host) is not None:
            return False
        if addresses is None:
            return None
        held = [any(e.holds(addr) for e in networks) for addr in addresses]
        return bool(held) and (any(held) if deny else all(held))

    def permits(self, host: str, port: int, addresses: Sequence[IPAddress] | None = None) -> str | None:
        """None if allowed, else why not (:data:`UNRESOLVED` when only a CIDR entry, and so
        the addresses ``host`` resolves to, can tell)."""
        try:
            host = normalize_host(host)
        except ValueError as exc:
            return str(exc)
        if self.has_actions:
            first = self.first_match(host, port, addresses)
            if isinstance(first, Entry):
                return None if first.action == "allow" else ASK if first.action == "ask" else \
                    f"denied by the allowlist entry {str(first)!r}"
            if first == UNRESOLVED:
                return UNRESOLVED
            return f"not in this sandbox's allowlist (rules: {self})"
        hit = self.match(host, port, addresses)
        if hit is None:
            return UNRESOLVED
        if hit:
            return None
        hits = [entry for entry in self.entries if entry.matches_host(host)]
        if hits:
            return f"port {port} is not allowed for {host} (an entry without a port allows 80 and 443 only; " \
                   f"allowed: {self})"
        literal = "IP addresses must be listed exactly; " if ip_literal(host) is not None else ""
        return f"{literal}not in this sandbox's allowlist (allowed: {self})"


class Rules:
    """What one sandbox may reach: ``ceiling`` (its policy's allowlist) and, within it, a
    client's narrowing: ``allow`` entries win over ``deny`` entries, and a destination neither
    names is allowed (both empty: no narrowing). ``broken`` refuses everything (a rules file
    that could not be read: fail closed)."""

    def __init__(self, ceiling: Allowlist, allow: Allowlist | None = None, deny: Allowlist | None = None,
                 broken: str | None = None) -> None:
        self.ceiling = ceiling
        self.allow = allow or Allowlist(())
        self.deny = deny or Allowlist(())
        self.broken = broken

    @classmethod
    def parse(cls, ceiling: Iterable[str], allow: Iterable[str] = (), deny: Iterable[str] = ()) -> Rules:
        return cls(Allowlist.parse(ceiling), Allowlist.parse(allow).without_actions(),
                   Allowlist.parse(deny).without_actions())

    @property
    def narrowed(self) -> bool:
        return bool(self.allow) or bool(self.deny)

    def __str__(self) -> str:
        text = f"allowed: {self.ceiling}"
        if self.narrowed:
            text += f"; narrowed by the sandbox's rules (allow: {self.allow}; deny: {self.deny})"
        return text

    def refusal(self, host: str, port: int, addresses: Sequence[IPAddress] | None = None) -> str | None:
        """None if ``host:port`` may be reached, else why not; :data:`UNRESOLVED` when the
        addresses ``host`` resolves to (not given) decide."""
        if self.broken is not None:
            return self.broken
        why = self.ceiling.permits(host, port, addresses)
        if (why is not None and why != ASK) or not self.narrowed:
            return why
        name = normalize_host(host)
        allowed = self.allow.match(name, port, addresses)
        if allowed:
            return why  # None, or ASK: a narrowing never answers for the person an entry asks
        denied = self.deny.match(name, port, addresses, deny=True)
        if denied is False:
            return why
        if allowed is None or denied is None:
            return UNRESOLVED
        return f"denied by this sandbox's network rules (deny: {self.deny}; allow: {self.allow})"


def address_refusal(addr: IPAddress) -> str | None:
    """Why ``addr`` may not be a destination (``"a loopback address"``...), None if globally routable."""
    if isinstance(addr, ipaddress.IPv6Address):
        if addr.ipv4_mapped is not None:
            return address_refusal(addr.ipv4_mapped)
        inner = addr.sixtofour or (ipaddress.IPv4Address(int(addr) & 0xFFFFFFFF) if addr in _NAT64 else None)
        if inner is not None and (why := address_refusal(inner)):
            return f"{why} ({inner}) embedded in an IPv6 address"
    checks = (("an unspecified address", addr.is_unspecified), ("a loopback address", addr.is_loopback),
              ("a link-local address (these include the cloud metadata service)", addr.is_link_local),
              ("a multicast address", addr.is_multicast),
              ("in the shared address space 100.64.0.0/10 (carrier-grade NAT)", addr in _CGNAT),
              ("a private address", addr.is_private), ("a reserved address", addr.is_reserved),
              ("not a globally routable address", not addr.is_global))
    return next((why for why, hit in checks if hit), None)


class Verdict(NamedTuple):
    address: IPAddress  # what to connect to (IPv4-mapped IPv6 unwrapped)
    refusal: str | None
    test_override: bool  # allowed only because of --test-allow-network


def check_address(addr: IPAddress, test_network: IPNetwork | None = None) -> Verdict:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    why = address_refusal(addr)
    if why and test_network is not None and addr.version == test_network.version and addr in test_network:
        return Verdict(addr, None, True)
    return Verdict(addr, why, False)
