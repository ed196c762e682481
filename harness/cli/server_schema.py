"""The schema of ``callbox serve``'s configuration file: one pydantic model per table, each
refusing unknown keys, and :func:`parse_config`, which reads TOML text against them (every
problem a :class:`ConfigError` naming the key's path) and anchors the file's relative paths.

What the file means beside the flags, and whether a server can run it, is judged above this
module (:mod:`harness.cli.server_check`); :mod:`harness.cli.server_config` is the file as a
whole (an example, reading, rendering) and what other modules import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.core.errors import ErrorCode, UsageError
from harness.core.policy import RuntimeName
from harness.core.sandbox_settings import PoolSettings
from harness.core.units import ByteSize
from harness.core.validation import parse_toml_model
from harness.doors.quotas import Quotas
from harness.engine.select import EngineChoice, EngineName, RayTable, choice_of

__all__ = ["DEFAULT_MAX_PER_CLIENT", "DEFAULT_MAX_SANDBOXES", "ConfigError", "Log", "ServerConfig", "parse_config"]


class ConfigError(UsageError):
    """The server configuration file is missing, unreadable or invalid, or the server cannot
    run what it and the flags say (exit code 2)."""

    code = ErrorCode.INVALID_CONFIG


DEFAULT_MAX_PER_CLIENT = 16
DEFAULT_MAX_SANDBOXES = 64


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DoorAddress(_Section):
    listen: str = Field(min_length=0, max_length=4096)
    """Where the door listens: ``HOST:PORT`` (port 0: a free one), and for gRPC also
    ``unix:PATH`` or ``""`` (the default unix socket)."""


class E2bDoor(DoorAddress):
    domain: str | None = Field(default=None, min_length=1, max_length=253)
    """The sandbox domain the E2B API names in its answers (``--e2b-domain``): a name whose
    every subdomain leads to this server (wildcard DNS, and a TLS certificate for
    ``*.DOMAIN``), with ``:PORT`` when that is not 443. The e2b SDK then reaches envd at
    ``https://49983-SANDBOXID.DOMAIN`` and ``get_host(port)`` is ``PORT-SANDBOXID.DOMAIN``.
    Absent: a client that reached the server as ``api.DOMAIN`` is answered with ``DOMAIN``,
    any other with a name that never resolves (see the E2B door's page)."""


class Doors(_Section):
    grpc: DoorAddress | None = None
    """The ``harness.v1`` gRPC executor (``--grpc``)."""
    mcp_http: DoorAddress | None = None
    """The MCP server over streamable HTTP (``--mcp-http``)."""
    e2b: E2bDoor | None = None
    """The E2B API (control plane and envd) for the e2b SDK (``--e2b``)."""


class Tls(_Section):
    cert: Path | None = None
    """TLS certificate (PEM) for gRPC over TCP and the E2B API (``--tls-cert``)."""
    key: Path | None = None
    """Its private key (PEM) (``--tls-key``)."""
    insecure: bool = False
    """Allow gRPC over TCP, and MCP over HTTP or the E2B API on a non-loopback address,
    without TLS (``--insecure``)."""


class Auth(_Section):
    token_file: Path | None = None
    """Client tokens, one ``NAME:TOKEN`` per line, mode 0600 (``--token-file``): gRPC bearer
    tokens and E2B API keys."""


class PolicyRef(_Section):
    file: Path | None = None
    """The policy every door serves with (``--policy``); absent: the packaged default."""


class Audit(_Section):
    db: Path | None = None
    """The audit store (``--audit-db``); absent: ``$CALLBOX_AUDIT_DB`` or the state dir."""


class Limits(_Section):
    max_sandboxes: int = Field(default=DEFAULT_MAX_SANDBOXES, ge=1)
    """Live sandboxes in total, over every client (``--max-sandboxes``)."""
    max_per_client: int = Field(default=DEFAULT_MAX_PER_CLIENT, ge=1)
    """Live sandboxes per client (``--max-per-client``): a hard limit when set; left out, a
    work-conserving share of the same default (a client past it is held back only while
    another client waits to start a sandbox, up to ``max_sandboxes``)."""


class Http(_Section):
    listen: str = Field(min_length=1, max_length=4096)
    """``HOST:PORT`` of the HTTP endpoint (``--http``): ``/metrics`` (Prometheus text, no
    token), ``/healthz`` and the web console under ``/`` (a token of the token file). A
    non-loopback host needs TLS or ``tls.insecure``."""


class Service(_Section):
    keep_sandboxes: bool = True
    """On stop, leave the live sandboxes running (their expiry still bounds them) and
    re-adopt them, with their runs and pending approvals, at the next start on the same
    audit store. ``false``: every sandbox is destroyed when the server stops."""


class Log(_Section):
    format: Literal["text", "json"] = "text"
    """``json``: one JSON object a line (time, level, logger, message, and the fields a
    record carries); ``text``: plain lines."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The least severe level written."""
    file: Path | None = None
    """Write to this file, rotated by size; absent: standard error (journald under systemd)."""
    max_bytes: ByteSize = Field(default=10 << 20, ge=4096)
    """With ``file``: its size at which it is rotated (bytes, or a size such as ``"10m"``)."""
    backups: int = Field(default=5, ge=0, le=1000)
    """With ``file``: how many rotated files are kept (``FILE.1`` ... ``FILE.N``)."""


class Telemetry(_Section):
    otlp_endpoint: str | None = Field(default=None, pattern=r"^https?://")
    """OTLP/HTTP traces endpoint (``http://HOST:4318/v1/traces``); absent: no traces."""
    service_name: str = Field(default="callbox", min_length=1, max_length=255)
    """The ``service.name`` the traces carry."""


class Runtime(_Section):
    default: RuntimeName | None = None
    """The OCI runtime of the doors' sandboxes (``runc`` or ``runsc``); absent: the
    policy's ``[sandbox] runtime``. A policy's ``[runtime] require`` still applies."""


class Profile(_Section):
    policy: Path | None = None
    """The policy the profile's clients are served with; absent: the server's policy."""
    quotas: Quotas = Quotas()
    """Quotas over ``[quotas]``, key by key."""


class Client(_Section):
    profile: str | None = Field(default=None, min_length=1, max_length=64)
    """A ``[profiles.NAME]`` of this file."""
    quotas: Quotas = Quotas()
    """The client's own quotas, over its profile's and ``[quotas]``, key by key."""


class ServerConfig(_Section):
    """A ``callbox serve`` configuration file."""

    doors: Doors = Doors()
    """``[doors.NAME]``: the doors served and where each listens; the file must name at least one."""
    tls: Tls = Tls()
    """``[tls]``: the certificate and key of the TCP doors, or ``insecure``."""
    auth: Auth = Auth()
    """``[auth]``: the clients' tokens."""
    policy: PolicyRef = PolicyRef()
    """``[policy]``: the policy file the doors serve with."""
    audit: Audit = Audit()
    """``[audit]``: where the audit store is."""
    limits: Limits = Limits()
    """``[limits]``: how many sandboxes may live at once, in all and per client."""
    http: Http | None = None
    """``[http]``: metrics, health and the console; absent: not served."""
    service: Service = Service()
    """``[service]``: what a stop and a restart do with the live sandboxes."""
    log: Log = Log()
    """``[log]``: the server's log: format, level, and a file instead of standard error."""
    telemetry: Telemetry = Telemetry()
    """``[telemetry]``: traces of each call, sent over OTLP/HTTP."""
    pool: PoolSettings | None = None
    """``[pool]``: pre-started sandboxes, replacing the served policy's ``[pool]`` table."""
    runtime: Runtime = Runtime()
    """``[runtime]``: the OCI runtime of the doors' sandboxes."""
    quotas: Quotas = Quotas()
    """``[quotas]``: every client's quotas (see :mod:`harness.doors.quotas`)."""
    profiles: dict[str, Profile] = Field(default_factory=dict)
    """``[profiles.NAME]``: a policy and quotas that clients are mapped to."""
    clients: dict[str, Client] = Field(default_factory=dict)
    """``[clients.NAME]``: per client name of the token file, its profile and quotas."""
    engine: EngineName | None = None
    """Where the doors' sandboxes run (``--engine``): ``docker`` (this machine) or ``ray``
    (``[ray]``); absent: the served policy's ``engine``, else docker."""
    ray: RayTable = None
    """``[ray]``: the Ray cluster of ``engine = "ray"`` (:mod:`harness.engine.ray.settings`)."""

    @model_validator(mode="after")
    def _profiles_exist(self) -> ServerConfig:
        for name, client in self.clients.items():
            if client.profile is not None and client.profile not in self.profiles:
                known = ", ".join(sorted(self.profiles)) or "none is defined"
                raise ValueError(f"clients.{name}.profile: no [profiles.{client.profile}] ({known}); "
                                 "add that table or fix the name")
        return self

    def client_quotas(self, client: str) -> Quotas:
        """``client``'s quotas: its own over its profile's over ``[quotas]``, and
        ``limits.max_per_client`` where ``live_sandboxes`` is left unset, if the file sets it
        (left out, it is the executor's work-conserving share, not a quota)."""
        entry = self.clients.get(client, Client())
        quotas = self.quotas
        if entry.profile is not None:
            quotas = self.profiles[entry.profile].quotas.over(quotas)
        quotas = entry.quotas.over(quotas)
        if quotas.live_sandboxes is None and "max_per_client" in self.limits.model_fields_set:
            quotas = quotas.model_copy(update={"live_sandboxes": self.limits.max_per_client})
        return quotas

    def anchored(self, base: Path) -> ServerConfig:
        """Every relative path taken against ``base`` (the file's directory), ``~`` expanded."""

        def anchor(path: Path | None) -> Path | None:
            if path is None:
                return None
            path = path.expanduser()
            return path if path.is_absolute() else base / path

        return self.model_copy(update={
            "tls": self.tls.model_copy(update={"cert": anchor(self.tls.cert), "key": anchor(self.tls.key)}),
            "auth": self.auth.model_copy(update={"token_file": anchor(self.auth.token_file)}),
            "policy": self.policy.model_copy(update={"file": anchor(self.policy.file)}),
            "audit": self.audit.model_copy(update={"db": anchor(self.audit.db)}),
            "log": self.log.model_copy(update={"file": anchor(self.log.file)}),
            "profiles": {name: profile.model_copy(update={"policy": anchor(profile.policy)})
                         for name, profile in self.profiles.items()},
            "ray": self.ray.anchored(base) if self.ray is not None else None,
        })

    def engine_choice(self) -> EngineChoice | None:
        """The engine this file chooses (None: it sets no ``engine``)."""
        return choice_of(self.engine, self.ray)

    def effective(self) -> dict[str, Any]:
        """The configuration with every default filled in, as plain JSON values."""
        return json.loads(self.model_dump_json())  # type: ignore[no-any-return]


def parse_config(text: str, *, source: str, base: Path) -> ServerConfig:
    """Validate configuration TOML; ``source`` names it in errors, ``base`` anchors paths."""
    config = parse_toml_model(text, ServerConfig, source=source, error=ConfigError, message=_problems_message)
    try:
        return config.anchored(base)
    except ValueError as exc:  # the [ray] token file, once anchored
        raise ConfigError(f"{source}: {exc}") from None


def _problems_message(source: str, problems: list[str]) -> str:
    head = f"{source}: " if len(problems) == 1 else f"{source} has {len(problems)} problems: "
    return head + "; ".join(problems)
