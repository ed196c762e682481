"""Session fixtures for the foreign test images (see foreign_images.py); load with
``pytest_plugins = ["tests.support.foreign_fixtures"]``. They use the suite's ``engine`` fixture, so a
missing engine skips (fails under CI=true) as everywhere else; a failed build fails the test."""

from __future__ import annotations

import pytest

from tests.support import foreign_images


@pytest.fixture(scope="session")
def busybox_image(engine) -> str:
    return foreign_images.busybox_image(engine.client)


@pytest.fixture(scope="session")
def bookworm_nopython_image(engine) -> str:
    return foreign_images.bookworm_nopython_image(engine.client)


@pytest.fixture(scope="session")
def musl_image(engine) -> str:
    return foreign_images.musl_image(engine.client)
