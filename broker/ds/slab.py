"""A slab: the LevelDB directory of one shard x generation, and the reads on it.

Everything about the slab lives inside it (keys.py): data, index keys, LTS edges, counters,
creation time and wildcard thresholds. So a slab can be moved, dropped as a directory, or
read by another program, and a restart rebuilds its state from the slab alone.

A sealed slab's state (period, counters, LTS) is also in its manifest, which is all that
opening it reads: its LevelDB stays closed until a reader needs it (open_slabs.py keeps a
bounded number open), so thousands of generations cost no file descriptors.
"""

import asyncio
import itertools
import json
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.ds import keys
from broker.ds.cook import STATS_KEY, CookedBatch, SlabStats
from broker.ds.files import fsync_dir, write_atomically
from broker.ds.lts import LTS, PLUS
from broker.ds.manifest import read_manifest, write_manifest
from broker.ds.recent import RecentReads
from broker.ds.ttv import TTV, decode_value

_CREATED: Final = keys.meta_key("created")
_THRESHOLDS: Final = keys.meta_key("thresholds")
# A replicated shard's Raft checkpoint (shard.py): the log replays what a slab holding one
# stored after it, so opening the slab does not count that.
CHECKPOINT_KEY: Final = keys.meta_key("raft_checkpoint")
# A slab made ahead of its rotation (spare.py) holds this file until it is a generation for
# sure: opening a shard drops the newest slabs that still hold it, and readers outside the
# broker (spark-apps) pass them by, as they pass by a slab being created.
SPARE_FILE: Final = "SPARE"
_PAST_TIMESTAMPS: Final = b"\xff" * (keys.TIMESTAMP_SIZE + 1)  # sorts after every key of a prefix
# LevelDB's floor (it raises anything lower to 64 table files + 10 others; measured: 16 and
# 74 cache the same tables). An open slab holds 4 descriptors (LOCK, LOG, MANIFEST, log);
# table files are mmapped and hold none until the process has 1,000 mappings (LevelDB's
# limit), so this bounds a slab's share of those, and its descriptors past them.
MAX_OPEN_FILES: Final = 74
_UIDS: Final = itertools.count()


class SlabClosed(Exception):
    """A sealed slab was used without acquiring it (open_slabs.py), or opened again after
    it was dropped."""


# LevelDB's block cache per database (its default is 8 MiB): with up to
# `max_open_slabs` open at once, 2 MiB each bounds the caches at 128 MiB for the default 64.
# Readers stream a slab forward once, so a larger cache would hold blocks never read again.
BLOCK_CACHE_SIZE: Final = 2 * 1024 * 1024


Compression = str | None
"""LevelDB's block compression of the tables a slab writes from now on: "snappy", or None
(tables already written keep theirs; LevelDB reads both). None is the default
(`durable_storage.messages.compression`): with many streams in a shard every table
overlaps the others (keys.py), so each compaction rewrites them, and compression is paid
again at every rewrite, not once per message (bench/compaction_bench.py)."""


def _open_leveldb(path: Path, create: bool, compression: Compression) -> plyvel.DB:
    return plyvel.DB(
        str(path), create_if_missing=create, error_if_exists=create,
        max_open_files=MAX_OPEN_FILES, lru_cache_size=BLOCK_CACHE_SIZE,
        compression=compression,
    )


def prepare_batch(db: plyvel.DB, batch: CookedBatch, sync: bool) -> Any:
    """The LevelDB write batch of a cooked batch, ready for its `write()`."""
    prepared = db.write_batch(sync=sync)
    put = prepared.put
    for key, value in batch.puts:
        put(key, value)
    for key in batch.deletes:
        prepared.delete(key)
    return prepared


async def write_batch(db: plyvel.DB, batch: CookedBatch, sync: bool, executor: Executor) -> None:
    """Writes the batch atomically. The LevelDB write batch is built on the caller's (event
    loop) thread; with fsync only its `write()` goes to a worker thread: plyvel releases the
    GIL there, while a loop of puts in the worker would hold it and make the event loop wait
    up to a switch interval (5 ms). Without fsync LevelDB only appends to its log and
    memtable, which costs less than the round trip to a thread and back: written inline."""
    prepared = prepare_batch(db, batch, sync)
    if sync:
        await asyncio.get_running_loop().run_in_executor(executor, prepared.write)
    else:
        prepared.write()


class Slab:
    def __init__(
        self, path: Path, generation: int, created: int, lts: LTS, stats: SlabStats,
        sealed_at: int | None, db: plyvel.DB | None, compression: Compression = None,
    ) -> None:
        self.path = path
        # This slab among every one this process opened: the key of its messages in
        # RecentReads (a generation number repeats across shards and databases).
        self.uid = next(_UIDS)
        self.compression = compression
        self.generation = generation
        self.created = created
        self.lts = lts
        self.stats = stats
        self.sealed_at = sealed_at
        self._db = db
        self._opening = threading.Lock()  # one LevelDB open at a time (it locks its directory)
        # Reads, writes and seals using the LevelDB now (open_slabs.py never closes it then);
        # `dropped` once retention removed it or its shard is being replaced: the last
        # user closes it.
        self.pins = 0
        self.dropped = False
        self.keys_visited = 0

    @classmethod
    def create(cls, path: Path, generation: int, thresholds: Sequence[int], now_us: int,
               compression: Compression = None, spare: bool = False) -> "Slab":
        db = _open_leveldb(path, True, compression)
        with db.write_batch(sync=True) as batch:
            batch.put(_CREATED, keys.pack_u64(now_us))
            batch.put(_THRESHOLDS, json.dumps(list(thresholds)).encode())
        if spare:
            write_atomically(path / SPARE_FILE, b"")
        return cls._from_leveldb(path, generation, db, compression)

    @classmethod
    def open(cls, path: Path, generation: int, compression: Compression = None) -> "Slab":
        """Blocking. A sealed slab is read from its manifest and left closed; any other is
        opened, and what was stored after its counters' checkpoint is counted, unless the
        Raft log replays it (a replicated slab)."""
        manifest = read_manifest(path)
        if manifest is None:  # a seal writes the checkpoint first: nothing follows it
            slab = cls._from_leveldb(path, generation, _open_leveldb(path, False, compression),
                                     compression)
            if slab.db.get(CHECKPOINT_KEY) is None:
                slab.count_after_checkpoint()
            return slab
        stats = SlabStats(manifest["messages"], manifest["bytes"], manifest["min_timestamp"],
                          manifest["max_timestamp"])
        return cls(path, generation, manifest["since"], LTS.from_json(manifest["lts"]), stats,
                   manifest["until"], None, compression)

    @classmethod
    def _from_leveldb(cls, path: Path, generation: int, db: plyvel.DB,
                      compression: Compression) -> "Slab":
        created = db.get(_CREATED)
        thresholds = db.get(_THRESHOLDS)
        if created is None or thresholds is None:
            db.close()
            raise ValueError(f"{path}: not a slab (no creation record)")
        lts = LTS(json.loads(thresholds), (
            keys.parse_edge(key, value) for key, value in db.iterator(prefix=keys.EDGE)
        ))
        return cls(path, generation, keys.unpack_u64_from(created, 0)[0], lts,
                   SlabStats.decode(db.get(STATS_KEY)), None, db, compression)

    @property
    def db(self) -> plyvel.DB:
        db = self._db
        if db is None:
            raise SlabClosed(f"{self.path} is closed")
        return db

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def reopen(self) -> bool:
        """Blocking (LevelDB writes and syncs a new log and manifest: ~10 ms) and safe on a
        worker thread; False if the slab was open already."""
        with self._opening:
            if self._db is not None:
                return False
            if self.dropped:
                raise SlabClosed(f"{self.path} was dropped")
            self._db = _open_leveldb(self.path, False, self.compression)
            return True

    def reload(self) -> None:
        """Blocking: the LevelDB closed and opened again, and the topic structure and
        counters read back from it. After a failed write: LevelDB refuses writes after a
        failed background write until it is reopened, and the cooking of the failed batch
        changed them in memory only. If opening fails the slab stays closed; call again."""
        self.close()
        fresh = Slab.open(self.path, self.generation, self.compression)
        self._db, self.lts, self.stats = fresh._db, fresh.lts, fresh.stats
        self.created = fresh.created  # (a restored generation's: shard.apply_load)

    def steady(self) -> threading.Lock:
        """Held, the slab is neither opened nor closed (LevelDB writes a new MANIFEST and
        CURRENT at each open): its files are linked for a snapshot (broker/ds/shipped.py)."""
        return self._opening

    def close(self) -> None:
        with self._opening:
            db = self._db
            self._db = None
            if db is not None and not db.closed:
                db.close()

    @property
    def sealed(self) -> bool:
        return self.sealed_at is not None

    @property
    def spare(self) -> bool:
        """Made ahead of a rotation and not yet a generation for sure."""
        return (self.path / SPARE_FILE).exists()

    def activate(self, created: int, checkpoint: bytes | None, sync: bool) -> None:
        """A spare becomes the shard's current generation, created at `created` (the
        rotation's time, the same on every replica). With `sync` it is one for sure at once;
        without, it stays marked until `unmark`: a crash before that drops it at the next
        open, and the Raft log replays the rotation."""
        with self.db.write_batch(sync=sync) as batch:
            batch.put(_CREATED, keys.pack_u64(created))
            if checkpoint is not None:
                batch.put(CHECKPOINT_KEY, checkpoint)
        self.created = created
        if sync:
            self.unmark()

    def unmark(self) -> None:
        """Blocking: an activated spare is a generation for sure (synced)."""
        (self.path / SPARE_FILE).unlink(missing_ok=True)
        fsync_dir(self.path)

    async def write(self, batch: CookedBatch, sync: bool, executor: Executor) -> None:
        await write_batch(self.db, batch, sync, executor)

    def count_after_checkpoint(self) -> None:
        """Adds the messages stored after the last counters checkpoint (cook.py) to it.
        Timestamps grow across the shard's streams, so they are exactly those past the
        checkpoint's last timestamp; sizes are counted as the cooker counts them."""
        stats = self.stats
        checkpointed = stats.messages
        start = keys.pack_u64(stats.max_timestamp + 1)
        found: list[int] = []  # the first and last timestamp found in each stream
        for stream in self.lts.streams():
            prefix = keys.master_prefix(stream)
            index_size = keys.INDEX_KEY_SIZE * self.lts.structure(stream).count(PLUS)
            first: bytes | None = None
            last = b""
            for last, value in self.db.iterator(start=prefix + start,
                                                stop=prefix + _PAST_TIMESTAMPS):
                if first is None:
                    first = last
                stats.messages += 1
                stats.size += len(last) + len(value) + index_size
            if first is not None:
                found += (keys.timestamp_of(first), keys.timestamp_of(last))
        if found:
            if not checkpointed:
                stats.min_timestamp = min(found)
            stats.max_timestamp = max(found)

    def checkpoint(self) -> None:
        """Blocking: writes the counters, so the next open has nothing to count."""
        self.db.put(STATS_KEY, self.stats.encode(), sync=True)

    def seal(self, until: int, shard: int) -> None:
        """Blocking: compacts the whole slab (its level-0 tables into the levels below, so
        LevelDB has no reason to rewrite a sealed slab's files later), then writes the
        manifest that marks the slab sealed."""
        self.checkpoint()
        self.db.compact_range(start=b"", stop=keys.PAST_EVERY_KEY)
        lts = self.lts
        write_manifest(self.path, {
            "shard": shard, "generation": self.generation,
            "since": self.created, "until": until,
            "min_timestamp": self.stats.min_timestamp,
            "max_timestamp": self.stats.max_timestamp,
            "messages": self.stats.messages, "bytes": self.stats.size,
            "streams": [
                {"id": s, "structure": "/".join(lts.structure(s))} for s in lts.streams()
            ],
            "lts": lts.to_json(), "key_format": 2, "value_format": 1,
        })
        self.sealed_at = until

    def scan(
        self, stream: int, after: int, limit: int, accept: Callable[[str], bool] | None,
        recent: RecentReads | None = None,
    ) -> tuple[list[TTV], int]:
        """Messages of a stream after a timestamp, reading the master range in order (and
        taking those read lately from `recent` rather than decoding them again).

        Returns them and the last timestamp examined (the new position: rejected messages
        are not examined again)."""
        prefix = keys.master_prefix(stream)
        out: list[TTV] = []
        last = after
        visited = 0
        uid = self.uid
        for key, value in self.db.iterator(
            start=prefix + keys.pack_u64(after + 1), stop=prefix + _PAST_TIMESTAMPS,
        ):
            visited += 1
            ttv = decode_value(value) if recent is None else recent.decoded(uid, key, value)
            last = ttv.timestamp
            if accept is None or accept(ttv.topic):
                out.append(ttv)
                if len(out) >= limit:
                    break
        self.keys_visited += visited
        return out, last

    def scan_indexed(
        self, stream: int, fixed: Sequence[tuple[int, str]], after: int, limit: int,
        accept: Callable[[str], bool], recent: RecentReads | None = None,
    ) -> tuple[list[TTV], int]:
        """Like `scan`, for a filter that fixes varying levels: intersects the index ranges
        of those levels by leapfrogging (each cursor seeks to the largest timestamp another
        has proved), then fetches the master key of each timestamp all of them agree on.
        Keys visited ~ matches x levels, whatever the stream's size."""
        prefixes = [keys.index_prefix(stream, ordinal, keys.level_hash(value))
                    for ordinal, value in fixed]
        db = self.db
        cursors = [
            db.iterator(start=p, stop=p + _PAST_TIMESTAMPS, include_value=False)
            for p in prefixes
        ]
        master = keys.master_prefix(stream)
        pack = keys.pack_u64
        out: list[TTV] = []
        target = after + 1
        agreed = 0
        visited = 0
        position = after
        turn = 0
        n = len(cursors)
        while True:
            cursor = cursors[turn]
            cursor.seek(prefixes[turn] + pack(target))
            key = next(cursor, None)
            visited += 1
            if key is None:
                # No key >= target in this level: everything before target is examined.
                position = max(position, target - 1)
                break
            found = keys.timestamp_of(key)
            if found == target:
                agreed += 1
            else:
                target, agreed = found, 1
            if agreed == n:
                key = master + pack(target)
                value = db.get(key)
                visited += 1
                position = target
                if value is not None:
                    ttv = (decode_value(value) if recent is None
                           else recent.decoded(self.uid, key, value))
                    if accept(ttv.topic):
                        out.append(ttv)
                        if len(out) >= limit:
                            break
                target, agreed = target + 1, 0
            turn = (turn + 1) % n
        for cursor in cursors:
            cursor.close()
        self.keys_visited += visited
        return out, position
