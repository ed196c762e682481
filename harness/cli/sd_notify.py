"""systemd's readiness protocol (``Type=notify``), with the standard library alone.

When systemd starts a service of ``Type=notify`` it sets ``NOTIFY_SOCKET`` to a unix
datagram socket (a path, or ``@name`` in the abstract namespace) and waits for the service
to send ``READY=1`` there. ``RELOADING=1`` and ``STOPPING=1`` report a reload and a stop;
``STATUS=...`` is the line ``systemctl status`` shows. Without ``NOTIFY_SOCKET`` (not
under systemd) every call does nothing.
"""

from __future__ import annotations

import os
import socket
import time

NOTIFY_SOCKET = "NOTIFY_SOCKET"


def notify(*fields: str, environ: dict[str, str] | None = None) -> bool:
    """Send ``fields`` (``"READY=1"``, ``"STATUS=serving"``) to systemd; False when not
    under systemd or the socket refused the message (readiness is a courtesy to the
    service manager: it never stops the server)."""
    address = (os.environ if environ is None else environ).get(NOTIFY_SOCKET, "")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    message = "\n".join(fields).encode()
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message, address)
    except OSError:
        return False
    return True


def reloading() -> list[str]:
    """The fields that announce a reload (``MONOTONIC_USEC`` is what ``Type=notify-reload``
    asks for with ``RELOADING=1``)."""
    return ["RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}"]
