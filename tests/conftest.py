"""Shared fixtures. Docker tests use the real engine and the real image.

Outside CI a missing engine or image skips the Docker tests with the reason; with
CI=true it fails them, because in CI every Docker and security test must run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
IMAGE = os.environ.get("CALLBOX_TEST_IMAGE", "callbox-sandbox:latest")


def _unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def engine():  # type: ignore[no-untyped-def]
    from harness.docker_engine import DockerEngine
    from harness.errors import EngineUnavailable

    try:
        eng = DockerEngine.connect()
    except EngineUnavailable as exc:
        _unavailable(f"no Docker engine: {exc.message} (run `make test`, which starts one)")
    try:
        eng.client.images.get(IMAGE)
    except Exception:
        _unavailable(f"image {IMAGE} is missing (run `make image`)")
    return eng


@pytest.fixture
def make_sandbox(engine) -> Iterator[Callable[..., object]]:  # type: ignore[no-untyped-def]
    """Factory: ``make_sandbox(**spec_fields)``; every sandbox is destroyed afterwards."""
    from harness.spec import SandboxSpec

    created = []

    def make(**fields: object) -> object:
        fields.setdefault("image", IMAGE)
        box = engine.create(SandboxSpec(**fields))
        created.append(box)
        return box

    try:
        yield make
    finally:
        for box in created:
            box.destroy()


@pytest.fixture
def sandbox(make_sandbox):  # type: ignore[no-untyped-def]
    return make_sandbox()
