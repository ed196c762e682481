"""The server's configuration file: ``callbox serve --config FILE`` and ``callbox config check``.

One TOML file holds what ``callbox serve``'s flags hold: the doors and their addresses, TLS,
the token file, the policy, the audit store and the sandbox limits. It is validated by the
pydantic models of :mod:`harness.cli.server_schema` (re-exported here), which refuse unknown
keys everywhere; every problem is a :class:`ConfigError` (exit code 2) naming the file and
the key's path. Relative paths are taken against the file's directory.

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
from typing import Any

from harness.cli.server_check import Checked, Origin, check_settings, served_policy
from harness.cli.server_schema import (
    DEFAULT_MAX_PER_CLIENT,
    DEFAULT_MAX_SANDBOXES,
    Audit,
    Auth,
    Client,
    ConfigError,
    DoorAddress,
    Doors,
    Http,
    Limits,
    Log,
    PolicyRef,
    Profile,
    Runtime,
    ServerConfig,
    Service,
    Telemetry,
    Tls,
    parse_config,
)
from harness.core.units import format_size
from harness.engine.select import EngineChoice, choice_of

__all__ = [  # the schema's names too, so that importers need not know where each one lives
    "DEFAULT_MAX_PER_CLIENT", "DEFAULT_MAX_SANDBOXES", "SETTINGS", "Audit", "Auth", "Checked", "Client", "ConfigError",
    "DoorAddress", "Doors", "Http", "Limits", "Log", "PolicyRef", "Profile", "Runtime", "ServerConfig", "Service",
    "Telemetry", "Tls", "apply_config", "check_file", "engine_notes", "load_config", "parse_config", "read_config",
    "render_toml", "serve_namespace", "served_policy", "setting",
]

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
    "e2b_domain": "doors.e2b.domain",
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
    # An explicit per-client limit (the flag, or the key in the file) is hard; the default is a share.
    args.max_per_client_explicit = args.max_per_client is not None or (
        config is not None and "max_per_client" in config.limits.model_fields_set)
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
