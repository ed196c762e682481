"""Whether a door's address can be listened on, and who holds it when it cannot.

Used by ``callbox doctor --config``: a TCP address is tried the way the doors bind it
(``SO_REUSEADDR``, no ``SO_REUSEPORT``, closed again at once); a unix socket path is looked
at without touching it (``callbox serve`` removes a stale socket and refuses a live one).
When something listens there already, the process is looked up by its socket (``psutil``:
this user's processes, or every one for root) and said to be a running ``callbox serve``
when its command line is one.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

SUN_PATH_MAX = 107
"""The longest unix socket path the kernel takes (bytes)."""


@dataclass(frozen=True)
class Holder:
    """A process listening where a door would."""

    pid: int | None
    """None: the socket's owner is not visible to this user."""
    command: str = ""

    @property
    def is_callbox_serve(self) -> bool:
        words = self.command.split()
        named = any(os.path.basename(w) == "callbox" or w == "harness.cli.main" for w in words)
        return named and "serve" in words

    def describe(self) -> str:
        if self.pid is None:
            if os.geteuid() == 0:
                return "a process outside this PID namespace (another container's, or the host's)"
            return "a process this user cannot see (run doctor as root, or `sudo ss -ltxp`, to name it)"
        return f"pid {self.pid}: {self.command or 'its command line is not readable'}"


@dataclass(frozen=True)
class Bindable:
    """The outcome of trying an address: free (``problem`` None), or why not and who holds it."""

    problem: str | None = None
    in_use: bool = False
    holder: Holder | None = None


def _command(pid: int) -> str:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        return ""


def tcp_holder(port: int) -> Holder:
    """Who listens on TCP ``port`` (any address), as far as this user can see."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return Holder(None)
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid is not None:
            return Holder(conn.pid, _command(conn.pid))
    return Holder(None)


def unix_holder(path: Path) -> Holder:
    """Who listens on the unix socket at ``path``, as far as this user can see."""
    import psutil

    try:
        connections = psutil.net_connections(kind="unix")
    except (psutil.Error, OSError):
        return Holder(None)
    for conn in connections:
        if str(conn.laddr) == str(path) and conn.pid is not None:  # a unix socket's laddr is its path
            return Holder(conn.pid, _command(conn.pid))
    return Holder(None)


def try_tcp(host: str, port: int) -> Bindable:
    """Bind ``host:port`` as the doors do, and let it go again."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    family = socket.AF_INET6 if ":" in bare else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        return Bindable(f"cannot make a socket for {host}: {exc.strerror or exc}")
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bare, port))
    except OSError as exc:
        return _bind_problem(exc, host, port)
    finally:
        sock.close()
    return Bindable()


def _bind_problem(exc: OSError, host: str, port: int) -> Bindable:
    if exc.errno == errno.EADDRINUSE:
        return Bindable(f"port {port} is in use", in_use=True, holder=tcp_holder(port))
    if exc.errno == errno.EACCES:
        return Bindable(f"port {port} is below 1024, which needs root or CAP_NET_BIND_SERVICE; choose a port of "
                        "1024 or more")
    if exc.errno == errno.EADDRNOTAVAIL:
        return Bindable(f"{host} is not an address of this host; use one of its addresses, 127.0.0.1, or 0.0.0.0 "
                        "for every interface")
    if isinstance(exc, socket.gaierror):
        return Bindable(f"host {host!r} does not resolve ({exc.strerror or exc}); fix the name or use an address")
    return Bindable(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def try_unix(path: Path) -> Bindable:
    """Whether ``callbox serve`` could listen on the unix socket ``path`` (nothing is changed)."""
    if len(str(path).encode()) > SUN_PATH_MAX:
        return Bindable(f"the socket path is longer than {SUN_PATH_MAX} bytes; choose a shorter one")
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return _creatable(path)
    except OSError as exc:
        return Bindable(f"{path} cannot be looked at: {exc.strerror or exc}")
    if not stat.S_ISSOCK(mode):
        return Bindable(f"{path} exists and is not a socket; remove it or choose another path")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return _creatable(path, stale=True)
    finally:
        probe.close()
    return Bindable("something listens on it", in_use=True, holder=unix_holder(path))


def _creatable(path: Path, stale: bool = False) -> Bindable:
    """A socket can be made at ``path``: its directory is writable, or can be made."""
    directory = path.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent
    if not directory.is_dir():
        return Bindable(f"{directory} is not a directory; fix the socket path")
    if (problem := unwritable(directory)) is not None:
        what = "remove the stale socket there (nobody listens on it)" if stale else "create the socket"
        return Bindable(f"cannot {what}: {problem}")
    return Bindable()


def unwritable(directory: Path) -> str | None:
    """Why this user cannot make a file in the existing ``directory`` (None: it can). A file
    is made and removed again: permission bits do not tell for root or a read-only mount."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".callbox-doctor-", dir=directory)
    except OSError as exc:
        return f"this user cannot make files in {directory} ({exc.strerror or exc})"
    os.close(fd)
    os.unlink(name)
    return None
