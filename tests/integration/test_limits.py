"""Non-default limits from the configuration, observed through paho-mqtt."""

import socket
from collections.abc import Iterator

import pytest

from tests.integration.clients import (
    BOTH,
    CLIENT_ID_NOT_VALID,
    PACKET_TOO_LARGE,
    PROTOCOL_ERROR,
    QOS_NOT_SUPPORTED,
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED,
    TOPIC_ALIAS_INVALID,
    TOPIC_FILTER_INVALID,
    TOPIC_NAME_INVALID,
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED,
    payloads,
    publish_props,
    unique,
    wait_offline,
    wait_until,
)
from tests.support.broker_process import BrokerProcess

pytestmark = pytest.mark.integration

# One broker for every test of a non-default limit (startup is the slow part); none of these
# settings gets in the way of another's test.
LIMITS = {
    "mqtt.max_qos_allowed": "1",
    "mqtt.max_topic_alias": "2",
    "mqtt.max_mqueue_len": "3",
    "mqtt.mqueue_store_qos0": "false",
    "mqtt.max_session_expiry_interval": "100s",
    "mqtt.max_packet_size": "2KB",
    "retainer.max_payload_size": "16",
    "mqtt.wildcard_subscription": "false",
    "mqtt.shared_subscription": "false",
    "mqtt.max_clientid_len": "40",
    "mqtt.max_topic_levels": "8",
    # The memory session's queue limits are what these tests check (durable sessions keep
    # their backlog in Durable Storage, without a queue limit).
    "durable_sessions.enable": "false",
}


@pytest.fixture(scope="module")
def limited_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    process = BrokerProcess(tmp_path_factory.mktemp("limited"), dict(LIMITS)).start()
    yield process
    process.kill()


def test_max_qos_allowed(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("MaximumQoS") == 1
    assert client.subscribe("capped/t", 2) == [1]  # granted QoS capped
    client.client.publish("capped/t", b"x", 2)
    assert client.wait_disconnected() == QOS_NOT_SUPPORTED


def test_retained_max_payload_size(paho_client, limited_broker) -> None:
    port = limited_broker.tcp
    both = [("size/small", 1), ("size/big", 1)]  # no wildcards on this broker
    live = paho_client(port=port)
    live.subscribe(both)
    pub = paho_client(port=port)
    pub.publish("size/small", b"s" * 16, 1, retain=True)
    pub.publish("size/big", b"b" * 17, 1, retain=True)
    assert payloads(live.wait_messages(2)) == [b"s" * 16, b"b" * 17]  # both forwarded
    sub = paho_client(port=port)
    sub.subscribe(both)
    assert [(m.topic, m.payload) for m in sub.barrier()] == [("size/small", b"s" * 16)]


def test_v5_topic_alias_limits(paho_client, limited_broker) -> None:
    pub = paho_client(port=limited_broker.tcp)
    assert pub.connack.prop("TopicAliasMaximum") == 2
    pub.publish("alias/t", b"ok", 1, properties=publish_props(TopicAlias=2))
    pub.client.publish("alias/t", b"x", 1, properties=publish_props(TopicAlias=3))
    assert pub.wait_disconnected() == TOPIC_ALIAS_INVALID
    unset = paho_client(port=limited_broker.tcp)
    unset.client.publish("", b"x", 1, properties=publish_props(TopicAlias=1))
    assert unset.wait_disconnected() == PROTOCOL_ERROR  # alias never set


def test_v5_session_expiry_capped_in_connack(paho_client, limited_broker) -> None:
    capped = paho_client(port=limited_broker.tcp, session_expiry=100_000)
    assert capped.connack.prop("SessionExpiryInterval") == 100
    within = paho_client(port=limited_broker.tcp, session_expiry=50)
    assert within.connack.prop("SessionExpiryInterval") is None  # granted as asked


def test_offline_queue_keeps_newest_and_skips_qos0(paho_client, limited_broker) -> None:
    port = limited_broker.tcp
    client_id = unique("mqueue")
    sub = paho_client(client_id, port=port, session_expiry=60)
    sub.subscribe("mq/t", 1)
    sub.disconnect()
    wait_offline(limited_broker.ports["http"], client_id)
    pub = paho_client(port=port)
    for n in range(5):
        pub.publish("mq/t", f"q1-{n}".encode(), 1)
        pub.publish("mq/t", f"q0-{n}".encode(), 0)  # mqueue_store_qos0 = false
    back = paho_client(client_id, port=port, clean_start=False, session_expiry=60)
    assert back.connack.session_present is True
    back.wait_messages(3)
    # max_mqueue_len = 3: the oldest QoS 1 messages were dropped, no QoS 0 was queued.
    assert payloads(back.barrier()) == [b"q1-2", b"q1-3", b"q1-4"]


def test_v5_packet_too_large(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("MaximumPacketSize") == 2048
    client.subscribe("big/t", 1)
    client.publish("big/t", b"x" * 1900, 1)  # fits
    assert payloads(client.wait_messages(1)) == [b"x" * 1900]
    client.client.publish("big/t", b"x" * 3000, 1)
    assert client.wait_disconnected() == PACKET_TOO_LARGE


def test_wildcard_and_shared_subscriptions_disabled(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    assert client.connack.prop("WildcardSubscriptionAvailable") == 0
    assert client.connack.prop("SharedSubscriptionAvailable") == 0
    codes = client.subscribe([("w/+", 1), ("w/#", 1), ("$share/g/w", 1), ("w/plain", 1)])
    assert codes == [WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED] * 2 + [
        SHARED_SUBSCRIPTIONS_NOT_SUPPORTED, 1]
    assert client.connected


@BOTH
def test_client_id_length_limit(paho_client, limited_broker, version) -> None:
    fits = paho_client("x" * 40, port=limited_broker.tcp, version=version)
    assert fits.connack.reason_code == 0
    too_long = paho_client("y" * 41, port=limited_broker.tcp, version=version, connect=False)
    result = too_long.connect(expect_success=False)
    assert result.reason_code == CLIENT_ID_NOT_VALID  # paho maps v3.1.1's return code 2


def test_topic_level_limit(paho_client, limited_broker) -> None:
    client = paho_client(port=limited_broker.tcp)
    eight, nine = "/".join("l" * 8), "/".join("l" * 9)  # at most 8 levels
    assert client.subscribe([(eight, 1), (nine, 1)]) == [1, TOPIC_FILTER_INVALID]
    client.publish(eight, b"ok", 1)
    assert payloads(client.wait_messages(1)) == [b"ok"]
    client.client.publish(nine, b"too deep", 1)
    assert client.wait_disconnected() == TOPIC_NAME_INVALID


def test_subscriptions_past_max_subscriptions_get_quota_exceeded(start_broker,
                                                                paho_client) -> None:
    broker = start_broker(**{"mqtt.max_subscriptions": "3"})
    client = paho_client(port=broker.tcp)
    assert client.subscribe([("a/1", 1), ("a/2", 1)]) == [1, 1]
    assert client.subscribe([("a/1", 0), ("a/3", 1), ("a/4", 1)]) == [0, 1, 0x97]
    assert client.unsubscribe("a/2") == [0]
    assert client.subscribe("a/4", qos=1) == [1]
    assert broker.metric("mqtt_limit_refusals_total", limit="max_subscriptions") == 1


def test_a_listener_closes_connections_past_max_connections(start_broker,
                                                           paho_client) -> None:
    broker = start_broker(**{"listeners.tcp.default.max_connections": "2"})
    first, second = paho_client(port=broker.tcp), paho_client(port=broker.tcp)
    with socket.create_connection(("127.0.0.1", broker.tcp), timeout=10) as third:
        assert third.recv(1) == b""  # closed before a byte was read from it
    assert broker.metric("mqtt_limit_refusals_total", limit="tcp.max_connections") == 1
    assert first.connected and second.connected
    first.disconnect()
    wait_until(lambda: _accepted(broker.tcp), 10, "room again once one left")


def _accepted(port: int) -> bool:
    """A CONNECT answered by a CONNACK (not a closed socket)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            sock.sendall(b"\x10\x0d\x00\x04MQTT\x04\x02\x00\x3c\x00\x01x")
            return sock.recv(4)[:1] == b"\x20"
        except ConnectionError:
            return False


def test_a_listener_accepts_at_most_max_conn_rate_new_connections_a_second(
        start_broker) -> None:
    broker = start_broker(**{"listeners.tcp.default.max_conn_rate": "5"})
    answered = sum(_accepted(broker.tcp) for _ in range(20))
    # The bucket holds one second's worth (5); a few more are earned while the burst runs
    # (one per 200 ms), so not all 20 however slow the machine is, short of 3 s.
    assert 5 <= answered < 20
    refused = broker.metric("mqtt_limit_refusals_total", limit="tcp.max_conn_rate")
    assert refused == 20 - answered
