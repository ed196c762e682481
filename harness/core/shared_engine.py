"""One engine connection that many sessions share, with the policy's warm pool on it.

A door that serves many sessions from one process hands each of them the same
:class:`SharedEngine` as its ``engine_factory``: the engine is connected (and leftovers
reaped) once, on first use, and when the policy's ``[pool]`` asks for one (``size`` > 0)
the engine gets a warm pool (:mod:`harness.engine.docker.pool`) of the ``pool_specs`` as it
connects, so a session's create that matches a pooled spec is a claim. ``close`` destroys
the pooled sandboxes; after it the factory still hands out the engine, without a pool.

The doors that use one: the MCP server (stdio and HTTP, :mod:`harness.doors.mcp.service`)
and library Sessions whose policy has ``[pool]`` (:func:`pooled_engine`: one per process
and pooled spec, closed at interpreter exit or by :func:`close_pooled_engines`). One-shot
CLI commands (``callbox run``, ``call``, ``exec``, ``sandbox new``) create cold: their
process ends with its one sandbox, so a pool would only start a second container to throw
away, and a pool lives in the memory of the process that holds it (its ready list, its
lock), so another process cannot claim from it.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from harness.core.errors import CallboxError
from harness.core.sandbox_settings import PoolSettings
from harness.engine.base import Engine, PoolEntry
from harness.engine.default import connect_default_engine
from harness.engine.select import EngineChoice, engine_connector
from harness.engine.spec import SandboxSpec

if TYPE_CHECKING:
    from harness.engine.docker.pool import WarmPool

__all__ = ["SharedEngine", "close_pooled_engines", "pooled_engine"]

log = logging.getLogger("callbox.engine.shared")


class SharedEngine:
    """One engine connection for all sessions (connected on first use), with a warm pool of
    ``pool_specs`` when ``pool`` (the policy's ``[pool]``) has ``size`` > 0; ``room``: the
    most sandboxes the pool may hold at a time (a server's total limit minus its live ones).
    Only ``network = "none"`` specs are pooled; the others are left out with a warning."""

    def __init__(self, connect: Callable[[], Engine] = connect_default_engine, *, pool: PoolSettings | None = None,
                 pool_specs: list[SandboxSpec] | None = None, room: Callable[[], int] | None = None) -> None:
        self._connect = connect
        self._engine: Engine | None = None
        self._lock = threading.Lock()
        self._pool = pool if pool is not None and pool.enabled else None
        self.pool_specs: list[SandboxSpec | PoolEntry] = list(pool_specs or [])
        """The specs pooled (a door adds its own with :meth:`add_pool_entry`)."""
        self._room = room
        self._closed = False

    def __call__(self) -> Engine:
        with self._lock:
            if self._engine is None:
                self._engine = self._connect()
                if self._pool is not None and not self._closed:
                    self._enable_pool(self._engine, self._pool)
            return self._engine

    def add_pool_entry(self, entry: PoolEntry) -> None:
        """Pool ``entry`` too (its own size; e.g. a door's template), when this engine has a
        pool: at the first connect, or now if that was earlier."""
        with self._lock:
            if self._pool is None or self._closed:
                return
            self.pool_specs.append(entry)
            if self._engine is None:
                return
            pool = self.pool
            if pool is None:
                self._enable_pool(self._engine, self._pool)
            elif entry.spec.network == "none":
                pool.add(entry)

    def _enable_pool(self, engine: Engine, settings: PoolSettings) -> None:
        def spec(entry: SandboxSpec | PoolEntry) -> SandboxSpec:
            return entry.spec if isinstance(entry, PoolEntry) else entry

        pooled = [entry for entry in self.pool_specs if spec(entry).network == "none"]
        if len(pooled) < len(self.pool_specs):
            log.warning("the warm pool holds network = \"none\" sandboxes only; other creates start cold")
        # An engine that can keep a pool (Docker's) has enable_pool; any other creates cold.
        enable_pool = getattr(engine, "enable_pool", None)
        if not hasattr(engine, "pool"):  # a pool elsewhere (Ray's hosts) takes specs, not entries
            pooled = [entry for entry in pooled if not isinstance(entry, PoolEntry)]
        if enable_pool is None or not pooled:
            return
        try:
            enable_pool(pooled, size=settings.size, max=settings.ceiling, pause_s=settings.pause_s,
                               room=self._room)
        except CallboxError as exc:  # e.g. a mount missing now: creates say so, cold
            log.warning("no warm pool: %s", exc)

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool, once connected with one (None before the first use, or without)."""
        engine = self._engine
        found: WarmPool | None = getattr(engine, "pool", None)
        return found

    def warm(self) -> None:
        """Connect now (a warm pool starts filling); a failure is logged, the first create retries."""
        try:
            self()
        except Exception as exc:
            log.warning("cannot start the warm pool yet: %s", exc)

    def warm_in_background(self) -> None:
        """``warm`` in a daemon thread (a server starts answering while its pool fills)."""
        threading.Thread(target=self.warm, name="callbox-pool-warm", daemon=True).start()

    def close(self) -> list[str]:
        """Destroy the pooled sandboxes (if a pool was started; a connect in progress is
        waited for) and start no pool from now on; their ids. Idempotent."""
        with self._lock:
            self._closed = True
        pool = self.pool
        return pool.close() if pool is not None else []


_process_engines: dict[str, SharedEngine] = {}
_process_lock = threading.Lock()


def pooled_engine(pool: PoolSettings, spec: SandboxSpec, choice: EngineChoice | None = None) -> SharedEngine:
    """The engine this process's library Sessions with ``[pool]`` settings ``pool`` and sandbox
    ``spec`` share, on the engine of ``choice`` (None: Docker): one per (settings, spec,
    engine), its pool started filling (in the background) when it is first asked for. Its
    pooled sandboxes go at interpreter exit or with :func:`close_pooled_engines` (and, if the
    process is killed, with any later gc: their owner is gone)."""
    engine = choice.model_dump(mode="json") if choice is not None and choice.ray is not None else None
    key = json.dumps([pool.model_dump(mode="json"), spec.model_dump(mode="json"), engine], sort_keys=True)
    with _process_lock:
        shared = _process_engines.get(key)
        if shared is None:
            shared = _process_engines[key] = SharedEngine(engine_connector(choice), pool=pool, pool_specs=[spec])
            shared.warm_in_background()
        return shared


def close_pooled_engines() -> list[str]:
    """Destroy the pooled sandboxes of every :func:`pooled_engine` of this process; their ids.
    Sessions made afterwards start new pools."""
    with _process_lock:
        engines = list(_process_engines.values())
        _process_engines.clear()
    return [sandbox_id for shared in engines for sandbox_id in shared.close()]


atexit.register(close_pooled_engines)
