"""QoS 2 with durable sessions, both directions, across a `kill -9` of the broker.

Incoming: the PUBREC of a client's QoS 2 PUBLISH means the broker remembers owning the
message, so after a restart the client's resend is acknowledged and not routed again, and
its PUBREL is answered with success once (then the identifier is free). Outgoing: once the
broker sent PUBREL, a restart resumes the flow with PUBREL, never with the PUBLISH, which
the client would take as a new message.
"""

import pytest

from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.packets import (
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
)
from tests.integration.clients import unique
from tests.protocol.rawclient import RawClient

pytestmark = pytest.mark.integration

EXPIRY = {PropertyId.SESSION_EXPIRY_INTERVAL: 3600}
PACKET_ID = 7


def durable(port: int, client_id: str, present: bool) -> RawClient:
    client = RawClient(port)
    connack = client.connect(client_id, clean_start=False, properties=dict(EXPIRY))
    assert connack.session_present is present
    return client


def subscribe(client: RawClient, topic: str) -> None:
    client.send(Subscribe(1, [Subscription(topic, 2)]))
    assert isinstance(suback := client.recv(), Suback) and suback.reason_codes == [2]


def test_an_incoming_qos2_message_is_routed_once_across_a_kill(start_broker) -> None:
    broker = start_broker()
    topic, pub_id, sub_id = unique("in2"), unique("in2-pub"), unique("in2-sub")
    sub = durable(broker.tcp, sub_id, False)
    subscribe(sub, topic)
    sub.close()
    pub = durable(broker.tcp, pub_id, False)
    pub.send(Publish(topic, b"once", 2, packet_id=PACKET_ID))
    assert pub.recv() == Pubrec(PACKET_ID)  # stored, and owned until PUBREL, on disk
    pub.close()
    broker.kill()
    broker = start_broker(broker.data_dir)

    pub = durable(broker.tcp, pub_id, True)
    pub.send(Publish(topic, b"once", 2, dup=True, packet_id=PACKET_ID))
    assert pub.recv() == Pubrec(PACKET_ID)
    pub.send(Pubrel(PACKET_ID))
    assert pub.recv() == Pubcomp(PACKET_ID)
    pub.send(Pubrel(PACKET_ID))  # the identifier is free now
    assert pub.recv() == Pubcomp(PACKET_ID, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND)
    pub.send(Publish(topic, b"end", 1, packet_id=PACKET_ID + 1))
    assert isinstance(pub.recv(), Puback)
    pub.close()

    sub = durable(broker.tcp, sub_id, True)
    received: list[bytes] = []
    while not received or received[-1] != b"end":
        got = sub.recv()
        if isinstance(got, Pubrel):
            sub.send(Pubcomp(got.packet_id))
            continue
        assert isinstance(got, Publish) and got.packet_id is not None
        received.append(got.payload)
        sub.send(Puback(got.packet_id) if got.qos == 1 else Pubrec(got.packet_id))
    sub.close()
    assert received == [b"once", b"end"]


def test_a_released_delivery_resumes_with_pubrel_after_a_kill(start_broker) -> None:
    broker = start_broker()
    topic, sub_id = unique("out2"), unique("out2-sub")
    sub = durable(broker.tcp, sub_id, False)
    subscribe(sub, topic)
    pub = RawClient(broker.tcp)
    pub.connect(unique("out2-pub"))
    pub.send(Publish(topic, b"released", 2, packet_id=1))
    assert pub.recv() == Pubrec(1)
    pub.close()
    got = sub.recv()
    assert isinstance(got, Publish) and got.payload == b"released" and got.packet_id
    sub.send(Pubrec(got.packet_id))
    assert sub.recv() == Pubrel(got.packet_id)  # sent once the release is on disk
    sub.close()
    broker.kill()
    broker = start_broker(broker.data_dir)

    sub = durable(broker.tcp, sub_id, True)
    assert sub.recv() == Pubrel(got.packet_id)
    sub.send(Pubcomp(got.packet_id))
    sub.send(Subscribe(2, [Subscription(topic, 2)]))  # nothing else comes before its SUBACK
    assert isinstance(sub.recv(), Suback)
    sub.close()
