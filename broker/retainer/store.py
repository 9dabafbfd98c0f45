"""Retained messages: one per topic, on disk in LevelDB, indexed in memory by a topic trie.

Disk is the source of truth across restarts; the in-memory trie makes a subscribe with a
wildcard find its retained messages without scanning every stored topic. Records reuse the
MQTT 5 PUBLISH encoding, so every property survives byte for byte:

    offset  size  field
    0       1     format, 0x82
    1       8     expires_at, wall-clock seconds as a big-endian double (0 = never)
    9       4     P = publisher client ID length, unsigned big-endian
    13      P     publisher client ID, UTF-8
    13+P    rest  the message as an MQTT 5 PUBLISH packet

The first format had no format byte and a 1-byte publisher length, which lost every
retained message from a client ID over 255 bytes. Its records start with the double, whose
first byte is below 0x80 for any expires_at >= 0, so both formats read from one store and
the old records stay readable as they are.
"""

import dataclasses
import struct
import time
from pathlib import Path
from typing import Final

import plyvel  # type: ignore[import-untyped]

from broker.mqtt.codec import Decoder, encode_publish
from broker.mqtt.constants import MQTT_5
from broker.mqtt.packets import Publish
from broker.routing.trie import TopicTrie
from broker.session.message import Message

FORMAT: Final = 0x82
_HEADER: Final = struct.Struct(">BdI")
_LEGACY_HEADER: Final = struct.Struct(">dB")  # the first format: no format byte
_NEVER: Final = 0.0


def encode_record(message: Message) -> bytes:
    publisher = message.publisher.encode()
    packet = encode_publish(
        message.topic, message.payload, message.qos, True, False,
        1 if message.qos else None, message.properties, MQTT_5,
    )
    header = _HEADER.pack(FORMAT, message.expires_at or _NEVER, len(publisher))
    return header + publisher + packet


def decode_record(record: bytes) -> Message:
    if record[0] == FORMAT:
        _, expires_at, publisher_len = _HEADER.unpack_from(record)
        start = _HEADER.size
    else:
        expires_at, publisher_len = _LEGACY_HEADER.unpack_from(record)
        start = _LEGACY_HEADER.size
    publisher = record[start:start + publisher_len].decode()
    (packet,) = Decoder(version=MQTT_5).feed(record[start + publisher_len:])
    assert isinstance(packet, Publish)
    return Message(
        packet.topic, packet.payload, packet.qos, True, publisher, packet.properties,
        expires_at=expires_at or None,
    )


class RetainedStore:
    def __init__(
        self, path: Path, max_messages: int, max_payload_size: int, default_expiry: float
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        self._db = plyvel.DB(str(path), create_if_missing=True)
        self._index: TopicTrie[Message] = TopicTrie()
        self._max_messages = max_messages
        self._max_payload_size = max_payload_size
        self._default_expiry = default_expiry
        for key, record in self._db:
            message = decode_record(record)
            self._index.add(key.decode(), None, message)

    def __len__(self) -> int:
        return len(self._index)

    def put(self, message: Message) -> bool:
        """Stores, replaces or (empty payload) deletes; False if limits kept it out."""
        topic = message.topic
        if not message.payload:
            if self._index.remove(topic, None) is not None:
                self._db.delete(topic.encode())
            return True
        if len(message.payload) > self._max_payload_size:
            return False
        exists = self._index.get(topic, None) is not None
        if not exists and self._max_messages and len(self._index) >= self._max_messages:
            return False
        if message.expires_at is None and self._default_expiry:
            # A copy: the default lifetime applies to the stored message, not the live one.
            message = dataclasses.replace(
                message, expires_at=time.time() + self._default_expiry
            )
        self._db.put(topic.encode(), encode_record(message))
        self._index.add(topic, None, message)
        return True

    def match(self, topic_filter: str) -> list[Message]:
        now = time.time()
        return [
            message for _, _, message in self._index.match_filter(topic_filter)
            if not message.is_expired(now)
        ]

    def clear_expired(self) -> int:
        now = time.time()
        expired = [topic for topic, _, message in self._index.items() if message.is_expired(now)]
        with self._db.write_batch() as batch:
            for topic in expired:
                self._index.remove(topic, None)
                batch.delete(topic.encode())
        return len(expired)

    def close(self) -> None:
        self._db.close()
