"""Secrets a sandbox uses but never holds: ``[[secret]]`` in the policy, ``SandboxSpec.secrets``.

Each entry names the environment variable the sandbox's programs read (``name``), where the
real value comes from on the harness's host (``env``: a variable of the harness process, or
``file``: a file read when the sandbox starts), the hosts it may go to (``hosts``: the
allowlist's syntax, names only: ``api.example.com``, ``api.example.com:8443``,
``*.example.com``; no port means 80 and 443), and where it goes in a request: ``header =
"Authorization: Bearer {value}"`` (a header name, a colon, a value template with ``{value}``
once) or ``basic_auth = "USER"`` (``Authorization: Basic`` of ``USER:value``; ``""`` keeps
the user the client sends).

In the sandbox ``name`` holds only a placeholder, random for each sandbox
(:func:`new_placeholder`). Its egress proxy, given the real value, puts it in where a
request to one of ``hosts`` carries the placeholder in that header (see
``sandbox/egress_secrets.py``). A spec holds only these definitions, never a value:
:meth:`SecretSpec.read` reads the value when a sandbox starts.
"""

from __future__ import annotations

import os
import re
import secrets as random
from collections.abc import Mapping
from pathlib import Path

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from harness.core.errors import CallboxError, ErrorCode

__all__ = ["PLACEHOLDER_PREFIX", "SecretSpec", "SecretUnavailable", "new_placeholder", "read_source",
           "redaction_pairs", "secrets_problem"]

PLACEHOLDER_PREFIX = "CALLBOX_PLACEHOLDER_"
"""Every placeholder starts so: ``CALLBOX_PLACEHOLDER_<name>_<24 random hex digits>``."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HEADER = re.compile(r"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*)")
_FORBIDDEN_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "te", "upgrade",
                                "proxy-authorization", "proxy-connection", "keep-alive"})


class SecretUnavailable(CallboxError):
    """A secret's value cannot be read (its variable is unset, its file unreadable)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, code=ErrorCode.INVALID_CONFIG)


def new_placeholder(name: str) -> str:
    """A fresh placeholder for the secret ``name``: recognisable, random, URL- and header-safe."""
    return f"{PLACEHOLDER_PREFIX}{name}_{random.token_hex(12)}"


class SecretSpec(BaseModel):
    """One ``[[secret]]``: its definition, never its value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """The environment variable of the sandbox's programs; it holds the placeholder."""
    env: str | None = None
    """The variable of the harness process holding the value (read when a sandbox starts)."""
    file: Path | None = None
    """Or a file on the harness's host holding it (one trailing newline is dropped)."""
    hosts: tuple[str, ...]
    """Where it may go (allowlist syntax; names only)."""
    header: str | None = None
    """``"NAME: TEMPLATE"``, ``{value}`` once in TEMPLATE."""
    basic_auth: str | None = None
    """Or HTTP basic auth as this user (``""``: the client's own)."""
    optional: bool = False
    """A value that cannot be read when the sandbox starts leaves the placeholder unfilled
    instead of failing the start (what a declared ``http`` tool's secret header is: its call
    says the variable is missing)."""

    @field_validator("name", "env")
    @classmethod
    def _env_name(cls, value: str | None) -> str | None:
        if value is not None and _ENV_NAME.fullmatch(value) is None:
            raise ValueError(f"{value!r} is not an environment variable name (letters, digits, '_')")
        return value

    @field_validator("hosts")
    @classmethod
    def _hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from sandbox.egress_policy import Entry, ip_literal  # the proxy's own parser: one syntax

        if not value:
            raise ValueError("hosts is empty: name the hosts the secret may go to, e.g. hosts = [\"api.example.com\"]")
        for text in value:
            entry = Entry.parse(text)
            if entry.network is not None or ip_literal(entry.host) is not None:
                raise ValueError(f"{text!r}: a secret goes to host names only (its TLS certificate names them), "
                                 "not to IP addresses or networks")
        return value

    @model_validator(mode="after")
    def _one_each(self) -> SecretSpec:
        if (self.env is None) == (self.file is None):
            raise ValueError(f'secret {self.name}: give exactly one source, env = "VARIABLE" or file = "/path"')
        if (self.header is None) == (self.basic_auth is None):
            raise ValueError(f'secret {self.name}: give exactly one of header = "Authorization: Bearer {{value}}" '
                             'or basic_auth = "USER"')
        if self.file is not None and not self.file.is_absolute():
            raise ValueError(f"secret {self.name}: file {str(self.file)!r} must be an absolute path")
        if self.header is not None:
            self.header_parts()
        if self.basic_auth is not None and any(c in self.basic_auth for c in ":\r\n\0"):
            raise ValueError(f"secret {self.name}: basic_auth is a user name, without ':' or line breaks")
        return self

    def header_parts(self) -> tuple[str, str | None]:
        """(the header's name, its value template; None for basic auth)."""
        if self.header is None:
            return "Authorization", None
        match = _HEADER.fullmatch(self.header)
        if match is None or any(c in self.header for c in "\r\n\0"):
            raise ValueError(f"secret {self.name}: header {self.header!r} is not \"NAME: TEMPLATE\", "
                             'e.g. "Authorization: Bearer {value}"')
        name, template = match.groups()
        if template.count("{value}") != 1:
            raise ValueError(f"secret {self.name}: header {self.header!r} must hold {{value}} exactly once")
        if name.lower() in _FORBIDDEN_HEADERS:
            raise ValueError(f"secret {self.name}: the proxy cannot carry a secret in {name}; use another header")
        return name, template

    def source(self) -> str:
        """Where the value comes from, for messages (``env GITHUB_TOKEN``, ``file /run/key``)."""
        return f"the harness's environment variable {self.env}" if self.env is not None else f"the file {self.file}"

    def read(self, environ: Mapping[str, str] | None = None) -> str:
        """The value now; SecretUnavailable naming the source and the fix (never the value)."""
        value = read_source(f"secret {self.name}", self.env, self.file, environ)
        if any(c in value for c in "\r\n\0"):
            raise SecretUnavailable(f"secret {self.name}: {self.source()} holds a line break or NUL; "
                                    "a header value is one line")
        return value


def read_source(what: str, env: str | None, file: Path | None, environ: Mapping[str, str] | None = None) -> str:
    """The value of a secret (``what`` names it in messages) from the harness's environment
    variable ``env`` or the ``file`` (one trailing newline dropped); SecretUnavailable
    naming the source and the fix, never the value."""
    if env is not None:
        value = (os.environ if environ is None else environ).get(env)
        if not value:
            raise SecretUnavailable(f"{what} takes its value from the environment variable "
                                    f"{env} of the harness, which is not set; set it where callbox runs")
        return value
    assert file is not None
    try:
        value = file.read_text(encoding="utf-8").removesuffix("\n").removesuffix("\r")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or type(exc).__name__
        raise SecretUnavailable(f"{what} takes its value from the file {file}, which "
                                f"cannot be read ({why}); create it, readable by the user callbox "
                                "runs as") from None
    if not value:
        raise SecretUnavailable(f"{what}: the file {file} is empty")
    return value


def redaction_pairs(specs: tuple[SecretSpec, ...],
                    sandbox_env: Mapping[str, str] | None = None) -> list[tuple[str, str]]:
    """``(kind, literal)`` pairs for the redactor: each value that can be read now (a required
    secret that cannot be read raises SecretUnavailable: before the first call) and, given
    the started sandbox's ``sandbox_env``, each placeholder in it."""
    pairs: list[tuple[str, str]] = []
    for spec in specs:
        try:
            pairs.append((f"secret:{spec.name}", spec.read()))
        except SecretUnavailable:
            if not spec.optional:
                raise
        placeholder = (sandbox_env or {}).get(spec.name, "")
        if placeholder.startswith(PLACEHOLDER_PREFIX):
            pairs.append((f"secret:{spec.name}:placeholder", placeholder))
    return pairs


def secrets_problem(secrets: tuple[SecretSpec, ...], network: str, allow_hosts: tuple[str, ...],
                    env: Mapping[str, str]) -> str | None:
    """Why a spec cannot carry ``secrets`` (its network is not an allowlist, a secret's host
    is not in ``allow_hosts``, a name is taken twice or by ``env``), or None."""
    from sandbox.egress_policy import Allowlist, Entry

    if network != "allowlist":
        return (f"secrets go out through the egress proxy of network 'allowlist', but the network is {network!r}; "
                "set network = 'allowlist' and list the secrets' hosts in allow_hosts")
    allowlist, names = Allowlist.parse(allow_hosts), set()
    for secret in secrets:
        if secret.name in names or secret.name in env:
            return (f"secret {secret.name}: the name is taken by another secret or by env; "
                    "a variable holds one placeholder")
        names.add(secret.name)
        for text in secret.hosts:
            entry = Entry.parse(text)
            host = f"x.{entry.host}" if entry.wildcard else entry.host
            if any(allowlist.permits(host, port) is not None for port in ([entry.port] if entry.port else [443])):
                return (f"secret {secret.name} may go to {text}, which allow_hosts does not allow "
                        f"(allowed: {allowlist}); add it to allow_hosts")
    return None
