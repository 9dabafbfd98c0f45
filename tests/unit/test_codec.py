"""Codec round trips (hypothesis), byte-exact spec vectors, version mapping and streaming.

The strategies generate only packets a conforming peer may send, so `decode(encode(p)) == p`
must hold exactly; anything the codec normalises (v3 CONNACK codes) is tested separately.
"""

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.mqtt.codec import Decoder, encode, encode_ack, encode_properties, encode_publish
from broker.mqtt.constants import MAX_VARINT, MQTT_3_1, MQTT_3_1_1, MQTT_5, PacketType
from broker.mqtt.constants import PropertyId as P
from broker.mqtt.errors import MQTTError, PacketTooLarge
from broker.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
    Pingresp,
    Properties,
    Puback,
    Pubcomp,
    Publish,
    Pubrec,
    Pubrel,
    Suback,
    Subscribe,
    Subscription,
    Unsuback,
    Unsubscribe,
    Will,
)
from broker.mqtt.properties import ALLOWED_PROPERTIES, WILL_PROPERTIES, encode_varint

VERSIONS = (MQTT_3_1, MQTT_3_1_1, MQTT_5)

# ---------------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------------

# Valid MQTT strings: any code point except surrogates (not encodable) and U+0000.
text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
# A small alphabet makes duplicate user properties likely.
short = st.text("ab\u00e9\U0001f600", max_size=3)
topic_name = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00+#"), min_size=1, max_size=12
)
topic_filter = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), min_size=1, max_size=12
)
binary = st.binary(max_size=24)
u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFF_FFFF)
flag = st.integers(0, 1)
packet_id = st.integers(1, 0xFFFF)

PROPERTY_VALUES: dict[int, st.SearchStrategy[Any]] = {
    P.PAYLOAD_FORMAT_INDICATOR: flag,
    P.MESSAGE_EXPIRY_INTERVAL: u32,
    P.CONTENT_TYPE: text,
    P.RESPONSE_TOPIC: topic_name,
    P.CORRELATION_DATA: binary,
    P.SUBSCRIPTION_IDENTIFIER: st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=4),
    P.SESSION_EXPIRY_INTERVAL: u32,
    P.ASSIGNED_CLIENT_IDENTIFIER: text,
    P.SERVER_KEEP_ALIVE: u16,
    P.AUTHENTICATION_METHOD: text,
    P.AUTHENTICATION_DATA: binary,
    P.REQUEST_PROBLEM_INFORMATION: flag,
    P.WILL_DELAY_INTERVAL: u32,
    P.REQUEST_RESPONSE_INFORMATION: flag,
    P.RESPONSE_INFORMATION: text,
    P.SERVER_REFERENCE: text,
    P.REASON_STRING: text,
    P.RECEIVE_MAXIMUM: st.integers(1, 0xFFFF),
    P.TOPIC_ALIAS_MAXIMUM: u16,
    P.TOPIC_ALIAS: st.integers(1, 0xFFFF),
    P.MAXIMUM_QOS: flag,
    P.RETAIN_AVAILABLE: flag,
    P.USER_PROPERTY: st.lists(st.tuples(short, short), min_size=1, max_size=5),
    P.MAXIMUM_PACKET_SIZE: st.integers(1, 0xFFFF_FFFF),
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: flag,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: flag,
    P.SHARED_SUBSCRIPTION_AVAILABLE: flag,
}


def properties(
    ptype: int | None,
    version: int,
    overrides: dict[int, st.SearchStrategy[Any]] | None = None,
) -> st.SearchStrategy[Properties]:
    """Properties allowed in `ptype` (None: will properties); {} before v5."""
    if version != MQTT_5:
        return st.just({})
    allowed = WILL_PROPERTIES if ptype is None else ALLOWED_PROPERTIES[ptype]
    optional = {int(pid): PROPERTY_VALUES[pid] for pid in allowed}
    optional.update(overrides or {})
    return st.fixed_dictionaries({}, optional=optional)


def reason(version: int, v5_codes: tuple[int, ...]) -> st.SearchStrategy[int]:
    return st.sampled_from(v5_codes) if version == MQTT_5 else st.just(0)


CONNACK_CODES = (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C,
                 0x90, 0x95, 0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)  # fmt: skip
# The v5 codes that a v3 CONNACK return code decodes back to.
CONNACK_CODES_V3 = (0x00, 0x84, 0x85, 0x88, 0x86, 0x87)
PUBACK_CODES = (0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99)
PUBREL_CODES = (0x00, 0x92)
SUBACK_CODES = (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2)
UNSUBACK_CODES = (0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91)
DISCONNECT_CODES = (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90,
                    0x93, 0x94, 0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F,
                    0xA0, 0xA1, 0xA2)  # fmt: skip
AUTH_CODES = (0x00, 0x18, 0x19)


@st.composite
def connects(draw: st.DrawFn, version: int) -> Connect:
    will = None
    if draw(st.booleans()):
        will = Will(
            draw(topic_name),
            draw(binary),
            draw(st.integers(0, 2)),
            draw(st.booleans()),
            draw(properties(None, version)),
        )
    username = draw(st.none() | text)
    password = draw(st.none() | binary)
    if version != MQTT_5 and username is None:
        password = None  # v3.1.1 forbids a password without a user name
    props = draw(properties(PacketType.CONNECT, version))
    if P.AUTHENTICATION_DATA in props and P.AUTHENTICATION_METHOD not in props:
        props[P.AUTHENTICATION_METHOD] = draw(text)
    return Connect(
        draw(text), version, draw(st.booleans()), draw(u16), username, password, will, props
    )


@st.composite
def publishes(draw: st.DrawFn, version: int) -> Publish:
    qos = draw(st.integers(0, 2))
    props = draw(properties(PacketType.PUBLISH, version))
    topic = draw(topic_name)
    if P.TOPIC_ALIAS in props and draw(st.booleans()):
        topic = ""  # allowed in v5 together with a topic alias
    return Publish(
        topic,
        draw(st.binary(max_size=300)),  # > 127 bytes exercises multi-byte remaining lengths
        qos,
        draw(st.booleans()),
        draw(st.booleans()) if qos else False,
        draw(packet_id) if qos else None,
        props,
    )


@st.composite
def subscribes(draw: st.DrawFn, version: int) -> Subscribe:
    subs = []
    for _ in range(draw(st.integers(1, 4))):
        if version == MQTT_5:
            sub = Subscription(
                draw(topic_filter),
                draw(st.integers(0, 2)),
                draw(st.booleans()),
                draw(st.booleans()),
                draw(st.integers(0, 2)),
            )
        else:
            sub = Subscription(draw(topic_filter), draw(st.integers(0, 2)))
        subs.append(sub)
    # SUBSCRIBE may carry at most one subscription identifier.
    sub_id = st.lists(st.integers(1, MAX_VARINT), min_size=1, max_size=1)
    props = draw(properties(PacketType.SUBSCRIBE, version, {P.SUBSCRIPTION_IDENTIFIER: sub_id}))
    return Subscribe(draw(packet_id), subs, props)


def acks(cls: type, codes: tuple[int, ...], version: int) -> st.SearchStrategy[Packet]:
    return st.builds(
        cls,
        packet_id,
        reason(version, codes),
        properties(cls(0).type, version),
    )


def packets(version: int) -> st.SearchStrategy[Packet]:
    """Any packet either side may send at `version`."""
    v5 = version == MQTT_5
    choices: list[st.SearchStrategy[Packet]] = [
        connects(version),
        st.builds(
            Connack,
            st.booleans(),
            st.sampled_from(CONNACK_CODES if v5 else CONNACK_CODES_V3),
            properties(PacketType.CONNACK, version),
        ),
        publishes(version),
        acks(Puback, PUBACK_CODES, version),
        acks(Pubrec, PUBACK_CODES, version),
        acks(Pubrel, PUBREL_CODES, version),
        acks(Pubcomp, PUBREL_CODES, version),
        subscribes(version),
        st.builds(
            Suback,
            packet_id,
            st.lists(st.sampled_from(SUBACK_CODES if v5 else (0, 1, 2, 0x80)), min_size=1),
            properties(PacketType.SUBACK, version),
        ),
        st.builds(
            Unsubscribe,
            packet_id,
            st.lists(topic_filter, min_size=1, max_size=4),
            properties(PacketType.UNSUBSCRIBE, version),
        ),
        st.builds(
            Unsuback,
            packet_id,
            st.lists(st.sampled_from(UNSUBACK_CODES), min_size=1) if v5 else st.just([]),
            properties(PacketType.UNSUBACK, version),
        ),
        st.just(Pingreq()),
        st.just(Pingresp()),
        st.builds(
            Disconnect,
            reason(version, DISCONNECT_CODES),
            properties(PacketType.DISCONNECT, version),
        ),
    ]
    if v5:
        choices.append(
            st.builds(Auth, st.sampled_from(AUTH_CODES), properties(PacketType.AUTH, version))
        )
    return st.one_of(choices)


@st.composite
def versioned_packets(draw: st.DrawFn, max_size: int = 6) -> tuple[int, list[Packet]]:
    """A version and a sequence of packets; no CONNECT, which would switch the version."""
    version = draw(st.sampled_from(VERSIONS))
    pkts = draw(
        st.lists(packets(version).filter(lambda p: not isinstance(p, Connect)), max_size=max_size)
    )
    return version, pkts


def decode_all(data: bytes, version: int | None) -> list[Packet]:
    decoder = Decoder(version=version)
    return decoder.feed(data)


SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
@SETTINGS
@given(data=st.data())
def test_round_trip_every_packet(version: int, data: st.DataObject) -> None:
    packet = data.draw(packets(version))
    wire = encode(packet, version)
    decoder = Decoder(version=None if isinstance(packet, Connect) else version)
    assert decoder.feed(wire) == [packet]
    assert decoder.version == version


@SETTINGS
@given(vp=versioned_packets(), data=st.data())
def test_round_trip_in_random_chunks(vp: tuple[int, list[Packet]], data: st.DataObject) -> None:
    version, pkts = vp
    wire = b"".join(encode(p, version) for p in pkts)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=8)))
    decoder = Decoder(version=version)
    got: list[Packet] = []
    prev = 0
    for cut in [*cuts, len(wire)]:
        got += decoder.feed(wire[prev:cut])
        prev = cut
    assert got == pkts


@settings(max_examples=60, deadline=None)
@given(vp=versioned_packets(max_size=3))
def test_round_trip_one_byte_at_a_time(vp: tuple[int, list[Packet]]) -> None:
    version, pkts = vp
    wire = b"".join(encode(p, version) for p in pkts)
    decoder = Decoder(version=version)
    got: list[Packet] = []
    for i in range(len(wire)):
        got += decoder.feed(wire[i : i + 1])
    assert got == pkts


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_connect_then_packets_switches_version(version: int, data: st.DataObject) -> None:
    """A server-side decoder learns the version from CONNECT mid-chunk."""
    connect = data.draw(connects(version))
    rest = data.draw(
        st.lists(packets(version).filter(lambda p: not isinstance(p, Connect)), max_size=4)
    )
    decoder = Decoder()
    assert decoder.version is None
    wire = encode(connect, version) + b"".join(encode(p, version) for p in rest)
    assert decoder.feed(wire) == [connect, *rest]
    assert decoder.version == version


@SETTINGS
@given(data=st.data())
def test_encode_publish_matches_encode(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from(VERSIONS))
    p = data.draw(publishes(version))
    fast = encode_publish(
        p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties or None, version
    )
    assert fast == encode(p, version)


def test_user_properties_keep_order_and_duplicates() -> None:
    props = {
        P.USER_PROPERTY: [("k", "2"), ("a", "x"), ("k", "1"), ("k", "2")],
        P.SUBSCRIPTION_IDENTIFIER: [7, 1, 7, 268_435_455],
    }
    wire = encode(Publish("t", b"", 0, properties=props), MQTT_5)
    (got,) = decode_all(wire, MQTT_5)
    assert got.properties[P.USER_PROPERTY] == [("k", "2"), ("a", "x"), ("k", "1"), ("k", "2")]
    assert got.properties[P.SUBSCRIPTION_IDENTIFIER] == [7, 1, 7, 268_435_455]


def test_subscribe_subscription_identifier_is_a_list() -> None:
    sub = Subscribe(1, [Subscription("a/#", 1)], {P.SUBSCRIPTION_IDENTIFIER: [42]})
    (got,) = decode_all(encode(sub, MQTT_5), MQTT_5)
    assert got.properties == {P.SUBSCRIPTION_IDENTIFIER: [42]}


def test_decoded_strings_and_payload_types() -> None:
    wire = encode(Publish("a/\u00e9", b"\x00\xff", 1, packet_id=3), MQTT_3_1_1)
    (got,) = decode_all(wire, MQTT_3_1_1)
    assert type(got.topic) is str and type(got.payload) is bytes


# ---------------------------------------------------------------------------------------------
# Byte-exact vectors
# ---------------------------------------------------------------------------------------------

VECTORS: list[tuple[str, Packet, int, str]] = [
    ("pingreq", Pingreq(), MQTT_3_1_1, "c000"),
    ("pingresp", Pingresp(), MQTT_5, "d000"),
    # v3.1.1 CONNECT, client id "abc", clean session, keepalive 60 (spec 3.1.2.10 layout).
    ("connect 3.1.1", Connect("abc", 4, True, 60), MQTT_3_1_1,
     "100f 00044d515454 04 02 003c 0003616263"),
    ("connect 3.1", Connect("abc", 3, True, 60), MQTT_3_1,
     "1011 00064d5149736470 03 02 003c 0003616263"),
    # v5 CONNECT with Session Expiry Interval 10, user "u", password "p", will "w" = "x".
    ("connect 5", Connect("c", 5, False, 10, "u", b"p", Will("w", b"x", 1, True),
                          {P.SESSION_EXPIRY_INTERVAL: 10}), MQTT_5,
     "1020 00044d515454 05 ec 000a 05 110000000a 000163 00 000177 000178 000175 000170"),
    # v5 PUBLISH QoS 1, id 10, Payload Format 1, Message Expiry 60, User Property k=v.
    ("publish 5", Publish("a/b", b"hi", 1, False, False, 10, {
        P.PAYLOAD_FORMAT_INDICATOR: 1,
        P.MESSAGE_EXPIRY_INTERVAL: 60,
        P.USER_PROPERTY: [("k", "v")],
    }), MQTT_5, "3218 0003612f62 000a 0e 0101 020000003c 260001 6b 000176 6869"),
    ("publish 3.1.1 retain dup qos2", Publish("a", b"", 2, True, True, 1), MQTT_3_1_1,
     "3d05 000161 0001"),
    ("publish 5 qos0 no props", Publish("a", b"z", 0), MQTT_5, "3005 000161 00 7a"),
    ("puback 5 short", Puback(1), MQTT_5, "40020001"),
    ("puback 5 code only", Puback(1, 0x10), MQTT_5, "4003000110"),
    ("puback 5 props", Puback(1, 0, {P.REASON_STRING: "r"}), MQTT_5, "4008 0001 00 04 1f000172"),
    ("puback 3.1.1 drops code", Puback(1, 0x80), MQTT_3_1_1, "40020001"),
    ("pubrel", Pubrel(258), MQTT_3_1_1, "62020102"),
    ("subscribe 3.1.1", Subscribe(1, [Subscription("a/b", 1)]), MQTT_3_1_1,
     "8208 0001 0003612f62 01"),
    ("subscribe 5 options", Subscribe(1, [Subscription("a", 2, True, True, 2)]), MQTT_5,
     "8207 0001 00 000161 2e"),
    ("suback 3.1.1 failure collapses", Suback(1, [0, 0x87, 2, 0x80]), MQTT_3_1_1,
     "9006 0001 00800280"),
    ("suback 5", Suback(1, [0, 0x87]), MQTT_5, "9005 0001 00 0087"),
    ("unsubscribe", Unsubscribe(2, ["x"]), MQTT_3_1_1, "a205 0002 000178"),
    ("unsuback 3.1.1 no payload", Unsuback(2, [0x11]), MQTT_3_1_1, "b0020002"),
    ("unsuback 5", Unsuback(2, [0x11]), MQTT_5, "b004 0002 00 11"),
    ("connack 3.1.1", Connack(True, 0), MQTT_3_1_1, "20020100"),
    ("connack 5", Connack(False, 0), MQTT_5, "2003 00 00 00"),
    ("connack 5 props", Connack(False, 0x80, {P.MAXIMUM_QOS: 1}), MQTT_5, "2005 00 80 02 2401"),
    ("disconnect 3.1.1", Disconnect(0x8E), MQTT_3_1_1, "e000"),
    ("disconnect 5 normal", Disconnect(), MQTT_5, "e000"),
    ("disconnect 5 code", Disconnect(0x8E), MQTT_5, "e0018e"),
    ("disconnect 5 props", Disconnect(0, {P.SESSION_EXPIRY_INTERVAL: 0}), MQTT_5,
     "e007 00 05 1100000000"),
    ("auth 5 short", Auth(), MQTT_5, "f000"),
    ("auth 5", Auth(0x18, {P.AUTHENTICATION_METHOD: "m"}), MQTT_5, "f006 18 04 1500016d"),
]  # fmt: skip


@pytest.mark.parametrize(("packet", "version", "hexstr"), [v[1:] for v in VECTORS],
                         ids=[v[0] for v in VECTORS])  # fmt: skip
def test_vectors(packet: Packet, version: int, hexstr: str) -> None:
    wire = bytes.fromhex(hexstr.replace(" ", ""))
    assert encode(packet, version) == wire
    decoded = decode_all(wire, None if isinstance(packet, Connect) else version)
    # Some vectors are lossy for v3 by design; those are checked in the mapping tests below.
    if version == MQTT_5 or not isinstance(packet, Puback | Suback | Unsuback | Disconnect):
        assert decoded == [packet]


@pytest.mark.parametrize(
    ("value", "hexstr"),
    [
        (0, "00"),
        (127, "7f"),
        (128, "8001"),
        (16_383, "ff7f"),
        (16_384, "808001"),
        (2_097_151, "ffff7f"),
        (2_097_152, "80808001"),
        (268_435_455, "ffffff7f"),
    ],
)
def test_varint_vectors(value: int, hexstr: str) -> None:
    """Spec table 1-1 (remaining length boundaries)."""
    assert encode_varint(value) == bytes.fromhex(hexstr)
    payload = b"x" * (value - 3) if 3 <= value <= 2_097_152 else None
    if payload is not None:
        wire = encode(Publish("a", payload), MQTT_3_1_1)
        assert wire[1 : 1 + len(hexstr) // 2] == bytes.fromhex(hexstr)
        assert decode_all(wire, MQTT_3_1_1)[0].payload == payload


@pytest.mark.parametrize("value", [-1, MAX_VARINT + 1])
def test_varint_out_of_range(value: int) -> None:
    with pytest.raises(ValueError):
        encode_varint(value)


def test_encode_properties_is_length_prefixed() -> None:
    assert encode_properties({}) == b"\x00"
    assert encode_properties({P.TOPIC_ALIAS: 5}) == bytes.fromhex("03 23 0005")
    assert encode_properties({P.SUBSCRIPTION_IDENTIFIER: [1, 128]}) == bytes.fromhex(
        "05 0b01 0b8001"
    )
    with pytest.raises(ValueError):
        encode_properties({0x7F: 1})


# ---------------------------------------------------------------------------------------------
# v3 mapping and encoder edge cases
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("v5_code", "v3_code"),
    [
        (0x00, 0),
        (0x84, 1),
        (0x85, 2),
        (0x88, 3),
        (0x89, 3),
        (0x86, 4),
        (0x8C, 4),
        (0x87, 5),
        (0x8A, 5),
        (0x80, 3),
        (0x81, 3),
        (0x82, 3),
        (0x97, 3),
        (0x9C, 3),
        (3, 3),  # already a v3 code: passed through
        (5, 5),
    ],
)
@pytest.mark.parametrize("version", [MQTT_3_1, MQTT_3_1_1])
def test_connack_v3_mapping(v5_code: int, v3_code: int, version: int) -> None:
    assert encode(Connack(False, v5_code), version) == bytes((0x20, 2, 0, v3_code))


def test_connack_v3_decodes_to_v5_codes() -> None:
    for v3_code, v5_code in enumerate((0x00, 0x84, 0x85, 0x88, 0x86, 0x87)):
        (got,) = decode_all(bytes((0x20, 2, 0, v3_code)), MQTT_3_1_1)
        assert got == Connack(False, v5_code)


def test_v3_drops_properties_and_ack_codes() -> None:
    pub = Publish("t", b"p", 1, packet_id=1, properties={P.MESSAGE_EXPIRY_INTERVAL: 5})
    assert encode(pub, MQTT_3_1_1) == encode(Publish("t", b"p", 1, packet_id=1), MQTT_3_1_1)
    assert encode(Unsuback(9, [0x11], {P.REASON_STRING: "x"}), MQTT_3_1_1) == b"\xb0\x02\x00\x09"
    assert encode(Disconnect(0x98, {P.REASON_STRING: "x"}), MQTT_3_1_1) == b"\xe0\x00"
    sub = Subscribe(1, [Subscription("a", 1, no_local=True, retain_handling=2)])
    assert encode(sub, MQTT_3_1_1)[-1] == 1


@pytest.mark.parametrize("version", [MQTT_3_1, MQTT_3_1_1])
def test_auth_does_not_exist_in_v3(version: int) -> None:
    with pytest.raises(ValueError):
        encode(Auth(0x18), version)


def test_encode_rejects_unrepresentable_values() -> None:
    with pytest.raises(ValueError):
        encode(Connect("c", 4, password=b"p"), MQTT_3_1_1)  # password without user name
    with pytest.raises(ValueError):
        encode(Puback(0x10000), MQTT_3_1_1)
    with pytest.raises(ValueError):
        encode(Pingreq(), 6)
    with pytest.raises(ValueError):
        encode_publish("a", b"", 1, False, False, None, None, MQTT_3_1_1)
    with pytest.raises(ValueError):
        encode_publish("a" * 65_536, b"", 0, False, False, None, None, MQTT_3_1_1)
    with pytest.raises(ValueError):
        encode(Publish("t", properties={P.TOPIC_ALIAS: 70_000}), MQTT_5)


def test_encode_publish_empty_topic_with_alias() -> None:
    wire = encode_publish("", b"x", 0, False, False, None, {P.TOPIC_ALIAS: 1}, MQTT_5)
    assert wire == bytes.fromhex("3007 0000 03 230001 78")
    (got,) = decode_all(wire, MQTT_5)
    assert got == Publish("", b"x", properties={P.TOPIC_ALIAS: 1})


def test_encode_connect_uses_version_argument_for_level() -> None:
    wire = encode(Connect("c", protocol_level=5), MQTT_3_1_1)
    assert wire[8] == MQTT_3_1_1


# ---------------------------------------------------------------------------------------------
# Streaming behaviour
# ---------------------------------------------------------------------------------------------


def test_partial_packets_are_kept() -> None:
    wire = encode(Publish("a/b", b"x" * 200, 1, packet_id=5), MQTT_3_1_1)
    decoder = Decoder(version=MQTT_3_1_1)
    assert decoder.feed(wire[:1]) == []
    assert decoder.feed(wire[1:2]) == []  # multi-byte remaining length still incomplete
    assert decoder.feed(wire[2:50]) == []
    assert decoder.feed(wire[50:] + wire[:3]) == [Publish("a/b", b"x" * 200, 1, packet_id=5)]
    assert decoder.feed(wire[3:]) == [Publish("a/b", b"x" * 200, 1, packet_id=5)]
    assert decoder.feed(b"") == []


def test_feed_accepts_bytearray_and_memoryview_without_aliasing() -> None:
    wire = bytearray(encode(Publish("a", b"hello"), MQTT_3_1_1))
    decoder = Decoder(version=MQTT_3_1_1)
    assert decoder.feed(memoryview(wire)[:4]) == []
    wire[3] = ord("z")  # the caller reuses its buffer; the decoder must have copied
    (got,) = decoder.feed(wire[4:])
    assert got == Publish("a", b"hello")


def test_large_packet_in_many_small_chunks() -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB
    wire = encode(Publish("big", payload, 1, packet_id=1), MQTT_5)
    decoder = Decoder(version=MQTT_5)
    got: list[Packet] = []
    for i in range(0, len(wire), 1000):
        got += decoder.feed(wire[i : i + 1000])
    assert got == [Publish("big", payload, 1, packet_id=1)]


def test_error_keeps_packets_before_it_and_kills_decoder() -> None:
    good = encode(Pingreq(), MQTT_3_1_1) + encode(Publish("a", b"1"), MQTT_3_1_1)
    decoder = Decoder(version=MQTT_3_1_1)
    with pytest.raises(MQTTError) as info:
        decoder.feed(good + b"\x00\x00" + encode(Pingreq(), MQTT_3_1_1))
    assert info.value.packets == [Pingreq(), Publish("a", b"1")]  # type: ignore[attr-defined]
    with pytest.raises(type(info.value)) as again:
        decoder.feed(encode(Pingreq(), MQTT_3_1_1))
    assert again.value.reason_code == info.value.reason_code
    assert again.value.packets == []  # type: ignore[attr-defined]


def test_packets_attribute_is_empty_list_when_first_packet_fails() -> None:
    with pytest.raises(MQTTError) as info:
        Decoder(version=MQTT_5).feed(b"\x00\x00")
    assert info.value.packets == []  # type: ignore[attr-defined]


def test_error_in_later_feed_reports_only_that_call() -> None:
    decoder = Decoder(version=MQTT_3_1_1)
    assert decoder.feed(b"\xc0\x00\xc0") == [Pingreq()]
    with pytest.raises(MQTTError) as info:
        decoder.feed(b"\x01\x00")  # PINGREQ with a body
    assert info.value.packets == []  # type: ignore[attr-defined]


def test_packet_too_large_before_body_arrives() -> None:
    decoder = Decoder(max_packet_size=1000, version=MQTT_3_1_1)
    header = b"\x30" + encode_varint(2_000_000)  # announces a 2 MB PUBLISH
    with pytest.raises(PacketTooLarge) as info:
        decoder.feed(header)
    assert info.value.reason_code == 0x95


def test_packet_too_large_small_limit_single_byte_length() -> None:
    decoder = Decoder(max_packet_size=10, version=MQTT_3_1_1)
    assert decoder.feed(encode(Publish("abc", b"xyz"), MQTT_3_1_1)) == [Publish("abc", b"xyz")]
    with pytest.raises(PacketTooLarge):
        decoder.feed(b"\x30\x09")  # 11 bytes total


def test_packet_exactly_at_limit_is_accepted() -> None:
    wire = encode(Publish("t", b"x" * 500), MQTT_5)
    decoder = Decoder(max_packet_size=len(wire), version=MQTT_5)
    assert decoder.feed(wire) == [Publish("t", b"x" * 500)]
    with pytest.raises(PacketTooLarge):
        Decoder(max_packet_size=len(wire) - 1, version=MQTT_5).feed(wire[:3])


def test_decoder_rejects_unknown_version_argument() -> None:
    with pytest.raises(ValueError):
        Decoder(version=6)


@pytest.mark.parametrize("cls", [Puback, Pubrec, Pubrel, Pubcomp])
@pytest.mark.parametrize("version", [3, 4, 5])
@pytest.mark.parametrize("reason_code", [0x00, 0x10, 0x92])
@pytest.mark.parametrize("packet_id", [1, 300, 0xFFFF])
def test_encode_ack_fast_path_matches_the_packet_encoder(
    cls: type, version: int, reason_code: int, packet_id: int
) -> None:
    first = {Puback: 0x40, Pubrec: 0x50, Pubrel: 0x62, Pubcomp: 0x70}[cls]
    expected = encode(cls(packet_id, reason_code if version == 5 else 0), version)
    assert encode_ack(first, packet_id, reason_code, version) == expected
