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
from broker.ds.ttv import TTV, pack_value

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


@dataclass(slots=True)
class CookedBatch:
    """Deterministic mutations of one slab; `streams` says which streams got data (to wake
    their subscribers)."""

    puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    deletes: list[bytes] = field(default_factory=list)
    # stream -> its messages in this batch, timestamps set: real-time readers of a stream
    # are handed these instead of reading back what was just written.
    streams: dict[int, list[TTV]] = field(default_factory=dict)
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

    def cook(self, messages: Sequence[TTV], now_us: int) -> CookedBatch:
        """Timestamps are max(clock, previous + 1): strictly increasing per shard even if
        the clock steps back, so a reader's position (stream, last timestamp) never skips a
        later write."""
        batch = CookedBatch()
        edges: list[Edge] = []
        puts = batch.puts
        append = puts.append
        pack_ts = keys.pack_u64
        ts = self.last_timestamp
        first = ts + 1 if now_us <= ts else now_us
        size = 0
        routes, publishers = self._routes, self._publishers
        streams = batch.streams
        for message in messages:
            ts = ts + 1 if now_us <= ts else now_us
            topic = message.topic
            route = routes.get(topic) or self._learn(topic, edges)
            stream, master, indexes, topic_bytes = route
            message.timestamp = ts
            fresh = streams.get(stream)
            if fresh is None:
                fresh = streams[stream] = []
            fresh.append(message)
            ts_bytes = pack_ts(ts)
            key = master + ts_bytes
            publisher = message.publisher
            value = pack_value(
                topic_bytes, publishers.get(publisher) or self._publisher(publisher), message, ts
            )
            append((key, value))
            size += len(key) + len(value)
            for prefix in indexes:
                append((prefix + ts_bytes, b""))
                size += len(prefix) + 8
        puts.extend((keys.edge_key(p, level), keys.pack_u32(c)) for p, level, c in edges)
        stats = self.stats
        if messages:
            if not stats.messages:
                stats.min_timestamp = first
            stats.messages += len(messages)
            stats.size += size
            stats.max_timestamp = ts
        if stats.size - self._checkpointed >= self._checkpoint_bytes:
            puts.append((STATS_KEY, stats.encode()))
            batch.checkpoint = True
            self._checkpointed = stats.size
        batch.messages = len(messages)
        batch.size = size
        batch.last_timestamp = self.last_timestamp = ts
        return batch
