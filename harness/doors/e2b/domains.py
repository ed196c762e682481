"""The sandbox domain the E2B door names in its create, connect and info answers.

The e2b SDK (every 2.x from 2.40 on reads it the same way) builds two things from a sandbox's
``domain`` (the answer's field; without one, the client's own ``E2B_DOMAIN``, else
``e2b.app``):

* envd's URL, unless ``E2B_SANDBOX_URL`` is set: ``https://49983-SANDBOXID.DOMAIN`` (for
  E2B's own domains ``https://sandbox.DOMAIN``), always https unless ``E2B_DEBUG``;
* ``sandbox.get_host(port)``: ``PORT-SANDBOXID.DOMAIN``.

So an answer without a domain sends a client that set ``E2B_API_URL`` but not
``E2B_SANDBOX_URL`` (and the sandbox's access token with it) to E2B's cloud. The door
therefore always names one (:func:`sandbox_domain`):

1. the server's configured domain (``--e2b-domain``, ``[doors.e2b] domain``), a name whose
   every subdomain leads to this server;
2. else, when the client reached the server as ``api.DOMAIN`` (the SDK's API URL when only
   ``E2B_DOMAIN`` is set), that ``DOMAIN``: its names lead here, as ``api.DOMAIN`` did;
3. else :data:`UNROUTABLE`, a name under the reserved ``.invalid`` whose first label is
   longer than DNS allows (63 bytes), so a lookup fails in the client before any packet is
   sent, not even a DNS query, and the error (it names the URL) says what to set.

A configured domain is checked when the server starts (:func:`checked_domain`): a DNS name,
with ``:PORT`` when the server is not reached on 443 (the SDK puts the domain after
``https://PORT-SANDBOXID.`` as it is, so a port in it reaches the server's, and the door reads
the sandbox and port from the host name whatever follows them). Anything else (a URL, a path,
an IP address, a wildcard) would make every envd URL and ``get_host`` wrong, so it is refused
before the first request rather than answered.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping

__all__ = ["UNROUTABLE", "checked_domain", "sandbox_domain"]

UNROUTABLE = "no-sandbox-domain-set-e2b-sandbox-url-to-the-callbox-url-or-serve-it-with-e2b-domain.invalid"
"""The domain of a server that knows no name for its sandboxes (see the module docstring)."""


_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?", re.ASCII)
_MAX_NAME = 253


def checked_domain(text: str) -> str:
    """``text`` as a sandbox domain, ``NAME`` or ``NAME:PORT`` (lower-cased); ValueError naming
    what is wrong and the form expected."""
    domain = text.strip().lower()
    name, colon, port = domain.partition(":")
    problem = ""
    if "://" in domain:
        problem = "it is a URL, not a host name"
    elif not name or "/" in domain or "*" in domain:
        problem = "it is not a host name"
    elif _is_address(name) or _is_address(domain):
        problem = "an IP address cannot have subdomains"
    elif len(name) > _MAX_NAME or not all(_LABEL.fullmatch(label) for label in name.split(".")):
        problem = "it is not a DNS name (labels of letters, digits and inner hyphens, at most 63 characters)"
    elif colon and not (port.isdigit() and 1 <= int(port) <= 65535):
        problem = f"{port!r} is not a TCP port (1-65535)"
    if problem:
        raise ValueError(f"sandbox domain {text!r}: {problem}; give the name whose every subdomain leads to this "
                         "server, with :PORT when it is not served on 443 (e.g. sandboxes.example.com or "
                         "sandboxes.example.com:8443): the SDK reaches https://PORT-SANDBOXID.DOMAIN")
    return domain


def _is_address(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 or host.startswith("[") else host
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def sandbox_domain(headers: Mapping[str, str], configured: str | None) -> str:
    """The domain to answer a control plane request with ``headers`` (lower-case names)."""
    if configured:
        return configured
    host = headers.get("host", "").strip().lower()
    if host.startswith("api.") and len(host) > 4 and not _is_address(host):
        return host[4:]
    return UNROUTABLE
