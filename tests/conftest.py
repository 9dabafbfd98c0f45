from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.clients import PahoClient
from tests.support.broker_process import BrokerProcess


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Starts real broker processes; every one is killed at teardown, also on failure."""
    started: list[BrokerProcess] = []

    def start(data_dir: Path | None = None, **settings: str) -> BrokerProcess:
        process = BrokerProcess(data_dir or tmp_path / "data", dict(settings))
        started.append(process)
        return process.start()

    yield start
    for process in started:
        process.kill()


@pytest.fixture
def broker(start_broker: Callable[..., BrokerProcess]) -> BrokerProcess:
    return start_broker()


@pytest.fixture
def clients() -> Iterator[list[PahoClient]]:
    """Paho clients a test makes itself (append them); every one closed at teardown, also
    on failure."""
    made: list[PahoClient] = []
    yield made
    for client in made:
        client.close()
