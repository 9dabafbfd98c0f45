from collections.abc import Callable, Iterator

import pytest

from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the whole module: these tests only look at single connections."""
    process = BrokerProcess(tmp_path_factory.mktemp("proto") / "data").start()
    yield process
    process.kill()


@pytest.fixture
def client(shared_broker: BrokerProcess) -> Iterator[Callable[..., RawClient]]:
    made: list[RawClient] = []

    def make(version: int = 5) -> RawClient:
        raw = RawClient(shared_broker.tcp, version)
        made.append(raw)
        return raw

    yield make
    for raw in made:
        raw.close()
