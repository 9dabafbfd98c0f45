"""The `messages` database: shards by publisher, streams by topic structure, reads by
iterator.

n_shards is written to db.json when the database is created and read from there ever after:
changing the setting later must not move a publisher's messages to another shard, or the
per-shard ordering an iterator relies on would break.

Every read pins its slab in `open_slabs` (a sealed one is opened if the LRU closed it), so
at most `max_open_slabs` LevelDBs are open whatever the number of generations.

A shard is created on its first write, not with the database: creating one costs a dozen
fsyncs, and a node started on an empty data dir would wait for all of them (16 shards, some
150 fsyncs) before its first client, where no client needs a shard to connect. A shard that
was never written holds nothing, so reads need none; the shards on disk open with the
database, side by side. Writes that arrive while their shard is being made wait for it and
are handed to its buffer in arrival order, in one step, so no later write overtakes them.
"""

import asyncio
import json
import shutil
import zlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import plyvel  # type: ignore[import-untyped]

from broker.ds.files import fsync_dir, recover_swap, staging, swap_in, write_atomically
from broker.ds.iterator import Iterator, Stream, read_plan
from broker.ds.open_slabs import OpenSlabs
from broker.ds.recent import RecentReads
from broker.ds.settings import Settings
from broker.ds.shard import ChangeListener, Shard, load_slabs
from broker.ds.slab import Slab, SlabClosed
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
        self._spares = False  # each shard's next generation made ahead (`make_spares`)
        # Shard i, None until it is created (module docstring); the shards being created,
        # and the writes waiting for each (messages, sync, the caller's future).
        self._by_index: list[Shard | None] = [None] * self.n_shards
        self._making: dict[int, asyncio.Task[Shard]] = {}
        self._waiting: dict[int, list[tuple[list[TTV], bool, asyncio.Future[None]]]] = {}
        self._side_by_side(self._load_shard, [i for i in range(self.n_shards) if self._on_disk(i)])

    def _side_by_side(self, load: Callable[[int], list[Slab]], indexes: list[int]) -> None:
        """Blocking: shards `indexes` opened or created (`load`) on threads side by side:
        each LevelDB open and creation waits on fsyncs (a dozen for a new shard), and one
        shard after the other would wait for all of them in turn."""
        with ThreadPoolExecutor(_OPENING_THREADS, thread_name_prefix=f"{self.name}-open") as pool:
            loaded = list(pool.map(load, indexes))
        for i, slabs in zip(indexes, loaded, strict=True):
            self._by_index[i] = self._shard(i, slabs)

    def shard_path(self, i: int) -> Path:
        return self.path / f"shard-{i:03d}"

    def _on_disk(self, i: int) -> bool:
        """Whether shard `i` was created (or a swap a crash cut short left it staged)."""
        path = self.shard_path(i)
        return path.exists() or staging(path).exists()

    @property
    def created_shards(self) -> list[Shard]:
        """The shards created so far, in index order (the others hold nothing): a position in
        this list is not a shard number; `shard(i)` looks one up."""
        return [shard for shard in self._by_index if shard is not None]

    def shard(self, i: int) -> Shard:
        """Shard `i`, which must have been created (`create`)."""
        shard = self._by_index[i]
        if shard is None:
            raise LookupError(f"{self.name} shard {i} was never written: not created")
        return shard

    def create(self, indexes: Sequence[int] | None = None) -> None:
        """Blocking: the shards `indexes` (all by default) not created yet, now, side by
        side (a replicated node's Raft groups each apply to one, written or not)."""
        self._side_by_side(self._make_shard, [i for i in range(self.n_shards) if self._by_index[i]
                                              is None and (indexes is None or i in indexes)])

    async def create_async(self) -> None:
        """`create` of every shard, on worker threads (an export's cut lists each
        shard's current generation)."""
        # Shielded: a creation cut short would leave its LevelDB open (and locked) unused.
        await asyncio.gather(*(asyncio.shield(self._create(i))
                               for i, shard in enumerate(self._by_index) if shard is None))

    def _make_shard(self, i: int) -> list[Slab]:
        """Blocking: `_load_shard` of a shard not created yet, its directory made durable
        first (the first write's acknowledgement relies on it; again if an attempt failed)."""
        self.shard_path(i).mkdir(exist_ok=True)
        fsync_dir(self.path)
        return self._load_shard(i)

    def _load_shard(self, i: int) -> list[Slab]:
        """Blocking: shard `i`'s slabs (shard.load_slabs), on any thread."""
        settings = self._settings
        path = self.shard_path(i)
        recover_swap(path)  # a snapshot install a crash cut short
        return load_slabs(i, path, settings.wildcard_thresholds, settings.generation_max_size,
                          settings.leveldb_compression)

    def _shard(self, i: int, slabs: list[Slab]) -> Shard:
        settings = self._settings
        return Shard(i, self.shard_path(i), slabs, settings.wildcard_thresholds,
                     self._executor, self._on_change, settings.buffer,
                     settings.generation_max_size, self.open_slabs, settings.leveldb_compression)

    def _create(self, i: int) -> "asyncio.Task[Shard]":
        """The creation of shard `i` on a worker thread, started unless under way."""
        making = self._making.get(i)
        if making is None:
            making = self._making[i] = asyncio.ensure_future(self._made(i))
            # A failure reaches the writes waiting (and `create_async`), not the log.
            making.add_done_callback(lambda done: done.cancelled() or done.exception())
        return making

    async def _made(self, i: int, make: Callable[[int], list[Slab]] | None = None) -> Shard:
        loop = asyncio.get_running_loop()
        try:
            slabs = await loop.run_in_executor(self._executor, make or self._make_shard, i)
        except Exception as error:  # (never cancelled: nothing cancels the task)
            for _, _, waiter in self._waiting.pop(i, []):
                if not waiter.done():
                    waiter.set_exception(error)
            raise
        finally:
            del self._making[i]
        shard = self._install(i, slabs)
        for messages, sync, waiter in self._waiting.pop(i, []):  # in one step: in order
            _chain(shard.buffer.add(messages, sync), waiter)
        return shard

    def _add(self, i: int, messages: list[TTV], sync: bool) -> "asyncio.Future[None]":
        """`messages` buffered on shard `i`, once it exists."""
        shard = self._by_index[i]
        if shard is not None:
            return shard.buffer.add(messages, sync)
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(i, []).append((messages, sync, waiter))
        self._create(i)
        return waiter

    def make_spares(self) -> None:
        """From now on each shard has its next generation made ahead (shard.prepare_next),
        a shard created later too."""
        self._spares = True
        for shard in self.created_shards:
            shard.prepare_next()

    def close_shard_now(self, i: int) -> None:
        """Blocking: closes shard `i`'s slabs (its directory is about to be replaced;
        readers find its generations gone), once its seals under way are over (callers
        that can await `shard.wait_sealed()` first). A slab a reader on a worker thread
        holds is closed by that reader when it lets go: closing a LevelDB under a thread
        that uses it frees what that thread reads, or deadlocks its compaction. Until then
        the slab's path stays locked, and a shard reopened there fails and is retried."""
        shard = self._by_index[i]
        if shard is None:
            return
        shard.next.discard()
        shard.finish_seals()
        for slab in shard.slabs.values():
            self.open_slabs.drop(slab, writer_pin=slab is shard.current)
            self._on_change(i, slab.generation, None)

    def reopen_shard(self, i: int) -> Shard:
        """Blocking: shard `i` again from its directory, with the old one's writer hooks."""
        return self._install(i, self._load_shard(i))

    def _install(self, i: int, slabs: list[Slab]) -> Shard:
        old = self._by_index[i]
        shard = self._by_index[i] = self._shard(i, slabs)
        if old is not None:
            shard.replication = old.replication
        if self._spares if old is None else old.next.wanted:
            shard.prepare_next()
        return shard

    async def replace_shards(self, built: dict[int, Path]) -> None:
        """Shards `built` closed, their directories replaced by the ones built (on this
        filesystem: moved to `staging`, then files.swap_in; a shard not created yet is
        created so) and opened again, on worker threads side by side: each swap and open
        waits on fsyncs, which the event loop would wait for (tens of milliseconds a
        shard). Meanwhile each is a shard being created: writes to it wait for it, in order,
        and readers find no generation. A shard a first write is creating is made first.
        For unreplicated shards (a replica's are replaced through its Raft group)."""
        await self.settled(built)
        for shard in [self._by_index[i] for i in built]:
            if shard is not None:
                await shard.wait_sealed()
        for i, path in built.items():
            self.close_shard_now(i)
            self._by_index[i] = None
            self._making[i] = asyncio.ensure_future(
                self._made(i, partial(self._swapped_in, path)))
        await asyncio.gather(*(self._making[i] for i in built))

    async def settled(self, indexes: Iterable[int]) -> None:
        """Once no shard of `indexes` is being created (a write's may have failed)."""
        await asyncio.gather(*(self._making[i] for i in indexes if i in self._making),
                             return_exceptions=True)

    def _swapped_in(self, built: Path, i: int) -> list[Slab]:
        fresh = staging(self.shard_path(i))
        shutil.rmtree(fresh, ignore_errors=True)
        built.rename(fresh)
        swap_in(self.shard_path(i))
        return self._load_shard(i)

    def store_batch(self, messages: Sequence[TTV], sync: bool = True) -> Awaitable[None]:
        """Buffers the messages on their publishers' shards (creating a shard on its first
        write); the result resolves once all of them are written (and fsynced, with
        `sync`)."""
        by_shard: dict[int, list[TTV]] = {}
        by_publisher: dict[str, list[TTV]] = {}  # a batch usually has one publisher
        n = self.n_shards
        for message in messages:
            publisher = message.publisher
            group = by_publisher.get(publisher)
            if group is None:
                group = by_publisher[publisher] = by_shard.setdefault(shard_of(publisher, n), [])
            group.append(message)
        futures = [self._add(i, batch, sync) for i, batch in by_shard.items()]
        if len(futures) == 1:
            return futures[0]
        return asyncio.gather(*futures)  # type: ignore[return-value]  # only its completion counts

    def get_streams(self, topic_filter: str, start_time: int = 0,
                    shard_index: int | None = None) -> list[Stream]:
        """Streams of every live generation that may hold messages matching the filter at or
        after `start_time` (microseconds), oldest generation first; of one shard's only when
        given (a reader that finished a stream looks for what follows it in its shard)."""
        streams: list[Stream] = []
        by_index = self._by_index
        shards = by_index if shard_index is None else by_index[shard_index:shard_index + 1]
        for shard in shards:
            if shard is None:
                continue
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
        shard = self._by_index[stream.shard]
        return None if shard is None else shard.slabs.get(stream.generation)

    def next(self, iterator: Iterator, batch_size: int) -> tuple[Iterator | None, list[TTV]]:
        """Up to `batch_size` messages after the iterator's position. The iterator returned
        is None at the end of the stream: its generation is sealed and fully read, or was
        dropped by retention; the caller moves on to newer generations' streams."""
        slab = self._slab(iterator.stream)
        if slab is None:
            return None, []
        try:
            self.open_slabs.acquire(slab)
        except (plyvel.Error, SlabClosed):
            if slab.dropped:  # removed while it was being opened
                return None, []
            raise
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
        except (plyvel.Error, SlabClosed):
            if slab.dropped:  # removed while it was being opened
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
        return sum(slab.keys_visited for s in self.created_shards for slab in s.slabs.values())

    def _timed(self, shards: list[Shard], timer: bool) -> list[Shard]:
        """Replicated shards' timers act on the shard's leader only: every node runs them,
        and one rotation per interval is what the log should get."""
        return [shard for shard in shards if not timer or shard.replication is None
                or shard.replication.leads(shard.index)]

    async def rotate(self, timer: bool = False) -> int:
        """Seals every shard's current generation that holds data (the admin "seal now" and
        the generation timer; an empty one stays current) and returns how many it sealed."""
        sealed = [shard for shard in self._timed(self.created_shards, timer)
                  if shard.current.stats.messages]
        for shard in sealed:
            await shard.rotate()
        for shard in sealed:
            await shard.wait_sealed()
        return len(sealed)

    async def drop_older_than(self, cutoff: int, timer: bool = False) -> int:
        dropped = 0
        for shard in self._timed(self.created_shards, timer):
            dropped += len(await shard.drop_older_than(cutoff))
        return dropped

    async def close(self) -> None:
        await asyncio.gather(*self._making.values(), return_exceptions=True)
        for shard in self.created_shards:
            await shard.close()
        await self.open_slabs.close()

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "n_shards": self.n_shards,
                "shards": [shard.info() for shard in self.created_shards]}


def _chain(source: "asyncio.Future[None]", waiter: "asyncio.Future[None]") -> None:
    """`waiter` resolves as `source` does (unless its caller gave up on it)."""
    def copy(done: "asyncio.Future[None]") -> None:
        if waiter.done():
            return
        if done.cancelled():
            waiter.cancel()
        elif (error := done.exception()) is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(None)
    source.add_done_callback(copy)
