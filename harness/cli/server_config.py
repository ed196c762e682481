"""The server's configuration file: ``callbox serve --config FILE`` and ``callbox config check``.

One TOML file holds what ``callbox serve``'s flags hold: the doors and their addresses, TLS,
the token file, the policy, the audit store and the sandbox limits. It is validated by the
pydantic models below, which refuse unknown keys everywhere; every problem is a
:class:`ConfigError` (exit code 2) naming the file and the key's path. Relative paths are
taken against the file's directory. The referenced files are checked too: the policy is
loaded (so its own problems show up here), and the token file and TLS files must exist.

A flag given on the command line wins over the file's value for that setting.

Example::

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
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from harness.core.errors import UsageError
from harness.core.validation import parse_toml_model

DEFAULT_MAX_PER_CLIENT = 16
DEFAULT_MAX_SANDBOXES = 64


class ConfigError(UsageError):
    """The server configuration file is missing, unreadable or invalid (exit code 2)."""


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


class ServerConfig(_Section):
    """A ``callbox serve`` configuration file."""

    doors: Doors = Doors()
    tls: Tls = Tls()
    auth: Auth = Auth()
    policy: PolicyRef = PolicyRef()
    audit: Audit = Audit()
    limits: Limits = Limits()

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
        })

    def effective(self) -> dict[str, Any]:
        """The configuration with every default filled in, as plain JSON values."""
        return json.loads(self.model_dump_json())  # type: ignore[no-any-return]


def parse_config(text: str, *, source: str, base: Path) -> ServerConfig:
    """Validate configuration TOML; ``source`` names it in errors, ``base`` anchors paths."""
    config = parse_toml_model(text, ServerConfig, source=source, error=ConfigError, message=_problems_message)
    return config.anchored(base)


def _problems_message(source: str, problems: list[str]) -> str:
    head = f"{source}: " if len(problems) == 1 else f"{source} has {len(problems)} problems: "
    return head + "; ".join(problems)


def load_config(path: Path) -> ServerConfig:
    """Read, validate and check a configuration file (see the module's docstring)."""
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
    config = parse_config(text, source=source, base=path.resolve().parent)
    check_files(config, source)
    return config


def check_files(config: ServerConfig, source: str) -> None:
    """The files the configuration names exist (and the policy is valid); ConfigError if not."""
    from harness.core.errors import CallboxError
    from harness.core.policy import load_policy

    named = {"auth.token_file": config.auth.token_file, "tls.cert": config.tls.cert, "tls.key": config.tls.key}
    for key, path in named.items():
        if path is not None and not path.is_file():
            raise ConfigError(f"{source}: {key} = {str(path)!r} is not a file; fix the path")
    if (config.tls.cert is None) != (config.tls.key is None):
        raise ConfigError(f"{source}: tls.cert and tls.key go together; give both or neither")
    if config.doors.grpc is None and config.doors.mcp_http is None and config.doors.e2b is None:
        raise ConfigError(f"{source}: no door to serve; add [doors.grpc], [doors.mcp_http] and/or [doors.e2b] "
                          "with a listen address")
    if config.auth.token_file is not None:
        from harness.doors.grpc.tokens import load_token_file

        try:
            load_token_file(config.auth.token_file)
        except CallboxError as exc:
            raise ConfigError(f"{source}: auth.token_file: {exc.message}") from None
    try:
        load_policy(config.policy.file)
    except CallboxError as exc:
        raise ConfigError(f"{source}: policy.file: {exc.message}") from None


def render_toml(effective: dict[str, Any]) -> str:
    """The effective configuration as TOML a user can read and reuse (unset values are
    comments saying what applies instead)."""
    lines: list[str] = []

    def table(name: str, values: dict[str, Any]) -> None:
        lines.append(f"[{name}]")
        for key, value in values.items():
            if value is None:
                lines.append(f"# {key}: not set ({UNSET.get(f'{name}.{key}', 'not used')})")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
        lines.append("")

    for door, address in effective["doors"].items():
        if address is None:
            lines += [f"# [doors.{door}]: not served", ""]
        else:
            table(f"doors.{door}", address)
    for section in ("tls", "auth", "policy", "audit", "limits"):
        table(section, effective[section])
    return "\n".join(lines)


UNSET = {
    "tls.cert": "no TLS: TCP doors need tls.insecure = true",
    "tls.key": "no TLS",
    "auth.token_file": "$CALLBOX_TOKEN, $CALLBOX_TOKEN_FILE, or the default token file (made on first start)",
    "policy.file": "the packaged default policy",
    "audit.db": "$CALLBOX_AUDIT_DB or the state dir",
}
"""What applies when a path is not set, as ``callbox config check`` says it."""


SETTINGS = {
    "grpc": "doors.grpc.listen", "mcp_http": "doors.mcp_http.listen", "e2b": "doors.e2b.listen",
    "tls_cert": "tls.cert", "tls_key": "tls.key", "insecure": "tls.insecure", "token_file": "auth.token_file",
    "policy": "policy.file", "audit_db": "audit.db",
    "max_per_client": "limits.max_per_client", "max_sandboxes": "limits.max_sandboxes",
}
"""Each ``callbox serve`` setting (its flag's name in the parsed arguments) and its key in the file."""


def setting(config: ServerConfig, key: str) -> Any:
    """The value at dotted ``key`` (None where a table on the way is absent: a door not served)."""
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part, None) if value is not None else None
    return value


def apply_config(args: argparse.Namespace) -> None:
    """Fill the serve settings ``args`` leaves unset from ``--config``'s file, then the
    defaults; a flag given on the command line wins over the file (``--insecure`` can
    only turn it on)."""
    if args.config is not None:
        config = load_config(args.config)
        for name, key in SETTINGS.items():
            if getattr(args, name) in (None, False):
                setattr(args, name, setting(config, key))
    if args.max_per_client is None:
        args.max_per_client = DEFAULT_MAX_PER_CLIENT
    if args.max_sandboxes is None:
        args.max_sandboxes = DEFAULT_MAX_SANDBOXES
