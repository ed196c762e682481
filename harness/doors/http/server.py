"""Binding the HTTP endpoint and running it: :func:`serve_http` starts the app of
:mod:`harness.doors.http.app` under uvicorn in a background thread and returns an
:class:`HttpServer` (``url``, ``address``, ``stop()``).

* **Address.** ``HOST:PORT`` (``[::1]:PORT``; port 0 picks a free one, the handle reports
  the real one). A host that is not loopback needs TLS (``tls_cert`` + ``tls_key``, the PEM
  files the other doors use) or ``insecure=True``: tokens and the session cookie would
  otherwise cross the network in clear text. Serving without TLS off loopback is logged as a
  warning. This is how the E2B door and the gRPC door decide.
* **Health.** ``/healthz`` calls ``engine_ping`` (default: a ping of the Docker engine named
  by ``DOCKER_HOST``, at most :data:`PING_TIMEOUT_S`); 200 when it returns, 503 with the
  reason when it raises.
* **Shutdown.** ``stop()`` ends uvicorn (requests in flight get a few seconds) and closes the
  socket; the executor and the audit store belong to the caller (unless ``close_audit``).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import docker
import docker.errors
import requests
import uvicorn

from harness.audit.store import AuditStore
from harness.core.errors import EngineUnavailable, UsageError, short_reason
from harness.doors.grpc.server import ServeError
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.tokens import TokenSet
from harness.doors.http.app import console_app
from harness.doors.http.auth import Sessions
from harness.doors.http.console import Console
from harness.doors.mcp.http import _bind, _is_loopback, parse_addr
from harness.doors.uvicorn_thread import ReadyUvicorn, UvicornThread, check_tls, load_config
from harness.engine.docker.client import engine_host
from harness.telemetry import metrics
from harness.telemetry.samples import GaugeSampler

__all__ = ["PING_TIMEOUT_S", "EnginePing", "HttpServer", "serve_http"]

log = logging.getLogger("callbox.http")

PING_TIMEOUT_S = 5
GRACEFUL_SHUTDOWN_S = 3
START_TIMEOUT_S = 30.0


class EnginePing:
    """The default health check: ``GET /_ping`` of the Docker engine (one client, kept while
    it answers); EngineUnavailable naming the engine when it does not."""

    def __init__(self, timeout_s: int = PING_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._client: docker.DockerClient | None = None

    def __call__(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        try:
            client = client or docker.from_env(timeout=self.timeout_s)
            client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            if client is not None:
                client.close()
            raise EngineUnavailable(f"the Docker engine at {engine_host()} does not answer ({short_reason(exc)})"
                                    ) from None
        with self._lock:
            if self._client is None:
                self._client = client
                return
        client.close()  # another request kept its own meanwhile

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


class HttpServer(UvicornThread):
    """The running HTTP endpoint: ``/metrics``, ``/healthz`` and the console."""

    def __init__(self, *, server: ReadyUvicorn, sock: socket.socket, host: str, tls: bool, console: Console,
                 sessions: Sessions, ping: Callable[[], None], close_audit: bool, sampler: GaugeSampler) -> None:
        super().__init__(server=server, sock=sock, host=host, tls=tls, thread_name="callbox-http",
                         what="the HTTP endpoint")
        self.console = console
        self.sessions = sessions
        self._ping = ping
        self._close_audit = close_audit
        self.sampler = sampler
        """The gauges sampled for the overview's charts (started with the server)."""

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        super().start(timeout)
        self.sampler.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop serving (idempotent). The executor is left to its door."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
            self.halt(timeout)
            self.sampler.stop()
            if isinstance(self._ping, EnginePing):
                self._ping.close()
            if self._close_audit:
                self.console.audit.close()
            log.info("HTTP endpoint on %s stopped", self.url)

    def __enter__(self) -> HttpServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_http(
    listen: str,
    *,
    tokens: TokenSet,
    executor: ExecutorService | None,
    audit: AuditStore,
    insecure: bool = False,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    engine_ping: Callable[[], None] | None = None,
    close_audit: bool = False,
) -> HttpServer:
    """Start ``/metrics``, ``/healthz`` and the console on ``listen`` (``HOST:PORT``) in the
    background; see :mod:`harness.doors.http`.

    ``tokens``: who may use the console (the doors' token set). ``executor``: the gRPC/E2B
    doors' shared executor when one runs (live sandboxes and the kill button), else None.
    ``audit``: the store the doors write (approvals, runs, egress); ``close_audit`` closes it
    on ``stop``. ``engine_ping`` raises when the engine does not answer (default: ping the
    Docker engine). Raises ServeError (exit code 2) for a refused address, bad TLS files or a
    port that cannot be bound (the audit store then closed too, with ``close_audit``).
    """
    try:
        return _serve(listen, tokens=tokens, executor=executor, audit=audit, insecure=insecure, tls_cert=tls_cert,
                      tls_key=tls_key, engine_ping=engine_ping, close_audit=close_audit)
    except BaseException:
        if close_audit:
            audit.close()
        raise


def _serve(listen: str, *, tokens: TokenSet, executor: ExecutorService | None, audit: AuditStore, insecure: bool,
           tls_cert: Path | None, tls_key: Path | None, engine_ping: Callable[[], None] | None,
           close_audit: bool) -> HttpServer:
    host, port = parse_addr(listen)
    tls = check_tls(host, port, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure, what="the console",
                    secrets="tokens and the login cookie", log=log)
    ping = engine_ping if engine_ping is not None else EnginePing()
    console = Console(audit, executor)
    metrics.watch_audit_chain(str(audit.path), audit)  # the head /metrics shows
    sessions = Sessions(tokens)
    sampler = GaugeSampler(executor.live_sandboxes if executor is not None else None)
    app = console_app(console, sessions, engine_ping=ping, tls=tls, loopback=_is_loopback(host),
                      samples=sampler.samples)
    config = uvicorn.Config(
        app, http="h11", ws="websockets-sansio", lifespan="off", log_level="warning", access_log=False, log_config=None,
        proxy_headers=False, server_header=False, timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        ssl_certfile=str(tls_cert) if tls_cert is not None else None,
        ssl_keyfile=str(tls_key) if tls_key is not None else None,
    )
    load_config(config, tls_cert, tls_key)
    try:
        sock = _bind(host, port)
    except UsageError as error:
        raise ServeError(error.message) from None
    handle = HttpServer(server=ReadyUvicorn(config), sock=sock, host=host, tls=tls, console=console, sessions=sessions,
                        ping=ping, close_audit=close_audit, sampler=sampler)
    handle.start()
    log.debug("HTTP endpoint on %s: /metrics, /healthz, console (%d token(s) from %s)", handle.url, len(tokens),
             tokens.source)
    return handle
