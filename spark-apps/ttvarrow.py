"""Stored TTV values decoded a batch at a time into Arrow columns.

The byte format is `broker/ds/ttv.py`'s. `decode_value` per message builds a TTV, two
strings, a bytes object and a dict, which Arrow then copies again into columns: more time
than the LevelDB scan itself. Here a batch of values becomes one Arrow buffer; numpy reads
every value's fixed 14-byte head at once, and the topic, publisher and payload are cut out
of that buffer as views (Arrow's binary_view: a length and an offset per value) that
Arrow's C++ cast gathers into plain columns, checking the UTF-8 of the strings as
`bytes.decode` does. Only values that carry MQTT 5 properties go through the broker's own
property decoder, one at a time. tests/unit/spark checks every column against
`decode_value`.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa

from broker.ds.ttv import FORMAT_VERSION
from broker.mqtt.constants import PacketType, PropertyId
from broker.mqtt.errors import MQTTError
from broker.mqtt.properties import ALLOWED_PROPERTIES, decode_properties

_STRING: Final = pa.string()
USER_PROPERTIES: Final = pa.list_(pa.struct([("key", _STRING), ("value", _STRING)]))
# The columns a batch of values decodes to, in the order of the reader's schema.
FIELDS: Final = [
    pa.field("topic", _STRING), pa.field("timestamp_us", pa.int64()),
    pa.field("payload", pa.binary()), pa.field("qos", pa.int32()),
    pa.field("retain", pa.bool_()), pa.field("publisher", _STRING),
    pa.field("content_type", _STRING), pa.field("payload_format", pa.int32()),
    pa.field("response_topic", _STRING), pa.field("correlation_data", pa.binary()),
    pa.field("message_expiry", pa.int64()), pa.field("user_properties", USER_PROPERTIES),
]
# Not a message column but decoded as one: a job that only adds payload sizes up spares
# cutting the payloads out.
PAYLOAD_SIZE: Final = pa.field("payload_size", pa.int64())
_HEAD: Final = np.dtype([("version", "u1"), ("flags", "u1"), ("timestamp", ">u8"),
                         ("topic_length", ">u2"), ("publisher_length", ">u2")])
_INLINE: Final = 12  # a binary_view holds values up to 12 bytes in the view itself
# A last value after the batch's: the words read at any field's start stay in the buffer.
_PADDING: Final = bytes(_INLINE + 4)
_VIEW_OFFSET_LIMIT: Final = 2**31  # a view's offset is an int32
_PUBLISH_PROPERTIES: Final = ALLOWED_PROPERTIES[PacketType.PUBLISH]
_FROM_PROPERTIES: Final = {
    "content_type": PropertyId.CONTENT_TYPE,
    "payload_format": PropertyId.PAYLOAD_FORMAT_INDICATOR,
    "response_topic": PropertyId.RESPONSE_TOPIC,
    "correlation_data": PropertyId.CORRELATION_DATA,
    "message_expiry": PropertyId.MESSAGE_EXPIRY_INTERVAL,
    "user_properties": PropertyId.USER_PROPERTY,
}
_NONE: Final[dict[int, Any]] = {}


@dataclass(slots=True)
class _Values:
    """A batch of values as one buffer, and where each value's fields start in it."""

    values: list[bytes]
    buffer: pa.Buffer
    u32: np.ndarray  # the little-endian 4-byte word at each byte of the buffer
    u64: np.ndarray  # and the 8-byte one
    ends: np.ndarray  # where each value ends
    head: np.ndarray  # the fixed heads, _HEAD
    topic_at: np.ndarray
    publisher_at: np.ndarray
    payload_at: np.ndarray
    properties: dict[int, dict[int, Any]]  # by row, the rows that have any

    def cut(self, at: np.ndarray, length: np.ndarray, kind: pa.DataType) -> pa.Array:
        """The byte ranges [at, at + length) of the buffer as a column of `kind`. A view
        is two words: the length and the first 4 bytes, then the next 8 bytes (up to 12
        in all, the rest zero) or the buffer (0) and the offset of a longer value."""
        kept = np.minimum(length, _INLINE + 1)
        views = np.empty((len(at), 2), np.uint64)
        np.bitwise_and(length.astype(np.uint64) | self.u32[at].astype(np.uint64) << 32,
                       _KEEP_FIRST[kept], out=views[:, 0])
        np.bitwise_and(np.where(length <= _INLINE, self.u64[at + 4],
                                at.astype(np.uint64) << 32),
                       _KEEP_SECOND[kept], out=views[:, 1])
        cut = pa.Array.from_buffers(pa.binary_view(), len(at),
                                    [None, pa.py_buffer(views), self.buffer])
        return cut.cast(kind)


def _masks(kept_bytes: Callable[[int], int]) -> np.ndarray:
    """By a field's length up to _INLINE, then _INLINE + 1 for any longer one: the bits
    of a view's word to keep."""
    return np.array([(1 << 8 * kept_bytes(n)) - 1 for n in range(_INLINE + 2)], np.uint64)


_KEEP_FIRST: Final = _masks(lambda n: 4 + min(n, 4))  # the length, then the first bytes
_KEEP_SECOND: Final = _masks(lambda n: 8 if n > _INLINE else max(n - 4, 0))


def decode(values: list[bytes], fields: Sequence[pa.Field]) -> list[pa.Array]:
    """The columns `fields` (of FIELDS, and PAYLOAD_SIZE) of the messages stored as `values`. Raises
    ValueError for a value that is not a TTV of the known format."""
    n = len(values)
    raw = pa.array([*values, _PADDING], pa.large_binary())
    offsets = np.frombuffer(raw.buffers()[1], np.int64, n + 2)
    if offsets[n] >= _VIEW_OFFSET_LIMIT and n > 1:
        half = n // 2
        return [pa.concat_arrays(pair) for pair in zip(
            decode(values[:half], fields), decode(values[half:], fields), strict=True)]
    batch = _locate(values, raw.buffers()[2], offsets[:n + 1])
    return [_COLUMNS[field.name](batch, field.type) for field in fields]


def decodes(name: str) -> bool:
    return name in _COLUMNS


def _words(buffer: pa.Buffer, kind: np.dtype) -> np.ndarray:
    """A word of `kind` starting at every byte of the buffer (they overlap)."""
    return np.ndarray((buffer.size - kind.itemsize + 1,), kind, buffer, 0, (1,))


def _locate(values: list[bytes], buffer: pa.Buffer, offsets: np.ndarray) -> _Values:
    starts, ends = offsets[:-1], offsets[1:]
    if np.any(ends - starts <= _HEAD.itemsize):
        raise ValueError("a TTV value shorter than its head")
    head = _words(buffer, _HEAD)[starts]
    if np.any(head["version"] != FORMAT_VERSION):
        version = head["version"][head["version"] != FORMAT_VERSION][0]
        raise ValueError(f"unknown TTV format version {version}")
    topic_at = starts + _HEAD.itemsize
    publisher_at = topic_at + head["topic_length"]
    properties_at = publisher_at + head["publisher_length"]
    if np.any(properties_at >= ends):
        raise ValueError("a TTV value shorter than its topic and publisher")
    payload_at = properties_at + 1
    properties = {}
    for row in np.flatnonzero(np.frombuffer(buffer, np.uint8)[properties_at]).tolist():
        start = int(starts[row])
        value = values[row]
        try:
            properties[row], at = decode_properties(
                value, int(properties_at[row]) - start, len(value), _PUBLISH_PROPERTIES)
        except MQTTError as error:
            raise ValueError(f"TTV properties: {error}") from None
        payload_at[row] = start + at
    return _Values(values, buffer, _words(buffer, np.dtype("<u4")),
                   _words(buffer, np.dtype("<u8")), ends, head, topic_at, publisher_at,
                   payload_at, properties)


def _property(name: str) -> Callable[[_Values, pa.DataType], pa.Array]:
    key = _FROM_PROPERTIES[name]

    def column(batch: _Values, kind: pa.DataType) -> pa.Array:
        n = len(batch.values)
        found = batch.properties
        if kind == USER_PROPERTIES:  # a list: empty, never null
            return pa.array([found.get(row, _NONE).get(key, ()) for row in range(n)]
                            if found else [()] * n, kind)
        return pa.array([found.get(row, _NONE).get(key) for row in range(n)], kind) \
            if found else pa.nulls(n, kind)

    return column


_COLUMNS: Final[dict[str, Callable[[_Values, pa.DataType], pa.Array]]] = {
    "topic": lambda b, kind: b.cut(b.topic_at, b.head["topic_length"].astype(np.int64), kind),
    "publisher": lambda b, kind: b.cut(
        b.publisher_at, b.head["publisher_length"].astype(np.int64), kind),
    "payload": lambda b, kind: b.cut(b.payload_at, b.ends - b.payload_at, kind),
    "payload_size": lambda b, kind: pa.array(b.ends - b.payload_at, kind),
    "timestamp_us": lambda b, kind: pa.array(b.head["timestamp"].astype(np.int64), kind),
    "qos": lambda b, kind: pa.array((b.head["flags"] & 3).astype(np.int32), kind),
    "retain": lambda b, kind: pa.array((b.head["flags"] & 4) != 0, kind),
    **{name: _property(name) for name in _FROM_PROPERTIES},
}
