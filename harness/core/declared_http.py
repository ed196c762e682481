"""``kind = "http"``: the parts of a declared tool that describe one HTTP request, and their checks.

A ``kind = "http"`` table (its handler is :mod:`harness.tools.declared.http`) takes:

* ``method``: ``GET`` (default), ``POST``, ``PUT``, ``PATCH``, ``DELETE`` or ``HEAD``;
* ``url``: ``http://`` or ``https://``, a literal host (and port), then a path that may hold
  ``{name}`` placeholders. Each placeholder's value is percent-encoded as text inside its path
  segment (``/``, ``?``, ``#``, ``%`` and everything but RFC 3986's unreserved characters are
  encoded), so an argument can never add a segment, a query or a fragment; a segment whose
  value would be exactly ``.`` or ``..`` is refused when the call is made. No placeholder in
  the scheme or host, no ``?`` or ``#`` in the template (the query is ``query``). A path
  argument must be required or have a default.
* ``query``: ``param = "{arg}"`` or a literal (or text mixing both); a parameter using an
  optional argument the call left out is omitted. ``"{arg}"`` with an array argument
  repeats the parameter once per item.
* ``headers``: literal values, or ``{ env = "NAME" }`` (with an optional ``prefix``, e.g.
  ``"Bearer "``) whose value is read from the environment of the harness process (the host)
  when the sandbox starts and given to its egress proxy only, as an optional ``[[secret]]``
  for the URL's host (:func:`implied_secrets`): the request leaves the sandbox with the
  sandbox's placeholder in that header, and the proxy puts the value in. It is never an
  argument, so neither the model, the sandbox nor the audit store sees it. A variable that
  is not set when the sandbox starts is an error result of each call naming it, and no
  request is made. ``Host``, ``Content-Length``, ``Transfer-Encoding``, ``Connection`` and
  ``Proxy-*`` are not settable.
* ``body``: ``{ json = { KEY = "{arg}", ... } }`` (an object template: a string that is exactly
  ``"{arg}"`` becomes the argument's JSON value, a key whose value uses an absent optional
  argument is left out) or ``{ text = "{arg}" }`` (one argument, sent as UTF-8 text). No body
  on ``GET`` or ``HEAD``.

Every argument must be used by the URL, the query or the body (checked in
:mod:`harness.core.declared`, which knows the arguments). Whether the sandbox may reach
the URL's host is checked against ``[sandbox]`` when the registry is built
(:func:`harness.tools.declared.declared_tools`): the network must be ``allowlist`` and
``allow_hosts`` must permit the URL's host and port.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from harness.engine.secrets import SecretSpec

__all__ = [
    "FIXED_HEADERS",
    "HEADER_NAME",
    "PLACEHOLDER_LIKE",
    "HttpBody",
    "HttpMethod",
    "SecretHeader",
    "UrlParts",
    "check_header_value",
    "implied_secret_name",
    "implied_secrets",
    "split_url",
]

HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"]
_URL = re.compile(r"(?P<scheme>https?)://(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?"
                  r"(?P<path>/[^?#]*)?")
HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLACEHOLDER_LIKE = re.compile(r"\{[A-Za-z][A-Za-z0-9_]*\}")
FIXED_HEADERS = frozenset({"host", "content-length", "transfer-encoding", "connection", "te", "upgrade"})


class SecretHeader(BaseModel):
    """``headers.NAME = { env = "VAR" }``: a header value from the host's environment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    env: str
    """The environment variable of the harness process (the host) holding the value, read at each call."""
    prefix: str = ""
    """Text put before the value (``"Bearer "``, ``"token "``)."""

    @model_validator(mode="after")
    def _check(self) -> SecretHeader:
        if _ENV_NAME.fullmatch(self.env) is None:
            raise ValueError(f"env {self.env!r} is not an environment variable name (letters, digits, '_')")
        check_header_value(self.prefix, "prefix")
        return self


class HttpBody(BaseModel):
    """``body``: what the request sends, ``json`` or ``text`` (exactly one)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_template: dict[str, Any] | None = Field(default=None, alias="json")
    """``json``: an object template; ``"{arg}"`` is the argument's JSON value, other strings are text templates."""
    text: str | None = None
    """``text``: exactly ``"{arg}"``: that string argument as the body, UTF-8."""

    @model_validator(mode="after")
    def _one(self) -> HttpBody:
        if (self.json_template is None) == (self.text is None):
            raise ValueError('body takes exactly one of json = { ... } or text = "{ARG}"')
        return self


@dataclass(frozen=True)
class UrlParts:
    """A URL template split: the literal origin, the host and port the allowlist sees, the path template."""

    scheme: str
    origin: str
    host: str
    port: int
    path: str


def split_url(url: str) -> UrlParts:
    """``url`` as :class:`UrlParts`; ``ValueError`` naming the fix when it is not a template callbox accepts."""
    if "?" in url or "#" in url:
        raise ValueError(f"url {url!r} has a '?' or '#': put query parameters in [tool.query] "
                         '(param = "{ARG}" or a literal); a fragment is never sent')
    match = _URL.fullmatch(url)
    if match is None:
        head = url.split("://", 1)
        if len(head) == 2 and "{" in head[1].split("/", 1)[0]:
            raise ValueError(f"url {url!r}: the scheme and host must be literal; placeholders go in the path")
        raise ValueError(f'url {url!r} is not "http(s)://HOST[:PORT]/PATH" (a literal scheme and host, '
                         "{ARG} placeholders only in the path)")
    scheme, host = match["scheme"], match["host"].lower().rstrip(".")
    port = int(match["port"]) if match["port"] else (443 if scheme == "https" else 80)
    if not 0 < port < 65536:
        raise ValueError(f"url {url!r}: port {port} is out of range")
    path = match["path"] or "/"
    return UrlParts(scheme, url[:match.start("path")] if match["path"] else url, host.strip("[]"), port, path)


def check_header_value(value: str, where: str) -> None:
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"{where} contains a line break or NUL; a header value is one line")


def implied_secret_name(tool: str, header: str) -> str:
    """The sandbox variable holding the placeholder of ``tool``'s secret ``header``."""
    return "CALLBOX_HTTP_" + re.sub(r"[^A-Za-z0-9]", "_", f"{tool}_{header}").upper()


def implied_secrets(declared: Any) -> list[SecretSpec]:
    """The optional secrets a ``kind = "http"`` tool's ``{ env = ... }`` headers stand for:
    each for the URL's host and port, put in that header as ``PREFIX{value}``."""
    headers: dict[str, Any] = declared.headers or {}
    if not declared.url or not any(isinstance(v, SecretHeader) for v in headers.values()):
        return []
    parts = split_url(declared.url)
    if re.fullmatch(r"[0-9.]+|.*:.*", parts.host):
        return []  # a secret goes to names only (its certificate names them): the call says it has none
    host = parts.host
    return [SecretSpec(name=implied_secret_name(declared.name, name), env=value.env, hosts=(f"{host}:{parts.port}",),
                       header=f"{name}: {value.prefix}{{value}}",
                       optional=True)
            for name, value in headers.items() if isinstance(value, SecretHeader)]
