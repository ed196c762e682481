"""Which sandbox and port an E2B request names, and the headers a forwarded request keeps.

A request names a sandbox port by the ``E2b-Sandbox-Id``/``E2b-Sandbox-Port`` headers or by a
``PORT-SANDBOXID.DOMAIN`` host name (what ``get_host(port)`` gives). Shared by the door's
router, its HTTP port proxy and its WebSocket relay.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from harness.core.errors import ErrorCode
from harness.doors.e2b.errors import E2bError

__all__ = ["ENVD_PORT", "HOP_BY_HOP_HEADERS", "TRAFFIC_TOKEN_HEADER", "WEBSOCKET_HEADERS", "PortTarget",
           "forwarded_headers", "port_target", "target_path"]

ENVD_PORT = 49983
"""envd's port: requests to it are envd's, never forwarded."""
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"  # noqa: S105 - a header name, not a secret
"""The header of a sandbox's traffic access token on a port request (as E2B names it)."""

_CREDENTIALS = frozenset({TRAFFIC_TOKEN_HEADER, "x-access-token", "x-api-key"})
HOP_BY_HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te",
                                "trailer", "transfer-encoding", "upgrade"})
"""Headers of one HTTP hop, never relayed."""
_DOOR_HEADERS = frozenset({"e2b-sandbox-id", "e2b-sandbox-port"})
WEBSOCKET_HEADERS = frozenset({"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions",
                               "sec-websocket-protocol", "sec-websocket-accept", "host"})
"""Headers the WebSocket relay sets itself on the upgrade it makes to the program."""
_PORT_HOST = re.compile(r"(\d{1,5})-([A-Za-z0-9][A-Za-z0-9_-]*)(?:\.|:|$)", re.ASCII)


@dataclass(frozen=True)
class PortTarget:
    """The sandbox and port a request names."""

    sandbox_id: str
    port: int
    by_host: bool
    """Named by its host name (``PORT-ID.DOMAIN``) rather than by the ``E2b-Sandbox-*`` headers."""


def _check_port(text: str) -> int:
    try:
        port = int(text.strip())
    except ValueError:
        port = 0
    if not 1 <= port <= 65535:
        raise E2bError(ErrorCode.INVALID_REQUEST, f"E2b-Sandbox-Port: {text.strip()!r} is not a TCP port (1-65535)")
    return port


def port_target(headers: Mapping[str, str]) -> PortTarget | None:
    """The sandbox and port ``headers`` name: ``E2b-Sandbox-Id`` (and ``E2b-Sandbox-Port``,
    envd's when absent), else a ``Host`` of the form ``PORT-SANDBOXID.ANYTHING``; None for a
    control plane request. ``invalid_argument`` for a port that is not one."""
    sandbox_id = headers.get("e2b-sandbox-id")
    if sandbox_id is not None:
        port = headers.get("e2b-sandbox-port")
        return PortTarget(sandbox_id, ENVD_PORT if port is None else _check_port(port), by_host=False)
    match = _PORT_HOST.match(headers.get("host", ""))
    if match is None:
        return None
    return PortTarget(match.group(2), _check_port(match.group(1)), by_host=True)


def forwarded_headers(headers: Mapping[str, str], *, drop: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """The request headers the program in the sandbox gets: no credential, no hop-by-hop header."""
    skip = _CREDENTIALS | HOP_BY_HOP_HEADERS | _DOOR_HEADERS | drop
    return [(name, value) for name, value in headers.items() if name not in skip]


def target_path(scope_path: str, raw_path: bytes | None, query: bytes) -> str:
    path = raw_path.decode("latin-1") if raw_path else scope_path
    return path + ("?" + query.decode("latin-1") if query else "")
