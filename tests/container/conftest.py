"""The images, built (or found up to date) once per session, and the engine that runs them."""

import os

import pytest

from tests.container.engine import Engine, build_images, detect


@pytest.fixture(scope="session")
def engine() -> Engine:
    build_images(dict(os.environ))
    return detect(dict(os.environ))
