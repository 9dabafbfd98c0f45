"""Bad input: every violation ends that connection with the right reason code, nothing else."""

import os
from collections.abc import Callable

from broker.mqtt.constants import PropertyId, ReasonCode
from broker.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)
from tests.protocol.rawclient import RawClient

Client = Callable[..., RawClient]


def assert_disconnected_with(raw: RawClient, reason: int) -> None:
    packet = raw.recv()
    assert isinstance(packet, Disconnect), packet
    assert packet.reason_code == reason
    assert raw.closed_by_broker()


def test_malformed_publish_v5_gets_disconnect_0x81(client: Client) -> None:
    raw = client()
    raw.connect("bad-qos")
    raw.send_raw(bytes([0x36, 0x05, 0x00, 0x01, 0x61, 0x00, 0x01]))  # PUBLISH with QoS 3
    assert_disconnected_with(raw, ReasonCode.MALFORMED_PACKET)


def test_malformed_publish_v311_is_closed_without_disconnect(client: Client) -> None:
    raw = client(4)
    raw.connect("bad-qos-v3")
    raw.send_raw(bytes([0x36, 0x05, 0x00, 0x01, 0x61, 0x00, 0x01]))
    assert raw.closed_by_broker()


def test_remaining_length_over_four_bytes_is_malformed(client: Client) -> None:
    raw = client()
    raw.connect("varint")
    raw.send_raw(bytes([0x30, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]))
    assert_disconnected_with(raw, ReasonCode.MALFORMED_PACKET)


def test_packet_before_connect_closes(client: Client) -> None:
    raw = client()
    raw.send(Publish("t", b"x"))
    assert raw.closed_by_broker()


def test_second_connect_is_a_protocol_error(client: Client) -> None:
    raw = client()
    raw.connect("twice")
    raw.send(Connect("twice"))
    assert_disconnected_with(raw, ReasonCode.PROTOCOL_ERROR)


def test_unsupported_protocol_level_gets_connack_return_code_1(client: Client) -> None:
    raw = client(4)
    raw.send_raw(b"\x10\x0d\x00\x04MQTT\x07\x02\x00\x3c\x00\x01x")
    assert raw.sock.recv(16) == b"\x20\x02\x00\x01"  # CONNACK, return code 1
    assert raw.closed_by_broker()


def test_v5_connect_with_a_wrong_protocol_name_gets_a_v5_connack_0x84(client: Client) -> None:
    """Not the v3.1.1 CONNACK (20 02 00 01), which a v5 client reads as "granted QoS 1"."""
    raw = client(5)
    raw.send_raw(b"\x10\x0e\x00\x04MQTX\x05\x02\x00\x3c\x00\x00\x01x")
    assert raw.sock.recv(16) == b"\x20\x03\x00\x84\x00"  # CONNACK 0x84, no properties
    assert raw.closed_by_broker()


def test_v311_empty_client_id_with_persistent_session_is_rejected(client: Client) -> None:
    raw = client(4)
    connack = raw.connect("", clean_start=False)
    assert connack.reason_code == ReasonCode.CLIENT_IDENTIFIER_NOT_VALID  # 2 on the wire


def test_v5_empty_client_id_is_assigned(client: Client) -> None:
    raw = client()
    connack = raw.connect("")
    assert connack.reason_code == 0
    assert connack.properties[PropertyId.ASSIGNED_CLIENT_IDENTIFIER].startswith("auto-")


def test_packet_too_large_is_refused_before_its_body_arrives(client: Client) -> None:
    raw = client()
    raw.connect("big")
    raw.send_raw(bytes([0x30, 0x80, 0x80, 0x80, 0x01]))  # claims a 2 MiB PUBLISH, sends nothing
    assert_disconnected_with(raw, ReasonCode.PACKET_TOO_LARGE)


def test_topic_alias_above_maximum_is_invalid(client: Client) -> None:
    raw = client()
    raw.connect("alias-max")
    raw.send(Publish("t", b"x", properties={PropertyId.TOPIC_ALIAS: 65535 + 0}))
    raw.send(Publish("t", b"x", properties={PropertyId.TOPIC_ALIAS: 1}))
    raw.send(Publish("", b"x", properties={PropertyId.TOPIC_ALIAS: 2}))
    assert_disconnected_with(raw, ReasonCode.PROTOCOL_ERROR)


def test_invalid_utf8_with_payload_format_indicator_is_refused(client: Client) -> None:
    raw = client()
    raw.connect("pfi")
    raw.send(Publish("t", b"\xff\xfe", qos=1, packet_id=9,
                     properties={PropertyId.PAYLOAD_FORMAT_INDICATOR: 1}))
    ack = raw.recv()
    assert isinstance(ack, Puback)
    assert (ack.packet_id, ack.reason_code) == (9, ReasonCode.PAYLOAD_FORMAT_INVALID)


def test_puback_says_no_matching_subscribers(client: Client) -> None:
    raw = client()
    raw.connect("lonely")
    raw.send(Publish("nobody/listens", b"x", qos=1, packet_id=3))
    ack = raw.recv()
    assert isinstance(ack, Puback)
    assert ack.reason_code == ReasonCode.NO_MATCHING_SUBSCRIBERS


def test_invalid_filters_get_0x8f_and_valid_ones_are_granted(client: Client) -> None:
    raw = client()
    raw.connect("filters")
    raw.send(Subscribe(1, [Subscription("a/#/b", 1), Subscription("ok/+", 2),
                           Subscription("a+", 0), Subscription("$share/g", 0)]))
    suback = raw.recv()
    assert isinstance(suback, Suback)
    invalid = ReasonCode.TOPIC_FILTER_INVALID
    assert suback.reason_codes == [invalid, 2, invalid, invalid]


def test_a_durable_sessions_bad_share_filters_get_0x8f(client: Client) -> None:
    """MQTT 5.0 section 4.8.2: a share name is at least one character without wildcards,
    followed by a filter; a durable session (which would store the group) is told so per
    filter, and keeps its connection."""
    raw = client()
    raw.connect("shared-bad", properties={PropertyId.SESSION_EXPIRY_INTERVAL: 3600})
    bad = ["$share//jobs", "$share/wo+rk/jobs", "$share/w#/jobs", "$share/workers",
           "$share/workers/", "$share/w/a/#/b"]
    raw.send(Subscribe(1, [Subscription(f, 1) for f in [*bad, "$share/w/jobs/#"]]))
    suback = raw.recv()
    assert isinstance(suback, Suback)
    assert suback.reason_codes == [ReasonCode.TOPIC_FILTER_INVALID] * len(bad) + [1]


def test_no_local_on_shared_subscription_is_a_protocol_error(client: Client) -> None:
    raw = client()
    raw.connect("shared-nl")
    raw.send(Subscribe(1, [Subscription("$share/g/t", 1, no_local=True)]))
    assert_disconnected_with(raw, ReasonCode.PROTOCOL_ERROR)


def test_session_expiry_cannot_be_raised_from_zero_on_disconnect(client: Client) -> None:
    raw = client()
    raw.connect("expiry-zero")
    raw.send(Disconnect(0, {PropertyId.SESSION_EXPIRY_INTERVAL: 60}))
    assert_disconnected_with(raw, ReasonCode.PROTOCOL_ERROR)


def test_garbage_does_not_hurt_the_broker(client: Client) -> None:
    for seed in range(20):
        raw = client()
        raw.send_raw(os.urandom(64 + seed * 37))
        assert raw.closed_by_broker()
    healthy = client()
    assert healthy.connect("still-alive").reason_code == 0


def test_malformed_v311_connect_is_closed_without_connack(client: Client) -> None:
    raw = client(4)
    raw.send_raw(b"\x10\x0d\x00\x04MQTT\x04\x03\x00\x3c\x00\x01x")  # reserved flag bit set
    assert raw.sock.recv(16) == b""


def test_malformed_v5_connect_gets_connack_0x81(client: Client) -> None:
    raw = client()
    raw.send_raw(b"\x10\x0e\x00\x04MQTT\x05\x03\x00\x3c\x00\x00\x01x")  # reserved flag bit set
    connack = raw.recv()
    assert isinstance(connack, Connack)
    assert connack.reason_code == ReasonCode.MALFORMED_PACKET


def test_client_publish_with_subscription_identifier_is_a_protocol_error(client: Client) -> None:
    raw = client()
    raw.connect("sub-id-pub")
    raw.send(Publish("t", b"x", properties={PropertyId.SUBSCRIPTION_IDENTIFIER: [3]}))
    assert_disconnected_with(raw, ReasonCode.PROTOCOL_ERROR)


def test_wildcard_response_topic_is_refused(client: Client) -> None:
    raw = client()
    raw.connect("resp-topic")
    raw.send(Publish("t", b"x", properties={PropertyId.RESPONSE_TOPIC: "replies/#"}))
    assert_disconnected_with(raw, ReasonCode.TOPIC_NAME_INVALID)
