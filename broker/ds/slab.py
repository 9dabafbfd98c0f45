"""A slab: the LevelDB directory of one shard x generation, and the reads on it.

Everything about the slab lives inside it (keys.py): data, index keys, LTS edges, counters,
creation time and wildcard thresholds. So a slab can be moved, dropped as a directory, or
read by another program, and a restart rebuilds its state from the slab alone.
"""

import asyncio
import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.ds import keys
from broker.ds.cook import STATS_KEY, CookedBatch, SlabStats
from broker.ds.lts import LTS, PLUS
from broker.ds.manifest import read_manifest, write_manifest
from broker.ds.ttv import TTV, decode_value

_CREATED: Final = keys.meta_key("created")
_THRESHOLDS: Final = keys.meta_key("thresholds")
_PAST_TIMESTAMPS: Final = b"\xff" * (keys.TIMESTAMP_SIZE + 1)  # sorts after every key of a prefix
# Each slab is its own LevelDB with its own table cache; many generations x shards stay open.
_MAX_OPEN_FILES: Final = 64


def _open_leveldb(path: Path, create: bool) -> plyvel.DB:
    return plyvel.DB(
        str(path), create_if_missing=create, error_if_exists=create,
        max_open_files=_MAX_OPEN_FILES,
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
    def __init__(self, path: Path, generation: int, db: plyvel.DB) -> None:
        self.path = path
        self.generation = generation
        self.db = db
        created = db.get(_CREATED)
        thresholds = db.get(_THRESHOLDS)
        if created is None or thresholds is None:
            raise ValueError(f"{path}: not a slab (no creation record)")
        self.created = keys.unpack_u64_from(created, 0)[0]
        self.lts = LTS(json.loads(thresholds), (
            keys.parse_edge(key, value) for key, value in db.iterator(prefix=keys.EDGE)
        ))
        self.stats = SlabStats.decode(db.get(STATS_KEY))
        manifest = read_manifest(path)
        self.sealed_at: int | None = manifest["until"] if manifest else None
        if manifest is None:  # a seal writes the checkpoint first: nothing follows it
            self._count_after_checkpoint()
        self.keys_visited = 0

    @classmethod
    def create(cls, path: Path, generation: int, thresholds: Sequence[int], now_us: int) -> "Slab":
        db = _open_leveldb(path, create=True)
        with db.write_batch(sync=True) as batch:
            batch.put(_CREATED, keys.pack_u64(now_us))
            batch.put(_THRESHOLDS, json.dumps(list(thresholds)).encode())
        return cls(path, generation, db)

    @classmethod
    def open(cls, path: Path, generation: int) -> "Slab":
        return cls(path, generation, _open_leveldb(path, create=False))

    @property
    def sealed(self) -> bool:
        return self.sealed_at is not None

    async def write(self, batch: CookedBatch, sync: bool, executor: Executor) -> None:
        await write_batch(self.db, batch, sync, executor)

    def _count_after_checkpoint(self) -> None:
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
        """Blocking: compacts, then writes the manifest that marks the slab sealed."""
        self.checkpoint()
        self.db.compact_range()
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

    def close(self) -> None:
        if not self.db.closed:
            self.db.close()

    def scan(
        self, stream: int, after: int, limit: int, accept: Callable[[str], bool] | None
    ) -> tuple[list[TTV], int]:
        """Messages of a stream after a timestamp, reading the master range in order.

        Returns them and the last timestamp examined (the new position: rejected messages
        are not examined again)."""
        prefix = keys.master_prefix(stream)
        out: list[TTV] = []
        last = after
        visited = 0
        for value in self.db.iterator(
            start=prefix + keys.pack_u64(after + 1), stop=prefix + _PAST_TIMESTAMPS,
            include_key=False,
        ):
            visited += 1
            ttv = decode_value(value)
            last = ttv.timestamp
            if accept is None or accept(ttv.topic):
                out.append(ttv)
                if len(out) >= limit:
                    break
        self.keys_visited += visited
        return out, last

    def scan_indexed(
        self, stream: int, fixed: Sequence[tuple[int, str]], after: int, limit: int,
        accept: Callable[[str], bool],
    ) -> tuple[list[TTV], int]:
        """Like `scan`, for a filter that fixes varying levels: intersects the index ranges
        of those levels by leapfrogging (each cursor seeks to the largest timestamp another
        has proved), then fetches the master key of each timestamp all of them agree on.
        Keys visited ~ matches x levels, whatever the stream's size."""
        prefixes = [keys.index_prefix(stream, ordinal, keys.level_hash(value))
                    for ordinal, value in fixed]
        cursors = [
            self.db.iterator(start=p, stop=p + _PAST_TIMESTAMPS, include_value=False)
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
                value = self.db.get(master + pack(target))
                visited += 1
                position = target
                if value is not None:
                    ttv = decode_value(value)
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
