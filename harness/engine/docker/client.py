"""Reaching the Docker engine: the checked client, what losing it mid-request means, the
hardened seccomp profile, where per-sandbox sockets live on the host, and removing a
container whatever state it is in."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from functools import cache, wraps
from importlib import resources
from typing import ParamSpec, TypeVar

import docker
import docker.errors
import requests
from docker.transport.unixconn import UnixHTTPAdapter, UnixHTTPConnectionPool

from harness.core.errors import EngineUnavailable, ImageNotFound, SandboxStartError, short_reason
from harness.telemetry.metrics import record_engine_error

_P = ParamSpec("_P")
_R = TypeVar("_R")


def engine_host() -> str:
    """The engine this process talks to, as DOCKER_HOST names it (or the default socket)."""
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


ENGINE_CONNECTIONS = 128
"""Connections to the engine kept open for reuse: as many as the harness runs requests at once
(the gRPC door's 128 RPC threads). A request beyond them still goes through, on a connection
of its own that is closed after it."""


class OnePoolAdapter(UnixHTTPAdapter):
    """docker-py's unix-socket adapter with one connection pool for the socket.

    docker-py's own keys its pools by the whole URL (container ids and query strings
    included) and keeps the 25 last used: 100 concurrent creates made more pools than that,
    so one still lending connections was evicted and closed, and a request returning its
    connection to it while it overflowed failed with ``AttributeError: 'NoneType' object has
    no attribute 'qsize'`` (urllib3's ``_put_conn``)."""

    POOL_KEY = "http+docker://localhost"

    def get_connection(self, url: bytes | str, proxies: object = None) -> UnixHTTPConnectionPool:
        return super().get_connection(self.POOL_KEY, proxies)


def _one_pool(client: docker.DockerClient) -> None:
    """Give a unix-socket ``client`` one pool of ``ENGINE_CONNECTIONS`` for its socket."""
    api = client.api
    old = api.get_adapter(OnePoolAdapter.POOL_KEY)
    if not isinstance(old, UnixHTTPAdapter):
        return  # tcp:// or ssh://: requests' and docker-py's adapters key by host already
    adapter = OnePoolAdapter(f"http+unix://{old.socket_path}", timeout=old.timeout,
                             max_pool_size=ENGINE_CONNECTIONS)
    api.mount("http+docker://", adapter)
    api._custom_adapter = adapter  # type: ignore[attr-defined]  # docker-py's fallback (not in its stubs)
    old.close()


def connect_client(timeout: int = 60) -> docker.DockerClient:
    """A client of the engine named by DOCKER_HOST (default socket) that answered a ping,
    with one connection pool for as many requests as the harness runs at once;
    EngineUnavailable naming the engine and the fix otherwise."""
    try:
        client = docker.from_env(timeout=timeout, max_pool_size=ENGINE_CONNECTIONS)
        _one_pool(client)
        client.ping()
    except docker.errors.DockerException as exc:
        record_engine_error("engine_unavailable")
        raise EngineUnavailable(
            f"cannot reach the Docker engine at {engine_host()} ({short_reason(exc)}); start dockerd "
            "(`make test` and `make demo` start it) or set DOCKER_HOST. No tool runs without a sandbox."
        ) from None
    return client


_ERROR_KINDS: tuple[tuple[type[Exception], str], ...] = (
    (EngineUnavailable, "engine_unavailable"), (ImageNotFound, "image_not_found"),
    (SandboxStartError, "sandbox_start"), (docker.errors.APIError, "docker_api"),
)


def _count_error(exc: Exception) -> None:
    """Count ``exc`` in ``callbox_engine_errors_total`` once (engine methods call each other)."""
    if getattr(exc, "_callbox_counted", False):
        return
    for cls, kind in _ERROR_KINDS:
        if isinstance(exc, cls):
            record_engine_error(kind)
            exc._callbox_counted = True  # type: ignore[attr-defined]
            return


def engine_calls(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """Losing the engine mid-request (dockerd stopped or restarting) raises the requests
    library's own errors, which docker-py passes through; make them EngineUnavailable. The
    engine's failures are counted in the metrics by kind."""

    @wraps(method)
    def call(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(*args, **kwargs)
        except requests.exceptions.RequestException as exc:
            if isinstance(exc, docker.errors.DockerException):  # APIError is both: an answer, not a loss
                _count_error(exc)
                raise
            lost = EngineUnavailable(
                f"lost the Docker engine at {engine_host()} ({short_reason(exc)}): it stopped or is restarting; "
                "start dockerd again (`make test` and `make demo` start it)"
            )
            _count_error(lost)
            raise lost from None
        except (EngineUnavailable, ImageNotFound, SandboxStartError) as exc:
            _count_error(exc)
            raise

    return call


def remove_container(client: docker.DockerClient, name: str) -> None:
    """Remove a container (by name or id) with its anonymous volumes, running or not; one
    that is missing, or whose removal is already in progress, is not an error."""
    try:
        client.api.remove_container(name, force=True, v=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as exc:
        if exc.status_code != 409:  # 409: removal already in progress
            raise


@cache
def seccomp_profile() -> str:
    """Docker's default seccomp profile minus io_uring (see harness/data/SECCOMP.md)."""
    text = resources.files("harness").joinpath("data/seccomp.json").read_text()
    return json.dumps(json.loads(text), separators=(",", ":"))


