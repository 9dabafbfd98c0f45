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

In a cluster the store is the state machine's data of the metadata Raft group
(broker/retainer/machine.py): writes come from committed log entries, each batch written
together with the log position it reflects (key `\x00applied`: index, term), so a replay after
a restart starts where the data is and applying an entry twice cannot happen. LevelDB is
written without sync: the Raft log is the durable copy, and `flush` (one synced write, which
makes every earlier write durable) says up to where the log may be truncated. Keys starting
with a NUL byte are such markers, never topics: MQTT forbids U+0000 in topic names.
"""

import dataclasses
import struct
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from broker.ds import bulk
from broker.mqtt.codec import Decoder, encode_publish
from broker.mqtt.constants import MQTT_5
from broker.mqtt.packets import Publish
from broker.mqtt.topic import topic_matches
from broker.routing.trie import TopicTrie
from broker.session.message import Message

FORMAT: Final = 0x82
_HEADER: Final = struct.Struct(">BdI")
_MARKER: Final = b"\x00"
_APPLIED: Final = b"\x00applied"  # index, term of the last log entry the data reflects
_SNAPSHOT: Final = b"\x00snapshot"  # index, term, configuration of the last installed snapshot
# The cluster's effective version (broker/cluster/versions.py) the log set, u32; absent: 0.
# The one marker a snapshot carries: a node that installs one runs the cluster's version.
CLUSTER_VERSION_KEY: Final = b"\x00cluster_version"
_VERSION: Final = struct.Struct(">I")
_POSITION: Final = struct.Struct(">QQ")
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
        self.path = path
        self._db = bulk.open_db(path)
        self._index: TopicTrie[Message] = TopicTrie()
        self._max_messages = max_messages
        self._max_payload_size = max_payload_size
        self._default_expiry = default_expiry
        # Writes on their way through the Raft log, from this node (topic -> the latest, and
        # how many are pending): visible here at once, so a client that published a retained
        # message and then subscribes sees it, as it would on a single node.
        # (A dict, not a trie: few are pending at a time, and they change on every publish.)
        self._pending: dict[str, tuple[Message, int]] = {}
        self._load()

    def _load(self) -> None:
        for key, record in self._db:
            if not key.startswith(_MARKER):
                self._index.add(key.decode(), None, decode_record(record))

    def reload(self) -> None:
        """Blocking: the LevelDB closed and opened again (it refuses writes after a failed
        one until then), and the index read back from it: a failed write changed the index
        in memory only. Raises if it cannot be opened (call again)."""
        if not self._db.closed:
            self._db.close()
        self._db = bulk.open_db(self.path)
        self._index = TopicTrie()
        self._load()

    def __len__(self) -> int:
        return len(self._index)

    def admit(self, message: Message) -> Message | None:
        """The message as it is to be stored (with the default lifetime, fixed now so that
        every replica stores the same deadline), or None when its payload is too large."""
        if len(message.payload) > self._max_payload_size:
            return None
        if message.payload and message.expires_at is None and self._default_expiry:
            # A copy: the default lifetime applies to the stored message, not the live one.
            return dataclasses.replace(message, expires_at=time.time() + self._default_expiry)
        return message

    def put(self, message: Message) -> bool:
        """Stores, replaces or (empty payload) deletes at once, outside any log (a node
        without Raft, and local clean-ups); False if limits kept it out."""
        admitted = self.admit(message)
        if admitted is None:
            return False
        with self._db.write_batch() as batch:
            return self._stage(batch, admitted, encode_record(admitted))

    def write(self, messages: list[tuple[Message, bytes]], index: int, term: int,
              cluster_version: int | None = None) -> int:
        """Applies admitted messages with their records (a committed log entry at `index`,
        `term`) in one atomic write with that position (and the cluster version the entry
        set); returns how many the message limit refused."""
        refused = 0
        with self._db.write_batch() as batch:
            for message, record in messages:
                if not self._stage(batch, message, record):
                    refused += 1
            if cluster_version is not None:
                batch.put(CLUSTER_VERSION_KEY, _VERSION.pack(cluster_version))
            batch.put(_APPLIED, _POSITION.pack(index, term))
        return refused

    def cluster_version(self) -> int:
        """The effective cluster version the applied log set; 0 before any did."""
        raw = self._db.get(CLUSTER_VERSION_KEY)
        return _VERSION.unpack(raw)[0] if raw is not None else 0

    def _stage(self, batch: Any, message: Message, record: bytes) -> bool:
        topic = message.topic
        if not message.payload:
            if self._index.remove(topic, None) is not None:
                batch.delete(topic.encode())
            return True
        exists = self._index.get(topic, None) is not None
        if not exists and self._max_messages and len(self._index) >= self._max_messages:
            return False
        batch.put(topic.encode(), record)
        self._index.add(topic, None, message)
        return True

    def applied(self) -> tuple[int, int]:
        """(index, term) of the last log entry the data reflects; (0, 0) for none."""
        raw = self._db.get(_APPLIED)
        return _POSITION.unpack(raw) if raw is not None else (0, 0)

    def flush(self, index: int, term: int) -> None:
        """Makes everything written so far durable (LevelDB syncs its log, which holds every
        earlier unsynced write too), recording the position it reflects."""
        self._db.put(_APPLIED, _POSITION.pack(index, term), sync=True)

    def view(self) -> Any:
        """A LevelDB snapshot: what the store holds now, for a reader on another thread
        (close it before the store closes)."""
        return self._db.snapshot()

    def replace(self, records: Iterable[tuple[bytes, bytes]], index: int, term: int,
                config: bytes) -> None:
        """Replaces the whole content with a snapshot's (topic, record) pairs, durably, at
        `index`, `term`, without holding them twice in memory (bulk.replace)."""
        self._db = bulk.replace(self.path, records, [
            (_APPLIED, _POSITION.pack(index, term)),
            (_SNAPSHOT, _POSITION.pack(index, term) + config)], self._db.close)
        self._index = TopicTrie()
        self._load()

    def installed_snapshot(self) -> tuple[int, int, bytes] | None:
        """(index, term, configuration) of the last snapshot `replace` installed."""
        raw = self._db.get(_SNAPSHOT)
        if raw is None:
            return None
        index, term = _POSITION.unpack_from(raw)
        return index, term, raw[_POSITION.size:]

    def clear(self) -> None:
        """Forgets everything, markers included (a node joining another cluster's group)."""
        with self._db.write_batch(sync=True) as batch:
            self._delete_all(batch)
        self._index = TopicTrie()

    def _delete_all(self, batch: Any) -> None:
        for key in self._db.iterator(include_value=False):
            batch.delete(key)

    def hold(self, message: Message) -> None:
        """A write proposed here, shown by `match` until `release` (it is then applied, or
        failed: a clear shows as the topic's absence)."""
        held = self._pending.get(message.topic)
        self._pending[message.topic] = (message, held[1] + 1 if held else 1)

    def release(self, *topics: str) -> None:
        pending = self._pending
        for topic in topics:
            held = pending.get(topic)
            if held is None:
                continue
            if held[1] > 1:
                pending[topic] = (held[0], held[1] - 1)
            else:
                del pending[topic]

    def match(self, topic_filter: str) -> list[Message]:
        now = time.time()
        found = {topic: message for topic, _, message in self._index.match_filter(topic_filter)}
        for topic, (message, _) in self._pending.items():
            if topic_matches(topic_filter, topic):
                found[topic] = message
        return [message for message in found.values()
                if message.payload and not message.is_expired(now)]

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
