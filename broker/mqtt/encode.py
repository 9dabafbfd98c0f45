"""Packet encoding for MQTT 3.1 / 3.1.1 (protocol levels 3, 4) and 5.0.

Packet objects carry no version; the caller passes the version of the connection. Fields a
version cannot express are dropped (properties and ack reason codes in v3), except where
dropping would change the meaning: v3 CONNACK / SUBACK codes are mapped (see
`connack_code_v3`), and AUTH, which v3 does not have, raises ValueError.

`encode` does not re-validate packet contents (the broker only encodes what it built or
decoded); it raises ValueError for values that cannot be represented on the wire at all.
"""

from collections.abc import Callable
from struct import Struct
from struct import error as StructError
from typing import Any, Final

from broker.mqtt.constants import (
    AUTH_BYTE,
    CONNACK_BYTE,
    CONNECT_BYTE,
    CONNECT_CLEAN_START,
    CONNECT_PASSWORD,
    CONNECT_USERNAME,
    CONNECT_WILL,
    CONNECT_WILL_RETAIN,
    DISCONNECT_BYTE,
    FIRST_FAILURE_CODE,
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PINGREQ_BYTE,
    PINGRESP_BYTE,
    PROTOCOL_NAMES,
    PUBACK_BYTE,
    PUBCOMP_BYTE,
    PUBLISH_BYTE,
    PUBREC_BYTE,
    PUBREL_BYTE,
    SUBACK_BYTE,
    SUBACK_FAILURE_V3,
    SUBSCRIBE_BYTE,
    UNSUBACK_BYTE,
    UNSUBSCRIBE_BYTE,
    ConnackCodeV3,
    ReasonCode,
)
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
    Unsuback,
    Unsubscribe,
)
from broker.mqtt.properties import encode_binary, encode_properties, encode_string, encode_varint

__all__ = ["connack_code_v3", "encode", "encode_publish"]

_VERSIONS: Final = (MQTT_3_1, MQTT_3_1_1, MQTT_5)

# ---------------------------------------------------------------------------------------------
# PUBLISH: the hot path
# ---------------------------------------------------------------------------------------------

_pack_BBH: Final = Struct(">BBH").pack  # first byte, 1-byte remaining length, a 16-bit field
_pack_BBBH: Final = Struct(">BBBH").pack  # the same with a 2-byte remaining length (< 16,384)
_pack_H: Final = Struct(">H").pack
_EMPTY_PROPS: Final = b"\x00"


def encode_publish(
    topic: str,
    payload: bytes,
    qos: int,
    retain: bool,
    dup: bool,
    packet_id: int | None,
    properties: Properties | None,
    version: int,
) -> bytes:
    """Encode a PUBLISH without building a `Publish` object (used for every delivery).

    `topic` may be empty (the v5 sender then puts a TOPIC_ALIAS in `properties`).
    `properties` is ignored for v3. `packet_id` is required for QoS 1/2 and ignored for QoS 0.
    """
    t = topic.encode()
    tl = len(t)
    first = PUBLISH_BYTE | (qos << 1) | (1 if retain else 0) | (8 if dup else 0)
    props = b""
    if version == MQTT_5:
        props = encode_properties(properties) if properties else _EMPTY_PROPS
    if qos:
        if qos > 2 or not packet_id or packet_id > 0xFFFF:
            raise ValueError(f"bad qos {qos} / packet id {packet_id} for PUBLISH")
        rl = tl + 4 + len(props) + len(payload)
        if rl < 128:  # the common small message: one struct.pack for header + topic length
            return b"".join((_pack_BBH(first, rl, tl), t, _pack_H(packet_id), props, payload))
        if rl < 16384:  # a typical sensor payload of 100-16,000 bytes
            return b"".join((_pack_BBBH(first, rl & 0x7F | 0x80, rl >> 7, tl), t,
                             _pack_H(packet_id), props, payload))
        pid = _pack_H(packet_id)
    else:
        if qos < 0:
            raise ValueError(f"bad qos {qos}")
        rl = tl + 2 + len(props) + len(payload)
        if rl < 128:
            return b"".join((_pack_BBH(first, rl, tl), t, props, payload))
        pid = b""
    if tl > 0xFFFF:  # only possible on this path: rl >= tl
        raise ValueError("topic longer than 65535 bytes")
    return b"".join((bytes((first,)), encode_varint(rl), _pack_H(tl), t, pid, props, payload))


# ---------------------------------------------------------------------------------------------
# Everything else
# ---------------------------------------------------------------------------------------------


def _packet(first: int, *parts: bytes) -> bytes:
    """Fixed header + body."""
    body = b"".join(parts)
    return bytes((first,)) + encode_varint(len(body)) + body


def _props(properties: Properties, version: int) -> bytes:
    return encode_properties(properties) if version == MQTT_5 else b""


_CONNACK_V3: Final[dict[int, int]] = {
    ReasonCode.SUCCESS: ConnackCodeV3.ACCEPTED,
    ReasonCode.UNSUPPORTED_PROTOCOL_VERSION: ConnackCodeV3.UNACCEPTABLE_PROTOCOL_VERSION,
    ReasonCode.CLIENT_IDENTIFIER_NOT_VALID: ConnackCodeV3.IDENTIFIER_REJECTED,
    ReasonCode.SERVER_UNAVAILABLE: ConnackCodeV3.SERVER_UNAVAILABLE,
    ReasonCode.SERVER_BUSY: ConnackCodeV3.SERVER_UNAVAILABLE,
    ReasonCode.BAD_USER_NAME_OR_PASSWORD: ConnackCodeV3.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.BAD_AUTHENTICATION_METHOD: ConnackCodeV3.BAD_USER_NAME_OR_PASSWORD,
    ReasonCode.NOT_AUTHORIZED: ConnackCodeV3.NOT_AUTHORIZED,
    ReasonCode.BANNED: ConnackCodeV3.NOT_AUTHORIZED,
}


def connack_code_v3(reason_code: int) -> int:
    """Map a v5 CONNACK reason code to a v3.1/3.1.1 return code.

    0x00->0, 0x84->1, 0x85->2, 0x88/0x89->3, 0x86/0x8C (bad auth method)->4,
    0x87/0x8A (banned)->5; every other error (0x80-0x83, 0x90, 0x95, 0x97, 0x99-0x9D, 0x9F)
    -> 3 "server unavailable", the only v3 code that does not blame the client's identity
    or credentials. Values 1-5 are not v5 CONNACK codes, so they are passed through as
    already-v3 codes.
    """
    code = _CONNACK_V3.get(reason_code)
    if code is not None:
        return code
    if 1 <= reason_code <= 5:
        return reason_code
    return ConnackCodeV3.SERVER_UNAVAILABLE


def _enc_connect(p: Connect, version: int) -> bytes:
    """CONNECT; the protocol level written is `version` (p.protocol_level is informational)."""
    flags = CONNECT_CLEAN_START if p.clean_start else 0
    will = p.will
    parts = [
        encode_string(PROTOCOL_NAMES[version]),
        b"",  # level + flags + keepalive, filled below
        _props(p.properties, version),
        encode_string(p.client_id),
    ]
    if will is not None:
        if not 0 <= will.qos <= 2:
            raise ValueError(f"bad will qos {will.qos}")
        flags |= CONNECT_WILL | (will.qos << 3) | (CONNECT_WILL_RETAIN if will.retain else 0)
        parts += (
            _props(will.properties, version),
            encode_string(will.topic),
            encode_binary(will.payload),
        )
    if p.username is not None:
        flags |= CONNECT_USERNAME
        parts.append(encode_string(p.username))
    elif p.password is not None and version != MQTT_5:
        raise ValueError("v3.1.1 forbids a password without a user name")
    if p.password is not None:
        flags |= CONNECT_PASSWORD
        parts.append(encode_binary(p.password))
    parts[1] = bytes((version, flags)) + p.keepalive.to_bytes(2, "big")
    return _packet(CONNECT_BYTE, *parts)


def _enc_connack(p: Connack, version: int) -> bytes:
    flags = 1 if p.session_present else 0
    if version != MQTT_5:
        return bytes((CONNACK_BYTE, 2, flags, connack_code_v3(p.reason_code)))
    return _packet(CONNACK_BYTE, bytes((flags, p.reason_code)), encode_properties(p.properties))




def encode_ack(first: int, packet_id: int, reason_code: int, version: int) -> bytes:
    """PUBACK / PUBREC / PUBREL / PUBCOMP (`first`: PUBACK_BYTE ...) without properties,
    without building a packet object: one of these answers every QoS 1/2 message."""
    if version != MQTT_5 or reason_code == 0:
        return _pack_BBH(first, 2, packet_id)
    return _pack_BBH(first, 3, packet_id) + bytes((reason_code,))


def _ack(
    first: int, packet_id: int, reason_code: int, properties: Properties, version: int
) -> bytes:
    """PUBACK/PUBREC/PUBREL/PUBCOMP, using the short forms v5 allows (3.4.2.1)."""
    if not properties or version != MQTT_5:
        return encode_ack(first, packet_id, reason_code, version)
    return _packet(first, _pack_H(packet_id), bytes((reason_code,)), encode_properties(properties))


def _enc_puback(p: Puback, version: int) -> bytes:
    return _ack(PUBACK_BYTE, p.packet_id, p.reason_code, p.properties, version)


def _enc_pubrec(p: Pubrec, version: int) -> bytes:
    return _ack(PUBREC_BYTE, p.packet_id, p.reason_code, p.properties, version)


def _enc_pubrel(p: Pubrel, version: int) -> bytes:
    return _ack(PUBREL_BYTE, p.packet_id, p.reason_code, p.properties, version)


def _enc_pubcomp(p: Pubcomp, version: int) -> bytes:
    return _ack(PUBCOMP_BYTE, p.packet_id, p.reason_code, p.properties, version)


def _enc_publish(p: Publish, version: int) -> bytes:
    return encode_publish(
        p.topic, p.payload, p.qos, p.retain, p.dup, p.packet_id, p.properties, version
    )


def _enc_subscribe(p: Subscribe, version: int) -> bytes:
    """SUBSCRIBE; v3 keeps only the QoS bits of the subscription options."""
    parts = [_pack_H(p.packet_id), _props(p.properties, version)]
    for s in p.subscriptions:
        if not 0 <= s.qos <= 2 or not 0 <= s.retain_handling <= 2:
            raise ValueError(f"bad subscription options for {s.topic_filter!r}")
        opts = s.qos
        if version == MQTT_5:
            opts |= (
                (4 if s.no_local else 0)
                | (8 if s.retain_as_published else 0)
                | (s.retain_handling << 4)
            )
        parts.append(encode_string(s.topic_filter) + bytes((opts,)))
    return _packet(SUBSCRIBE_BYTE, *parts)


def _enc_suback(p: Suback, version: int) -> bytes:
    """SUBACK; v3 collapses every failure code to its one (0x80)."""
    if version == MQTT_5:
        codes = bytes(p.reason_codes)
    else:
        codes = bytes(c if c < FIRST_FAILURE_CODE else SUBACK_FAILURE_V3 for c in p.reason_codes)
    return _packet(SUBACK_BYTE, _pack_H(p.packet_id), _props(p.properties, version), codes)


def _enc_unsubscribe(p: Unsubscribe, version: int) -> bytes:
    return _packet(
        UNSUBSCRIBE_BYTE,
        _pack_H(p.packet_id),
        _props(p.properties, version),
        *(encode_string(f) for f in p.topic_filters),
    )


def _enc_unsuback(p: Unsuback, version: int) -> bytes:
    """UNSUBACK; v3 has no payload (reason codes and properties are dropped)."""
    if version != MQTT_5:
        return _pack_BBH(UNSUBACK_BYTE, 2, p.packet_id)
    return _packet(
        UNSUBACK_BYTE, _pack_H(p.packet_id), encode_properties(p.properties), bytes(p.reason_codes)
    )


def _enc_pingreq(p: Pingreq, version: int) -> bytes:
    return bytes((PINGREQ_BYTE, 0))


def _enc_pingresp(p: Pingresp, version: int) -> bytes:
    return bytes((PINGRESP_BYTE, 0))


def _enc_disconnect(p: Disconnect, version: int) -> bytes:
    """DISCONNECT; v3 is the bare header, v5 uses the shortest form allowed (3.14.2.1)."""
    if version != MQTT_5 or (p.reason_code == 0 and not p.properties):
        return bytes((DISCONNECT_BYTE, 0))
    if not p.properties:
        return bytes((DISCONNECT_BYTE, 1, p.reason_code))
    return _packet(DISCONNECT_BYTE, bytes((p.reason_code,)), encode_properties(p.properties))


def _enc_auth(p: Auth, version: int) -> bytes:
    """AUTH exists only in v5. The short form is rl=0; otherwise code + property length,
    since unlike DISCONNECT the spec gives AUTH no one-byte form (3.15.2.2.1)."""
    if version != MQTT_5:
        raise ValueError("AUTH does not exist before MQTT 5")
    if p.reason_code == 0 and not p.properties:
        return bytes((AUTH_BYTE, 0))
    return _packet(AUTH_BYTE, bytes((p.reason_code,)), encode_properties(p.properties))


_ENCODERS: Final[dict[type, Callable[[Any, int], bytes]]] = {
    Connect: _enc_connect,
    Connack: _enc_connack,
    Publish: _enc_publish,
    Puback: _enc_puback,
    Pubrec: _enc_pubrec,
    Pubrel: _enc_pubrel,
    Pubcomp: _enc_pubcomp,
    Subscribe: _enc_subscribe,
    Suback: _enc_suback,
    Unsubscribe: _enc_unsubscribe,
    Unsuback: _enc_unsuback,
    Pingreq: _enc_pingreq,
    Pingresp: _enc_pingresp,
    Disconnect: _enc_disconnect,
    Auth: _enc_auth,
}


def encode(packet: Packet, version: int) -> bytes:
    """Encode any packet for a connection speaking `version` (3, 4 or 5).

    ValueError for an unknown version, AUTH on v3, or values the wire cannot carry
    (out-of-range integers, strings over 65535 bytes, unknown property identifiers).
    """
    if version not in _VERSIONS:
        raise ValueError(f"unsupported protocol version {version}")
    try:
        encoder = _ENCODERS[type(packet)]
    except KeyError:
        raise TypeError(f"not an MQTT packet: {packet!r}") from None
    try:
        return encoder(packet, version)
    except (OverflowError, TypeError, StructError) as exc:  # to_bytes/struct/bytes() range
        raise ValueError(f"cannot encode {packet!r}: {exc}") from exc
