"""Delivery semantics seen on the wire: flow control, redelivery, exactly-once, aliases."""

import json
import socket
import urllib.request
from collections.abc import Callable

from broker.mqtt.constants import PropertyId
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
from tests.protocol.rawclient import RawClient
from tests.support.broker_process import BrokerProcess

Client = Callable[..., RawClient]
P = PropertyId


def subscribe(raw: RawClient, topic_filter: str, qos: int = 1) -> None:
    raw.send(Subscribe(1, [Subscription(topic_filter, qos)]))
    assert isinstance(raw.recv(), Suback)


def publish_qos1(raw: RawClient, topic: str, payloads: list[bytes], **props: int) -> None:
    """Publishes and waits for every PUBACK: by then the broker has routed each message."""
    properties = {getattr(P, name): value for name, value in props.items()}
    for index, payload in enumerate(payloads, start=1):
        raw.send(Publish(topic, payload, qos=1, packet_id=index, properties=dict(properties)))
    for _ in payloads:
        assert isinstance(raw.recv(), Puback)


def client_info(broker: BrokerProcess, client_id: str) -> dict[str, object]:
    url = f"http://127.0.0.1:{broker.ports['http']}/api/v5/clients/{client_id}"
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


def test_receive_maximum_bounds_the_inflight_window(
    client: Client, shared_broker: BrokerProcess
) -> None:
    sub = client()
    sub.connect("rm-sub", properties={P.RECEIVE_MAXIMUM: 2})
    subscribe(sub, "rm/t")
    pub = client()
    pub.connect("rm-pub")
    publish_qos1(pub, "rm/t", [b"1", b"2", b"3", b"4", b"5"])
    info = client_info(shared_broker, "rm-sub")
    assert (info["inflight_cnt"], info["mqueue_len"]) == (2, 3)
    received = [sub.recv() for _ in range(2)]
    assert [p.payload for p in received] == [b"1", b"2"]
    for packet in received:
        sub.send(Puback(packet.packet_id))
    rest = [sub.recv() for _ in range(2)]
    assert [p.payload for p in rest] == [b"3", b"4"]


def test_unacknowledged_messages_are_redelivered_with_dup(client: Client) -> None:
    sub = client()
    sub.connect("dup-sub", clean_start=False, properties={P.SESSION_EXPIRY_INTERVAL: 60})
    subscribe(sub, "dup/t")
    pub = client()
    pub.connect("dup-pub")
    publish_qos1(pub, "dup/t", [b"once"])
    first = sub.recv()
    assert isinstance(first, Publish) and not first.dup
    sub.close()
    again = client()
    connack = again.connect("dup-sub", clean_start=False,
                            properties={P.SESSION_EXPIRY_INTERVAL: 60})
    assert connack.session_present
    redelivered = again.recv()
    assert isinstance(redelivered, Publish)
    assert (redelivered.payload, redelivered.dup, redelivered.packet_id) == (
        b"once", True, first.packet_id)


def test_qos2_duplicate_publish_is_routed_once(client: Client) -> None:
    sub = client()
    sub.connect("q2-sub")
    subscribe(sub, "q2/t", 2)
    pub = client()
    pub.connect("q2-pub")
    pub.send(Publish("q2/t", b"exactly", qos=2, packet_id=7))
    assert isinstance(pub.recv(), Pubrec)
    pub.send(Publish("q2/t", b"exactly", qos=2, packet_id=7, dup=True))
    assert isinstance(pub.recv(), Pubrec)
    pub.send(Pubrel(7))
    assert isinstance(pub.recv(), Pubcomp)
    pub.send(Publish("q2/t", b"next", qos=2, packet_id=8))
    assert isinstance(pub.recv(), Pubrec)
    got = [sub.recv(), sub.recv()]
    assert [p.payload for p in got if isinstance(p, Publish)] == [b"exactly", b"next"]
    sub.send(Pubrec(got[0].packet_id))
    assert sub.recv() == Pubrel(got[0].packet_id)


def test_outbound_topic_alias_replaces_repeated_topics(client: Client) -> None:
    sub = client()
    sub.connect("alias-sub", properties={P.TOPIC_ALIAS_MAXIMUM: 4})
    subscribe(sub, "alias/#", 0)
    pub = client()
    pub.connect("alias-pub")
    publish_qos1(pub, "alias/long/topic/name", [b"a", b"b"])
    first, second = sub.recv(), sub.recv()
    assert isinstance(first, Publish) and isinstance(second, Publish)
    assert first.topic == "alias/long/topic/name"
    assert first.properties[P.TOPIC_ALIAS] == second.properties[P.TOPIC_ALIAS]
    assert second.topic == ""


def test_message_larger_than_client_maximum_is_skipped(client: Client) -> None:
    sub = client()
    sub.connect("small-sub", properties={P.MAXIMUM_PACKET_SIZE: 64})
    subscribe(sub, "size/t")
    pub = client()
    pub.connect("size-pub")
    publish_qos1(pub, "size/t", [b"x" * 200, b"small"])
    got = sub.recv()
    assert isinstance(got, Publish) and got.payload == b"small"


def test_forwarded_message_carries_remaining_expiry_and_properties(client: Client) -> None:
    sub = client()
    sub.connect("exp-sub")
    subscribe(sub, "exp/t")
    pub = client()
    pub.connect("exp-pub")
    users = [("k", "1"), ("k", "2"), ("a", "3")]
    pub.send(Publish("exp/t", b"x", qos=1, packet_id=1, properties={
        P.MESSAGE_EXPIRY_INTERVAL: 100, P.USER_PROPERTY: users, P.CONTENT_TYPE: "text/plain",
        P.RESPONSE_TOPIC: "reply/here", P.CORRELATION_DATA: b"\x00\x01",
    }))
    got = sub.recv()
    assert isinstance(got, Publish)
    assert 0 < got.properties[P.MESSAGE_EXPIRY_INTERVAL] <= 100
    assert got.properties[P.USER_PROPERTY] == users
    assert got.properties[P.CONTENT_TYPE] == "text/plain"
    assert got.properties[P.RESPONSE_TOPIC] == "reply/here"
    assert got.properties[P.CORRELATION_DATA] == b"\x00\x01"


def test_subscription_identifier_and_retain_handling(client: Client) -> None:
    pub = client()
    pub.connect("rh-pub")
    pub.send(Publish("rh/t", b"kept", qos=1, packet_id=1, retain=True))
    assert isinstance(pub.recv(), Puback)
    sub = client()
    sub.connect("rh-sub")
    sub.send(Subscribe(1, [Subscription("rh/+", 1, retain_handling=1)],
                       {P.SUBSCRIPTION_IDENTIFIER: [42]}))
    assert isinstance(sub.recv(), Suback)
    retained = sub.recv()
    assert isinstance(retained, Publish)
    assert (retained.payload, retained.retain) == (b"kept", True)
    assert retained.properties[P.SUBSCRIPTION_IDENTIFIER] == [42]
    sub.send(Puback(retained.packet_id))
    # Retain Handling 1: the subscription exists now, so re-subscribing sends nothing; the
    # next message proves the queue is empty of retained copies.
    sub.send(Subscribe(2, [Subscription("rh/+", 1, retain_handling=1)]))
    assert isinstance(sub.recv(), Suback)
    publish_qos1(pub, "rh/t", [b"live"])
    live = sub.recv()
    assert isinstance(live, Publish)
    assert (live.payload, live.retain) == (b"live", False)


def test_slow_qos0_consumer_is_bounded_not_buffered_forever(
    client: Client, shared_broker: BrokerProcess
) -> None:
    sub = client()
    sub.connect("slow-sub")
    subscribe(sub, "slow/t", 0)
    sub.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    pub = client()
    pub.connect("slow-pub")
    payload = b"x" * 60_000
    for _ in range(400):  # 24 MB towards a client that never reads
        pub.send(Publish("slow/t", payload))
    publish_qos1(pub, "slow/t", [b"sync"])  # the PUBACK means all 400 were routed
    url = f"http://127.0.0.1:{shared_broker.ports['http']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        metrics = response.read().decode()
    assert 'mqtt_messages_dropped_total{reason="slow_consumer"}' in metrics
