"""Everything the decoder must refuse, one case per rule, plus fuzzing.

Each case is raw bytes built by hand (not by the encoder, which cannot produce them), fed to
a decoder at a given version (None: a server that has not seen CONNECT yet), with the
expected exception class and reason code.
"""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.constants import MQTT_3_1, MQTT_3_1_1, MQTT_5, ReasonCode
from broker.mqtt.constants import PropertyId as P
from broker.mqtt.errors import (
    MalformedPacket,
    MQTTError,
    PacketTooLarge,
    ProtocolError,
    UnsupportedProtocolVersion,
)
from broker.mqtt.packets import (
    Auth,
    Connack,
    Connect,
    Disconnect,
    Packet,
    Pingreq,
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
from broker.mqtt.properties import encode_varint

M = MalformedPacket
PE = ProtocolError
R = ReasonCode


def pkt(first: int, *parts: bytes) -> bytes:
    """A packet with a correct remaining length around arbitrary body bytes."""
    body = b"".join(parts)
    return bytes((first,)) + encode_varint(len(body)) + body


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return len(raw).to_bytes(2, "big") + raw


def h(hexstr: str) -> bytes:
    return bytes.fromhex(hexstr.replace(" ", ""))


def connect_v(level: int, flags: int = 0x02, name: str = "MQTT", rest: bytes = b"") -> bytes:
    """CONNECT with the given header fields; `rest` is properties (v5) + payload."""
    return pkt(0x10, s(name), bytes((level, flags)), b"\x00\x3c", rest)


def c5(flags: int = 0x02, rest: bytes = b"\x00" + s("c")) -> bytes:
    return connect_v(5, flags, rest=rest)


def c4(flags: int = 0x02, rest: bytes = s("c")) -> bytes:
    return connect_v(4, flags, rest=rest)


def pub5(props: bytes, topic: str = "t", first: int = 0x30) -> bytes:
    return pkt(first, s(topic), props, b"payload")


def prop_block(*props: bytes) -> bytes:
    body = b"".join(props)
    return encode_varint(len(body)) + body


V3, V4, V5 = MQTT_3_1, MQTT_3_1_1, MQTT_5

# (id, version, bytes, exception class, reason code)
CASES: list[tuple[str, int | None, bytes, type[MQTTError], int]] = [
    # --- fixed header -------------------------------------------------------------------
    ("remaining length 5 bytes", V4, h("30 ff ff ff ff 7f"), M, R.MALFORMED_PACKET),
    ("remaining length 5 bytes (only 4 sent)", V4, h("30 80 80 80 80"), M, R.MALFORMED_PACKET),
    ("remaining length non-minimal", V4, h("c0 80 00"), M, R.MALFORMED_PACKET),
    ("packet type 0", V4, h("00 00"), M, R.MALFORMED_PACKET),
    ("packet type 0 before connect", None, h("00 00"), M, R.MALFORMED_PACKET),
    ("PUBREL flags 0", V4, h("60 02 0001"), M, R.MALFORMED_PACKET),
    ("SUBSCRIBE flags 0", V4, pkt(0x80, h("0001"), s("a"), b"\x00"), M, R.MALFORMED_PACKET),
    ("UNSUBSCRIBE flags 3", V4, pkt(0xA3, h("0001"), s("a")), M, R.MALFORMED_PACKET),
    ("PUBACK flags 1", V4, h("41 02 0001"), M, R.MALFORMED_PACKET),
    ("PINGREQ flags 8", V4, h("c8 00"), M, R.MALFORMED_PACKET),
    ("DISCONNECT flags 2", V5, h("e2 00"), M, R.MALFORMED_PACKET),
    ("CONNECT flags 1", None, h("11") + c4()[1:], M, R.MALFORMED_PACKET),
    ("AUTH in v3.1.1", V4, h("f0 00"), M, R.MALFORMED_PACKET),
    ("AUTH in v3.1", V3, h("f0 00"), M, R.MALFORMED_PACKET),
    ("first packet not CONNECT", None, h("c0 00"), PE, R.PROTOCOL_ERROR),
    ("first packet PUBLISH", None, pkt(0x30, s("t")), PE, R.PROTOCOL_ERROR),
    # --- lengths and leftovers ----------------------------------------------------------
    ("PINGREQ with body", V4, h("c0 01 00"), M, R.MALFORMED_PACKET),
    ("PINGRESP with body", V5, h("d0 01 00"), M, R.MALFORMED_PACKET),
    ("PUBACK v3.1.1 too long", V4, h("40 03 0001 00"), M, R.MALFORMED_PACKET),
    ("PUBACK too short", V4, h("40 01 00"), M, R.MALFORMED_PACKET),
    ("PUBACK v5 props beyond packet", V5, h("40 05 0001 00 05 1f"), M, R.MALFORMED_PACKET),
    ("PUBACK v5 leftover after props", V5, h("40 05 0001 00 00 00"), M, R.MALFORMED_PACKET),
    ("UNSUBACK v3.1.1 with payload", V4, h("b0 03 0001 00"), M, R.MALFORMED_PACKET),
    ("DISCONNECT v3.1.1 with body", V4, h("e0 01 00"), M, R.MALFORMED_PACKET),
    ("DISCONNECT v5 leftover", V5, h("e0 03 00 00 00"), M, R.MALFORMED_PACKET),
    ("AUTH v5 code without property length", V5, h("f0 01 18"), M, R.MALFORMED_PACKET),
    ("CONNACK v3.1.1 too long", V4, h("20 03 00 00 00"), M, R.MALFORMED_PACKET),
    ("CONNACK v5 without properties", V5, h("20 02 00 00"), M, R.MALFORMED_PACKET),
    ("PUBLISH topic length beyond packet", V4, pkt(0x30, h("000a"), b"abc"), M, R.MALFORMED_PACKET),
    ("PUBLISH one byte", V4, h("30 01 00"), M, R.MALFORMED_PACKET),
    ("PUBLISH empty body", V4, h("30 00"), M, R.MALFORMED_PACKET),
    ("PUBLISH qos1 no packet id", V4, pkt(0x32, s("t"), b"\x00"), M, R.MALFORMED_PACKET),
    ("PUBLISH v5 no property length", V5, pkt(0x30, s("t")), M, R.MALFORMED_PACKET),
    ("CONNECT leftover", None, c4() + b"", M, R.MALFORMED_PACKET),  # replaced below
    ("CONNECT truncated client id", None, connect_v(4, rest=h("0005 61")), M, R.MALFORMED_PACKET),
    ("CONNECT missing keepalive", None, pkt(0x10, s("MQTT"), h("04 02 00")), M, R.MALFORMED_PACKET),
    ("CONNECT protocol name beyond packet", None, pkt(0x10, h("0010"), b"MQ"), M,
     R.MALFORMED_PACKET),
    ("CONNECT will flag but no will", None, c4(0x06), M, R.MALFORMED_PACKET),
    ("CONNECT username flag but none", None, c4(0x82), M, R.MALFORMED_PACKET),
    ("SUBSCRIBE filter without options", V4, pkt(0x82, h("0001"), s("a")), M, R.MALFORMED_PACKET),
    # --- UTF-8 --------------------------------------------------------------------------
    ("topic invalid UTF-8", V4, pkt(0x30, s(b"\xff\xfe")), M, R.MALFORMED_PACKET),
    ("topic overlong UTF-8", V4, pkt(0x30, s(b"\xc0\xaf")), M, R.MALFORMED_PACKET),
    ("topic surrogate", V4, pkt(0x30, s(b"a\xed\xa0\x80")), M, R.MALFORMED_PACKET),
    ("topic U+0000", V4, pkt(0x30, s(b"a\x00b")), M, R.MALFORMED_PACKET),
    ("client id U+0000", None, c4(rest=s(b"a\x00")), M, R.MALFORMED_PACKET),
    ("client id invalid UTF-8", None, c5(rest=b"\x00" + s(b"\x80")), M, R.MALFORMED_PACKET),
    ("username invalid UTF-8", None, c4(0x82, s("c") + s(b"\xff")), M, R.MALFORMED_PACKET),
    ("filter invalid UTF-8", V4, pkt(0x82, h("0001"), s(b"\xe2\x82"), b"\x00"), M,
     R.MALFORMED_PACKET),
    ("unsubscribe filter U+0000", V4, pkt(0xA2, h("0001"), s(b"\x00")), M, R.MALFORMED_PACKET),
    ("user property U+0000", V5, pub5(prop_block(b"\x26" + s("k") + s(b"\x00"))), M,
     R.MALFORMED_PACKET),
    ("content type invalid UTF-8", V5, pub5(prop_block(b"\x03" + s(b"\xc3"))), M,
     R.MALFORMED_PACKET),
    # --- PUBLISH ------------------------------------------------------------------------
    ("PUBLISH QoS 3", V4, pkt(0x36, s("t"), h("0001")), M, R.MALFORMED_PACKET),
    ("PUBLISH DUP with QoS 0", V4, pkt(0x38, s("t")), M, R.MALFORMED_PACKET),
    ("PUBLISH QoS 1 packet id 0", V4, pkt(0x32, s("t"), h("0000")), M, R.MALFORMED_PACKET),
    ("PUBLISH QoS 2 packet id 0", V5, pkt(0x34, s("t"), h("0000 00")), M, R.MALFORMED_PACKET),
    ("PUBLISH topic with +", V4, pkt(0x30, s("a/+")), PE, R.TOPIC_NAME_INVALID),
    ("PUBLISH topic with #", V5, pkt(0x30, s("a/#"), b"\x00"), PE, R.TOPIC_NAME_INVALID),
    ("PUBLISH topic + inside level", V4, pkt(0x30, s("a+b")), PE, R.TOPIC_NAME_INVALID),
    ("PUBLISH empty topic v3.1.1", V4, pkt(0x30, s("")), PE, R.TOPIC_NAME_INVALID),
    ("PUBLISH empty topic v3.1", V3, pkt(0x30, s(""), b"x"), PE, R.TOPIC_NAME_INVALID),
    ("PUBLISH empty topic v5 no alias", V5, pkt(0x30, s(""), b"\x00"), PE, R.PROTOCOL_ERROR),
    ("PUBLISH empty topic v5 other props", V5, pub5(prop_block(h("020000000a")), ""), PE,
     R.PROTOCOL_ERROR),
    # --- CONNECT ------------------------------------------------------------------------
    ("CONNECT MQTT level 3", None, connect_v(3), UnsupportedProtocolVersion,
     R.UNSUPPORTED_PROTOCOL_VERSION),
    ("CONNECT MQTT level 6", None, connect_v(6), UnsupportedProtocolVersion,
     R.UNSUPPORTED_PROTOCOL_VERSION),
    ("CONNECT MQIsdp level 4", None, connect_v(4, name="MQIsdp"), UnsupportedProtocolVersion,
     R.UNSUPPORTED_PROTOCOL_VERSION),
    ("CONNECT unknown protocol name", None, connect_v(4, name="HTTP"),
     UnsupportedProtocolVersion, R.UNSUPPORTED_PROTOCOL_VERSION),
    ("CONNECT lowercase name", None, connect_v(4, name="mqtt"), UnsupportedProtocolVersion,
     R.UNSUPPORTED_PROTOCOL_VERSION),
    ("CONNECT reserved flag", None, c4(0x03), M, R.MALFORMED_PACKET),
    ("CONNECT v5 reserved flag", None, c5(0x01), M, R.MALFORMED_PACKET),
    ("CONNECT will QoS without will flag", None, c4(0x0A), M, R.MALFORMED_PACKET),
    ("CONNECT will retain without will flag", None, c4(0x22), M, R.MALFORMED_PACKET),
    ("CONNECT will QoS 3", None, c4(0x1E, s("c") + s("w") + s("x")), M, R.MALFORMED_PACKET),
    ("CONNECT v3.1.1 password without username", None, c4(0x42, s("c") + s("p")), M,
     R.MALFORMED_PACKET),
    ("CONNECT v3.1 password without username", None,
     connect_v(3, 0x42, "MQIsdp", s("c") + s("p")), M, R.MALFORMED_PACKET),
    ("CONNECT will topic wildcard", None, c4(0x06, s("c") + s("a/#") + s("x")), PE,
     R.TOPIC_NAME_INVALID),
    ("CONNECT will topic empty", None, c5(0x06, b"\x00" + s("c") + b"\x00" + s("") + s("x")),
     PE, R.TOPIC_NAME_INVALID),
    # --- properties ---------------------------------------------------------------------
    ("topic alias in CONNECT", None, c5(rest=prop_block(h("230001")) + s("c")), M,
     R.MALFORMED_PACKET),
    ("session expiry in PUBLISH", V5, pub5(prop_block(h("1100000001"))), M, R.MALFORMED_PACKET),
    ("reason string in SUBSCRIBE", V5,
     pkt(0x82, h("0001"), prop_block(b"\x1f" + s("r")), s("a"), b"\x00"), M, R.MALFORMED_PACKET),
    ("subscription id in UNSUBSCRIBE", V5, pkt(0xA2, h("0001"), prop_block(h("0b01")), s("a")),
     M, R.MALFORMED_PACKET),
    ("will delay in CONNECT properties", None, c5(rest=prop_block(h("1800000001")) + s("c")), M,
     R.MALFORMED_PACKET),
    ("topic alias in will properties", None,
     c5(0x06, b"\x00" + s("c") + prop_block(h("230001")) + s("w") + s("x")), M,
     R.MALFORMED_PACKET),
    ("session expiry in will properties", None,
     c5(0x06, b"\x00" + s("c") + prop_block(h("1100000001")) + s("w") + s("x")), M,
     R.MALFORMED_PACKET),
    ("unknown property id", V5, pub5(prop_block(h("7f00"))), M, R.MALFORMED_PACKET),
    ("property id 0", V5, pub5(prop_block(h("00"))), M, R.MALFORMED_PACKET),
    ("multi-byte property id", V5, pub5(prop_block(h("8101"))), M, R.MALFORMED_PACKET),
    ("property length beyond packet", V5, pkt(0x30, s("t"), h("0a 0101")), M,
     R.MALFORMED_PACKET),
    ("property value truncated", V5, pub5(prop_block(h("020000"))), M, R.MALFORMED_PACKET),
    ("property string truncated", V5, pub5(prop_block(h("03 0005 6162"))), M,
     R.MALFORMED_PACKET),
    ("user property missing value", V5, pub5(prop_block(b"\x26" + s("k"))), M,
     R.MALFORMED_PACKET),
    ("property length non-minimal", V5, pkt(0x30, s("t"), h("8000")), M, R.MALFORMED_PACKET),
    ("subscription identifier 5-byte varint", V5, pub5(prop_block(h("0b ff ff ff ff 01"))), M,
     R.MALFORMED_PACKET),
    ("duplicate message expiry", V5, pub5(prop_block(h("0200000001 0200000002"))), PE,
     R.PROTOCOL_ERROR),
    ("duplicate topic alias", V5, pub5(prop_block(h("230001 230002"))), PE, R.PROTOCOL_ERROR),
    ("duplicate content type", V5, pub5(prop_block(b"\x03" + s("a") + b"\x03" + s("a"))), PE,
     R.PROTOCOL_ERROR),
    ("duplicate reason string", V5, pkt(0x40, h("0001 00"), prop_block(2 * (b"\x1f" + s("r")))),
     PE, R.PROTOCOL_ERROR),
    ("duplicate subscription id in SUBSCRIBE", V5,
     pkt(0x82, h("0001"), prop_block(h("0b01 0b02")), s("a"), b"\x00"), PE, R.PROTOCOL_ERROR),
    ("duplicate session expiry in CONNECT", None,
     c5(rest=prop_block(h("1100000001 1100000001")) + s("c")), PE, R.PROTOCOL_ERROR),
    ("payload format indicator 2", V5, pub5(prop_block(h("0102"))), PE, R.PROTOCOL_ERROR),
    ("will payload format indicator 2", None,
     c5(0x06, b"\x00" + s("c") + prop_block(h("0102")) + s("w") + s("x")), PE,
     R.PROTOCOL_ERROR),
    ("request problem information 2", None, c5(rest=prop_block(h("1702")) + s("c")), PE,
     R.PROTOCOL_ERROR),
    ("request response information 2", None, c5(rest=prop_block(h("1902")) + s("c")), PE,
     R.PROTOCOL_ERROR),
    ("maximum QoS 2", V5, pkt(0x20, h("00 00"), prop_block(h("2402"))), PE, R.PROTOCOL_ERROR),
    ("retain available 2", V5, pkt(0x20, h("00 00"), prop_block(h("2502"))), PE,
     R.PROTOCOL_ERROR),
    ("wildcard subscription available 2", V5, pkt(0x20, h("00 00"), prop_block(h("28ff"))), PE,
     R.PROTOCOL_ERROR),
    ("subscription identifier available 2", V5, pkt(0x20, h("00 00"), prop_block(h("2902"))),
     PE, R.PROTOCOL_ERROR),
    ("shared subscription available 2", V5, pkt(0x20, h("00 00"), prop_block(h("2a02"))), PE,
     R.PROTOCOL_ERROR),
    ("receive maximum 0", None, c5(rest=prop_block(h("210000")) + s("c")), PE,
     R.PROTOCOL_ERROR),
    ("maximum packet size 0", None, c5(rest=prop_block(h("2700000000")) + s("c")), PE,
     R.PROTOCOL_ERROR),
    ("subscription identifier 0 in PUBLISH", V5, pub5(prop_block(h("0b00"))), PE,
     R.PROTOCOL_ERROR),
    ("subscription identifier 0 in SUBSCRIBE", V5,
     pkt(0x82, h("0001"), prop_block(h("0b00")), s("a"), b"\x00"), PE, R.PROTOCOL_ERROR),
    ("topic alias 0", V5, pub5(prop_block(h("230000"))), PE, R.PROTOCOL_ERROR),
    ("authentication data without method", None,
     c5(rest=prop_block(b"\x16" + s("x")) + s("c")), PE, R.PROTOCOL_ERROR),
    # --- SUBSCRIBE / UNSUBSCRIBE --------------------------------------------------------
    ("SUBSCRIBE no subscriptions v3.1.1", V4, pkt(0x82, h("0001")), PE, R.PROTOCOL_ERROR),
    ("SUBSCRIBE no subscriptions v5", V5, pkt(0x82, h("0001 00")), PE, R.PROTOCOL_ERROR),
    ("SUBSCRIBE QoS 3", V4, pkt(0x82, h("0001"), s("a"), b"\x03"), M, R.MALFORMED_PACKET),
    ("SUBSCRIBE v5 QoS 3", V5, pkt(0x82, h("0001 00"), s("a"), b"\x03"), M, R.MALFORMED_PACKET),
    ("SUBSCRIBE retain handling 3", V5, pkt(0x82, h("0001 00"), s("a"), b"\x30"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE v5 reserved bit 6", V5, pkt(0x82, h("0001 00"), s("a"), b"\x40"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE v5 reserved bit 7", V5, pkt(0x82, h("0001 00"), s("a"), b"\x80"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE v3.1.1 no-local bit", V4, pkt(0x82, h("0001"), s("a"), b"\x04"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE v3.1.1 reserved bit 7", V4, pkt(0x82, h("0001"), s("a"), b"\x81"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE v3.1 reserved bit 2", V3, pkt(0x82, h("0001"), s("a"), b"\x04"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE second entry bad", V4, pkt(0x82, h("0001"), s("a"), b"\x01", s("b"), b"\x10"), M,
     R.MALFORMED_PACKET),
    ("SUBSCRIBE empty filter", V4, pkt(0x82, h("0001"), s(""), b"\x00"), M, R.MALFORMED_PACKET),
    ("UNSUBSCRIBE no filters v3.1.1", V4, pkt(0xA2, h("0001")), PE, R.PROTOCOL_ERROR),
    ("UNSUBSCRIBE no filters v5", V5, pkt(0xA2, h("0001 00")), PE, R.PROTOCOL_ERROR),
    ("UNSUBSCRIBE empty filter", V5, pkt(0xA2, h("0001 00"), s("")), M, R.MALFORMED_PACKET),
    ("SUBACK no codes", V5, pkt(0x90, h("0001 00")), PE, R.PROTOCOL_ERROR),
    ("UNSUBACK v5 no codes", V5, pkt(0xB0, h("0001 00")), PE, R.PROTOCOL_ERROR),
    # --- packet identifier 0 ------------------------------------------------------------
    ("SUBSCRIBE packet id 0", V4, pkt(0x82, h("0000"), s("a"), b"\x00"), M, R.MALFORMED_PACKET),
    ("UNSUBSCRIBE packet id 0", V5, pkt(0xA2, h("0000 00"), s("a")), M, R.MALFORMED_PACKET),
    ("PUBACK packet id 0", V4, h("40 02 0000"), M, R.MALFORMED_PACKET),
    ("PUBREC packet id 0", V5, h("50 02 0000"), M, R.MALFORMED_PACKET),
    ("PUBREL packet id 0", V5, h("62 03 0000 00"), M, R.MALFORMED_PACKET),
    ("PUBCOMP packet id 0", V4, h("70 02 0000"), M, R.MALFORMED_PACKET),
    ("SUBACK packet id 0", V4, h("90 03 0000 00"), M, R.MALFORMED_PACKET),
    ("UNSUBACK packet id 0", V4, h("b0 02 0000"), M, R.MALFORMED_PACKET),
    # --- reason codes -------------------------------------------------------------------
    ("PUBACK code 0x92", V5, h("40 03 0001 92"), M, R.MALFORMED_PACKET),
    ("PUBACK code 0x01", V5, h("40 03 0001 01"), M, R.MALFORMED_PACKET),
    ("PUBREC code 0x92", V5, h("50 04 0001 92 00"), M, R.MALFORMED_PACKET),
    ("PUBREL code 0x10", V5, h("62 03 0001 10"), M, R.MALFORMED_PACKET),
    ("PUBCOMP code 0x80", V5, h("70 03 0001 80"), M, R.MALFORMED_PACKET),
    ("CONNACK code 0x04", V5, h("20 03 00 04 00"), M, R.MALFORMED_PACKET),
    ("CONNACK code 0x8b", V5, h("20 03 00 8b 00"), M, R.MALFORMED_PACKET),
    ("CONNACK reserved flags", V5, h("20 03 02 00 00"), M, R.MALFORMED_PACKET),
    ("CONNACK v3.1.1 reserved flags", V4, h("20 02 80 00"), M, R.MALFORMED_PACKET),
    ("CONNACK v3.1.1 return code 6", V4, h("20 02 00 06"), M, R.MALFORMED_PACKET),
    ("SUBACK code 0x11", V5, h("90 04 0001 00 11"), M, R.MALFORMED_PACKET),
    ("SUBACK code 0x03", V5, h("90 04 0001 00 03"), M, R.MALFORMED_PACKET),
    ("SUBACK v3.1.1 code 0x87", V4, h("90 03 0001 87"), M, R.MALFORMED_PACKET),
    ("UNSUBACK code 0x02", V5, h("b0 04 0001 00 02"), M, R.MALFORMED_PACKET),
    ("DISCONNECT code 0x84", V5, h("e0 01 84"), M, R.MALFORMED_PACKET),
    ("DISCONNECT code 0x01", V5, h("e0 01 01"), M, R.MALFORMED_PACKET),
    ("AUTH code 0x80", V5, h("f0 02 80 00"), M, R.MALFORMED_PACKET),
    ("AUTH code 0x04", V5, h("f0 02 04 00"), M, R.MALFORMED_PACKET),
]  # fmt: skip
# A CONNECT followed by a stray byte inside its remaining length.
_good = c4()
CASES[[c[0] for c in CASES].index("CONNECT leftover")] = (
    "CONNECT leftover", None, pkt(0x10, _good[2:], b"\x00"), M, R.MALFORMED_PACKET
)  # fmt: skip


@pytest.mark.parametrize(("version", "data", "exc", "code"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_malformed(version: int | None, data: bytes, exc: type[MQTTError], code: int) -> None:
    with pytest.raises(MQTTError) as info:
        Decoder(version=version).feed(data)
    assert type(info.value) is exc, info.value
    assert info.value.reason_code == code


# A packet that is not CONNECT on a decoder that has not seen CONNECT cannot follow a good
# packet in the same stream, so those cases are left out here rather than skipped.
_AFTER_GOOD = [c for c in CASES if c[1] is not None or c[2][0] >> 4 == 1]


@pytest.mark.parametrize(("version", "data", "exc", "code"), [c[1:] for c in _AFTER_GOOD],
                         ids=[c[0] for c in _AFTER_GOOD])  # fmt: skip
def test_malformed_after_good_packet_keeps_good_one(
    version: int | None, data: bytes, exc: type[MQTTError], code: int
) -> None:
    """Same corpus, preceded by a valid packet in the same chunk and split byte by byte."""
    if version is None:
        version = MQTT_5
    good = encode(Connect("x", version), version) if data[0] >> 4 == 1 else b"\xc0\x00"
    decoder = Decoder(version=version)
    stream = good + data
    collected: list[Packet] = []
    with pytest.raises(MQTTError) as info:
        for i in range(len(stream)):
            collected += decoder.feed(stream[i : i + 1])
    assert type(info.value) is exc
    assert len(collected) == 1


# --- things that must be accepted (the other side of several rules above) ------------------


ACCEPTED: list[tuple[str, int | None, bytes, Packet]] = [
    ("empty topic v5 with alias", V5, pub5(prop_block(h("230007")), ""),
     Publish("", b"payload", properties={P.TOPIC_ALIAS: 7})),
    ("v5 password without username", None, c5(0x42, b"\x00" + s("c") + s("pw")),
     Connect("c", 5, True, 60, None, b"pw")),
    ("two subscription ids in PUBLISH", V5, pub5(prop_block(h("0b01 0b8001"))),
     Publish("t", b"payload", properties={P.SUBSCRIPTION_IDENTIFIER: [1, 128]})),
    ("SUBSCRIBE filter syntax not checked", V4, pkt(0x82, h("0001"), s("a/#/b"), b"\x01"),
     Subscribe(1, [Subscription("a/#/b", 1)])),
    ("PUBACK v5 code without properties", V5, h("40 03 0001 10"), Puback(1, 0x10)),
    ("PUBREL v5 rl 4 empty props", V5, h("62 04 0001 92 00"), Pubrel(1, 0x92)),
    ("PUBREC v5 short", V5, h("50 02 0001"), Pubrec(1)),
    ("PUBCOMP v3.1", V3, h("70 02 0001"), Pubcomp(1)),
    ("DISCONNECT v5 code only", V5, h("e0 01 04"), Disconnect(4)),
    ("AUTH v5 empty", V5, h("f0 00"), Auth()),
    ("CONNECT v3.1", None, connect_v(3, 0x02, "MQIsdp", s("c")), Connect("c", 3, True, 60)),
    ("CONNECT will QoS 2 retain", None, c4(0x36, s("c") + s("w") + s("x")),
     Connect("c", 4, True, 60, will=Will("w", b"x", 2, True))),
    ("CONNECT empty client id", None, c4(0x02, s("")), Connect("", 4, True, 60)),
    ("SUBACK v3.1.1 failure", V4, h("90 03 0001 80"), Suback(1, [0x80])),
    ("UNSUBACK v5", V5, h("b0 04 0001 00 11"), Unsuback(1, [0x11])),
    ("CONNACK v3.1.1 session present", V4, h("20 02 01 00"), Connack(True, 0)),
    ("UNSUBSCRIBE", V4, pkt(0xA2, h("0001"), s("a"), s("b")), Unsubscribe(1, ["a", "b"])),
]  # fmt: skip


@pytest.mark.parametrize(("version", "data", "packet"), [c[1:] for c in ACCEPTED],
                         ids=[c[0] for c in ACCEPTED])  # fmt: skip
def test_accepted(version: int | None, data: bytes, packet: Packet) -> None:
    assert Decoder(version=version).feed(data) == [packet]


# --- version bookkeeping on CONNECT errors ------------------------------------------------


@pytest.mark.parametrize(
    ("data", "version"),
    [
        (connect_v(6), MQTT_3_1_1),
        (connect_v(5, name="MQIsdp"), MQTT_5),  # refused in the form a v5 client reads
        (connect_v(5, name="MQTX"), MQTT_5),
        (connect_v(4, name="MQTX"), MQTT_3_1_1),
        (connect_v(0x83), MQTT_3_1_1),
        (c5(0x01), MQTT_5),  # level known before the flags were found bad
        (connect_v(3, 0x01, "MQIsdp", s("c")), MQTT_3_1),
        (pkt(0x10, h("0010"), b"MQ"), None),  # never got to the level
    ],
)
def test_version_after_connect_error(data: bytes, version: int | None) -> None:
    decoder = Decoder()
    with pytest.raises(MQTTError):
        decoder.feed(data)
    assert decoder.version == version


def test_unsupported_version_is_raised_before_rest_is_checked() -> None:
    # Level 6 with an otherwise garbage body: still "unsupported", answerable with CONNACK 1.
    decoder = Decoder()
    with pytest.raises(UnsupportedProtocolVersion):
        decoder.feed(pkt(0x10, s("MQTT"), b"\x06\xff\xff"))
    assert encode(Connack(False, R.UNSUPPORTED_PROTOCOL_VERSION), decoder.version) == h("20020001")  # type: ignore[arg-type]  # fmt: skip


def test_wrong_protocol_name_at_level_5_is_refused_in_v5_form() -> None:
    decoder = Decoder()
    with pytest.raises(UnsupportedProtocolVersion):
        decoder.feed(connect_v(5, name="MQTX"))
    assert decoder.version == MQTT_5
    assert encode(Connack(False, R.UNSUPPORTED_PROTOCOL_VERSION), MQTT_5) == h("2003008400")


def test_packet_too_large_on_header_alone() -> None:
    decoder = Decoder(max_packet_size=1024, version=MQTT_5)
    with pytest.raises(PacketTooLarge):
        decoder.feed(b"\x30\xff\xff\x7f")  # 2 MB announced, no body sent


def test_packet_too_large_before_connect() -> None:
    with pytest.raises(PacketTooLarge):
        Decoder(max_packet_size=1024).feed(b"\x10\x80\x80\x01")


# --- fuzzing -------------------------------------------------------------------------------

FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID_CORPUS: list[tuple[int, bytes]] = [
    (v, encode(p, v))
    for v in (MQTT_3_1, MQTT_3_1_1, MQTT_5)
    for p in [
        Connect("client", v, False, 30, "user", b"pw", Will("w/t", b"bye", 1, True)),
        Connack(True, 0),
        Publish("a/b/c", b"hello world", 1, True, True, 77),
        Publish("x", b"", 2, packet_id=65535),
        Puback(1),
        Pubrec(2),
        Pubrel(3),
        Pubcomp(4),
        Subscribe(5, [Subscription("a/+", 1), Subscription("#", 2)]),
        Suback(5, [1, 2, 0x80]),
        Unsubscribe(6, ["a/+", "b"]),
        Unsuback(6),
        Pingreq(),
        Disconnect(),
    ]
] + [
    (MQTT_5, encode(p, MQTT_5))
    for p in [
        Connect("c", 5, True, 10, None, b"p", Will("w", b"x", 2, False, {
            P.WILL_DELAY_INTERVAL: 5, P.CONTENT_TYPE: "t", P.USER_PROPERTY: [("a", "b")],
        }), {P.SESSION_EXPIRY_INTERVAL: 60, P.RECEIVE_MAXIMUM: 10,
             P.AUTHENTICATION_METHOD: "m", P.AUTHENTICATION_DATA: b"d"}),
        Connack(False, 0x87, {P.REASON_STRING: "no", P.MAXIMUM_QOS: 1, P.TOPIC_ALIAS_MAXIMUM: 3}),
        Publish("t", b"p" * 200, 1, False, False, 9, {
            P.TOPIC_ALIAS: 2, P.SUBSCRIPTION_IDENTIFIER: [1, 300], P.CORRELATION_DATA: b"c",
            P.USER_PROPERTY: [("k", "v"), ("k", "v")], P.MESSAGE_EXPIRY_INTERVAL: 9,
        }),
        Puback(7, 0x10, {P.REASON_STRING: "r"}),
        Subscribe(8, [Subscription("a", 1, True, True, 2)], {P.SUBSCRIPTION_IDENTIFIER: [5]}),
        Suback(8, [0x8F, 0xA2], {P.USER_PROPERTY: [("x", "y")]}),
        Unsuback(9, [0, 0x11], {P.REASON_STRING: "r"}),
        Disconnect(0x8E, {P.SERVER_REFERENCE: "s"}),
        Auth(0x19, {P.AUTHENTICATION_METHOD: "m"}),
    ]
]  # fmt: skip


def feed_all(decoder: Decoder, chunks: list[bytes]) -> list[Packet]:
    """Feed chunks; only MQTTError may escape. Returns what was decoded."""
    out: list[Packet] = []
    for chunk in chunks:
        try:
            out += decoder.feed(chunk)
        except MQTTError as exc:
            assert isinstance(exc.packets, list)  # type: ignore[attr-defined]
            out += exc.packets  # type: ignore[attr-defined]
            return out
    return out


@FUZZ
@given(st.binary(max_size=300), st.sampled_from([None, MQTT_3_1, MQTT_3_1_1, MQTT_5]))
def test_fuzz_random_bytes(data: bytes, version: int | None) -> None:
    feed_all(Decoder(version=version), [data])


@FUZZ
@given(st.binary(max_size=200), st.sampled_from([MQTT_3_1, MQTT_3_1_1, MQTT_5]))
def test_fuzz_random_bytes_after_connect(data: bytes, version: int) -> None:
    """Random bytes into a server decoder that has accepted a CONNECT."""
    decoder = Decoder()
    decoder.feed(encode(Connect("c", version), version))
    feed_all(decoder, [data])


@st.composite
def mutated(draw: st.DrawFn) -> tuple[int, bytes]:
    version, data = draw(st.sampled_from(VALID_CORPUS))
    buf = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "dup"]))
        i = draw(st.integers(0, max(len(buf) - 1, 0)))
        if not buf:
            break
        if op == "flip":
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set":
            buf[i] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=4))
        elif op == "delete":
            del buf[i]
        elif op == "truncate":
            del buf[i:]
        else:
            buf += buf[i:]
    return version, bytes(buf)


@FUZZ
@given(mutated(), st.data())
def test_fuzz_mutated_valid_packets(case: tuple[int, bytes], data: st.DataObject) -> None:
    """Mutations fed whole and in random chunks give the same packets and the same error."""
    version, wire = case
    start_version = None if wire[:1] == b"\x10" else version
    whole = Decoder(version=start_version)
    whole_error: type[MQTTError] | None = None
    try:
        whole_out = whole.feed(wire)
    except MQTTError as exc:
        whole_error, whole_out = type(exc), exc.packets  # type: ignore[attr-defined]

    cuts = sorted(data.draw(st.lists(st.integers(0, len(wire)), max_size=5)))
    chunks = [wire[a:b] for a, b in zip([0, *cuts], [*cuts, len(wire)], strict=True)]
    split = Decoder(version=start_version)
    split_out: list[Packet] = []
    split_error: type[MQTTError] | None = None
    for chunk in chunks:
        try:
            split_out += split.feed(chunk)
        except MQTTError as exc:
            split_out += exc.packets  # type: ignore[attr-defined]
            split_error = type(exc)
            break
    # Incomplete data is not an error and every check fires on the shortest prefix that
    # shows the violation, so splitting changes neither the packets nor the error.
    assert split_out == whole_out
    assert split_error is whole_error
    # Whatever decoded must re-encode and decode to itself (until a CONNECT switches version).
    for packet in whole_out:
        if isinstance(packet, Connect):
            break
        wire_again = encode(packet, version)
        assert Decoder(version=version).feed(wire_again) == [packet]
