"""Which engine the sandboxes run on: this machine's Docker engine (the default) or a Ray cluster.

The choice is written ``engine = "docker" | "ray"`` with a ``[ray]`` table
(:class:`~harness.engine.ray.settings.RaySettings`) in a policy or a server configuration, or
given as ``--engine ray --ray-address HOST:PORT --ray-token-file FILE`` on the command line;
:class:`EngineChoice` holds it and :func:`connect_engine` connects to it. The two keys go
together: ``[ray]`` without ``engine = "ray"`` (or the reverse) is refused, naming the fix
(:data:`RayTable` checks it where the keys are read).

Docker is connected as before (:func:`~harness.engine.default.connect_default_engine`). Ray is
imported only when chosen; without it the choice fails naming ``pip install 'callbox[ray]'``.
Before joining the cluster the settings are checked in seconds
(:func:`~harness.engine.ray.preflight.preflight`: the cluster answers and takes the token,
this machine is one of its nodes), so a wrong address is an error, never a wait. A process
joins one Ray cluster (``ray.init`` is per process): its Ray engine is made once and shared
by every caller of :func:`connect_engine` with the same settings.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, model_validator

from harness.core.errors import CallboxError, ErrorCode, UsageError
from harness.engine.ray.settings import RaySettings

if TYPE_CHECKING:
    from harness.engine.base import Engine

__all__ = ["DOCKER", "EngineChoice", "EngineName", "RayTable", "check_engine_keys", "choice_of", "connect_engine",
           "engine_connector", "with_engine"]

log = logging.getLogger("callbox.engine")

EngineName = Literal["docker", "ray"]


def check_engine_keys(engine: str | None, ray: RaySettings | None) -> None:
    """``engine`` and ``[ray]`` go together; ValueError naming the fix otherwise."""
    if ray is not None and engine != "ray":
        said = "is not set" if engine is None else f'is "{engine}"'
        raise ValueError(f'[ray] is set but engine {said}; add engine = "ray" (a top-level key, above every '
                         "table) to run the sandboxes on that cluster, or remove [ray]")
    if engine == "ray" and ray is None:
        raise ValueError('engine = "ray" needs a [ray] table: address = "HOST:PORT" of the cluster\'s head and '
                         'token_file = "FILE" with its token')


def _ray_matches_engine(value: RaySettings | None, info: ValidationInfo) -> RaySettings | None:
    if "engine" in info.data:  # absent when the engine key itself was refused
        check_engine_keys(info.data["engine"], value)
    return value


RayTable = Annotated[RaySettings | None, Field(validate_default=True), AfterValidator(_ray_matches_engine)]
"""The ``[ray]`` field of a model with an ``engine: EngineName | None`` field declared before
it: checked against it (``key 'ray': ...``), also when ``[ray]`` is absent."""


class EngineChoice(BaseModel):
    """An engine and its settings (``ray`` for the Ray engine, None for Docker)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: EngineName = "docker"
    """``docker``: this machine's Docker engine; ``ray``: the Ray cluster of ``ray``."""
    ray: RaySettings | None = None
    """The cluster, with ``engine = "ray"`` only."""

    @model_validator(mode="after")
    def _together(self) -> EngineChoice:
        check_engine_keys(self.engine, self.ray)
        return self

    def describe(self) -> str:
        """One line for messages and logs."""
        if self.ray is None:
            return "the Docker engine of this machine"
        return f"the {self.ray.describe()}"


DOCKER = EngineChoice()


def choice_of(engine: EngineName | None, ray: RaySettings | None) -> EngineChoice | None:
    """The choice a file's ``engine`` and ``[ray]`` keys make; None when ``engine`` is not set."""
    return None if engine is None else EngineChoice(engine=engine, ray=ray)


_Keyed = TypeVar("_Keyed", bound=BaseModel)


def with_engine(model: _Keyed, choice: EngineChoice) -> _Keyed:
    """``model`` (a policy, with ``engine`` and ``ray`` fields) saying ``choice``: what a
    command line chose travels with the policy (into a paused run's checkpoint, to the
    sessions of a door). Unchanged when it says so already, or names no engine and the choice
    is Docker."""
    engine, ray = getattr(model, "engine", None), getattr(model, "ray", None)
    if (engine, ray) == (choice.engine, choice.ray) or (engine is None and choice.ray is None):
        return model
    return model.model_copy(update={"engine": choice.engine, "ray": choice.ray})


def connect_engine(choice: EngineChoice | None = None) -> Engine:
    """The engine of ``choice`` (None: Docker), connected; fails closed with a CallboxError
    saying why (see the module's docstring)."""
    return engine_connector(choice)()


def engine_connector(choice: EngineChoice | None, *, retry: bool = True) -> Callable[[], Engine]:
    """A function connecting to ``choice``'s engine (a SharedEngine's ``connect``, a Session's
    ``engine_factory``). Docker: with a few retries (``retry``) or failing at once, as a
    server does; Ray: this process's engine for those settings."""
    if choice is None or choice.ray is None:
        from harness.engine.default import connect_default_engine

        return connect_default_engine if retry else _docker_once
    settings = choice.ray
    return lambda: _ray_engine(settings)


def _docker_once() -> Engine:
    from harness.engine.docker.engine import DockerEngine

    engine: Engine = DockerEngine.connect()
    return engine


_ray_lock = threading.Lock()
_ray_engines: dict[str, Any] = {}


def _ray_engine(settings: RaySettings) -> Engine:
    """This process's Ray engine for ``settings`` (a relative token file taken against the
    working directory), joined on first use; a CallboxError when it cannot be."""
    try:
        settings = settings.anchored(Path.cwd())
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    key = json.dumps(settings.model_dump(mode="json"), sort_keys=True)
    with _ray_lock:
        engine = _ray_engines.get(key)
        if engine is not None:
            return engine  # type: ignore[no-any-return]
        if _ray_engines:
            (other,) = [json.loads(k)["address"] for k in _ray_engines]
            raise CallboxError(f"this process drives the Ray cluster at {other} already and cannot join another "
                               f"({settings.address}) or the same with other settings: Ray joins one cluster "
                               "per process", code=ErrorCode.CONFLICT)
        from harness.engine.ray.preflight import RayMissing, preflight

        preflight(settings)
        try:
            from harness.engine.ray.engine import RayEngine
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] != "ray":
                raise
            raise RayMissing(f"the Ray engine needs Ray ({exc}): pip install 'callbox[ray]'") from None
        engine = _ray_engines[key] = RayEngine.connect(settings)
        log.info("sandboxes run on %s", EngineChoice(engine="ray", ray=settings).describe())
        return engine


def forget_ray_engines() -> list[Any]:
    """Drop this process's Ray engines from the cache (a test that closed its engine, a
    process that left the cluster); the engines dropped, for the caller to close."""
    with _ray_lock:
        engines = list(_ray_engines.values())
        _ray_engines.clear()
    return engines
