"""Secrets the egress proxy puts into requests, so the sandbox holds only placeholders.

Standard library only, like ``sandbox/egress.py``; ``sandbox/egress_tls.py`` loads it when the
engine gives it ``--secrets-file FILE``: a JSON object the harness wrote (mode 0600, owned by the proxy's
user) and which :func:`load` removes as soon as it has read it, with the leaf key it names::

    {"secrets": [{"name": "GITHUB_TOKEN", "hosts": ["api.github.com"], "header": "Authorization",
                  "template": "Bearer {value}", "basic_user": null, "placeholder": "...", "value": "..."}],
     "cert": "/var/log/callbox-egress/leaf.crt", "key": "/var/log/callbox-egress/leaf.key",
     "ca": "/var/log/callbox-egress/trust/ca.crt", "bundle": "/var/log/callbox-egress/trust/ca-bundle.pem"}

A secret applies to a request whose host and port one of its ``hosts`` names (the
allowlist's syntax: ``name``, ``name:port``, ``*.name``; no port means 80 and 443). In such a
request, and only in the header the secret names, a header value holding the placeholder is
replaced whole: by ``template`` with ``{value}`` filled in, or, for basic auth, by
``Basic base64(USER:value)`` (USER: ``basic_user``, or the user the client sent when that is
empty; the client's header is ``Basic base64(user:PLACEHOLDER)``, as URL userinfo gives).
Anywhere else (another header, the path, the body, another host) the placeholder passes
unchanged, and is worthless there.

``bundle`` is written at load: the system's CA bundle (``/etc/ssl/certs/ca-certificates.crt``
of the image both containers run), then ``ca`` (the sandbox's own CA, which signed ``cert``),
then the test CA if any; the sandbox sees it read-only and its ``SSL_CERT_FILE`` names it.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import ssl
import sys
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass

from sandbox.egress_policy import Entry, normalize_host

__all__ = ["SYSTEM_BUNDLE", "Secret", "SecretRules", "carried", "load", "load_secrets", "rewrite_headers"]

SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):[ \t]*(.*?)[ \t]*")


@dataclass(frozen=True)
class Secret:
    """One secret as the proxy holds it (never printed: ``__repr__`` names it only)."""

    name: str
    hosts: tuple[Entry, ...]
    header: str
    """The header it goes in (``Authorization`` for basic auth), compared case-insensitively."""
    template: str | None
    """``Bearer {value}``; None for basic auth."""
    basic_user: str | None
    placeholder: str
    value: str

    def __repr__(self) -> str:
        return f"Secret({self.name!r}, hosts={[str(h) for h in self.hosts]})"

    def applies(self, host: str, port: int) -> bool:
        return any(entry.matches_host(host) and entry.allows_port(port) for entry in self.hosts)

    def filled(self, current: str) -> str | None:
        """The header value to send instead of ``current``, or None when ``current`` does not
        hold the placeholder (then it is sent as it is)."""
        if self.template is None:
            scheme, _, encoded = current.partition(" ")
            if scheme.lower() != "basic":
                return None
            try:
                user, _, password = base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return None
            if self.placeholder not in user + ":" + password:
                return None
            user = self.basic_user or user.replace(self.placeholder, "")
            return "Basic " + base64.b64encode(f"{user}:{self.value}".encode()).decode("ascii")
        if self.placeholder not in current:
            return None
        return self.template.replace("{value}", self.value)


class SecretRules:
    """The secrets of one sandbox, and the TLS contexts that carry them to their hosts."""

    def __init__(self, secrets: Sequence[Secret], server: ssl.SSLContext | None = None,
                 client: ssl.SSLContext | None = None) -> None:
        self.secrets = tuple(secrets)
        self.server = server
        """Presents the leaf for the secrets' hosts to the sandbox (signed by its own CA)."""
        self.client = client
        """Verifies the real hosts against the system's CAs (and the test CA, if given)."""

    def __repr__(self) -> str:
        return f"SecretRules({list(self.secrets)!r})"

    def for_host(self, host: str, port: int) -> tuple[Secret, ...]:
        try:
            name = normalize_host(host)
        except ValueError:
            return ()
        return tuple(s for s in self.secrets if s.applies(name, port))

    def intercepts(self, host: str, port: int) -> bool:
        """Whether a CONNECT to ``host:port`` is opened here (TLS terminated) rather than tunnelled."""
        return self.server is not None and bool(self.for_host(host, port))


def carried(rules: SecretRules | None, host: str, port: int) -> dict[str, object]:
    """What a decision record says of the secrets a connection to ``host:port`` may carry:
    ``{"secrets": [NAME, ...]}``, or nothing when none applies."""
    names = [s.name for s in rules.for_host(host, port)] if rules is not None else []
    return {"secrets": names} if names else {}


def rewrite_headers(head: bytes, secrets: Sequence[Secret]) -> tuple[bytes, list[str]]:
    """``head`` (a request line and header lines) with each secret filled in where its
    header holds its placeholder; and the names of the secrets filled in."""
    if not secrets:
        return head, []
    lines = head.split(b"\n")
    used: list[str] = []
    for index, raw in enumerate(lines[1:], start=1):
        line = raw.rstrip(b"\r")
        match = _HEADER_LINE.fullmatch(line)
        if match is None:
            continue
        name = match.group(1).decode("latin-1")
        value = match.group(2).decode("latin-1")
        for secret in secrets:
            if secret.header.lower() != name.lower():
                continue
            filled = secret.filled(value)
            if filled is not None:
                lines[index] = f"{name}: {filled}".encode() + (b"\r" if raw.endswith(b"\r") else b"")
                used.append(secret.name)
                break
    return b"\n".join(lines), used


def _secret(item: object) -> Secret:
    if not isinstance(item, dict):
        raise ValueError("each secret must be an object")
    hosts = item.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise ValueError(f"secret {item.get('name')!r} has no hosts")
    fields = {key: item.get(key) for key in ("name", "header", "placeholder", "value")}
    if not all(isinstance(v, str) and v for v in fields.values()):
        raise ValueError(f"secret {item.get('name')!r} lacks one of name, header, placeholder, value")
    template, basic = item.get("template"), item.get("basic_user")
    if (template is None) == (basic is None) or not isinstance(template or basic or "", str):
        raise ValueError(f"secret {item.get('name')!r} needs exactly one of template and basic_user")
    return Secret(str(fields["name"]), tuple(Entry.parse(h) for h in hosts), str(fields["header"]),
                  template, basic, str(fields["placeholder"]), str(fields["value"]))


def load(path: str, test_extra_ca: str | None = None, system_bundle: str = SYSTEM_BUNDLE) -> SecretRules:
    """Read the secrets file at ``path`` and remove it and the leaf key (also on failure);
    build the TLS contexts and write the sandbox's CA bundle. ValueError, OSError or
    ssl.SSLError when any of it fails (the proxy then does not start)."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    finally:
        with suppress(OSError):
            os.unlink(path)
    if not isinstance(data, dict) or not isinstance(data.get("secrets"), list):
        raise ValueError('expected {"secrets": [...], "cert": ..., "key": ..., "ca": ..., "bundle": ...}')
    key_path = str(data.get("key"))
    try:
        secrets = [_secret(item) for item in data["secrets"]]
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server.minimum_version = ssl.TLSVersion.TLSv1_2
        server.set_alpn_protocols(["http/1.1"])
        server.load_cert_chain(str(data["cert"]), key_path)
    finally:
        with suppress(OSError):
            os.unlink(key_path)
    if not os.path.isfile(system_bundle):
        raise ValueError(f"the image has no system CA bundle at {system_bundle}, so neither the proxy nor the "
                         "sandbox could verify a real host; install Debian's ca-certificates in the image")
    client = ssl.create_default_context(cafile=system_bundle)
    client.set_alpn_protocols(["http/1.1"])
    if test_extra_ca is not None:
        client.load_verify_locations(cafile=test_extra_ca)
    with open(system_bundle, "rb") as handle:
        parts = [handle.read()]
    for extra in (str(data["ca"]), test_extra_ca):
        if extra is not None:
            with open(extra, "rb") as handle:
                parts.append(handle.read())
    bundle = str(data["bundle"])
    temporary = bundle + ".tmp"
    with open(temporary, "wb") as handle:
        handle.write(b"\n".join(part.rstrip(b"\n") + b"\n" for part in parts))
    os.chmod(temporary, 0o644)
    os.replace(temporary, bundle)
    return SecretRules(secrets, server, client)


def load_secrets(path: str | None, test_extra_ca: str | None = None) -> SecretRules | None:
    """:func:`load` for the proxy's ``main``: None without a secrets file; a test CA is
    announced on stderr; any failure is a ValueError saying what failed (never a value)."""
    if test_extra_ca is not None:
        print(f"WARNING: --test-extra-ca {test_extra_ca}: the proxy trusts this CA for real hosts. This is for "
              "tests only and must never be used for real sandboxes.", file=sys.stderr)
    if path is None:
        return None
    try:
        return load(path, test_extra_ca)
    except (OSError, KeyError, ssl.SSLError) as exc:
        raise ValueError(f"{type(exc).__name__}: {getattr(exc, 'strerror', None) or exc}") from None
