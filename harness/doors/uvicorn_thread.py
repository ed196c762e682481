"""What the HTTP doors share: a uvicorn server on a bound socket in a background thread, and
the rule for serving TCP without TLS.

:class:`UvicornThread` is the base of a running door's handle (``address``, ``url``,
``start``, and ``halt`` for its ``stop``); the door adds what it owns. :func:`check_transport`
refuses a host that is not loopback without TLS unless ``insecure`` (then it warns), naming
what would cross the network in clear text.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from pathlib import Path

import uvicorn

from harness.doors.grpc.server import ServeError, _read_pem
from harness.doors.mcp.http import _is_loopback

__all__ = ["ReadyUvicorn", "UvicornThread", "check_tls", "check_transport", "load_config"]


class ReadyUvicorn(uvicorn.Server):
    """uvicorn, telling when it listens (or gave up)."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


class UvicornThread:
    """``server`` serving ``sock`` in a thread named ``thread_name``; ``what`` names the door
    in errors ("the E2B API server")."""

    def __init__(self, *, server: ReadyUvicorn, sock: socket.socket, host: str, tls: bool, thread_name: str,
                 what: str) -> None:
        self.tls = tls
        self.host = host
        self.port: int = sock.getsockname()[1]
        self._server = server
        self._sock = sock
        self._what = what
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._error: BaseException | None = None
        self._stop_lock = threading.Lock()
        self._stopped = False

    @property
    def address(self) -> str:
        """``HOST:PORT`` as bound (the real port when 0 was asked for)."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"{shown}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL, an unspecified host shown as loopback, without a trailing slash."""
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)  # noqa: S104
        shown = f"[{host}]" if ":" in host else host
        return f"{'https' if self.tls else 'http'}://{shown}:{self.port}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url})"

    def _run(self) -> None:
        try:
            self._server.run(sockets=[self._sock])
        except BaseException as exc:  # reported by start()
            self._error = exc
        finally:
            self._server.ready.set()

    def start(self, timeout: float) -> None:
        """Serve in the background; ServeError (after ``stop``) when it does not start in time."""
        self._thread.start()
        if not self._server.ready.wait(timeout) or not self._server.started:
            self.stop()
            raise ServeError(f"{self._what} did not start on {self.address}: {self._error or 'timed out'}")

    def stop(self) -> object:
        """The door's stop: subclasses override it, under ``_stop_lock`` and once
        (``_stopped``), and call :meth:`halt` in it."""
        raise NotImplementedError

    def halt(self, timeout: float) -> None:
        """Tell uvicorn to exit, wait up to ``timeout`` for its thread, close the socket."""
        self._server.should_exit = True
        if self._thread.is_alive():
            self._thread.join(timeout)
        self._sock.close()


def check_transport(host: str, port: int, *, insecure: bool, tls: bool, what: str, secrets: str,
                    log: logging.Logger) -> None:
    """Refuse ``what`` on TCP ``host:port`` off loopback without TLS unless ``insecure``;
    ``secrets`` names what would cross the network in clear text ("API keys and access tokens")."""
    if tls or _is_loopback(host):
        return
    if not insecure:
        raise ServeError(
            f"refusing to serve {what} on {host}:{port} without TLS: {secrets} would cross the network in clear "
            "text; pass --tls-cert and --tls-key, or --insecure to accept that (e.g. on a trusted network)"
        )
    log.warning("serving %s on %s:%d without TLS (--insecure): %s cross the network in clear text", what, host, port,
                secrets)


def check_tls(host: str, port: int, *, tls_cert: Path | None, tls_key: Path | None, insecure: bool, what: str,
              secrets: str, log: logging.Logger) -> bool:
    """Whether ``what`` serves TLS: both PEM files readable, or neither (then
    :func:`check_transport` decides whether plain TCP may go on ``host``). ServeError otherwise."""
    if (tls_cert is None) != (tls_key is None):
        raise ServeError("TLS needs both --tls-cert and --tls-key (PEM files)")
    tls = tls_cert is not None and tls_key is not None
    check_transport(host, port, insecure=insecure, tls=tls, what=what, secrets=secrets, log=log)
    if tls_cert is not None and tls_key is not None:
        _read_pem(tls_cert, "cert")
        _read_pem(tls_key, "key")
    return tls


def load_config(config: uvicorn.Config, tls_cert: Path | None, tls_key: Path | None) -> None:
    """Load uvicorn's ``config`` (its TLS context among it); ServeError naming the PEM files
    when they cannot be used."""
    try:
        config.load()
    except (ssl.SSLError, OSError) as exc:
        raise ServeError(f"--tls-cert {tls_cert} / --tls-key {tls_key} cannot be used: {exc}") from None
