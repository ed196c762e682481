"""What the egress proxy lets a sandbox reach: allowlist entries and destination addresses.

Standard library only, like ``sandbox/egress.py``, which imports it when run as a script in
the proxy's container. Allowlist entries are ``host``, ``host:port``, ``*.example.com[:port]``,
an IPv4 literal, ``[v6]:port`` or a bare IPv6 literal; an entry without a port allows ports
80 and 443 only. A destination address must be globally routable (``address_refusal``).
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_PORTS = (80, 443)
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


@dataclass(frozen=True)
class Entry:
    """One allowlist entry: a name (``*.`` + name when ``wildcard``) or an IP literal, with an optional port."""

    host: str
    port: int | None = None
    wildcard: bool = False

    @classmethod
    def parse(cls, text: str) -> Entry:
        if not text.strip() or text != text.strip():
            raise ValueError("empty entry or surrounding whitespace")
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
        return host.endswith("." + self.host) if self.wildcard else host == self.host

    def allows_port(self, port: int) -> bool:
        return port in DEFAULT_PORTS if self.port is None else port == self.port

    def __str__(self) -> str:
        host = "*." + self.host if self.wildcard else self.host
        return host if self.port is None else hostport(host, self.port)


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

    def permits(self, host: str, port: int) -> str | None:
        try:
            host = normalize_host(host)
        except ValueError as exc:
            return str(exc)
        hits = [entry for entry in self.entries if entry.matches_host(host)]
        if any(entry.allows_port(port) for entry in hits):
            return None
        if hits:
            return f"port {port} is not allowed for {host} (an entry without a port allows 80 and 443 only; " \
                   f"allowed: {self})"
        literal = "IP addresses must be listed exactly; " if ip_literal(host) is not None else ""
        return f"{literal}not in this sandbox's allowlist (allowed: {self})"


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
