"""How the harness reaches a Ray cluster: the ``[ray]`` table of a policy or server
configuration, and the ``--ray-*`` flags.

Nothing here imports ray: a configuration is checked on machines without it. The checks
are the ones a person can act on before any connection: the address is ``HOST:PORT`` (or
``auto``: the cluster this machine belongs to), and Ray's token file exists and is readable
by its owner only (``chmod 600``), because whoever holds the token can run any code on every
node. Without a token file the settings are refused unless ``allow_unauthenticated = true``
says so, and that loosening is reported by :meth:`RaySettings.loosened` (logged where the
settings are loaded and where the engine connects).

A relative ``token_file`` is taken against the directory of the file that names it
(:meth:`RaySettings.anchored`); it is checked once it is absolute.
"""

from __future__ import annotations

import ipaddress
import re
import stat
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = ["DEFAULT_GCS_PORT", "RaySettings", "check_token_file", "split_address"]

DEFAULT_GCS_PORT = 6379
"""The port ``ray start --head`` gives the GCS unless told otherwise."""

_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                       r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def split_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[V6]:PORT`` for an IPv6 address) as (host, port); ValueError naming
    the expected form otherwise."""
    if "://" in address:
        raise ValueError(f"{address!r} is a URL (ray:// is Ray Client's); callbox joins the cluster as a driver on "
                         f"one of its nodes: give the GCS's HOST:PORT (port {DEFAULT_GCS_PORT} by default)")
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT (the GCS address `ray start --head` prints, e.g. "
                         f"10.0.0.1:{DEFAULT_GCS_PORT}) or \"auto\"")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"{address!r}: port {port} is not between 1 and 65535")
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(f"{address!r}: {host} is not an IPv6 address") from None
        return host[1:-1], port
    if ":" in host:
        raise ValueError(f"{address!r}: write an IPv6 address in brackets, [ADDRESS]:PORT")
    if _HOSTNAME.match(host) is None:
        raise ValueError(f"{address!r}: {host!r} is not a host name or IPv4 address")
    return host, port


def check_token_file(path: Path) -> None:
    """A token file that exists, is a regular file, and is readable by its owner and by no
    one else; ValueError saying what to do otherwise."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ValueError(f"token_file {str(path)!r} does not exist; write the cluster's token there "
                         "(`ray get-auth-token` on the head prints it) with mode 0600") from None
    except OSError as exc:
        raise ValueError(f"token_file {str(path)!r} cannot be read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"token_file {str(path)!r} is not a regular file")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise ValueError(f"token_file {str(path)!r} is accessible by group or others (mode {mode:04o}); whoever "
                         f"reads it can run code on every node of the cluster: run `chmod 600 {path}`")
    if not mode & stat.S_IRUSR:
        raise ValueError(f"token_file {str(path)!r} is not readable by its owner (mode {mode:04o}); run "
                         f"`chmod 600 {path}`")


class RaySettings(BaseModel):
    """The Ray cluster the Ray engine places sandboxes on, and how this machine joins it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    address: str = Field(min_length=1, max_length=300)
    """The cluster's GCS address, ``HOST:PORT`` (what ``ray start --head`` prints), or
    ``auto``: the cluster this machine already belongs to (``ray start`` ran here)."""
    namespace: str = "callbox"
    """The Ray namespace this process joins the cluster in. The hosts (one per node) live in a
    namespace of their own per ``relay_port``, shared by every callbox process on the cluster."""
    token_file: Path | None = None
    """Ray's authentication token (what ``RAY_AUTH_TOKEN_PATH`` names), mode 0600: required
    unless ``allow_unauthenticated`` is set."""
    allow_unauthenticated: bool = False
    """Connect without a token. A Ray cluster runs any code its clients send, so a cluster
    without token authentication makes whoever reaches its GCS root on its nodes; a
    loosening, logged."""
    node_ip: str | None = None
    """This machine's address in the cluster (a Ray driver needs a raylet of its own here);
    absent: the address Ray picks (the one that routes to the GCS)."""
    relay_port: int = Field(default=7395, ge=1, le=65535)
    """The TCP port each node's relay listens on (on the node's address), through which the
    harness reaches the agents of that node's sandboxes."""
    image: str = Field(default="callbox-sandbox:latest", min_length=1, max_length=255, pattern=r"^\S+$")
    """The sandbox image every node must hold (checked, and sent where it is missing)."""

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if value != "auto":
            split_address(value)
        return value

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if _NAMESPACE.match(value) is None:
            raise ValueError(f"namespace {value!r}: 1 to 64 of letters, digits, '_', '.', '-', starting with a "
                             "letter or digit")
        return value

    @field_validator("node_ip")
    @classmethod
    def _node_ip(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                ipaddress.ip_address(value)
            except ValueError:
                raise ValueError(f"node_ip {value!r} is not an IP address") from None
        return value

    @model_validator(mode="after")
    def _authenticated(self) -> RaySettings:
        if self.token_file is None:
            if not self.allow_unauthenticated:
                raise ValueError("token_file is required: the cluster's token authentication (RAY_AUTH_MODE=token "
                                 "on every node) is what keeps others from running code on it; set token_file to "
                                 "the token's file (mode 0600), or allow_unauthenticated = true to connect without")
        elif self.token_file.is_absolute():  # a relative one is checked once anchored
            check_token_file(self.token_file)
        return self

    @property
    def gcs(self) -> tuple[str, int] | None:
        """The GCS's (host, port); None for ``auto``."""
        return None if self.address == "auto" else split_address(self.address)

    def anchored(self, base: Path) -> RaySettings:
        """These settings with a relative ``token_file`` taken against ``base`` (``~`` expanded),
        and checked: ValueError (``ray.token_file ...: what to do``) when the file is not fit."""
        if self.token_file is None:
            return self
        path = self.token_file.expanduser()
        if not path.is_absolute():
            path = base / path
        try:
            check_token_file(path)
        except ValueError as exc:
            raise ValueError(f"ray.{exc}") from None
        return self.model_copy(update={"token_file": path})

    def auth_environment(self) -> dict[str, str]:
        """What a Ray driver's environment needs for these settings (before ray reads it):
        token mode with the token file; without a token file, nothing."""
        if self.token_file is None:
            return {}
        return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token_file)}

    def loosened(self) -> list[str]:
        """One note per setting looser than the hardened default, naming its key."""
        if self.allow_unauthenticated and self.token_file is None:
            return ["ray.allow_unauthenticated = true: the harness connects to the Ray cluster without a token, "
                    "which works only with a cluster that has no token authentication, where whoever reaches its "
                    "GCS is root on its nodes (the default is a token_file)"]
        return []

    def describe(self) -> str:
        """One line for messages: the address, namespace and whether a token is used."""
        token = f"token {self.token_file}" if self.token_file is not None else "no token"
        return f"Ray cluster {self.address} (namespace {self.namespace}, {token})"
