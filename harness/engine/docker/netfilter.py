"""Packet filters that keep networked sandboxes away from the host, each other and metadata.

Docker alone does not keep a sandbox off the host: a container on an ``--internal``
network still reaches the host through its bridge's gateway address, and a container on
any bridge reaches every address of the host (the INPUT chain), the link-local cloud
metadata service (169.254.169.254) and whatever else the host routes to. callbox names
every bridge it creates ``cbx…`` (see ``harness.engine.docker.networks``), so two small chains cover
them all, whatever the subnet:

* ``CALLBOX-INPUT``, jumped to first from ``INPUT`` for ``-i cbx+`` (IPv4 and, where
  ``ip6tables`` exists, IPv6): drop. Nothing on a callbox bridge talks to the host.
* ``CALLBOX-FORWARD``, jumped to first from Docker's ``DOCKER-USER`` for ``-i cbx+``:
  drop link-local (169.254.0.0/16, metadata), loopback and multicast destinations.
  Traffic between two callbox bridges is already dropped by Docker's isolation chains,
  and each sandbox has a bridge of its own, so sandboxes never meet.

The rules only match ``cbx`` interfaces, so they never touch other containers. They are
installed (idempotently, checked with ``iptables -C``) every time a networked sandbox
is created, and removed by ``gc`` once no callbox network is left; both happen under
one host-wide file lock (:func:`lock_path_for`: the rules are the host's, whichever run
root a harness uses) so a removal never races a creation. A removal that still finds a
chain in use (a jump that a harness not holding this lock, say an older one, added) leaves
it and logs that: the chains are harmless without callbox bridges, and the next gc retries.
Installing needs root and the ``iptables`` command (the one Docker itself uses); without them a networked sandbox is
refused (fail closed), never started unfiltered.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from harness.core.errors import CallboxError

log = logging.getLogger("callbox.netfilter")

HOST_LOCK_PATH = Path("/run/callbox-netfilter.lock")
"""The lock every root harness on this host takes around installing or removing the rules."""


def lock_path_for(run_root: Path) -> Path:
    """Where the packet filter's lock lives: host-wide for root (only root installs rules,
    and harnesses with different run roots share the host's iptables); beside the run root
    otherwise, where nothing is ever installed."""
    return HOST_LOCK_PATH if os.geteuid() == 0 else run_root / "netfilter.lock"

BRIDGE_PREFIX = "cbx"
"""Every bridge callbox creates is named ``cbx…`` (at most 15 characters, a Linux limit)."""
INPUT_CHAIN = "CALLBOX-INPUT"
FORWARD_CHAIN = "CALLBOX-FORWARD"
DOCKER_USER = "DOCKER-USER"
BLOCKED_FORWARD_V4 = ("169.254.0.0/16", "127.0.0.0/8", "224.0.0.0/4", "0.0.0.0/8")
"""Destinations no sandbox packet may be forwarded to: link-local (cloud metadata),
loopback, multicast, "this network"."""
_TIMEOUT_S = 30.0


class PacketFilterUnavailable(CallboxError):
    """The host cannot filter sandbox traffic, so a networked sandbox is refused."""


@dataclass(frozen=True)
class Rule:
    """One rule: ``iptables -t <table> <op> <chain> <spec>``."""

    chain: str
    spec: tuple[str, ...]
    first: bool = False
    """Insert at the top of the chain (jumps into our chains) instead of appending."""


def ipv4_rules() -> list[Rule]:
    interface = ("-i", f"{BRIDGE_PREFIX}+")
    rules = [Rule(INPUT_CHAIN, ("-j", "DROP"))]
    rules += [Rule(FORWARD_CHAIN, ("-d", net, "-j", "DROP")) for net in BLOCKED_FORWARD_V4]
    rules += [
        Rule("INPUT", (*interface, "-j", INPUT_CHAIN), first=True),
        Rule(DOCKER_USER, (*interface, "-j", FORWARD_CHAIN), first=True),
    ]
    return rules


def ipv6_rules() -> list[Rule]:
    interface = ("-i", f"{BRIDGE_PREFIX}+")
    return [Rule(INPUT_CHAIN, ("-j", "DROP")), Rule("INPUT", (*interface, "-j", INPUT_CHAIN), first=True)]


class PacketFilter:
    """Installs and removes the callbox chains with the host's ``iptables``."""

    def __init__(self, lock_path: Path, *, iptables: str | None = None, ip6tables: str | None = None) -> None:
        self.lock_path = lock_path
        self.iptables = iptables or _find("iptables")
        self.ip6tables = ip6tables or _find("ip6tables")

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the host-wide lock that orders installs against removals."""
        self.lock_path.parent.mkdir(parents=True, mode=0o700, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def ensure(self) -> None:
        """Install the chains and jumps if any part is missing (call under ``locked``). One
        ``iptables -S`` per family when everything is in place already."""
        binary = self._require()
        self._ensure(binary, ipv4_rules(), docker_user=True)
        if self.ip6tables is not None:
            listing = self._listing(self.ip6tables)
            if listing is not None:
                self._ensure(self.ip6tables, ipv6_rules(), docker_user=False, listing=listing)

    def problem(self) -> str | None:
        """Why networked sandboxes would be refused on this host, or None when the filter
        can be installed (root, iptables, Docker's DOCKER-USER chain). Installs nothing."""
        try:
            binary = self._require()
        except PacketFilterUnavailable as exc:
            return exc.message
        if f"-N {DOCKER_USER}" not in (self._listing(binary) or []):
            return "Docker's DOCKER-USER chain is missing (the daemon runs with iptables disabled)"
        return None

    def installed(self) -> bool:
        """Whether every IPv4 rule is in place (``callbox doctor`` and tests use this)."""
        if self.iptables is None:
            return False
        listing = self._listing(self.iptables) or []
        return all(_line(rule) in listing for rule in ipv4_rules())

    def remove(self) -> None:
        """Remove the jumps and chains (call under ``locked``, with no callbox bridge left)."""
        for binary, rules in ((self.iptables, ipv4_rules()), (self.ip6tables, ipv6_rules())):
            if binary is None or os.geteuid() != 0 or not self._works(binary):
                continue
            for rule in rules:
                if rule.chain in ("INPUT", DOCKER_USER):
                    while self._check(binary, rule):
                        self._run(binary, ["-D", rule.chain, *rule.spec])
            for chain in (INPUT_CHAIN, FORWARD_CHAIN):
                if self._run(binary, ["-n", "-L", chain], check=False).returncode == 0:
                    self._run(binary, ["-F", chain])
                    deleted = self._run(binary, ["-X", chain], check=False)
                    if deleted.returncode != 0:
                        log.info("packet filter chain %s kept (still referenced; gc retries): %s", chain,
                                 deleted.stderr.strip()[:200])

    # ---- internals -----------------------------------------------------------------------------

    def _require(self) -> str:
        if os.geteuid() != 0:
            raise PacketFilterUnavailable(
                f"network modes other than 'none' need packet filtering, which callbox installs with iptables "
                f"as root; this harness runs as uid {os.geteuid()}. Run it as root or use --network none."
            )
        if self.iptables is None:
            raise PacketFilterUnavailable(
                "network modes other than 'none' need packet filtering, but no iptables command was found "
                "(install Debian's iptables package, which docker.io depends on) — use --network none"
            )
        return self.iptables

    def _ensure(self, binary: str, rules: Sequence[Rule], *, docker_user: bool,
                listing: list[str] | None = None) -> None:
        listing = listing if listing is not None else self._listing(binary)
        if listing is None:
            raise PacketFilterUnavailable(f"{binary} -S failed: cannot read the packet filter")
        if docker_user and f"-N {DOCKER_USER}" not in listing:
            raise PacketFilterUnavailable(
                "Docker's DOCKER-USER chain is missing: the daemon runs with iptables disabled, so callbox "
                "cannot filter sandbox traffic; re-enable iptables in the daemon or use --network none"
            )
        for chain in sorted({INPUT_CHAIN} | ({FORWARD_CHAIN} if docker_user else set())):
            if f"-N {chain}" not in listing:
                self._run(binary, ["-N", chain])
        for rule in rules:
            line = _line(rule)
            if rule.first:  # a jump must come before anything that could accept the packet
                in_chain = [entry for entry in listing if entry.startswith(f"-A {rule.chain} ")]
                if in_chain[:1] == [line]:
                    continue
                if line in listing:
                    self._run(binary, ["-D", rule.chain, *rule.spec])
                self._run(binary, ["-I", rule.chain, "1", *rule.spec])
            elif line not in listing:
                self._run(binary, ["-A", rule.chain, *rule.spec])
            else:
                continue
            log.info("installed packet filter: %s %s %s", os.path.basename(binary), rule.chain, " ".join(rule.spec))

    def _listing(self, binary: str) -> list[str] | None:
        """The filter table as ``iptables -S`` prints it (one rule or chain per line, in
        order); None if the command fails (no such table or family on this host)."""
        done = self._run(binary, ["-S"], check=False)
        return done.stdout.splitlines() if done.returncode == 0 else None

    def _check(self, binary: str, rule: Rule) -> bool:
        return self._run(binary, ["-C", rule.chain, *rule.spec], check=False).returncode == 0

    @staticmethod
    def _works(binary: str) -> bool:
        try:
            return subprocess.run([binary, "-w", "-n", "-L", "INPUT"], capture_output=True,
                                  timeout=_TIMEOUT_S, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    @staticmethod
    def _run(binary: str, args: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
        try:
            done = subprocess.run([binary, "-w", *args], capture_output=True, text=True, timeout=_TIMEOUT_S,
                                  check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PacketFilterUnavailable(f"{binary} {' '.join(args)} failed: {exc}") from None
        if check and done.returncode != 0:
            raise PacketFilterUnavailable(
                f"{binary} {' '.join(args)} failed (exit {done.returncode}): {done.stderr.strip()[:300]}"
            )
        return done


def _line(rule: Rule) -> str:
    """``rule`` as ``iptables -S`` prints it."""
    return " ".join(("-A", rule.chain, *rule.spec))


def _find(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/local/sbin")
