"""Client IDs up to `mqtt.max_clientid_len` (65535 bytes, the longest MQTT can carry) work
wherever the broker stores them: retained records, durable session records, stored messages.

A retained PUBLISH from a client ID over 255 bytes used to be lost (its record kept the
publisher's length in one byte) and the client got no PUBACK.
"""

from collections.abc import Callable

import pytest

from tests.integration.clients import BOTH, NO_MATCHING_SUBSCRIBERS, PahoClient, unique
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

LONGEST = 65535


def long_id(length: int) -> str:
    """A unique client ID of exactly `length` bytes."""
    tag = unique("long")
    return tag + "x" * (length - len(tag))


def test_the_longest_client_id_fits_the_wire() -> None:
    assert len(long_id(LONGEST).encode()) == LONGEST


@BOTH
@pytest.mark.parametrize("length", [256, LONGEST])
def test_a_retained_publish_from_a_long_client_id_is_stored_and_acknowledged(
    paho_client: Callable[..., PahoClient], start_broker: Callable[..., BrokerProcess],
    version: int, length: int,
) -> None:
    broker = start_broker()
    topic = unique("retained").replace("-", "/")
    pub = paho_client(long_id(length), port=broker.tcp, version=version)
    # The PUBACK arrived (v5: No matching subscribers, a success code).
    assert pub.publish(topic, b"kept", 1, retain=True) in (0, NO_MATCHING_SUBSCRIBERS)
    pub.publish(topic + "/qos0", b"kept too", 0, retain=True)
    assert pub.connected

    sub = paho_client(port=broker.tcp)
    sub.subscribe(topic + "/#", 1)
    got = sorted((m.topic, m.payload, m.retain) for m in sub.wait_messages(2))
    assert got == [(topic, b"kept", True), (topic + "/qos0", b"kept too", True)]

    assert broker.stop() == 0
    broker = start_broker(broker.data_dir)
    again = paho_client(port=broker.tcp)
    again.subscribe(topic, 1)
    assert [(m.payload, m.retain) for m in again.wait_messages(1)] == [(b"kept", True)]


def test_a_durable_session_with_the_longest_client_id_survives_a_restart(
    paho_client: Callable[..., PahoClient], start_broker: Callable[..., BrokerProcess],
) -> None:
    """Its records (meta, subscription, read positions, batches) are keyed by the client ID,
    and its own messages are stored with it as publisher: after a restart, the replay of an
    unacknowledged batch must still recognise them for No Local (only the other's comes)."""
    broker = start_broker()
    client_id = long_id(LONGEST)
    topic = unique("durable").replace("-", "/")
    session = paho_client(client_id, port=broker.tcp, clean_start=False, session_expiry=3600,
                          manual_ack=True)
    assert session.subscribe(topic, 1, no_local=True) == [1]
    assert session.publish(topic, b"own", 1) == 0
    other = paho_client(port=broker.tcp)
    assert other.publish(topic, b"other", 1) == 0
    assert [m.payload for m in session.wait_messages(1)] == [b"other"]  # never acknowledged
    assert session.barrier() == session.wait_messages(1)
    session.kill()
    assert broker.stop() == 0

    broker = start_broker(broker.data_dir)
    back = paho_client(client_id, port=broker.tcp, clean_start=False, session_expiry=3600)
    assert back.connack.session_present is True
    replayed = back.wait_messages(1)
    assert [(m.payload, m.dup) for m in replayed] == [(b"other", True)]
    assert back.barrier() == replayed  # not its own message
    later = paho_client(port=broker.tcp)
    assert later.publish(topic, b"after", 1) == 0
    assert [m.payload for m in back.wait_messages(2)] == [b"other", b"after"]
