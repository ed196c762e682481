"""Session fixtures for the images without Python (``tests.support.foreign_images``)."""

from __future__ import annotations

import pytest

from tests.support import foreign_images


@pytest.fixture(scope="session")
def busybox_image(engine) -> str:  # type: ignore[no-untyped-def]
    return foreign_images.busybox_image(engine.client)


@pytest.fixture(scope="session")
def bookworm_nopython_image(engine) -> str:  # type: ignore[no-untyped-def]
    return foreign_images.bookworm_nopython_image(engine.client)


@pytest.fixture(scope="session")
def musl_image(engine) -> str:  # type: ignore[no-untyped-def]
    return foreign_images.musl_image(engine.client)
