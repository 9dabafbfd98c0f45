"""Streaming, strict packet decoder for one connection (sans I/O).

The decoder is on the hot path of every connection, so `Decoder.feed` parses all complete
packets of a chunk in one loop over the chunk with integer indexing, decodes PUBLISH inline
and copies the unconsumed tail once per call. Partial packets are kept as a list of chunks
and joined only once enough bytes for the announced packet have arrived, so a large packet
trickling in over many reads costs O(size), not O(size^2).

Every rule the spec states as "treat as malformed / protocol error" is checked here; rules
that need connection state (topic aliases, packet id reuse, a second CONNECT, packets sent
in the wrong direction, filter syntax) are left to the connection.
"""

from collections.abc import Callable
from typing import Final, NoReturn

from broker.mqtt.constants import (
    CONNECT_BYTE,
    CONNECT_CLEAN_START,
    CONNECT_PASSWORD,
    CONNECT_RESERVED,
    CONNECT_USERNAME,
    CONNECT_WILL,
    CONNECT_WILL_RETAIN,
    MQTT_3_1,
    MQTT_3_1_1,
    MQTT_5,
    PUBACK_BYTE,
    PacketType,
    PropertyId,
    ReasonCode,
)
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
from broker.mqtt.properties import (
    ALLOWED_PROPERTIES,
    WILL_PROPERTIES,
    decode_binary,
    decode_properties,
    decode_string,
)

__all__ = ["DEFAULT_MAX_PACKET_SIZE", "Decoder"]

# 1 type byte + 4 length bytes + the largest remaining length.
DEFAULT_MAX_PACKET_SIZE: Final = 268_435_460

_TOPIC_ALIAS: Final = int(PropertyId.TOPIC_ALIAS)
_AUTH_METHOD: Final = int(PropertyId.AUTHENTICATION_METHOD)
_AUTH_DATA: Final = int(PropertyId.AUTHENTICATION_DATA)
_PUBLISH_PROPS: Final = ALLOWED_PROPERTIES[PacketType.PUBLISH]


def _first_byte_error(b0: int, version: int | None) -> MQTTError | None:
    """What is wrong with a fixed-header first byte on a connection at `version`, or None.

    Reserved flags (2.1.3), PUBLISH QoS 3 / DUP on QoS 0 (3.3.1), type 0, type 15 (AUTH)
    before v5, and anything but CONNECT while the version is still unknown.
    """
    ptype, flags = b0 >> 4, b0 & 0x0F
    if ptype == 0:
        return MalformedPacket("reserved packet type 0")
    if ptype == PacketType.PUBLISH:
        qos = (flags >> 1) & 3
        if qos == 3:
            return MalformedPacket("PUBLISH with QoS 3")
        if flags & 8 and not qos:
            return MalformedPacket("PUBLISH with DUP set on QoS 0")
    else:
        two = (PacketType.PUBREL, PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE)
        expected = 2 if ptype in two else 0
        if flags != expected:
            return MalformedPacket(f"reserved flags {flags:#06b} on packet type {ptype}")
    if ptype == PacketType.AUTH and version in (MQTT_3_1, MQTT_3_1_1):
        return MalformedPacket("packet type 15 is reserved before MQTT 5")
    if version is None and ptype != PacketType.CONNECT:
        return ProtocolError("first packet must be CONNECT")
    return None


# Precomputed per version and possible first byte, so that the whole fixed-header check
# costs one tuple index per packet. Holds exception templates; the raised error is a copy.
_FIRST_BYTE: Final[dict[int | None, tuple[MQTTError | None, ...]]] = {
    v: tuple(_first_byte_error(b, v) for b in range(256))
    for v in (None, MQTT_3_1, MQTT_3_1_1, MQTT_5)
}
# PUBLISH first byte -> (qos, retain, dup).
_PUBLISH_BITS: Final[tuple[tuple[int, bool, bool], ...]] = tuple(
    ((b >> 1) & 3, bool(b & 1), bool(b & 8)) for b in range(256)
)


def _raise_first_byte(template: MQTTError) -> NoReturn:
    raise type(template)(str(template), template.reason_code)


# Reason codes each v5 packet may carry (the "Reason Code values" table of each packet).
_R: Final = ReasonCode
_CONNACK_CODES: Final = frozenset(
    (0x00, 0x80, 0x81, 0x82, 0x83, 0x84, 0x85, 0x86, 0x87, 0x88, 0x89, 0x8A, 0x8C, 0x90, 0x95,
     0x97, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9F)
)  # fmt: skip
# PUBACK's, and PUBREC's too
_PUBACK_CODES: Final = frozenset((0x00, 0x10, 0x80, 0x83, 0x87, 0x90, 0x91, 0x97, 0x99))
_PUBREL_CODES: Final = frozenset((0x00, 0x92))  # PUBCOMP too
_SUBACK_CODES: Final = frozenset(
    (0x00, 0x01, 0x02, 0x80, 0x83, 0x87, 0x8F, 0x91, 0x97, 0x9E, 0xA1, 0xA2))
_SUBACK_CODES_V3: Final = frozenset((0x00, 0x01, 0x02, 0x80))
_UNSUBACK_CODES: Final = frozenset((0x00, 0x11, 0x80, 0x83, 0x87, 0x8F, 0x91))
_DISCONNECT_CODES: Final = frozenset(
    (0x00, 0x04, 0x80, 0x81, 0x82, 0x83, 0x87, 0x89, 0x8B, 0x8D, 0x8E, 0x8F, 0x90, 0x93, 0x94,
     0x95, 0x96, 0x97, 0x98, 0x99, 0x9A, 0x9B, 0x9C, 0x9D, 0x9E, 0x9F, 0xA0, 0xA1, 0xA2)
)  # fmt: skip
_AUTH_CODES: Final = frozenset((0x00, 0x18, 0x19))
# v3 CONNACK return code -> the v5 reason code it means (inverse of encode.connack_code_v3).
_CONNACK_FROM_V3: Final = (
    _R.SUCCESS,
    _R.UNSUPPORTED_PROTOCOL_VERSION,
    _R.CLIENT_IDENTIFIER_NOT_VALID,
    _R.SERVER_UNAVAILABLE,
    _R.BAD_USER_NAME_OR_PASSWORD,
    _R.NOT_AUTHORIZED,
)


def _remaining_length(buf: bytes, pos: int, n: int) -> tuple[int, int]:
    """Multi-byte Remaining Length at `pos`: (value, body start), or (-1, 0) if incomplete.

    Raises as soon as a 4th byte with the continuation bit is seen, without waiting for
    more data, and for non-minimal encodings (1.5.5).
    """
    value = 0
    shift = 0
    for i in range(pos, pos + 4):
        if i >= n:
            return -1, 0
        byte = buf[i]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0:
                raise MalformedPacket("non-minimal remaining length")
            return value, i + 1
        shift += 7
    raise MalformedPacket("remaining length longer than 4 bytes")


def _bad_topic(topic: str, props: Properties, version: int) -> None:
    """Slow path of the PUBLISH topic check; returns only for an empty v5 topic with alias."""
    if not topic:
        if version == MQTT_5:
            if _TOPIC_ALIAS in props:
                return
            raise ProtocolError("empty topic name without a topic alias")
        raise ProtocolError("empty topic name", ReasonCode.TOPIC_NAME_INVALID)
    if "\x00" in topic:
        raise MalformedPacket("UTF-8 string contains U+0000")
    raise ProtocolError(f"wildcard in topic name {topic!r}", ReasonCode.TOPIC_NAME_INVALID)


class _Reader:
    """Bounds-checked cursor over one packet body, for the less frequent packet types."""

    __slots__ = ("buf", "end", "pos")

    def __init__(self, buf: bytes, pos: int, end: int) -> None:
        self.buf = buf
        self.pos = pos
        self.end = end

    def more(self) -> bool:
        return self.pos < self.end

    def u8(self) -> int:
        if self.pos >= self.end:
            raise MalformedPacket("packet too short")
        self.pos += 1
        return self.buf[self.pos - 1]

    def u16(self) -> int:
        pos = self.pos
        if pos + 2 > self.end:
            raise MalformedPacket("packet too short")
        self.pos = pos + 2
        return (self.buf[pos] << 8) | self.buf[pos + 1]

    def packet_id(self) -> int:
        pid = self.u16()
        if not pid:
            raise MalformedPacket("packet identifier 0")
        return pid

    def string(self) -> str:
        value, self.pos = decode_string(self.buf, self.pos, self.end)
        return value

    def binary(self) -> bytes:
        value, self.pos = decode_binary(self.buf, self.pos, self.end)
        return value

    def props(self, allowed: frozenset[int]) -> Properties:
        value, self.pos = decode_properties(self.buf, self.pos, self.end, allowed)
        return value

    def done(self) -> None:
        if self.pos != self.end:
            raise MalformedPacket(f"{self.end - self.pos} unexpected bytes at end of packet")


def _reason(r: _Reader, allowed: frozenset[int], what: str) -> int:
    code = r.u8()
    if code not in allowed:
        raise MalformedPacket(f"reason code {code:#04x} not allowed in {what}")
    return code


def _dec_connack(r: _Reader, version: int) -> Connack:
    flags = r.u8()
    if flags & 0xFE:
        raise MalformedPacket("reserved CONNACK flags set")
    if version == MQTT_5:
        code = _reason(r, _CONNACK_CODES, "CONNACK")
        props = r.props(ALLOWED_PROPERTIES[PacketType.CONNACK])
    else:
        code = r.u8()
        if code >= len(_CONNACK_FROM_V3):
            raise MalformedPacket(f"reserved CONNACK return code {code}")
        code = _CONNACK_FROM_V3[code]
        props = {}
    r.done()
    return Connack(bool(flags), code, props)


_AckClass = type[Puback] | type[Pubrec] | type[Pubrel] | type[Pubcomp]


def _ack_decoder(cls: _AckClass, codes: frozenset[int]) -> Callable[[_Reader, int], Packet]:
    """PUBACK/PUBREC/PUBREL/PUBCOMP: packet id, then (v5) optional code and properties."""
    packet_type = cls(0).type  # a property of the instance (packets.py)
    allowed = ALLOWED_PROPERTIES[packet_type]
    name = packet_type.name

    def decode(r: _Reader, version: int) -> Packet:
        pid = r.packet_id()
        code = 0
        props: Properties = {}
        if version == MQTT_5 and r.more():
            code = _reason(r, codes, name)
            if r.more():
                props = r.props(allowed)
        r.done()
        return cls(pid, code, props)

    return decode


def _dec_subscribe(r: _Reader, version: int) -> Subscribe:
    pid = r.packet_id()
    props = r.props(ALLOWED_PROPERTIES[PacketType.SUBSCRIBE]) if version == MQTT_5 else {}
    subs: list[Subscription] = []
    while r.more():
        topic_filter = r.string()
        if not topic_filter:
            raise MalformedPacket("empty topic filter")
        opts = r.u8()
        qos = opts & 3
        if qos == 3:
            raise MalformedPacket("subscription QoS 3")
        if version == MQTT_5:
            if opts & 0xC0:
                raise MalformedPacket("reserved subscription option bits set")
            handling = (opts >> 4) & 3
            if handling == 3:
                raise MalformedPacket("retain handling 3")
            subs.append(Subscription(topic_filter, qos, bool(opts & 4), bool(opts & 8), handling))
        else:
            if opts & 0xFC:
                raise MalformedPacket("reserved subscription option bits set")
            subs.append(Subscription(topic_filter, qos))
    if not subs:
        raise ProtocolError("SUBSCRIBE without subscriptions")
    return Subscribe(pid, subs, props)


def _dec_suback(r: _Reader, version: int) -> Suback:
    pid = r.packet_id()
    props = r.props(ALLOWED_PROPERTIES[PacketType.SUBACK]) if version == MQTT_5 else {}
    allowed = _SUBACK_CODES if version == MQTT_5 else _SUBACK_CODES_V3
    codes: list[int] = []
    while r.more():
        codes.append(_reason(r, allowed, "SUBACK"))
    if not codes:
        raise ProtocolError("SUBACK without reason codes")
    return Suback(pid, codes, props)


def _dec_unsubscribe(r: _Reader, version: int) -> Unsubscribe:
    pid = r.packet_id()
    props = r.props(ALLOWED_PROPERTIES[PacketType.UNSUBSCRIBE]) if version == MQTT_5 else {}
    filters: list[str] = []
    while r.more():
        topic_filter = r.string()
        if not topic_filter:
            raise MalformedPacket("empty topic filter")
        filters.append(topic_filter)
    if not filters:
        raise ProtocolError("UNSUBSCRIBE without topic filters")
    return Unsubscribe(pid, filters, props)


def _dec_unsuback(r: _Reader, version: int) -> Unsuback:
    pid = r.packet_id()
    if version != MQTT_5:
        r.done()
        return Unsuback(pid)
    props = r.props(ALLOWED_PROPERTIES[PacketType.UNSUBACK])
    codes: list[int] = []
    while r.more():
        codes.append(_reason(r, _UNSUBACK_CODES, "UNSUBACK"))
    if not codes:
        raise ProtocolError("UNSUBACK without reason codes")
    return Unsuback(pid, codes, props)


def _dec_pingreq(r: _Reader, version: int) -> Pingreq:
    r.done()
    return Pingreq()


def _dec_pingresp(r: _Reader, version: int) -> Pingresp:
    r.done()
    return Pingresp()


def _dec_disconnect(r: _Reader, version: int) -> Disconnect:
    """v5 allows remaining length 0 (success), 1 (code only) or code + properties (3.14.2)."""
    code = 0
    props: Properties = {}
    if version == MQTT_5 and r.more():
        code = _reason(r, _DISCONNECT_CODES, "DISCONNECT")
        if r.more():
            props = r.props(ALLOWED_PROPERTIES[PacketType.DISCONNECT])
    r.done()
    return Disconnect(code, props)


def _dec_auth(r: _Reader, version: int) -> Auth:
    """v5 only (type 15 is reserved in v3, rejected before this). Remaining length 0 means
    success; otherwise code AND property length are required: unlike PUBACK/DISCONNECT the
    spec gives AUTH no "property length may be omitted" rule (3.15.2.2.1)."""
    if not r.more():
        return Auth()
    code = _reason(r, _AUTH_CODES, "AUTH")
    props = r.props(ALLOWED_PROPERTIES[PacketType.AUTH])
    r.done()
    return Auth(code, props)


_DECODERS: Final[dict[int, Callable[[_Reader, int], Packet]]] = {
    PacketType.CONNACK: _dec_connack,
    PacketType.PUBACK: _ack_decoder(Puback, _PUBACK_CODES),
    PacketType.PUBREC: _ack_decoder(Pubrec, _PUBACK_CODES),
    PacketType.PUBREL: _ack_decoder(Pubrel, _PUBREL_CODES),
    PacketType.PUBCOMP: _ack_decoder(Pubcomp, _PUBREL_CODES),
    PacketType.SUBSCRIBE: _dec_subscribe,
    PacketType.SUBACK: _dec_suback,
    PacketType.UNSUBSCRIBE: _dec_unsubscribe,
    PacketType.UNSUBACK: _dec_unsuback,
    PacketType.PINGREQ: _dec_pingreq,
    PacketType.PINGRESP: _dec_pingresp,
    PacketType.DISCONNECT: _dec_disconnect,
    PacketType.AUTH: _dec_auth,
}
# Plain list indexed by packet type: cheaper than a dict lookup with an int key.
_DECODER_TABLE: Final[list[Callable[[_Reader, int], Packet] | None]] = [
    _DECODERS.get(t) for t in range(16)
]


class Decoder:
    """Streaming decoder for one connection. Feed it whatever bytes arrived.

    `version` is None until a CONNECT was decoded (server side) or is given (client side,
    or a server that learned the version elsewhere). While it is None, the only packet
    accepted is CONNECT (3.1: "the first packet sent from the Client to the Server MUST be
    a CONNECT packet"); anything else is a ProtocolError before its body is read.

    The decoder does not know which side it is on: it decodes all 15 packet types in both
    directions, and leaves "a client must not send CONNACK" to the connection.
    """

    __slots__ = ("_chunks", "_error", "_have", "_need", "max_packet_size", "version")

    def __init__(
        self, *, max_packet_size: int = DEFAULT_MAX_PACKET_SIZE, version: int | None = None
    ) -> None:
        if version not in (None, MQTT_3_1, MQTT_3_1_1, MQTT_5):
            raise ValueError(f"unsupported protocol version {version}")
        self.version: int | None = version
        self.max_packet_size = max_packet_size
        self._chunks: list[bytes] = []  # unconsumed bytes (a partial packet), as received
        self._have = 0  # total length of _chunks
        self._need = 0  # bytes the partial packet needs in total; 0 = header not complete
        self._error: MQTTError | None = None

    def feed(self, data: bytes | bytearray | memoryview) -> list[Packet]:
        """Append `data`; return every complete packet now available, in order.

        On a violation raises an MQTTError subclass whose `.packets` holds the packets
        decoded before it in this call; the decoder is then dead and every further call
        raises an error of the same class and reason code.
        """
        if self._error is not None:
            raise self._dead()
        if type(data) is not bytes:
            data = bytes(data)  # own a copy: the caller may reuse a bytearray/memoryview
        if self._chunks:
            self._chunks.append(data)
            self._have += len(data)
            if self._have < self._need:
                return []
            buf = b"".join(self._chunks)
            self._chunks = []
        else:
            buf = data

        packets: list[Packet] = []
        append = packets.append
        n = len(buf)
        pos = 0
        need = 0
        version = self.version
        v5 = version == MQTT_5
        first_byte = _FIRST_BYTE[version]
        # With a one-byte remaining length a packet has at most 129 bytes: the size check
        # is only needed on that path when the limit is smaller than that.
        small_limit = self.max_packet_size - 2
        publish_bits = _PUBLISH_BITS
        publish = Publish
        puback = Puback
        try:
            while pos < n:
                b0 = buf[pos]
                if first_byte[b0] is not None:
                    _raise_first_byte(first_byte[b0])  # type: ignore[arg-type]
                if pos + 1 >= n:
                    need = 0
                    break
                rl = buf[pos + 1]
                if rl < 0x80:
                    start = pos + 2
                    if rl > small_limit:
                        self._too_large(rl + 2)
                else:
                    rl, start = _remaining_length(buf, pos + 1, n)
                    if rl < 0:
                        need = 0
                        break
                    if start - pos + rl > self.max_packet_size:
                        self._too_large(start - pos + rl)
                end = start + rl
                if end > n:
                    need = end - pos
                    break

                if b0 >> 4 == 3:
                    # PUBLISH, inline: topic, [packet id], [properties], payload.
                    if rl < 2:
                        raise MalformedPacket("PUBLISH too short")
                    p = start + 2 + ((buf[start] << 8) | buf[start + 1])
                    if p > end:
                        raise MalformedPacket("topic name longer than the packet")
                    try:
                        topic = buf[start + 2 : p].decode()
                    except UnicodeDecodeError:
                        raise MalformedPacket("invalid UTF-8 in topic name") from None
                    qos, retain, dup = publish_bits[b0]
                    if qos:
                        if p + 2 > end:
                            raise MalformedPacket("PUBLISH too short for packet identifier")
                        packet_id: int | None = (buf[p] << 8) | buf[p + 1]
                        if not packet_id:
                            raise MalformedPacket("packet identifier 0")
                        p += 2
                    else:
                        packet_id = None
                    if v5:
                        if p >= end:
                            raise MalformedPacket("PUBLISH without property length")
                        if buf[p]:
                            props, p = decode_properties(buf, p, end, _PUBLISH_PROPS)
                        else:
                            props = {}
                            p += 1
                    else:
                        props = {}
                    if not topic or "+" in topic or "#" in topic or "\x00" in topic:
                        _bad_topic(topic, props, version)  # type: ignore[arg-type]
                    append(publish(topic, buf[p:end], qos, retain, dup, packet_id, props))
                elif b0 == PUBACK_BYTE and rl == 2:
                    # PUBACK without reason code, the answer to every QoS 1 delivery.
                    packet_id = (buf[start] << 8) | buf[start + 1]
                    if not packet_id:
                        raise MalformedPacket("packet identifier 0")
                    append(puback(packet_id))
                elif b0 == CONNECT_BYTE:
                    append(self._decode_connect(_Reader(buf, start, end)))
                    version = self.version
                    v5 = version == MQTT_5
                    first_byte = _FIRST_BYTE[version]
                else:
                    decoder = _DECODER_TABLE[b0 >> 4]
                    append(decoder(_Reader(buf, start, end), version))  # type: ignore[misc,arg-type]
                pos = end
        except MQTTError as exc:
            exc.packets = packets  # type: ignore[attr-defined]
            # A copy, without the traceback: that holds this frame, whose locals hold the
            # decoder and the bytes received, so keeping `exc` made a reference cycle and a
            # connection ended for a violation stayed in memory, its last read included,
            # until the cycle collector's next full pass.
            self._error = type(exc)(str(exc), exc.reason_code)
            self._chunks = []
            raise

        if pos < n:
            rest = buf[pos:] if pos else buf
            self._chunks = [rest]
            self._have = len(rest)
            self._need = need
        else:
            self._have = self._need = 0
        return packets

    @property
    def partial(self) -> bool:
        """Part of a packet has arrived and the rest has not: the connection bounds how long
        that may last (a sender that stalls mid-packet would otherwise hold the buffer)."""
        return bool(self._chunks)

    @property
    def error(self) -> MQTTError | None:
        """The violation that ended decoding, if one did (the transport may report it in its
        own terms: a WebSocket closes with 1009 for a packet too large)."""
        return self._error

    def _dead(self) -> MQTTError:
        """What every call after a violation raises: the same class and reason code. Made
        here, not in `feed`: an exception in a local of the frame it is raised from is a
        reference cycle (the traceback holds the frame)."""
        error = self._error
        assert error is not None
        dead = type(error)(f"decoder failed earlier: {error}", error.reason_code)
        dead.packets = []  # type: ignore[attr-defined]
        return dead

    def _too_large(self, size: int) -> NoReturn:
        raise PacketTooLarge(f"packet of {size} bytes exceeds maximum of {self.max_packet_size}")

    def _decode_connect(self, r: _Reader) -> Connect:
        """CONNECT (3.1). Sets `self.version` as soon as the protocol level is known, so the
        connection can encode its CONNACK in the right version even if the rest is bad."""
        name_len = r.u16()
        if r.pos + name_len > r.end:
            raise MalformedPacket("protocol name longer than the packet")
        name = r.buf[r.pos : r.pos + name_len]
        r.pos += name_len
        level = r.u8()
        if (name == b"MQTT" and level in (MQTT_3_1_1, MQTT_5)) or (
            name == b"MQIsdp" and level == MQTT_3_1
        ):
            self.version = level
        elif self.version is not None:
            # A second CONNECT is a Protocol Error whatever it holds (MQTT-3.1.0-2): the
            # connection keeps its version and answers with a DISCONNECT, which has no 0x84
            # (3.14.2.1). Found by the network fuzzer.
            raise UnsupportedProtocolVersion(
                f"second CONNECT, unsupported protocol {name[:16]!r} level {level}",
                ReasonCode.PROTOCOL_ERROR)
        else:
            # Refused with a CONNACK 0x84 in the form the client reads: level 5 under a
            # wrong name is a v5 client (MQTT 5.0 section 3.1.2.1 lets the server close or
            # answer; a v3.1.1 CONNACK's return code 1 would read as "granted QoS 1" to a v5
            # client), anything else gets the v3.1.1 form (return code 1), which every
            # client parses.
            self.version = MQTT_5 if level == MQTT_5 else MQTT_3_1_1
            raise UnsupportedProtocolVersion(f"unsupported protocol {name[:16]!r} level {level}")
        v5 = level == MQTT_5
        flags = r.u8()
        if flags & CONNECT_RESERVED:
            raise MalformedPacket("reserved CONNECT flag set")
        will_flag = flags & CONNECT_WILL
        will_qos = (flags >> 3) & 3
        will_retain = bool(flags & CONNECT_WILL_RETAIN)
        if not will_flag and (will_qos or will_retain):
            raise MalformedPacket("will QoS/retain set without will flag")
        if will_qos == 3:
            raise MalformedPacket("will QoS 3")
        if not v5 and flags & CONNECT_PASSWORD and not flags & CONNECT_USERNAME:
            raise MalformedPacket("password flag without user name flag")
        keepalive = r.u16()
        props = r.props(ALLOWED_PROPERTIES[PacketType.CONNECT]) if v5 else {}
        if _AUTH_DATA in props and _AUTH_METHOD not in props:
            raise ProtocolError("authentication data without authentication method")
        client_id = r.string()
        will = None
        if will_flag:
            will_props = r.props(WILL_PROPERTIES) if v5 else {}
            will_topic = r.string()
            if not will_topic or "+" in will_topic or "#" in will_topic:
                raise ProtocolError(
                    f"invalid will topic {will_topic!r}", ReasonCode.TOPIC_NAME_INVALID
                )
            will = Will(will_topic, r.binary(), will_qos, will_retain, will_props)
        username = r.string() if flags & CONNECT_USERNAME else None
        password = r.binary() if flags & CONNECT_PASSWORD else None
        r.done()
        return Connect(
            client_id, level, bool(flags & CONNECT_CLEAN_START), keepalive, username, password,
            will, props,
        )
