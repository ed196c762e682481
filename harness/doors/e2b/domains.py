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
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping

__all__ = ["UNROUTABLE", "sandbox_domain"]

UNROUTABLE = "no-sandbox-domain-set-e2b-sandbox-url-to-the-callbox-url-or-serve-it-with-e2b-domain.invalid"
"""The domain of a server that knows no name for its sandboxes (see the module docstring)."""


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
