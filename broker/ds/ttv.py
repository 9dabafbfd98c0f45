"""TTV: a stored message (topic, timestamp, value) and its byte format.

The value is what a master key (keys.py) points to. Sealed slabs are read later by Spark jobs
straight from the volume, without the broker, so the format is fixed and versioned here:

    offset  size  field
    0       1     format version, 1
    1       1     flags: bits 0-1 QoS, bit 2 retain (other bits 0)
    2       8     timestamp, microseconds since the Unix epoch, unsigned big-endian
    10      2     T = topic length, unsigned big-endian
    12      2     P = publisher client ID length, unsigned big-endian
    14      T     topic, UTF-8
    14+T    P     publisher client ID, UTF-8 (may be empty)
    14+T+P  ...   MQTT 5 PUBLISH properties exactly as on the wire: Property Length as a
                  Variable Byte Integer (MQTT 5.0 section 1.5.5), then the properties
                  (section 3.3.2.3); a single 0x00 when there are none
    ...     rest  payload, to the end of the value

A reader in another language needs only struct unpacking and the MQTT 5 property table. Both
lengths sit in the fixed header so a reader unpacks once per message (the read path's cost).
"""

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

from broker.mqtt.constants import PacketType
from broker.mqtt.properties import ALLOWED_PROPERTIES, decode_properties, encode_properties

FORMAT_VERSION: Final = 1
_HEAD: Final = struct.Struct(">BBQHH")
_HEAD_SIZE: Final = _HEAD.size
_TIMESTAMP_END: Final = 10
_pack_head: Final = _HEAD.pack
_PUBLISH_PROPERTIES: Final = ALLOWED_PROPERTIES[PacketType.PUBLISH]
_NO_PROPERTIES: Final = b"\x00"


@dataclass(slots=True)
class TTV:
    """One message as Durable Storage keeps it. `timestamp` (microseconds) is assigned by
    the shard when the message is stored; whatever a writer puts there is ignored.

    The broker's own message is a subclass, so a message stored by a publisher reaches a
    caught-up durable session as the very same object (no copy, no decoding), and the
    compiled storage path reads its fields directly, not by attribute lookup."""

    topic: str
    payload: bytes
    qos: int = 0
    retain: bool = False
    publisher: str = ""
    properties: dict[int, Any] = field(default_factory=dict)
    timestamp: int = 0

    def __init__(self, topic: str, payload: bytes, qos: int = 0, retain: bool = False,
                 publisher: str = "", properties: dict[int, Any] | None = None,
                 timestamp: int = 0) -> None:
        # Written out: the dataclass-generated __init__ is interpreted even when the module
        # is compiled, ~0.3 us per message.
        self.topic = topic
        self.payload = payload
        self.qos = qos
        self.retain = retain
        self.publisher = publisher
        self.properties = {} if properties is None else properties
        self.timestamp = timestamp


Make = Callable[[str, bytes, int, bool, str, dict[int, Any], int], TTV]
"""What a stored message is read back as, from its fields in TTV's order: the broker's own
subclass of TTV (decode_value)."""


def encode_value(ttv: TTV, timestamp: int) -> bytes:
    return pack_value(ttv.topic.encode(), ttv.publisher.encode(), ttv, timestamp)


def pack_value(topic: bytes, publisher: bytes, ttv: TTV, timestamp: int) -> bytes:
    """`encode_value` for a writer that has the topic and publisher encoded already (the
    cooker caches them: they repeat from message to message)."""
    props = encode_properties(ttv.properties) if ttv.properties else _NO_PROPERTIES
    return b"".join((
        _pack_head(FORMAT_VERSION, ttv.qos | (4 if ttv.retain else 0), timestamp, len(topic),
                   len(publisher)),
        topic, publisher, props, ttv.payload,
    ))


def decode_value(
    value: bytes,
    make: "Make | None" = None,
) -> TTV:
    """The stored message `value` as a TTV, or as what `make` (a subclass's constructor)
    makes of its fields (a generic call, where TTV's own is a direct one when compiled)."""
    version, flags, timestamp, topic_end, publisher_len = _HEAD.unpack_from(value)
    if version != FORMAT_VERSION:
        raise ValueError(f"unknown TTV format version {version}")
    topic_end += _HEAD_SIZE
    pos = topic_end + publisher_len
    if value[pos] == 0:
        properties: dict[int, Any] = {}
        pos += 1
    else:
        properties, pos = decode_properties(value, pos, len(value), _PUBLISH_PROPERTIES)
    topic = value[_HEAD_SIZE:topic_end].decode()
    publisher = value[topic_end:topic_end + publisher_len].decode()
    if make is None:
        return TTV(topic, value[pos:], flags & 3, bool(flags & 4), publisher, properties,
                   timestamp)
    return make(topic, value[pos:], flags & 3, bool(flags & 4), publisher, properties, timestamp)


def encoded_topic(data: bytes, start: int, end: int) -> bytes:
    """The topic, as UTF-8, of the value at `data[start:end]`, whose header is checked
    against its length (a replica cooks values it did not encode: see `stamped`)."""
    # Indexing, not struct: compiled, a byte read is a load, a struct call a Python call.
    topic_at = start + _HEAD_SIZE
    if end <= topic_at or data[start] != FORMAT_VERSION:
        raise ValueError("not a TTV value of format version 1")
    lengths = start + _TIMESTAMP_END  # T, then P: 2 bytes each
    topic_end = topic_at + (data[lengths] << 8 | data[lengths + 1])
    if topic_end + (data[lengths + 2] << 8 | data[lengths + 3]) >= end:
        raise ValueError("TTV value shorter than its header says")  # properties: 1 byte+
    return data[topic_at:topic_end]


def stamped(data: bytes, start: int, end: int, timestamp: bytes) -> bytes:
    """The value at `data[start:end]` with its timestamp (8 bytes, big-endian) set: how a
    replica stores a message it received encoded, without decoding it and encoding it
    again (which would cost it more than the LevelDB write)."""
    return data[start:start + 2] + timestamp + data[start + _TIMESTAMP_END:end]
