"""Fixtures for integration tests: one shared broker process, unique names, tracked clients.

Most tests run against one broker started once per session (startup costs about a second);
they stay independent by using unique client IDs and topic prefixes. Tests that need their
own settings, a restart or a pristine topic space use `start_broker` / `broker` instead.
"""

from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

from tests.integration.clients import GmqttClient, MosquittoSub, PahoClient, unique
from tests.support.broker_process import BrokerProcess


@pytest.fixture(scope="session")
def _shared_broker_holder() -> Iterator[list[Any]]:
    holder: list[Any] = []
    yield holder
    for process in holder:
        process.kill()


@pytest.fixture
def shared_broker(
    _shared_broker_holder: list[BrokerProcess], tmp_path_factory: pytest.TempPathFactory
) -> BrokerProcess:
    """The session's broker; started again if an earlier test left it dead."""
    if not _shared_broker_holder or _shared_broker_holder[-1].proc.poll() is not None:
        data_dir = tmp_path_factory.mktemp("shared-broker")
        _shared_broker_holder.append(BrokerProcess(data_dir).start())
    return _shared_broker_holder[-1]


@pytest.fixture
def topic() -> str:
    """A topic prefix no other test uses."""
    return unique("t").replace("-", "/")


@pytest.fixture
def paho_client(shared_broker: BrokerProcess) -> Iterator[Callable[..., PahoClient]]:
    """paho_client(client_id=None, port=None, connect=True, version=5, **connect_kwargs).

    Creates (and by default connects) a paho client against the shared broker or `port`;
    every client is closed at teardown, also when the test failed.
    """
    clients: list[PahoClient] = []

    def make(
        client_id: str | None = None,
        *,
        port: int | None = None,
        version: int = 5,
        connect: bool = True,
        transport: str = "tcp",
        clean_session: bool = True,
        manual_ack: bool = False,
        **connect_kwargs: Any,
    ) -> PahoClient:
        client = PahoClient(
            port or shared_broker.tcp,
            unique("paho") if client_id is None else client_id,
            version=version, transport=transport, clean_session=clean_session,
            manual_ack=manual_ack,
        )
        clients.append(client)
        if connect:
            client.connect(**connect_kwargs)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
async def gmqtt_client(shared_broker: BrokerProcess) -> AsyncIterator[Callable[..., Any]]:
    clients: list[GmqttClient] = []

    async def make(client_id: str | None = None, *, version: int = 5, clean: bool = True,
                   **properties: Any) -> GmqttClient:
        client = GmqttClient(shared_broker.tcp, client_id or unique("gmqtt"), version=version,
                             clean=clean, **properties)
        clients.append(client)
        await client.connect()
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def mosquitto_sub() -> Iterator[Callable[..., MosquittoSub]]:
    subs: list[MosquittoSub] = []

    def make(port: int, topics: list[str], wait_for_suback: bool = True,
             **kwargs: Any) -> MosquittoSub:
        sub = MosquittoSub(port, topics, **kwargs)
        subs.append(sub)
        return sub.start(wait_for_suback)

    yield make
    for sub in subs:
        sub.close()
