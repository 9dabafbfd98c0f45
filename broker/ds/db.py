"""The `messages` database: shards by publisher, streams by topic structure, reads by
iterator.

n_shards is written to db.json when the database is created and read from there ever after:
changing the setting later must not move a publisher's messages to another shard, or the
per-shard ordering an iterator relies on would break.

Every read pins its slab in `open_slabs` (a sealed one is opened if the LRU closed it), so
at most `max_open_slabs` LevelDBs are open whatever the number of generations.
"""

import asyncio
import json
import zlib
from collections.abc import Awaitable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import plyvel  # type: ignore[import-untyped]

from broker.ds.files import recover_swap, swap_in, write_atomically
from broker.ds.iterator import Iterator, Stream, read_plan
from broker.ds.open_slabs import OpenSlabs
from broker.ds.recent import RecentReads
from broker.ds.settings import Settings
from broker.ds.shard import ChangeListener, Shard, load_slabs
from broker.ds.slab import Slab
from broker.ds.ttv import TTV, Make
from broker.mqtt.topic import topic_matches

DB_FILE = "db.json"
_OPENING_THREADS = 16


def shard_of(publisher: str, n_shards: int) -> int:
    """CRC-32, not hash(): Python randomises str hashes per process."""
    return zlib.crc32(publisher.encode()) % n_shards


def read_db_file(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads((path / DB_FILE).read_bytes())  # type: ignore[no-any-return]
    except FileNotFoundError:
        return None


class MessagesDB:
    def __init__(
        self, name: str, path: Path, settings: Settings, executor: Executor,
        on_change: ChangeListener, make: Make | None = None,
    ) -> None:
        """Blocking: reads the state of every slab of every shard; opens the current ones.
        Stored messages are read back as `make` makes them (TTVs by default)."""
        self.name = name
        self.recent = RecentReads(make)
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        meta = read_db_file(path)
        if meta is None:
            meta = {"n_shards": settings.n_shards, "format": 1}
            write_atomically(path / DB_FILE, json.dumps(meta).encode())
        self.n_shards: int = meta["n_shards"]
        self.open_slabs = OpenSlabs(settings.max_open_slabs, executor)
        self._settings = settings
        self._executor = executor
        self._on_change = on_change
        # Side by side: each shard's LevelDB open and creation waits on fsyncs (a dozen
        # for a new shard), and one shard after the other would wait for all of them in turn.
        with ThreadPoolExecutor(min(_OPENING_THREADS, self.n_shards),
                                thread_name_prefix=f"{name}-open") as opening:
            loaded = list(opening.map(self._load_shard, range(self.n_shards)))
        self.shards = [self._shard(i, slabs) for i, slabs in enumerate(loaded)]

    def _load_shard(self, i: int) -> list[Slab]:
        """Blocking: shard `i`'s slabs (shard.load_slabs), on any thread."""
        settings = self._settings
        path = self.path / f"shard-{i:03d}"
        recover_swap(path)  # a snapshot install a crash cut short
        return load_slabs(i, path, settings.wildcard_thresholds, settings.generation_max_size,
                          settings.leveldb_compression)

    def _shard(self, i: int, slabs: list[Slab]) -> Shard:
        settings = self._settings
        return Shard(i, self.path / f"shard-{i:03d}", slabs, settings.wildcard_thresholds,
                     self._executor, self._on_change, settings.buffer,
                     settings.generation_max_size, self.open_slabs, settings.leveldb_compression)

    def close_shard_now(self, i: int) -> None:
        """Blocking: closes shard `i`'s slabs, whatever is in flight (a snapshot is about
        to replace its directory; readers find its generations gone)."""
        self.shards[i].next.discard()
        for slab in self.shards[i].slabs.values():
            self.open_slabs.drop(slab)
            slab.close()
            self._on_change(i, slab.generation, None)

    def reopen_shard(self, i: int) -> Shard:
        """Blocking: shard `i` again from its directory, with the old one's writer hooks."""
        return self._install(i, self._load_shard(i))

    def _install(self, i: int, slabs: list[Slab]) -> Shard:
        old = self.shards[i]
        shard = self.shards[i] = self._shard(i, slabs)
        shard.replication = old.replication
        if old.next.wanted:
            shard.prepare_next()
        return shard

    def replace_shards(self, indexes: Sequence[int]) -> None:
        """Blocking: shards `indexes` closed, their directories replaced by the ones built
        beside them (files.swap_in) and opened again, side by side: each swap and open
        waits on fsyncs, which one shard after the other would wait for in turn."""
        for i in indexes:
            self.close_shard_now(i)

        def load(i: int) -> list[Slab]:
            swap_in(self.path / f"shard-{i:03d}")
            return self._load_shard(i)
        with ThreadPoolExecutor(len(indexes), thread_name_prefix=f"{self.name}-open") as pool:
            loaded = list(pool.map(load, indexes))
        for i, slabs in zip(indexes, loaded, strict=True):
            self._install(i, slabs)

    def store_batch(self, messages: Sequence[TTV], sync: bool = True) -> Awaitable[None]:
        """Buffers the messages on their publishers' shards; the result resolves once all
        of them are written (and fsynced, with `sync`)."""
        by_shard: dict[int, list[TTV]] = {}
        by_publisher: dict[str, list[TTV]] = {}  # a batch usually has one publisher
        n = self.n_shards
        for message in messages:
            publisher = message.publisher
            group = by_publisher.get(publisher)
            if group is None:
                group = by_publisher[publisher] = by_shard.setdefault(shard_of(publisher, n), [])
            group.append(message)
        futures = [self.shards[i].buffer.add(batch, sync) for i, batch in by_shard.items()]
        if len(futures) == 1:
            return futures[0]
        return asyncio.gather(*futures)  # type: ignore[return-value]  # only its completion counts

    def get_streams(self, topic_filter: str, start_time: int = 0,
                    shard_index: int | None = None) -> list[Stream]:
        """Streams of every live generation that may hold messages matching the filter at or
        after `start_time` (microseconds), oldest generation first; of one shard's only when
        given (a reader that finished a stream looks for what follows it in its shard)."""
        streams: list[Stream] = []
        shards = self.shards if shard_index is None else self.shards[shard_index:shard_index + 1]
        for shard in shards:
            for slab in shard.slabs.values():
                if slab.sealed and slab.stats.max_timestamp < start_time:
                    continue
                streams.extend(
                    Stream(self.name, shard.index, slab.generation, stream)
                    for stream in slab.lts.match(topic_filter)
                )
        streams.sort(key=lambda s: (s.generation, s.shard, s.id))
        return streams

    def make_iterator(self, stream: Stream, topic_filter: str, start_time: int = 0) -> Iterator:
        return Iterator(stream, topic_filter, max(start_time - 1, 0))

    def _slab(self, stream: Stream) -> Slab | None:
        return self.shards[stream.shard].slabs.get(stream.generation)

    def next(self, iterator: Iterator, batch_size: int) -> tuple[Iterator | None, list[TTV]]:
        """Up to `batch_size` messages after the iterator's position. The iterator returned
        is None at the end of the stream: its generation is sealed and fully read, or was
        dropped by retention; the caller moves on to newer generations' streams."""
        slab = self._slab(iterator.stream)
        if slab is None:
            return None, []
        self.open_slabs.acquire(slab)
        try:
            return self._scan(slab, iterator, batch_size)
        finally:
            self.open_slabs.release(slab)

    async def read(self, iterator: Iterator, batch_size: int) -> tuple[Iterator | None, list[TTV]]:
        """`next`, opening a closed slab on a worker thread rather than on the event loop."""
        slab = self._slab(iterator.stream)
        if slab is None:
            return None, []
        try:
            await self.open_slabs.acquire_async(slab)
        except plyvel.Error:
            if slab.dropped:  # retention removed it while it was being opened
                return None, []
            raise
        try:
            return self.next(iterator, batch_size)
        finally:
            self.open_slabs.release(slab)

    def _scan(
        self, slab: Slab, iterator: Iterator, batch_size: int
    ) -> tuple[Iterator | None, list[TTV]]:
        stream = iterator.stream
        sealed = slab.sealed  # read before the data: a write cannot follow a seal
        topic_filter = iterator.topic_filter
        plan = read_plan(slab.lts.structure(stream.id), topic_filter)
        accept = None if plan.exact else (lambda topic: topic_matches(topic_filter, topic))
        if plan.fixed:
            assert accept is not None
            messages, position = slab.scan_indexed(
                stream.id, plan.fixed, iterator.position, batch_size, accept, self.recent
            )
        else:
            messages, position = slab.scan(stream.id, iterator.position, batch_size, accept,
                                           self.recent)
        if not messages and sealed:
            return None, []
        if position == iterator.position:
            return iterator, messages
        return Iterator(stream, topic_filter, position), messages

    def keys_visited(self) -> int:
        return sum(slab.keys_visited for s in self.shards for slab in s.slabs.values())

    def _timed(self, shards: list[Shard], timer: bool) -> list[Shard]:
        """Replicated shards' timers act on the shard's leader only: every node runs them,
        and one rotation per interval is what the log should get."""
        return [shard for shard in shards if not timer or shard.replication is None
                or shard.replication.leads(shard.index)]

    async def rotate(self, timer: bool = False) -> int:
        """Seals every shard's current generation that holds data (the admin "seal now" and
        the generation timer; an empty one stays current) and returns how many it sealed."""
        sealed = [shard for shard in self._timed(self.shards, timer)
                  if shard.current.stats.messages]
        for shard in sealed:
            await shard.rotate()
        for shard in sealed:
            await shard.wait_sealed()
        return len(sealed)

    async def drop_older_than(self, cutoff: int, timer: bool = False) -> int:
        dropped = 0
        for shard in self._timed(self.shards, timer):
            dropped += len(await shard.drop_older_than(cutoff))
        return dropped

    async def close(self) -> None:
        for shard in self.shards:
            await shard.close()
        await self.open_slabs.close()

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "n_shards": self.n_shards,
                "shards": [shard.info() for shard in self.shards]}
