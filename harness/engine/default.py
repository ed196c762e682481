"""The engine a session uses unless it is given another: the local Docker engine."""

from __future__ import annotations

import tenacity

from harness.core.errors import EngineUnavailable
from harness.engine.base import Engine


def connect_default_engine() -> Engine:
    """The Docker engine named by DOCKER_HOST (or the local socket), failing closed when none
    answers. Engine set-up is safe to retry (nothing has run yet); commands never are."""
    from harness.engine.docker.engine import DockerEngine

    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(EngineUnavailable),
        stop=tenacity.stop_after_attempt(3),
        wait=tenacity.wait_exponential(multiplier=0.5, max=4),
        reraise=True,
    )
    engine: Engine = retrying(DockerEngine.connect)
    return engine
