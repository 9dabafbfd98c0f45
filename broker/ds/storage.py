"""Durable Storage as the rest of the broker sees it: the `messages` and `sessions`
databases of one node, their timers, and the admin view.

Blocking LevelDB work (writes with fsync, compaction, directory removal) runs on a small
thread pool; everything else runs on the event loop, which also orders it.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from broker.ds.cook import StreamWrite
from broker.ds.db import MessagesDB
from broker.ds.iterator import Iterator, Stream
from broker.ds.kv import KVStore
from broker.ds.settings import Settings
from broker.ds.shard import ChangeListener, now_us
from broker.ds.site import ensure_site_id
from broker.ds.space import DISK_FULL, QUOTA, SpaceGuard, tree_bytes
from broker.ds.subscribe import Subscription, SubscriptionPool
from broker.ds.ttv import TTV, Make
from broker.ds.tx import Transaction
from broker.periodic import every

log = logging.getLogger(__name__)

MESSAGES: Final = "messages"
SESSIONS: Final = "sessions"
_MAX_THREADS: Final = 4
SPACE_POLL: Final = 1.0  # seconds: the lack of space and quota checks


class DurableStorage:
    def __init__(self, data_dir: Path, settings: Settings, make: Make | None = None) -> None:
        """Blocking: opens (or creates) every database under `<data_dir>/ds`; stored
        messages are read back as `make` makes them (TTVs by default)."""
        self.root = Path(data_dir) / "ds"
        self.settings = settings
        self._executor = ThreadPoolExecutor(
            max_workers=min(_MAX_THREADS, settings.n_shards + 1), thread_name_prefix="ds"
        )
        # On workers meanwhile: a LevelDB's creation waits on fsyncs, and so does the site
        # ID's file at first start; neither need wait for the other, nor for the messages
        # database's db.json.
        sessions = self._executor.submit(KVStore, SESSIONS, self.root / SESSIONS,
                                         self._executor, settings.buffer)
        site_id = self._executor.submit(ensure_site_id, self.root, settings.site_id)
        self.messages = MessagesDB(MESSAGES, self.root / MESSAGES, settings, self._executor,
                                   self._on_change, make)
        self.site_id = site_id.result()
        self.sessions = sessions.result()
        # Lack of space and the storage quota: durable writes refused meanwhile (space.py).
        self.space = SpaceGuard(self.root)
        self.sessions.on_error = self.space.failed
        self.subscriptions = SubscriptionPool(MESSAGES, self.messages.read)
        # Told of every write (the streams written), seal and drop (None): durable sessions
        # learn of new streams this way instead of polling get_streams.
        self.change_listeners: list[ChangeListener] = []
        self._tasks: list[asyncio.Task[None]] = []

    def _on_change(
        self, shard: int, generation: int, streams: dict[int, StreamWrite] | None
    ) -> None:
        self.subscriptions.on_change(shard, generation, streams)
        for listener in self.change_listeners:
            listener(shard, generation, streams)

    def _messages(self, db: str) -> MessagesDB:
        if db != MESSAGES:
            raise KeyError(f"{db!r} is not a message database")
        return self.messages

    # Read path -------------------------------------------------------------------------

    def get_streams(self, db: str, topic_filter: str, start_time: int = 0,
                    shard: int | None = None) -> list[Stream]:
        return self._messages(db).get_streams(topic_filter, start_time, shard)

    def make_iterator(self, stream: Stream, topic_filter: str, start_time: int = 0) -> Iterator:
        return self._messages(stream.db).make_iterator(stream, topic_filter, start_time)

    def next(self, iterator: Iterator, batch_size: int) -> tuple[Iterator | None, list[TTV]]:
        return self._messages(iterator.stream.db).next(iterator, batch_size)

    def subscribe(
        self, iterator: Iterator, batch_size: int, max_unacked: int = 2
    ) -> Subscription:
        return self.subscriptions.subscribe(iterator, batch_size, max_unacked)

    # Write path ------------------------------------------------------------------------

    def store_batch(
        self, db: str, messages: Sequence[TTV], sync: bool = True
    ) -> Awaitable[None]:
        """Raises StorageRefused, with nothing stored, while writes are refused."""
        self.space.check()
        stored = asyncio.ensure_future(self._messages(db).store_batch(messages, sync))
        stored.add_done_callback(self._stored)
        return stored

    def _stored(self, stored: "asyncio.Future[None]") -> None:
        if not stored.cancelled() and stored.exception() is not None:
            self.space.failed(stored.exception())  # type: ignore[arg-type]

    def begin(self) -> Transaction:
        """A transaction on the `sessions` database."""
        return self.sessions.begin()

    async def commit(self, tx: Transaction, sync: bool = True) -> None:
        await self.sessions.commit(tx, sync)

    def commit_soon(self, tx: Transaction, sync: bool = True) -> asyncio.Future[None]:
        return self.sessions.commit_soon(tx, sync)

    # Generations -----------------------------------------------------------------------

    async def seal(self, db: str = MESSAGES) -> int:
        """Seals every shard's current generation that holds data; new writes go to new
        ones. Returns the number of generations sealed."""
        return await self._messages(db).rotate()

    async def apply_retention(self, now: int | None = None, timer: bool = False) -> int:
        cutoff = (now or now_us()) - int(self.settings.retention_period * 1e6)
        dropped = await self.messages.drop_older_than(cutoff, timer)
        if dropped:
            log.info("retention dropped %d generations", dropped)
        return dropped

    async def watch_space(self) -> None:
        """Every SPACE_POLL: writes resume once the volume has room again after a lack of
        space, or at once after another failure, the databases a write failed on reopened
        first (the next round tries again if one cannot be); then the quota is checked."""
        space = self.space
        room = space.has_room()  # (makes the reserve again first, if a start freed it)
        if space.reason(DISK_FULL) and (not room or space.held):
            return  # opening a LevelDB writes: not on a full volume
        recovered = self.sessions.recover()
        for shard in self.messages.created_shards:
            recovered = await shard.recover() and recovered
        if recovered:
            space.allow(DISK_FULL)
        if self.settings.storage_quota:
            await self._check_quota(self.settings.storage_quota)

    async def _check_quota(self, quota: int) -> None:
        """Over the quota, generations past retention go first; refused if still over."""
        loop = asyncio.get_running_loop()
        used = await loop.run_in_executor(self._executor, tree_bytes, self.messages.path)
        if used > quota and await self.apply_retention(timer=True):
            used = await loop.run_in_executor(self._executor, tree_bytes, self.messages.path)
        if used <= quota:
            self.space.allow(QUOTA)
            return
        self.space.refuse(QUOTA, f"the messages database holds {used} bytes, over"
                          f" durable_storage.messages.storage_quota ({quota})",
                          {"used_bytes": used, "quota_bytes": quota})

    def start(self, spares: bool = True) -> None:
        """Starts the generation, retention and space timers, and makes the reserve (call on
        the running loop). `spares`: each shard's next generation made ahead from now on,
        off the event loop; else the caller calls `messages.make_spares` later (a replica
        of replicated storage, once it caught up: a new one's 16 spare LevelDBs, a dozen
        fsyncs each, took the workers its catch-up writes and syncs its files on)."""
        settings = self.settings
        self.space.keep_reserve()  # (a node's, not an offline reader's: see space.py)
        if spares:
            self.messages.make_spares()
        self._tasks.append(asyncio.create_task(every(SPACE_POLL, self.watch_space)))
        self._tasks.append(asyncio.create_task(
            every(settings.generation_interval, lambda: self.messages.rotate(timer=True))
        ))
        self._tasks.append(asyncio.create_task(every(
            min(settings.retention_period, settings.generation_interval),
            lambda: self.apply_retention(timer=True),
        )))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.subscriptions.close()
        await self.messages.close()
        await self.sessions.close()
        self._executor.shutdown()

    # Admin -----------------------------------------------------------------------------

    def metrics(self) -> list[tuple[str, str, str, float]]:
        """(name, "counter" or "gauge", help, value) for /metrics; read on scrape only."""
        shards = self.messages.created_shards
        slabs = [slab for shard in shards for slab in shard.slabs.values()]
        return [
            ("ds_batches", "counter", "Batches written to the messages database",
             sum(s.batches for s in shards)),
            ("ds_messages", "counter", "Messages written to the messages database",
             sum(s.messages for s in shards)),
            ("ds_bytes", "counter", "Bytes (keys and values) written to the messages database",
             sum(s.bytes for s in shards)),
            ("ds_flush_seconds", "counter", "Time spent writing batches to LevelDB",
             sum(s.flush_seconds for s in shards)),
            ("ds_transactions", "counter", "Transactions committed to the sessions database",
             self.sessions.commits),
            ("ds_generations", "gauge", "Live generations, all shards", len(slabs)),
            ("ds_open_slabs", "gauge",
             "Generations whose LevelDB is open (or being opened), all shards",
             len(self.messages.open_slabs)),
            ("ds_max_open_slabs", "gauge",
             "durable_storage.messages.max_open_slabs: open generations beyond it are closed,"
             " least recently read first, once not in use", self.messages.open_slabs.limit),
            ("ds_slab_reopens", "counter",
             "Sealed generations opened again for a reader after the bound closed them",
             self.messages.open_slabs.reopened),
            ("ds_streams", "gauge", "Streams in live generations, all shards",
             sum(len(slab.lts.streams()) for slab in slabs)),
            ("ds_writes_refused", "counter",
             "Durable writes refused at once, for lack of space or over the storage quota",
             self.space.refused),
            ("ds_subscriptions", "gauge", "Push subscriptions", len(self.subscriptions)),
            ("ds_subscription_reads", "counter", "Reads made for push subscriptions",
             self.subscriptions.reads),
            ("ds_subscription_handovers", "counter",
             "Writes handed to caught-up push subscriptions without reading them back",
             self.subscriptions.handed_over),
        ]

    def info(self) -> dict[str, Any]:
        messages = self.messages.info()
        messages["replication_factor"] = self.settings.replication_factor
        return {"site_id": self.site_id, "databases": [messages, self.sessions.info()]}
