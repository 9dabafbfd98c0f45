"""MQTT wire data types (section 1.5) and the MQTT 5 property block (section 2.2.2).

The property block is made of every primitive type the protocol has (byte, two/four byte
integer, variable byte integer, UTF-8 string, binary data, string pair), so the primitives
live here too and both `encode.py` and `decode.py` import them from one place.

Decoding functions work on `(buf, pos, end)`: `buf` is the connection's receive buffer,
`end` is the end of the current packet. Every length is checked against `end` before it is
used, because Python slicing past the end silently returns short data instead of failing.
"""

from struct import Struct
from struct import error as StructError
from typing import Any, Final

from broker.mqtt.constants import MAX_VARINT, PacketType, PropertyId
from broker.mqtt.errors import MalformedPacket, ProtocolError
from broker.mqtt.packets import Properties

__all__ = [
    "ALLOWED_PROPERTIES",
    "WILL_PROPERTIES",
    "decode_binary",
    "decode_properties",
    "decode_string",
    "decode_varint",
    "encode_binary",
    "encode_properties",
    "encode_string",
    "encode_varint",
]

# ---------------------------------------------------------------------------------------------
# Primitive types: encoding
# ---------------------------------------------------------------------------------------------

# One-byte varints are by far the most common (every remaining length < 128); a table lookup
# is cheaper than building them.
_VARINT_1: Final = tuple(bytes((i,)) for i in range(128))


def encode_varint(value: int) -> bytes:
    """Variable Byte Integer (1.5.5); ValueError outside 0..268,435,455."""
    if value < 128:
        if value < 0:
            raise ValueError(f"varint out of range: {value}")
        return _VARINT_1[value]
    if value > MAX_VARINT:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def encode_string(value: str) -> bytes:
    """UTF-8 Encoded String (1.5.4): two-byte length then the bytes."""
    raw = value.encode()
    if len(raw) > 0xFFFF:
        raise ValueError("UTF-8 string longer than 65535 bytes")
    return len(raw).to_bytes(2, "big") + raw


def encode_binary(value: bytes) -> bytes:
    """Binary Data (1.5.6): two-byte length then the bytes."""
    if len(value) > 0xFFFF:
        raise ValueError("binary data longer than 65535 bytes")
    return len(value).to_bytes(2, "big") + bytes(value)


# ---------------------------------------------------------------------------------------------
# Primitive types: decoding
# ---------------------------------------------------------------------------------------------


def decode_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode a Variable Byte Integer at `pos`; returns (value, new_pos).

    Rejects encodings longer than 4 bytes and non-minimal encodings (a trailing 0x00
    continuation byte), which 1.5.5 forbids ("MUST use the minimum number of bytes").
    """
    value = 0
    shift = 0
    for i in range(4):
        if pos + i >= end:
            raise MalformedPacket("truncated variable byte integer")
        byte = buf[pos + i]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if byte == 0 and i:
                raise MalformedPacket("non-minimal variable byte integer")
            return value, pos + i + 1
        shift += 7
    raise MalformedPacket("variable byte integer longer than 4 bytes")


def decode_string(buf: bytes, pos: int, end: int) -> tuple[str, int]:
    """Decode a UTF-8 Encoded String; MalformedPacket on bad UTF-8 or U+0000 (1.5.4)."""
    if pos + 2 > end:
        raise MalformedPacket("truncated string length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("string longer than the packet")
    try:
        value = buf[pos + 2 : stop].decode()
    except UnicodeDecodeError:
        raise MalformedPacket("invalid UTF-8 string") from None
    if "\x00" in value:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return value, stop


def decode_binary(buf: bytes, pos: int, end: int) -> tuple[bytes, int]:
    """Decode Binary Data (1.5.6): two-byte length then that many bytes."""
    if pos + 2 > end:
        raise MalformedPacket("truncated binary data length")
    stop = pos + 2 + ((buf[pos] << 8) | buf[pos + 1])
    if stop > end:
        raise MalformedPacket("binary data longer than the packet")
    return bytes(buf[pos + 2 : stop]), stop


# ---------------------------------------------------------------------------------------------
# Property tables (MQTT 5.0 table 2.2.2.2 and each packet's property list)
# ---------------------------------------------------------------------------------------------

_BYTE, _U16, _U32, _VARINT, _STR, _BIN, _PAIR = range(7)

P: Final = PropertyId
_KIND: Final[dict[int, int]] = {
    P.PAYLOAD_FORMAT_INDICATOR: _BYTE,
    P.MESSAGE_EXPIRY_INTERVAL: _U32,
    P.CONTENT_TYPE: _STR,
    P.RESPONSE_TOPIC: _STR,
    P.CORRELATION_DATA: _BIN,
    P.SUBSCRIPTION_IDENTIFIER: _VARINT,
    P.SESSION_EXPIRY_INTERVAL: _U32,
    P.ASSIGNED_CLIENT_IDENTIFIER: _STR,
    P.SERVER_KEEP_ALIVE: _U16,
    P.AUTHENTICATION_METHOD: _STR,
    P.AUTHENTICATION_DATA: _BIN,
    P.REQUEST_PROBLEM_INFORMATION: _BYTE,
    P.WILL_DELAY_INTERVAL: _U32,
    P.REQUEST_RESPONSE_INFORMATION: _BYTE,
    P.RESPONSE_INFORMATION: _STR,
    P.SERVER_REFERENCE: _STR,
    P.REASON_STRING: _STR,
    P.RECEIVE_MAXIMUM: _U16,
    P.TOPIC_ALIAS_MAXIMUM: _U16,
    P.TOPIC_ALIAS: _U16,
    P.MAXIMUM_QOS: _BYTE,
    P.RETAIN_AVAILABLE: _BYTE,
    P.USER_PROPERTY: _PAIR,
    P.MAXIMUM_PACKET_SIZE: _U32,
    P.WILDCARD_SUBSCRIPTION_AVAILABLE: _BYTE,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: _BYTE,
    P.SHARED_SUBSCRIPTION_AVAILABLE: _BYTE,
}
# Plain-int keyed copy, and a tuple indexed by identifier byte for the decoder.
_KIND_INT: Final[dict[int, int]] = {int(k): v for k, v in _KIND.items()}
_KIND_TABLE: Final[tuple[int | None, ...]] = tuple(_KIND_INT.get(i) for i in range(256))

# Byte properties whose only legal values are 0 and 1 (Protocol Error otherwise).
_BOOLEAN: Final = frozenset(
    int(p)
    for p in (
        P.PAYLOAD_FORMAT_INDICATOR,
        P.REQUEST_PROBLEM_INFORMATION,
        P.REQUEST_RESPONSE_INFORMATION,
        P.MAXIMUM_QOS,
        P.RETAIN_AVAILABLE,
        P.WILDCARD_SUBSCRIPTION_AVAILABLE,
        P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
        P.SHARED_SUBSCRIPTION_AVAILABLE,
    )
)
# Integer properties for which 0 is a Protocol Error.
_NONZERO: Final = frozenset(
    int(p)
    for p in (
        P.RECEIVE_MAXIMUM,
        P.MAXIMUM_PACKET_SIZE,
        P.SUBSCRIPTION_IDENTIFIER,
        P.TOPIC_ALIAS,
    )
)

_UP: Final = int(P.USER_PROPERTY)
_SUB_ID: Final = int(P.SUBSCRIPTION_IDENTIFIER)
_REASON: Final = (int(P.REASON_STRING), _UP)

ALLOWED_PROPERTIES: Final[dict[int, frozenset[int]]] = {
    PacketType.CONNECT: frozenset(
        int(p)
        for p in (
            P.SESSION_EXPIRY_INTERVAL,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.REQUEST_PROBLEM_INFORMATION,
            P.REQUEST_RESPONSE_INFORMATION,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
        )
    ),
    PacketType.CONNACK: frozenset(
        int(p)
        for p in (
            P.SESSION_EXPIRY_INTERVAL,
            P.ASSIGNED_CLIENT_IDENTIFIER,
            P.SERVER_KEEP_ALIVE,
            P.AUTHENTICATION_METHOD,
            P.AUTHENTICATION_DATA,
            P.RESPONSE_INFORMATION,
            P.SERVER_REFERENCE,
            P.REASON_STRING,
            P.RECEIVE_MAXIMUM,
            P.TOPIC_ALIAS_MAXIMUM,
            P.MAXIMUM_QOS,
            P.RETAIN_AVAILABLE,
            P.USER_PROPERTY,
            P.MAXIMUM_PACKET_SIZE,
            P.WILDCARD_SUBSCRIPTION_AVAILABLE,
            P.SUBSCRIPTION_IDENTIFIER_AVAILABLE,
            P.SHARED_SUBSCRIPTION_AVAILABLE,
        )
    ),
    PacketType.PUBLISH: frozenset(
        int(p)
        for p in (
            P.PAYLOAD_FORMAT_INDICATOR,
            P.MESSAGE_EXPIRY_INTERVAL,
            P.CONTENT_TYPE,
            P.RESPONSE_TOPIC,
            P.CORRELATION_DATA,
            P.SUBSCRIPTION_IDENTIFIER,
            P.TOPIC_ALIAS,
            P.USER_PROPERTY,
        )
    ),
    PacketType.PUBACK: frozenset(_REASON),
    PacketType.PUBREC: frozenset(_REASON),
    PacketType.PUBREL: frozenset(_REASON),
    PacketType.PUBCOMP: frozenset(_REASON),
    PacketType.SUBSCRIBE: frozenset((_SUB_ID, _UP)),
    PacketType.SUBACK: frozenset(_REASON),
    PacketType.UNSUBSCRIBE: frozenset((_UP,)),
    PacketType.UNSUBACK: frozenset(_REASON),
    PacketType.DISCONNECT: frozenset(
        int(p)
        for p in (P.SESSION_EXPIRY_INTERVAL, P.SERVER_REFERENCE, P.REASON_STRING, P.USER_PROPERTY)
    ),
    PacketType.AUTH: frozenset(
        int(p)
        for p in (P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA, P.REASON_STRING, P.USER_PROPERTY)
    ),
}
WILL_PROPERTIES: Final[frozenset[int]] = frozenset(
    int(p)
    for p in (
        P.PAYLOAD_FORMAT_INDICATOR,
        P.MESSAGE_EXPIRY_INTERVAL,
        P.CONTENT_TYPE,
        P.RESPONSE_TOPIC,
        P.CORRELATION_DATA,
        P.WILL_DELAY_INTERVAL,
        P.USER_PROPERTY,
    )
)
_PUBLISH_ALLOWED: Final = ALLOWED_PROPERTIES[PacketType.PUBLISH]

# ---------------------------------------------------------------------------------------------
# Property block
# ---------------------------------------------------------------------------------------------


_pack_BB: Final = Struct(">BB").pack
_pack_BH: Final = Struct(">BH").pack
_pack_BI: Final = Struct(">BI").pack
_pack_H: Final = Struct(">H").pack


def encode_properties(properties: Properties) -> bytes:
    """Encode a property block including its varint length prefix.

    USER_PROPERTY values are emitted in list order (duplicates kept), SUBSCRIPTION_IDENTIFIER
    lists (or a bare int) emit one entry per identifier. Unknown identifiers and values the
    type cannot hold raise ValueError: the caller has a bug, and sending it would make the
    peer drop the connection. Flat and struct-based because v5 deliveries carrying a
    message expiry or user properties encode a block per message.
    """
    if not properties:
        return b"\x00"
    parts: list[bytes] = []
    append = parts.append
    kinds = _KIND_TABLE
    try:
        for pid, value in properties.items():
            kind = kinds[pid] if 0 <= pid < 256 else None
            if kind == _PAIR:
                for name, val in value:
                    raw_name = name.encode()
                    raw_val = val.encode()
                    append(_pack_BH(pid, len(raw_name)))
                    append(raw_name)
                    append(_pack_H(len(raw_val)))
                    append(raw_val)
            elif kind == _U32:
                append(_pack_BI(pid, value))
            elif kind == _STR:
                raw = value.encode()
                append(_pack_BH(pid, len(raw)))
                append(raw)
            elif kind == _U16:
                append(_pack_BH(pid, value))
            elif kind == _BYTE:
                append(_pack_BB(pid, value))
            elif kind == _BIN:
                append(_pack_BH(pid, len(value)))
                append(bytes(value))
            elif kind == _VARINT:
                for sub_id in (value,) if isinstance(value, int) else value:
                    append(bytes((pid,)))
                    append(encode_varint(sub_id))
            else:
                raise ValueError(f"unknown property identifier {pid!r}")
    except StructError as exc:
        raise ValueError(f"property value out of range: {exc}") from None
    body = b"".join(parts)
    if len(body) < 128:
        return _VARINT_1[len(body)] + body
    return encode_varint(len(body)) + body


def _utf8(raw: bytes) -> str:
    """Strict UTF-8 decode that reports MalformedPacket (1.5.4)."""
    try:
        value = raw.decode()
    except UnicodeDecodeError:
        raise MalformedPacket("invalid UTF-8 string") from None
    if "\x00" in value:
        raise MalformedPacket("UTF-8 string contains U+0000")
    return value


def decode_properties(
    buf: bytes, pos: int, end: int, allowed: frozenset[int]
) -> tuple[Properties, int]:
    """Decode a property block at `pos` (its length prefix included); returns (props, new_pos).

    Raises MalformedPacket for truncation, unknown identifiers and identifiers not in
    `allowed` (the packet's list), ProtocolError for duplicates and for the values the spec
    calls a Protocol Error (0/1 flags, zero Receive Maximum, ...).

    Written flat (strings decoded inline, kinds from a tuple) because v5 PUBLISH with user
    properties or a message expiry goes through here for every message.
    """
    if pos < end and buf[pos] < 0x80:
        stop = pos + 1 + buf[pos]
        pos += 1
    else:
        length, pos = decode_varint(buf, pos, end)
        stop = pos + length
    if stop > end:
        raise MalformedPacket("property length exceeds the packet")
    props: Properties = {}
    kinds = _KIND_TABLE
    while pos < stop:
        pid = buf[pos]
        pos += 1
        if pid not in allowed:
            if kinds[pid] is not None:
                raise MalformedPacket(f"property {pid:#x} not allowed in this packet")
            raise MalformedPacket(f"unknown property identifier {pid:#x}")
        kind = kinds[pid]
        value: Any
        if kind == _PAIR:
            if pos + 2 > stop:
                raise MalformedPacket("truncated user property")
            name_at = pos + 2
            pos = name_at + ((buf[pos] << 8) | buf[pos + 1])
            if pos + 2 > stop:
                raise MalformedPacket("truncated user property")
            value_at = pos + 2
            pos = value_at + ((buf[pos] << 8) | buf[pos + 1])
            if pos > stop:
                raise MalformedPacket("truncated user property")
            pair = (_utf8(buf[name_at : value_at - 2]), _utf8(buf[value_at:pos]))
            pairs = props.get(pid)
            if pairs is None:
                props[pid] = [pair]
            else:
                pairs.append(pair)
            continue
        if kind == _U32:
            if pos + 4 > stop:
                raise MalformedPacket("truncated property")
            value = int.from_bytes(buf[pos : pos + 4], "big")
            pos += 4
        elif kind in (_STR, _BIN):
            if pos + 2 > stop:
                raise MalformedPacket("truncated property")
            start = pos + 2
            pos = start + ((buf[pos] << 8) | buf[pos + 1])
            if pos > stop:
                raise MalformedPacket("truncated property")
            value = _utf8(buf[start:pos]) if kind == _STR else bytes(buf[start:pos])
        elif kind == _U16:
            if pos + 2 > stop:
                raise MalformedPacket("truncated property")
            value = (buf[pos] << 8) | buf[pos + 1]
            pos += 2
        elif kind == _BYTE:
            if pos >= stop:
                raise MalformedPacket("truncated property")
            value = buf[pos]
            pos += 1
            if value > 1 and pid in _BOOLEAN:
                raise ProtocolError(f"property {pid:#x} must be 0 or 1")
        else:  # _VARINT
            value, pos = decode_varint(buf, pos, stop)
        if value == 0 and pid in _NONZERO:
            raise ProtocolError(f"property {pid:#x} must not be 0")
        if pid == _SUB_ID:
            ids = props.get(pid)
            if ids is None:
                props[pid] = [value]
            elif allowed is _PUBLISH_ALLOWED:
                ids.append(value)
            else:
                raise ProtocolError(f"duplicate property {pid:#x}")
            continue
        if pid in props:
            raise ProtocolError(f"duplicate property {pid:#x}")
        props[pid] = value
    return props, pos
