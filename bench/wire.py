"""Pre-encoded MQTT 3.1.1 packets and C-speed stream scanners for the load generator.

Why this exists: the machine has 2 cores, so a client that builds and parses every packet in
Python would be the bottleneck, not the broker. Every packet a generator sends is encoded once,
up front, with the project's codec; every packet it receives is counted by strided slicing of
the received bytes (`data[off:end:size].count(byte)`), which runs in C. That works because in a
benchmark stream all PUBLISH packets (or all PUBACKs) have the same size. Anything unexpected
(a misaligned stream, a PUBLISH of another size) switches that connection to the codec's
`Decoder` for good, so counts stay exact; `slow_path` records that it happened.
"""

import socket
import struct
from dataclasses import dataclass

from broker.mqtt.codec import Decoder, encode
from broker.mqtt.packets import (
    Connack,
    Connect,
    Disconnect,
    Packet,
    Puback,
    Publish,
    Suback,
    Subscribe,
    Subscription,
)

MQTT_V311 = 4
"""All brokers are driven with MQTT 3.1.1 so the comparison is like for like."""


def connect(client_id: str, keepalive: int = 0, clean: bool = True,
            credentials: tuple[str, str] | None = None) -> bytes:
    """CONNECT; keepalive 0 so idle benchmark connections never ping. `clean=False` is the
    3.1.1 persistent session the durable benchmark queues messages for; `credentials` a user
    name and password (security_bench.py)."""
    username, password = credentials if credentials is not None else (None, None)
    packet = Connect(client_id=client_id, protocol_level=MQTT_V311, clean_start=clean,
                     keepalive=keepalive, username=username,
                     password=None if password is None else password.encode())
    return encode(packet, MQTT_V311)


DISCONNECT = encode(Disconnect(), MQTT_V311)
"""Sent before closing a persistent session, so the broker takes it offline at once and in
order, not whenever it notices the closed socket."""


def subscribe(topic_filter: str, qos: int, packet_id: int = 1) -> bytes:
    packet = Subscribe(packet_id=packet_id, subscriptions=[Subscription(topic_filter, qos=qos)])
    return encode(packet, MQTT_V311)


def publish(topic: str, payload: bytes, qos: int, packet_id: int | None = None,
            dup: bool = False) -> bytes:
    packet = Publish(topic=topic, payload=payload, qos=qos, packet_id=packet_id if qos else None,
                     dup=dup)
    return encode(packet, MQTT_V311)


CONNACK_SIZE = len(encode(Connack(), MQTT_V311))
SUBACK_SIZE = len(encode(Suback(packet_id=1, reason_codes=[0]), MQTT_V311))
"""v3.1.1 CONNACK and single-topic SUBACK have fixed sizes: handshakes read exactly that much,
so no byte of the following PUBLISH stream is ever swallowed by the handshake."""


IDENTITY = struct.Struct(">HI")
"""A numbered message's identity, the first bytes of its payload: its publisher's number and
its sequence number from that publisher (shared_bench.py counts every message by it)."""
_SEQUENCE = struct.calcsize(">H")  # where the sequence number sits in the identity


def identified(payload: bytes, publisher: int) -> bytes:
    """`payload`, same length, starting with the identity (publisher, sequence 0)."""
    return IDENTITY.pack(publisher, 0) + payload[IDENTITY.size :]


def numbered(packets: memoryview, size: int, payload_offset: int, first: int) -> bytearray:
    """Consecutive `size`-byte PUBLISHes of identified payloads (at `payload_offset` of each)
    with the sequence numbers first, first + 1, ... written into their identities; strided
    slice assignment, C speed."""
    count = len(packets) // size
    out = bytearray(packets)
    sequences = struct.pack(f">{count}I", *range(first, first + count))
    width = IDENTITY.size - _SEQUENCE
    for i in range(width):
        out[payload_offset + _SEQUENCE + i :: size] = sequences[i::width]
    return out


def identities(data: bytes, end: int, size: int, payload_offset: int) -> bytearray:
    """The identities of the `size`-byte PUBLISHes in data[:end], packed one after the
    other (IDENTITY.iter_unpack reads them back); strided slices, C speed."""
    out = bytearray(end // size * IDENTITY.size)
    for i in range(IDENTITY.size):
        out[i :: IDENTITY.size] = data[payload_offset + i : end : size]
    return out


def decode_one(data: bytes) -> Packet:
    """Decode exactly one packet (handshake replies), raising if the bytes are not one packet."""
    packets = Decoder(version=MQTT_V311).feed(data)
    if len(packets) != 1:
        raise ValueError(f"expected one packet, got {len(packets)} from {data!r}")
    return packets[0]


def publish_cycle(topic: str, payload: bytes, qos: int, count: int) -> bytes:
    """`count` consecutive PUBLISH packets, twice over, so any run of <= count is one slice.

    QoS 1 packets carry ids 1..count; a publisher keeps fewer than `count` in flight, so an id
    is reused only after the broker has acknowledged it.
    """
    one_cycle = b"".join(publish(topic, payload, qos, (i % 0xFFFF) + 1) for i in range(count))
    return one_cycle + one_cycle


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the constant bytes and the packet id sit inside one fixed-size packet."""

    size: int
    first_bytes: tuple[int, ...]  # accepted first bytes (a redelivered QoS 1 PUBLISH sets DUP)
    constant: bytes  # bytes 1..len(constant) that every packet shares (length, topic length)
    id_offset: int | None  # offset of the 2-byte packet id, None for QoS 0
    payload_offset: int = 0  # where the payload starts (an identity, when numbered)


def _id_offset(a: bytes, b: bytes) -> int:
    """Offset of the packet id found by diffing two encodings that differ only in the id."""
    return next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y)


def publish_layout(topic: str, payload: bytes, qos: int) -> Layout:
    """Layout of the PUBLISH a subscriber receives; derived from the codec, not hard-coded."""
    sample = publish(topic, payload, qos, 0x0101)
    constant = sample[1 : sample.index(topic.encode())]
    payload_offset = len(sample) - len(payload)
    if not qos:
        return Layout(len(sample), (sample[0],), constant, None, payload_offset)
    redelivery = encode(Publish(topic, payload, qos, dup=True, packet_id=0x0101), MQTT_V311)
    offset = _id_offset(sample, publish(topic, payload, qos, 0x0202))
    return Layout(len(sample), (sample[0], redelivery[0]), constant, offset, payload_offset)


_PUBACK = encode(Puback(packet_id=0x0101), MQTT_V311)
_PUBACK_ID = _id_offset(_PUBACK, encode(Puback(packet_id=0x0202), MQTT_V311))


def puback_layout() -> Layout:
    """Layout of the PUBACKs a QoS 1 publisher receives."""
    return Layout(len(_PUBACK), (_PUBACK[0],), _PUBACK[1:_PUBACK_ID], _PUBACK_ID)


def pubacks_for(ids_hi: bytes, ids_lo: bytes) -> bytes:
    """PUBACKs for a batch of packet ids, assembled with strided slice assignment (C speed)."""
    n, size = len(ids_hi), len(_PUBACK)
    out = bytearray(n * size)
    for i in range(size):
        if i == _PUBACK_ID:
            out[i::size] = ids_hi
        elif i == _PUBACK_ID + 1:
            out[i::size] = ids_lo
        else:
            out[i::size] = bytes([_PUBACK[i]]) * n
    return bytes(out)


class Scanner:
    """Counts fixed-size packets in one connection's byte stream, acking QoS 1 PUBLISHes.

    `feed` returns the PUBACK bytes to send back (empty unless `ack`). Bytes of a packet split
    across reads are carried over to the next call. `record`: keep the identity (IDENTITY) of
    every PUBLISH, in order of arrival, in `identities`.
    """

    def __init__(self, layout: Layout, ack: bool, kind: type = Publish,
                 record: bool = False) -> None:
        self.layout = layout
        self.ack = ack
        self.kind = kind
        self.identities = bytearray() if record else None
        self.count = 0
        self.slow_path = False
        self._rest = b""
        self._decoder: Decoder | None = None

    def feed(self, data: bytes) -> bytes:
        if self._decoder is not None:
            return self._feed_slow(data)
        if self._rest:
            data = self._rest + data
        lay = self.layout
        n = len(data) // lay.size
        end = n * lay.size
        if n and not self._aligned(data, n, end):
            self.slow_path = True
            self._decoder = Decoder(version=MQTT_V311)
            self._rest = b""
            return self._feed_slow(data)
        self._rest = data[end:]
        self.count += n
        if self.identities is not None:
            self.identities += identities(data, end, lay.size, lay.payload_offset)
        if not (self.ack and n):
            return b""
        off = lay.id_offset
        assert off is not None
        return pubacks_for(data[off:end:lay.size], data[off + 1 : end : lay.size])

    def _aligned(self, data: bytes, n: int, end: int) -> bool:
        lay = self.layout
        firsts = data[0:end:lay.size]
        if sum(firsts.count(b) for b in lay.first_bytes) != n:
            return False
        return all(
            data[1 + i : end : lay.size].count(byte) == n for i, byte in enumerate(lay.constant)
        )

    def _feed_slow(self, data: bytes) -> bytes:
        assert self._decoder is not None
        acks = []
        for packet in self._decoder.feed(data):
            if isinstance(packet, self.kind):
                self.count += 1
                if self.identities is not None and isinstance(packet, Publish):
                    self.identities += packet.payload[: IDENTITY.size]
                if self.ack and isinstance(packet, Publish) and packet.qos:
                    acks.append(encode(Puback(packet_id=packet.packet_id or 0), MQTT_V311))
        return b"".join(acks)


def recv_exact(sock: socket.socket, size: int) -> bytes:
    """Read exactly `size` bytes or raise ConnectionError."""
    buf = bytearray()
    while len(buf) < size:
        chunk = sock.recv(size - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {size} bytes")
        buf += chunk
    return bytes(buf)
