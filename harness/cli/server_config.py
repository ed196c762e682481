"""The server's configuration file: ``callbox serve --config FILE`` and ``callbox config check``.

One TOML file holds what ``callbox serve``'s flags hold: the doors and their addresses, TLS,
the token file, the policy, the audit store and the sandbox limits. It is validated by the
pydantic models below, which refuse unknown keys everywhere; every problem is a
:class:`ConfigError` (exit code 2) naming the file and the key's path. Relative paths are
taken against the file's directory.

A flag given on the command line wins over the file's value for that setting. What the
flags and the file say together is then judged by :mod:`harness.cli.server_check`, the one
judge of ``callbox serve`` (at start and on SIGHUP) and ``callbox config check``: the doors'
addresses against TLS, the files named (the policies loaded, so their own problems show up
here), the warm pool against the limits. :func:`apply_config` merges and judges;
:func:`check_file` and :func:`load_config` judge a file as ``callbox serve --config FILE``
would; :func:`read_config` reads one against the schema only.

``callbox config check`` renders the effective configuration as TOML (:func:`render_toml`)
with sizes as a user writes them (``"16g"``) and durations with their unit.

Example::

    engine = "ray"                   # where the sandboxes run; absent: the policy's engine, else docker

    [doors.grpc]
    listen = "0.0.0.0:7443"          # or "unix:/run/callbox/grpc.sock"; "" for the default socket

    [doors.e2b]
    listen = "127.0.0.1:49999"

    [tls]
    cert = "tls/server.crt"
    key = "tls/server.key"

    [auth]
    token_file = "tokens"            # NAME:TOKEN per line, mode 0600

    [policy]
    file = "policy.toml"             # absent: the packaged default policy

    [audit]
    db = "/var/lib/callbox/audit.db"

    [limits]
    max_sandboxes = 64
    max_per_client = 16

    [http]
    listen = "127.0.0.1:9464"        # /metrics, /healthz and the console

    [service]
    keep_sandboxes = true            # a restart re-adopts live sandboxes (the default here)

    [log]
    format = "json"                  # or "text"; to stderr (journald) unless file is set
    # file = "/var/log/callbox/callbox.log"

    [telemetry]
    # otlp_endpoint = "http://127.0.0.1:4318/v1/traces"   # traces off when unset

    [pool]                           # replaces the policy's [pool] for the doors' sandboxes
    size = 4

    [runtime]
    default = "runc"                 # the doors' sandboxes run under this unless the policy asks more

    [quotas]                         # every client's, unless its profile or its own table says otherwise
    calls_per_minute = 600
    memory = "16g"

    [profiles.ci]
    policy = "ci-policy.toml"        # the policy of the clients with this profile
    [profiles.ci.quotas]
    live_sandboxes = 4

    [clients.builder]                # a client name of the token file
    profile = "ci"
    [clients.builder.quotas]
    sandboxes_per_hour = 100

    [ray]                            # the cluster of engine = "ray" (only with it)
    address = "10.0.0.1:6379"        # the head's GCS
    token_file = "ray-token"         # the cluster's token, mode 0600

The server's ``engine`` (and ``--engine``) wins over its policies': every door and every
profile is served on one engine (:func:`served_policy`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.cli.server_check import Checked, ConfigError, Origin, check_settings, served_policy
from harness.core.policy import RuntimeName
from harness.core.sandbox_settings import PoolSettings
from harness.core.units import ByteSize, format_size
from harness.core.validation import parse_toml_model
from harness.doors.quotas import Quotas
from harness.engine.select import EngineChoice, EngineName, RayTable, choice_of

__all__ = ["DEFAULT_MAX_PER_CLIENT", "DEFAULT_MAX_SANDBOXES", "SETTINGS", "Checked", "ConfigError", "ServerConfig",
           "apply_config", "check_file", "engine_notes", "load_config", "parse_config", "read_config", "render_toml",
           "serve_namespace", "served_policy", "setting"]

DEFAULT_MAX_PER_CLIENT = 16
DEFAULT_MAX_SANDBOXES = 64


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DoorAddress(_Section):
    listen: str = Field(min_length=0, max_length=4096)
    """Where the door listens: ``HOST:PORT`` (port 0: a free one), and for gRPC also
    ``unix:PATH`` or ``""`` (the default unix socket)."""


class Doors(_Section):
    grpc: DoorAddress | None = None
    """The ``harness.v1`` gRPC executor (``--grpc``)."""
    mcp_http: DoorAddress | None = None
    """The MCP server over streamable HTTP (``--mcp-http``)."""
    e2b: DoorAddress | None = None
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
    """Live sandboxes per client (``--max-per-client``)."""


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
    tls: Tls = Tls()
    auth: Auth = Auth()
    policy: PolicyRef = PolicyRef()
    audit: Audit = Audit()
    limits: Limits = Limits()
    http: Http | None = None
    """``[http]``: metrics, health and the console; absent: not served."""
    service: Service = Service()
    log: Log = Log()
    telemetry: Telemetry = Telemetry()
    pool: PoolSettings | None = None
    """``[pool]``: pre-started sandboxes, replacing the served policy's ``[pool]`` table."""
    runtime: Runtime = Runtime()
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
        ``limits.max_per_client`` where ``live_sandboxes`` is left unset."""
        entry = self.clients.get(client, Client())
        quotas = self.quotas
        if entry.profile is not None:
            quotas = self.profiles[entry.profile].quotas.over(quotas)
        quotas = entry.quotas.over(quotas)
        if quotas.live_sandboxes is None:
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


def read_config(path: Path) -> ServerConfig:
    """Read and validate the file at ``path`` against the schema, its paths anchored; the
    files it names and the doors it asks for are judged by :func:`apply_config`."""
    source = f"config file {path}"
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{source} does not exist; pass an existing TOML file to --config") from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a directory; pass the configuration's TOML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{source} is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"{source} cannot be read: {exc.strerror or exc}") from None
    return parse_config(text, source=source, base=path.resolve().parent)


def check_file(path: Path) -> Checked:
    """Judge the file at ``path`` exactly as ``callbox serve --config PATH`` (without other
    flags, in this environment) would at start: ConfigError when it would refuse it."""
    return apply_config(serve_namespace(path))


def load_config(path: Path) -> ServerConfig:
    """Read, validate and check a configuration file as :func:`check_file` does; the file."""
    config = check_file(path).config
    assert config is not None
    return config


def engine_notes(config: ServerConfig) -> list[str]:
    """What ``callbox config check`` says of the engine when the policies name one too: which
    engine the doors run on and whose setting that is (the file's wins over its policies')."""
    own = config.engine_choice()
    served = own
    notes: list[str] = []
    policies = {"policy.file": config.policy.file}
    policies.update({f"profiles.{name}.policy": profile.policy for name, profile in config.profiles.items()
                     if profile.policy is not None})
    for key, path in policies.items():
        theirs = _policy_engine(path)
        if theirs is None:
            continue
        if key == "policy.file" and own is None:
            served = theirs
            notes.append(f"engine: not set here; {key} sets engine = \"{theirs.engine}\", so the doors run on "
                         f"{theirs.describe()}")
        elif served is not None and theirs != served:
            notes.append(f"engine: {key} sets engine = \"{theirs.engine}\" ({theirs.describe()}), but a server "
                         f"runs every door and profile on one engine: {served.describe()}, set by "
                         f"{'this file' if served is own else 'policy.file'}, wins")
    return notes


def _policy_engine(path: Path | None) -> EngineChoice | None:
    """The engine the policy at ``path`` names (read again, quietly: it was checked already)."""
    from harness.core.policy import parse_policy

    if path is None:
        return None
    policy = parse_policy(path.read_bytes(), source=f"policy file {path}", base_dir=path.parent)
    return choice_of(policy.engine, policy.ray)


def render_toml(effective: dict[str, Any]) -> str:
    """The effective configuration as TOML a user can read and reuse (unset values are
    comments saying what applies instead)."""
    lines: list[str] = []

    def table(name: str, values: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        nested = {key: value for key, value in values.items() if isinstance(value, dict)}
        for key, value in values.items():
            if key in nested:
                continue
            if value is None:
                lines.append(f"# {key}: not set ({_unset(f'{name}.{key}')})")
            else:
                lines.append(f"{key} = {_shown(f'{name}.{key}', value)}")
        lines.append("")
        for key, value in nested.items():
            table(f"{name}.{key}", value)

    for key in TOP_LEVEL:  # a top-level key comes before every table (unset: said beside [ray])
        if effective.get(key) is not None:
            lines += [f"{key} = {json.dumps(effective[key])}", ""]
    for door, address in effective["doors"].items():
        if address is None:
            lines += [f"# [doors.{door}]: not served", ""]
        else:
            table(f"doors.{door}", address)
    for section, value in effective.items():
        if section == "ray":
            lines += [f"# {key}: not set ({_unset(key)})" for key in TOP_LEVEL if effective.get(key) is None]
        if section == "doors" or section in TOP_LEVEL:
            continue
        if section in ("profiles", "clients"):
            for name, entry in value.items():
                table(f"{section}.{name}", entry)
            if not value:
                lines += [f"# [{section}.NAME]: none", ""]
        elif value is None:
            lines += [f"# [{section}]: {_unset(section)}", ""]
        else:
            table(section, value)
    return "\n".join(lines)


UNSET = {
    "tls.cert": "no TLS: TCP doors need tls.insecure = true",
    "tls.key": "no TLS",
    "auth.token_file": "$CALLBOX_TOKEN, $CALLBOX_TOKEN_FILE, or the default token file (made on first start)",
    "policy.file": "the packaged default policy",
    "audit.db": "$CALLBOX_AUDIT_DB or the state dir",
    "http": "not served: no /metrics, /healthz or console",
    "pool": "the policy's [pool]",
    "log.file": "standard error",
    "telemetry.otlp_endpoint": "no traces",
    "runtime.default": "the policy's [sandbox] runtime",
    "quotas.live_sandboxes": "limits.max_per_client",
    "pool.max": "pool.size",
    "profiles.*.policy": "the server's policy",
    "profiles.*.quotas.*": "[quotas]",
    "clients.*.profile": "none: the server's policy and [quotas]",
    "clients.*.quotas.*": "its profile's, else [quotas]",
    "engine": "the policy's engine, else \"docker\": this machine's Docker engine",
    "ray": "no Ray cluster (it goes with engine = \"ray\")",
    "ray.token_file": "none: ray.allow_unauthenticated",
    "ray.node_ip": "the address Ray picks, the one that routes to the GCS",
}
"""What applies when a key is not set, as ``callbox config check`` says it (``*``: any name)."""

SIZES = frozenset({"log.max_bytes", "quotas.memory", "profiles.*.quotas.memory", "clients.*.quotas.memory"})
"""Keys holding a number of bytes: shown as a size (``"16g"``), as a user writes them."""
DURATIONS = {"pool.pause_s": "seconds"}
"""Keys holding a duration, and its unit (said beside the value)."""


def _shown(key: str, value: Any) -> str:
    """The TOML text of ``value`` at dotted ``key``: a size as ``"512m"`` (bytes that are no
    whole number of KiB as ``"1500b"``), a duration with its unit beside it."""
    pattern = _pattern(key)
    if pattern in SIZES and isinstance(value, int):
        size = format_size(value)
        return json.dumps(size if not size.isdigit() else f"{size}b")
    if pattern in DURATIONS:
        return f"{json.dumps(value)}  # {DURATIONS[pattern]}"
    return json.dumps(value)


TOP_LEVEL = ("engine",)
"""Keys of the file outside any table."""


def _unset(key: str) -> str:
    """What :data:`UNSET` says of dotted ``key`` (a name under profiles or clients matches
    ``*``; a quota key there too); unlisted keys are limits: "no limit"."""
    parts = _pattern(key).split(".")
    if len(parts) > 3 and parts[0] in ("profiles", "clients") and parts[2] == "quotas":
        parts[3] = "*"
    return UNSET.get(".".join(parts), "no limit")


def _pattern(key: str) -> str:
    """Dotted ``key`` with the name under profiles or clients as ``*``."""
    parts = key.split(".")
    if parts[0] in ("profiles", "clients") and len(parts) > 1:
        parts[1] = "*"
    return ".".join(parts)


SETTINGS = {
    "grpc": "doors.grpc.listen", "mcp_http": "doors.mcp_http.listen", "e2b": "doors.e2b.listen",
    "tls_cert": "tls.cert", "tls_key": "tls.key", "insecure": "tls.insecure", "token_file": "auth.token_file",
    "policy": "policy.file", "audit_db": "audit.db",
    "max_per_client": "limits.max_per_client", "max_sandboxes": "limits.max_sandboxes",
    "http": "http.listen",
}
"""Each ``callbox serve`` setting (its flag's name in the parsed arguments) and its key in the file."""


def setting(config: ServerConfig, key: str) -> Any:
    """The value at dotted ``key`` (None where a table on the way is absent: a door not served)."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part, None) if value is not None else None
    return value


def serve_namespace(config: Path | None = None) -> argparse.Namespace:
    """The settings of ``callbox serve`` given no flag but ``--config config``."""
    values: dict[str, object] = {name: None for name in SETTINGS}
    values.update({"insecure": False, "config": config, "engine": None, "ray_address": None, "ray_token_file": None})
    return argparse.Namespace(**values)


def key_label(key: str) -> str:
    """A dotted key as an error names it: ``tls.cert`` -> ``[tls] cert``."""
    table, _, name = key.rpartition(".")
    return f"[{table}] {name}"


def apply_config(args: argparse.Namespace) -> Checked:
    """Fill the serve settings ``args`` leaves unset from ``--config``'s file, then the
    defaults (a flag given on the command line wins over the file; ``--insecure`` can only
    turn it on), and judge the result (:func:`~harness.cli.server_check.check_settings`);
    ConfigError when ``callbox serve`` would refuse it. ``args`` gains ``server_config`` (the
    file or None), ``origins`` (each setting's :class:`~harness.cli.server_check.Origin`)
    and ``checked`` (the verdict, also returned)."""
    config = read_config(args.config) if args.config is not None else None
    args.server_config = config
    origins: dict[str, Origin] = {}
    for name, key in SETTINGS.items():
        if config is None or getattr(args, name) not in (None, False):
            origins[name] = Origin("--" + name.replace("_", "-"))
        else:
            setattr(args, name, setting(config, key))
            origins[name] = Origin(key_label(key), "key")
    if args.max_per_client is None:
        args.max_per_client = DEFAULT_MAX_PER_CLIENT
    if args.max_sandboxes is None:
        args.max_sandboxes = DEFAULT_MAX_SANDBOXES
    checked = check_settings(args, origins, source=f"config file {args.config}" if config is not None else None)
    args.origins, args.checked = origins, checked
    return checked
