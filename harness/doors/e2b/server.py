"""``callbox serve --e2b HOST:PORT``: the E2B door, a drop-in for the e2b SDK.

:func:`serve_e2b` starts the door's ASGI app (:mod:`harness.doors.e2b.app`) under uvicorn in
a background thread and returns an :class:`E2bServer` handle (``url``, ``address``,
``stop()``). A program written for E2B reaches it with ``E2B_API_URL`` and
``E2B_SANDBOX_URL`` both set to ``url`` and ``E2B_API_KEY`` set to a token of the server's
token file. Decisions:

* **Address.** ``HOST:PORT`` (``[::1]:PORT``; port 0 picks a free one, the handle reports
  the real one). A host that is not loopback needs TLS (``tls_cert`` + ``tls_key``, PEM
  files) or ``insecure=True``: API keys and access tokens would otherwise cross the network
  in clear text. Serving without TLS off loopback is logged as a warning.
* **Sessions.** The door's sandboxes are sessions of an
  :class:`~harness.doors.grpc.service.ExecutorService`. Given one (``executor``, e.g. the
  gRPC door's when both doors run in one process), the door shares its limits, policy, audit
  store and API keys, and leaves its sandboxes to its owner. Otherwise the door makes its own
  from ``tokens``/``token_file`` (see :mod:`harness.doors.grpc.tokens`: each ``NAME:TOKEN``
  line is an E2B API key), ``policy`` and ``audit``, runs its TTL reaper, and ``stop()``
  destroys every sandbox in it.
* **Services.** The control plane's REST routes (:mod:`harness.doors.e2b.rest`), envd's
  ``process.Process`` and ``filesystem.Filesystem`` (:mod:`harness.doors.e2b.envd_process`,
  :mod:`harness.doors.e2b.envd_filesystem`) and its ``/files`` and ``/health``
  (:mod:`harness.doors.e2b.envd_files`); tests may pass their own.
* **Threads.** Handlers run on a pool of ``workers`` threads (a stream holds one for its
  whole life: the default leaves room for about 20 sandboxes each streaming several
  commands, watches and transfers at once); one client may hold a quarter of them at once
  (429 beyond), so the others always find some.
* **Quotas.** The executor's (:mod:`harness.doors.quota_ledger`): a create over one is 429
  with ``Retry-After``, as is a process Start over ``calls_per_minute``.
* **Shutdown.** ``stop()``: new sandboxes are refused (when the door owns its executor),
  every request in flight ends (its call scope cancelled, a stream ended with
  ``unavailable``), uvicorn stops, then the owned executor destroys its sandboxes.
* **Sandbox domain.** Create and connect answers name where the sandbox is served
  (``domain``, :mod:`harness.doors.e2b.domains`): ``domain`` given here (``--e2b-domain``),
  else what the client's ``api.DOMAIN`` host says, else a name that never resolves, so an
  SDK without ``E2B_SANDBOX_URL`` fails at once instead of sending anything to E2B's cloud.
* **Restarts.** With ``keep_sandboxes`` (a shared executor's own setting), the door's
  sandboxes are left running at stop instead, and the next server on the same audit store
  adopts them before it serves: ``Sandbox.connect(id)`` and ``Sandbox.list()`` find them
  again (:mod:`harness.doors.e2b.restart`).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import uvicorn

from harness.audit.store import AuditStore
from harness.core.policy import Policy, load_policy
from harness.core.registry import ToolRegistry
from harness.doors.e2b.app import E2bApp
from harness.doors.e2b.boxes import E2bSandboxes
from harness.doors.e2b.domains import checked_domain
from harness.doors.e2b.interpreter import install_template
from harness.doors.e2b.restart import adopt_e2b
from harness.doors.e2b.rpc import EnvdRoute, RestRoute, Service
from harness.doors.grpc.server import ServeError, announce_token
from harness.doors.grpc.service import ExecutorService
from harness.doors.grpc.sessions import Limits
from harness.doors.grpc.tokens import TokenSet, server_tokens
from harness.doors.mcp.http import _bind, parse_addr
from harness.doors.profiles import PolicySource
from harness.doors.quota_ledger import QuotaKeeper, fair_share
from harness.doors.uvicorn_thread import ReadyUvicorn, UvicornThread, check_tls, load_config
from harness.engine.docker.engine import DockerEngine
from harness.tools import registry_for

__all__ = ["DEFAULT_WORKERS", "E2bServer", "serve_e2b"]

log = logging.getLogger("callbox.e2b")

DEFAULT_WORKERS = 256
GRACEFUL_SHUTDOWN_S = 5
START_TIMEOUT_S = 30.0


class E2bServer(UvicornThread):
    """A running E2B door; see the module docstring. ``url`` is what ``E2B_API_URL`` and
    ``E2B_SANDBOX_URL`` are set to."""

    def __init__(self, *, app: E2bApp, server: ReadyUvicorn, sock: socket.socket, host: str, tls: bool,
                 sandboxes: E2bSandboxes, owns_executor: bool, owned_audit: AuditStore | None,
                 pool: ThreadPoolExecutor) -> None:
        super().__init__(server=server, sock=sock, host=host, tls=tls, thread_name="callbox-e2b-http",
                         what="the E2B API server")
        self.app = app
        self.sandboxes = sandboxes
        self.executor = sandboxes.executor
        self.owns_executor = owns_executor
        self._owned_audit = owned_audit
        self._pool = pool
        self.destroyed: list[str] = []
        self.left_running: list[str] = []
        """The sandboxes ``stop`` left running for the next server (an owned, keeping executor)."""

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        super().start(timeout)

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Stop serving (see the module docstring); the ids of the sandboxes destroyed. Idempotent."""
        with self._stop_lock:
            if self._stopped:
                return []
            self._stopped = True
            if self.owns_executor:
                self.executor.begin_shutdown()
            self.app.shutdown()
            self.halt(timeout)
            self.app.shutdown()  # anything that arrived meanwhile
            self._pool.shutdown(wait=False, cancel_futures=True)
            if self.owns_executor:
                self.destroyed = self.executor.shutdown()
                self.left_running = list(self.executor.left_running)
            if self._owned_audit is not None:
                self._owned_audit.close()
            log.info("E2B API on %s stopped; destroyed %d sandbox(es), left %d running for the next server",
                     self.url, len(self.destroyed), len(self.left_running))
            return self.destroyed

    def __enter__(self) -> E2bServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _door_services(sandboxes: E2bSandboxes, tls: bool, domain: str | None = None,
                   ) -> tuple[list[Service], list[RestRoute], list[EnvdRoute]]:
    from harness.doors.e2b.envd_files import http_routes
    from harness.doors.e2b.envd_filesystem import filesystem_service
    from harness.doors.e2b.envd_process import process_service
    from harness.doors.e2b.rest import routes
    from harness.doors.e2b.templates import template_routes

    templates, built = template_routes(sandboxes)
    templates.scheme = "https" if tls else "http"
    return ([process_service(sandboxes), filesystem_service(sandboxes)], routes(sandboxes, domain, built),
            http_routes(sandboxes))


def _sandbox_domain(domain: str | None, tls: bool) -> str | None:
    """The configured sandbox domain, checked (ServeError naming what is wrong)."""
    if domain is None:
        return None
    try:
        domain = checked_domain(domain)
    except ValueError as exc:
        raise ServeError(f"--e2b-domain: {exc}") from None
    if not tls:  # a TLS-terminating proxy may front it; said, since without one such clients cannot connect
        log.warning("the E2B API serves sandbox domain %s without TLS: SDKs without E2B_SANDBOX_URL reach "
                    "https://49983-SANDBOXID.%s, so a TLS proxy for *.%s must front this server (or pass "
                    "--tls-cert and --tls-key with a certificate for it)", domain, domain, domain.split(":")[0])
    return domain


def serve_e2b(
    addr: str = "127.0.0.1:0",
    *,
    sandboxes: E2bSandboxes | None = None,
    executor: ExecutorService | None = None,
    tokens: TokenSet | None = None,
    token_file: Path | None = None,
    policy: Policy | None = None,
    registry: ToolRegistry | None = None,
    audit: AuditStore | None = None,
    insecure: bool = False,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    announce: Callable[[str], None] | None = announce_token,
    max_sandboxes_per_client: int | None = None,
    max_sandboxes_total: int = 64,
    engine_factory: Callable[[], DockerEngine] | None = None,
    reaper_interval_s: float = 5.0,
    workers: int = DEFAULT_WORKERS,
    services: Iterable[Service] | None = None,
    rest_routes: Iterable[RestRoute] | None = None,
    envd_routes: Iterable[EnvdRoute] | None = None,
    quotas: QuotaKeeper | None = None,
    policies: PolicySource | None = None,
    keep_sandboxes: bool = False,
    domain: str | None = None,
) -> E2bServer:
    """Start the E2B door on ``addr`` in the background; see the module docstring.

    ``sandboxes`` or ``executor``: serve those (shared; not destroyed by ``stop``). Otherwise
    an executor of the door's own is made from ``tokens`` (else ``token_file`` and the token
    sources of :func:`~harness.doors.grpc.tokens.server_tokens`; ``announce`` shows a token
    generated on first start), ``policy`` (default: the packaged one), ``registry`` (default:
    the built-in tools and those the policy declares), ``audit`` (default: the default audit
    store) and the limits. ``services``, ``rest_routes``, ``envd_routes``
    replace the door's own (tests). ``quotas`` and ``policies`` go to an executor of the
    door's own as in :func:`~harness.doors.grpc.server.serve_grpc` (a shared executor has
    its own). ``keep_sandboxes``: an executor of the door's own leaves its sandboxes running
    at ``stop`` and first adopts those an earlier server on this audit store left (needs the
    Docker engine); a shared executor's own ``keep_sandboxes`` decides instead (it is not
    changed here), and the door adopts its sandboxes when that is on (given ``sandboxes``:
    their maker adopts, :func:`~harness.doors.e2b.restart.adopt_e2b`). ``domain``: the sandbox
    domain its answers name (:mod:`harness.doors.e2b.domains`). Each client may have a
    quarter of the ``workers`` busy at once. Raises
    ServeError (exit code 2) for a refused address, bad TLS files, or a port that cannot be
    bound.
    """
    host, port = parse_addr(addr)
    tls = check_tls(host, port, tls_cert=tls_cert, tls_key=tls_key, insecure=insecure, what="the E2B API",
                    secrets="API keys and access tokens", log=log)
    domain = _sandbox_domain(domain, tls)
    owned_audit: AuditStore | None = None
    owns = False
    made = sandboxes is None  # given sandboxes are adopted into by whoever made them (adopt_e2b)
    if sandboxes is None:
        if executor is None:
            token_set = tokens if tokens is not None else server_tokens(token_file, announce=announce)
            owned_audit = AuditStore() if audit is None else None
            store = audit if audit is not None else owned_audit
            assert store is not None
            served = policy or load_policy(None)
            try:
                executor = ExecutorService(
                    registry=registry or registry_for(served), policy=served, audit=store, tokens=token_set,
                    limits=Limits(max_sandboxes_per_client=max_sandboxes_per_client,
                                  max_sandboxes_total=max_sandboxes_total),
                    engine_factory=engine_factory, quotas=quotas, policies=policies,
                    keep_sandboxes=keep_sandboxes,
                )
            except BaseException:
                if owned_audit is not None:
                    owned_audit.close()
                raise
            owns = True
        sandboxes = E2bSandboxes(executor)
        install_template(sandboxes)  # before adoption: its sandboxes are adopted too
    keys = tokens if tokens is not None else sandboxes.executor.tokens
    try:
        if services is None or rest_routes is None or envd_routes is None:
            own_services, own_rest, own_envd = _door_services(sandboxes, tls, domain)
            services = own_services if services is None else services
            rest_routes = own_rest if rest_routes is None else rest_routes
            envd_routes = own_envd if envd_routes is None else envd_routes
        if made and sandboxes.executor.keep_sandboxes:
            log.info("E2B door: %s", adopt_e2b(sandboxes).summary())
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="callbox-e2b")
        app = E2bApp(tokens=keys, sandboxes=sandboxes, services=services, rest_routes=rest_routes,
                     envd_routes=envd_routes, pool=pool, share=fair_share(workers),
                     capacity=workers)
        config = uvicorn.Config(
            # WebSocket upgrades are for sandbox ports (harness.doors.e2b.ports_ws); envd uses none.
            app, http="h11", ws="websockets-sansio", lifespan="on", log_level="warning", access_log=False,
            log_config=None,
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
            ssl_certfile=str(tls_cert) if tls_cert is not None else None,
            ssl_keyfile=str(tls_key) if tls_key is not None else None,
        )
        load_config(config, tls_cert, tls_key)
        sock = _bind(host, port)
        # Accepted connections inherit TCP_NODELAY from the listener. asyncio sets it only on
        # sockets made with IPPROTO_TCP, and without it a response's body waits for the
        # client's delayed ACK of its head: about 40 ms a call.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except BaseException:
        if owns:  # adopted sandboxes stay for the next start; the engine's connection closes
            sandboxes.executor.shutdown(wait_for_creations_s=0)
        if owned_audit is not None:
            owned_audit.close()
        raise
    handle = E2bServer(app=app, server=ReadyUvicorn(config), sock=sock, host=host, tls=tls, sandboxes=sandboxes,
                       owns_executor=owns, owned_audit=owned_audit, pool=pool)
    handle.start()
    if owns:
        sandboxes.executor.start_reaper(reaper_interval_s)
    log.debug("E2B API on %s (%d API key(s) from %s)", handle.url, len(keys), keys.source)
    return handle
