"""Cooking: turning a batch of messages into the exact key/value writes of a slab.

The shard leader cooks; every replica (and a restart) only applies. So everything that needs
a decision happens here, deterministically from (LTS, stats, last timestamp, clock reading,
batch): timestamps, LTS learning (new edges are part of the output), stream assignment, index
keys and the slab's counters. A `builtin_raft` backend can put a `CookedBatch` in its log
as it is; `builtin_local` hands it to a LevelDB WriteBatch.
"""

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from broker.ds import keys
from broker.ds.lts import LTS, Edge
from broker.ds.ttv import TTV, decode_value, encoded_topic, pack_value, stamped

_STATS: Final = struct.Struct(">QQQQ")
STATS_KEY: Final = keys.meta_key("stats")
# The counters are written with the batch that takes them this far past the last written
# ones, not with every batch: a key outside the data's range in every batch costs LevelDB
# most of its compactions (keys.py). Opening a slab counts what came after (slab.py).
CHECKPOINT_BYTES: Final = 32 << 20
_CACHE_LIMIT: Final = 100_000
# (stream, master key prefix, index key prefixes, topic as UTF-8)
Route = tuple[int, bytes, tuple[bytes, ...], bytes]


@dataclass(slots=True)
class SlabStats:
    """Counters kept inside the slab: a checkpoint written in the same batch as the data it
    counts, plus what opening the slab counts after it, so they are exact after a crash."""

    messages: int = 0
    size: int = 0
    min_timestamp: int = 0
    max_timestamp: int = 0

    def encode(self) -> bytes:
        return _STATS.pack(self.messages, self.size, self.min_timestamp, self.max_timestamp)

    @classmethod
    def decode(cls, raw: bytes | None) -> "SlabStats":
        return cls(*_STATS.unpack(raw)) if raw else cls()


class StreamWrite:
    """A batch's messages in one stream, for its real-time readers (subscribe.py), timestamps
    set: the writer's own objects, or, on a replica applying a command another node
    encoded, decoded from the stored values only when a reader asks (a replica's streams
    mostly have no reader on its node, and decoding would cost it more than the write)."""

    __slots__ = ("_messages", "_values", "last")

    def __init__(self) -> None:
        self.last = 0  # the timestamp of the batch's last message in the stream
        self._messages: list[TTV] = []
        self._values: list[bytes] = []

    def messages(self) -> list[TTV]:
        if self._values:
            self._messages = [decode_value(value) for value in self._values]
            self._values = []
        return self._messages


@dataclass(slots=True)
class CookedBatch:
    """Deterministic mutations of one slab; `streams` says which streams got data (to wake
    their subscribers)."""

    puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    deletes: list[bytes] = field(default_factory=list)
    # stream -> its messages in this batch: real-time readers of a stream are handed these
    # instead of reading back what was just written.
    streams: dict[int, StreamWrite] = field(default_factory=dict)
    messages: int = 0
    size: int = 0
    last_timestamp: int = 0
    checkpoint: bool = False  # the counters are in `puts`

    def __init__(self, puts: list[tuple[bytes, bytes]] | None = None,
                 deletes: list[bytes] | None = None) -> None:
        # Written out: the dataclass-generated __init__ is interpreted even when the module
        # is compiled, and one batch is made per write.
        self.puts = [] if puts is None else puts
        self.deletes = [] if deletes is None else deletes
        self.streams = {}
        self.messages = 0
        self.size = 0
        self.last_timestamp = 0
        self.checkpoint = False


class Cooker:
    """The write side of a shard's current generation."""

    def __init__(self, lts: LTS, stats: SlabStats, last_timestamp: int,
                 checkpoint_bytes: int = CHECKPOINT_BYTES) -> None:
        self.lts = lts
        self.stats = stats
        self.last_timestamp = last_timestamp
        self._checkpoint_bytes = checkpoint_bytes
        self._checkpointed = stats.size
        # topic -> Route: most batches repeat topics, and a topic's route never changes once
        # learned. Per-message work is most of a write's CPU cost, so it is kept to lookups.
        self._routes: dict[str, Route] = {}
        self._publishers: dict[str, bytes] = {}
        self._encoded_routes: dict[bytes, Route] = {}  # the same, by the topic's UTF-8

    def _learn(self, topic: str, edges: list[Edge]) -> Route:
        stream, varying = self.lts.learn(topic, edges)
        route = (stream, keys.master_prefix(stream), tuple(
            keys.index_prefix(stream, ordinal, keys.level_hash(value))
            for ordinal, value in enumerate(varying)
        ), topic.encode())
        if len(self._routes) >= _CACHE_LIMIT:
            self._routes.clear()
        self._routes[topic] = route
        return route

    def _publisher(self, publisher: str) -> bytes:
        if len(self._publishers) >= _CACHE_LIMIT:
            self._publishers.clear()
        encoded = self._publishers[publisher] = publisher.encode()
        return encoded

    def _route(self, topic: str, edges: list[Edge]) -> Route:
        return self._routes.get(topic) or self._learn(topic, edges)

    def _stream(self, streams: dict[int, StreamWrite], stream: int, ts: int) -> StreamWrite:
        written = streams.get(stream)
        if written is None:
            written = streams[stream] = StreamWrite()
        written.last = ts
        return written

    def cook(self, messages: Sequence[TTV], now_us: int) -> CookedBatch:
        """Timestamps are max(clock, previous + 1): strictly increasing per shard even if
        the clock steps back, so a reader's position (stream, last timestamp) never skips a
        later write."""
        batch = CookedBatch()
        edges: list[Edge] = []
        puts = batch.puts
        ts = start = self.last_timestamp
        size = 0
        publishers = self._publishers
        streams = batch.streams
        for message in messages:
            ts = ts + 1 if now_us <= ts else now_us
            stream, master, indexes, topic_bytes = self._route(message.topic, edges)
            message.timestamp = ts
            self._stream(streams, stream, ts)._messages.append(message)
            ts_bytes = keys.pack_u64(ts)
            publisher = message.publisher
            value = pack_value(
                topic_bytes, publishers.get(publisher) or self._publisher(publisher), message, ts
            )
            size += _put(puts, master, indexes, ts_bytes, value)
        return self._close(batch, edges, len(messages), size, start, now_us, ts)

    def cook_encoded(self, data: bytes, spans: list[int], messages: list[TTV] | None,
                     now_us: int) -> CookedBatch:
        """`cook` for messages already in the stored format (a STORE command's values, their
        timestamps 0): `spans` holds each value's start and end in `data`, and each value is
        stored with its timestamp set, as `cook` would have packed it. `messages`: the same
        messages as objects (on the node that encoded them), handed to real-time readers;
        without them readers get the values decoded on demand. The values were checked when
        the command was decoded (replication_layer.decode_store), so nothing here fails
        half-way through a batch."""
        batch = CookedBatch()
        edges: list[Edge] = []
        puts = batch.puts
        ts = start = self.last_timestamp
        size = 0
        encoded_routes, streams = self._encoded_routes, batch.streams
        count = len(spans) // 2
        for i in range(count):
            begin, end = spans[2 * i], spans[2 * i + 1]
            ts = ts + 1 if now_us <= ts else now_us
            topic = encoded_topic(data, begin, end)
            route = encoded_routes.get(topic)
            if route is None:
                route = self._route(topic.decode(), edges)
                if len(encoded_routes) >= _CACHE_LIMIT:
                    encoded_routes.clear()
                encoded_routes[topic] = route
            stream, master, indexes, _ = route
            ts_bytes = keys.pack_u64(ts)
            value = stamped(data, begin, end, ts_bytes)
            written = self._stream(streams, stream, ts)
            if messages is None:
                written._values.append(value)
            else:
                message = messages[i]
                message.timestamp = ts
                written._messages.append(message)
            size += _put(puts, master, indexes, ts_bytes, value)
        return self._close(batch, edges, count, size, start, now_us, ts)

    def _close(self, batch: CookedBatch, edges: list[Edge], count: int, size: int,
               start: int, now_us: int, ts: int) -> CookedBatch:
        """The learned edges, the slab's counters and, when due, their checkpoint."""
        batch.puts.extend((keys.edge_key(p, level), keys.pack_u32(c)) for p, level, c in edges)
        stats = self.stats
        if count:
            if not stats.messages:
                stats.min_timestamp = start + 1 if now_us <= start else now_us
            stats.messages += count
            stats.size += size
            stats.max_timestamp = ts
        if stats.size - self._checkpointed >= self._checkpoint_bytes:
            batch.puts.append((STATS_KEY, stats.encode()))
            batch.checkpoint = True
            self._checkpointed = stats.size
        batch.messages = count
        batch.size = size
        batch.last_timestamp = self.last_timestamp = ts
        return batch


def _put(puts: list[tuple[bytes, bytes]], master: bytes, indexes: tuple[bytes, ...],
         ts_bytes: bytes, value: bytes) -> int:
    """A message's master key and its index keys (one per varying level); their size."""
    key = master + ts_bytes
    puts.append((key, value))
    size = len(key) + len(value)
    for prefix in indexes:
        puts.append((prefix + ts_bytes, b""))
        size += len(prefix) + 8
    return size
