"""Flow control of what clients send (MQTT 5.0 section 4.9): a QoS 1 publisher that never
waits for its PUBACKs, into a topic a durable session subscribes to, must not grow the broker
beyond its configured bounds; a v5 one that exceeds our Receive Maximum is disconnected.

Raw sockets: a client library keeps its own window, and the point is a client that does not.
Memory is the broker process's resident set (VmRSS), read while the flood runs.
"""

import threading

import pytest

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.packets import Disconnect, Puback, Publish
from tests.integration.clients import unique, wait_until
from tests.support.raw_mqtt import (
    PINGREQ,
    PINGRESP,
    raw_connect,
    raw_subscribe,
    read_until_closed,
    recv_packet,
)

pytestmark = pytest.mark.integration

RECEIVE_MAXIMUM = 32  # mqtt.max_inflight's default, advertised in CONNACK
RECEIVE_MAXIMUM_EXCEEDED = 0x93
MB = 1024 * 1024


def durable_subscriber(port: int, topic: str) -> None:
    """A session that outlives its connection (3.1.1, clean session 0) and subscribes to
    `topic`: every PUBLISH to it is stored before its PUBACK leaves. It goes offline at once
    (nothing reads the messages back)."""
    sock, _ = raw_connect(port, unique("durable"), keepalive=60, clean=False)
    with sock:
        raw_subscribe(sock, 1, [(topic, 1)])


def publishes(topic: str, count: int, payload: bytes, version: int) -> bytes:
    return b"".join(encode(Publish(topic, payload, qos=1, packet_id=i % 65535 + 1), version)
                    for i in range(count))


def test_qos1_flood_into_a_durable_session_is_bounded(start_broker) -> None:
    """256 MB of QoS 1 PUBLISHes from a 3.1.1 client that reads nothing back: the broker
    reads only as fast as it stores (the bound is 2 MB of payload awaiting storage), serves
    another client meanwhile, acknowledges every message, and is no bigger afterwards.
    Before flow control it read all of it into memory (hundreds of MB, held after the
    client left)."""
    broker = start_broker(**{"mqtt.max_awaiting_storage_bytes": "2MB"})
    topic = unique("flood")
    durable_subscriber(broker.tcp, topic)
    count, payload = 16_000, b"x" * 16_384
    flood = publishes(topic, count, payload, 4)
    baseline = broker.rss()

    flooder, _ = raw_connect(broker.tcp, unique("flooder"), keepalive=0)
    flooder.settimeout(120)
    sent = threading.Event()
    errors: list[BaseException] = []

    def send_all() -> None:
        try:
            flooder.sendall(flood)
        except BaseException as error:  # reported by the test thread
            errors.append(error)
        finally:
            sent.set()

    sender = threading.Thread(target=send_all, daemon=True)
    peak = baseline
    served_during_flood = False
    try:
        sender.start()
        while not sent.wait(0.05):
            peak = max(peak, broker.rss())
            if not served_during_flood:
                # The flooded broker still answers someone else at once.
                other, _ = raw_connect(broker.tcp, unique("other"), keepalive=30)
                with other:
                    other.settimeout(2)
                    other.sendall(PINGREQ)
                    assert recv_packet(other) == PINGRESP
                served_during_flood = True
        assert not errors, errors
        peak = max(peak, broker.rss())
        # Every message was stored and acknowledged, in order.
        decoder, acks = Decoder(version=4), []
        flooder.settimeout(30)
        while len(acks) < count:
            acks += decoder.feed(flooder.recv(65536))
        assert acks == [Puback(i % 65535 + 1) for i in range(count)]
    finally:
        flooder.close()
        sender.join(5)
    assert served_during_flood
    growth = peak - baseline
    assert growth < 80 * MB, f"broker grew by {growth / MB:.0f} MB during the flood"
    # After the publisher left, the broker is no bigger than the bound allowed during it.
    wait_until(lambda: broker.rss() - baseline < 80 * MB, timeout=10,
               what="the broker's memory to return under the bound")


def test_v5_publisher_beyond_receive_maximum_is_disconnected(start_broker) -> None:
    """Receive Maximum (32) PUBLISHes may wait for their PUBACK; the 33rd is a protocol
    violation answered with DISCONNECT 0x93 (MQTT 5.0 section 4.9). Sent in one write into
    a durable session's topic, their PUBACKs all wait on storage together."""
    broker = start_broker()
    topic = unique("rm")
    durable_subscriber(broker.tcp, topic)

    within, _ = raw_connect(broker.tcp, unique("within"), keepalive=0, version=5)
    with within:
        within.sendall(publishes(topic, RECEIVE_MAXIMUM, b"ok", 5))
        decoder, acks = Decoder(version=5), []
        while len(acks) < RECEIVE_MAXIMUM:
            acks += decoder.feed(within.recv(65536))
        assert [a.packet_id for a in acks] == list(range(1, RECEIVE_MAXIMUM + 1))

    beyond, _ = raw_connect(broker.tcp, unique("beyond"), keepalive=0, version=5)
    with beyond:
        beyond.sendall(publishes(topic, RECEIVE_MAXIMUM + 1, b"too many", 5))
        received = Decoder(version=5).feed(read_until_closed(beyond, timeout=5))
    assert received[-1:] == [Disconnect(RECEIVE_MAXIMUM_EXCEEDED)], received
