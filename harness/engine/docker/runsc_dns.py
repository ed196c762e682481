"""Name resolution for a sandbox under gVisor (runtime ``runsc``) with network ``open``.

Docker points every container on a network of its own at its embedded DNS server,
127.0.0.11, which it serves inside the container's network namespace through a NAT rule of
the host's kernel. Under gVisor's network stack a tool's packets to 127.0.0.11 stay in
gVisor's own loopback and never reach it, so no name would resolve. Such a sandbox gets a
resolv.conf of its own instead (bound read-only at /etc/resolv.conf), naming the resolvers
the embedded server would forward to, picked as Docker picks them: the nameservers of the
engine host's resolv.conf (systemd-resolved's upstream file when that names only its local
stub) without the loopback ones, else Docker's public defaults. ``allowlist`` needs none of
this: its egress proxy resolves the names.
"""

from __future__ import annotations

import ipaddress
import logging
from pathlib import Path
from typing import Final

log = logging.getLogger("callbox.engine")

HOST_RESOLV_CONF: Final = Path("/etc/resolv.conf")
SYSTEMD_RESOLV_CONF: Final = Path("/run/systemd/resolve/resolv.conf")
"""systemd-resolved's list of the upstream servers (the host's file names only its stub)."""
DOCKER_DEFAULT_NAMESERVERS: Final = ("8.8.8.8", "8.8.4.4")
"""What Docker itself falls back to when the host names no resolver a container can reach."""
FILE_NAME: Final = "resolv.conf"
TARGET: Final = "/etc/resolv.conf"


def nameservers(text: str) -> list[str]:
    """The non-loopback ``nameserver`` addresses of a resolv.conf, in its order."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "nameserver":
            continue
        try:
            address = ipaddress.ip_address(fields[1].split("%")[0])
        except ValueError:
            continue
        if not address.is_loopback:
            found.append(fields[1])
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def host_nameservers(host: Path = HOST_RESOLV_CONF, systemd: Path = SYSTEMD_RESOLV_CONF) -> list[str]:
    """The resolvers a sandbox's lookups go to, picked as Docker picks them for a container."""
    return nameservers(_read(host)) or nameservers(_read(systemd)) or list(DOCKER_DEFAULT_NAMESERVERS)


def write_resolv_conf(directory: Path, *, engine_is_local: bool) -> Path:
    """Write the sandbox's resolv.conf into ``directory`` (its socket directory); its path."""
    if engine_is_local:
        servers = host_nameservers()
    else:
        servers = list(DOCKER_DEFAULT_NAMESERVERS)
        log.warning("the Docker engine is remote: a runsc sandbox with network open resolves names with %s "
                    "(this host's resolvers may not be the engine host's)", ", ".join(servers))
    path = directory / FILE_NAME
    path.write_text("".join(f"nameserver {server}\n" for server in servers))
    path.chmod(0o644)
    return path
