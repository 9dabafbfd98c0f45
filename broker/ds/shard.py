"""A shard of the messages database: its generations, its writer and its retention.

Only the newest generation is writable. A rotation makes a new slab current first and then
seals the old one (compaction and manifest) outside the write lock, so writers wait only for
the new directory. On disk a generation without a manifest that is not the newest is one
whose sealing a crash interrupted; opening the shard finishes it. Only the current
generation's LevelDB stays open; sealed ones are opened by readers through `OpenSlabs`.

The next generation's slab is made ahead, on a worker thread (spare.py): a replicated
rotation is applied on the event loop, in log order, and creating a LevelDB costs a dozen
fsyncs. Replicated, a rotation activates the spare without a sync and the seal's worker
commits it, in rotation order: the old slab synced, then the new one unmarked (synced), so
the new one never counts commands as applied whose data the old one could still lose.
Every synced checkpoint commits first (the log is compacted only behind one). Without a
spare at hand (the first rotation after a snapshot install or a LOAD), a rotation creates
the slab itself, as before.

Two backends share this class. `builtin_local`: the write buffer's flush cooks and writes
(with fsync) here. `builtin_raft`: the flush, rotations and drops become commands of the
shard's Raft group (`replication`, set by the cluster), and every replica changes its shard
only in `apply_*`, synchronously, in log order: the log is the durable copy, so LevelDB is
written without fsync.

Replicated, the current slab holds a checkpoint: the last command applied and each writer's
last STORE serial, written in the same batch as the counters (cook.py), every 32 MiB, and
synced before the log is compacted. Not with every batch: a key outside the data's range in
every batch makes each table LevelDB flushes overlap the last one, and compacting them cost
three times the CPU of the writes themselves (keys.py). After a crash, or a restart, the slab
holds more than its checkpoint counts; the shard resumes from the checkpoint's counters and
the log replays the commands after it. Cooking is deterministic from that state (cook.py),
so a replayed command writes the very keys and values it wrote before: replaying is
idempotent.

    checkpoint := applied index u64 | applied term u64 | writers (JSON: site -> serial)
"""

import asyncio
import concurrent.futures
import json
import logging
import shutil
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any, Final, Protocol

import plyvel  # type: ignore[import-untyped]

from broker.ds import keys
from broker.ds.buffer import WriteBuffer
from broker.ds.cook import STATS_KEY, CookedBatch, Cooker, StreamWrite
from broker.ds.files import fsync_dir
from broker.ds.open_slabs import OpenSlabs
from broker.ds.replication_layer import LOAD_FIRST, LOAD_LAST, BadCommand, Load, Store
from broker.ds.slab import CHECKPOINT_KEY, Compression, Slab, prepare_batch
from broker.ds.space import DISK_FULL, WRITE_FAILED, StorageRefused, out_of_space
from broker.ds.spare import NextSlab
from broker.ds.ttv import TTV

log = logging.getLogger(__name__)

_GEN_PREFIX: Final = "gen-"
_TMP_SUFFIX: Final = ".tmp"

# (shard, generation, the messages written per stream, or None for "all of them": sealed
# or dropped)
ChangeListener = Callable[[int, int, dict[int, StreamWrite] | None], None]


_APPLIED: Final = struct.Struct(">QQ")
# A slab written before the checkpoint existed holds these, written with every batch (so
# exact): opening it writes its first checkpoint from them.
_EVERY_BATCH_APPLIED: Final = keys.meta_key("raft_applied")
_EVERY_BATCH_WRITERS: Final = keys.meta_key("raft_writers")


class Replication(Protocol):
    """A shard's Raft group as the shard sees it (broker/cluster/ds_groups.py)."""

    async def store(self, shard: int, messages: list[TTV]) -> None:
        """Returns once the messages are committed and applied here."""

    async def rotate(self, shard: int) -> None: ...

    async def drop(self, shard: int, cutoff: int) -> None: ...

    def leads(self, shard: int) -> bool:
        """Whether this node leads the shard's group (timers propose only there)."""


def now_us() -> int:
    return time.time_ns() // 1000


def generation_dir(shard_dir: Path, generation: int) -> Path:
    return shard_dir / f"{_GEN_PREFIX}{generation:06d}"


class Shard:
    def __init__(
        self, index: int, path: Path, slabs: list[Slab], thresholds: tuple[int, ...],
        executor: Executor, on_change: ChangeListener, buffer_settings: tuple[float, int, float],
        max_generation_bytes: int, open_slabs: OpenSlabs, compression: Compression = None,
    ) -> None:
        self.index = index
        self.compression = compression
        self.path = path
        self.slabs: dict[int, Slab] = {slab.generation: slab for slab in slabs}
        self.current = slabs[-1]
        self.open_slabs = open_slabs
        open_slabs.acquire(self.current)  # the writer's pin, for as long as it is current
        self.thresholds = thresholds
        self.executor = executor
        self._on_change = on_change
        self._max_bytes = max_generation_bytes
        # builtin_raft: each writer's last STORE serial applied (a retry's copy is skipped),
        # the (index, term) of the last command applied, and whether the current slab holds
        # a checkpoint.
        self._writers: dict[str, int] = {}
        self._applied: tuple[int, int] | None = None
        # The next generation's slab, made ahead; the rotations whose new slab is not
        # committed yet (old, new), oldest first.
        self.next = NextSlab(f"shard {index}", executor, open_slabs, self._make_spare)
        self._uncommitted: list[tuple[Slab, Slab]] = []
        self._committing = threading.Lock()
        self._checkpointed = self._resume_at_checkpoint()
        last = max(slab.stats.max_timestamp for slab in slabs)
        self.cooker = Cooker(self.current.lts, self.current.stats, last)
        self.buffer: WriteBuffer[TTV] = WriteBuffer(self._flush, *buffer_settings)
        self._lock = asyncio.Lock()
        # Seals under way on worker threads, by generation: concurrent futures, so that
        # `finish_seals` can wait for them off the event loop's futures too.
        self._sealing: dict[int, concurrent.futures.Future[None]] = {}
        # Counters for /metrics: batches, messages, bytes, seconds spent applying.
        self.batches = 0
        self.messages = 0
        self.bytes = 0
        self.flush_seconds = 0.0
        self.replication: Replication | None = None
        self.duplicates = 0  # STOREs applied already (a writer's retry), skipped
        # builtin_local: a write failed (with this error); none goes on until `recover`.
        self.failed: Exception | None = None

    async def _flush(self, messages: list[TTV], sync: bool) -> None:
        if self.replication is not None:
            await self.replication.store(self.index, messages)
            return
        async with self._lock:
            if self.failed is not None:
                raise StorageRefused(DISK_FULL if out_of_space(self.failed) else WRITE_FAILED,
                                     f"{self.current.path}: {self.failed}")
            slab = self.current
            batch = self.cooker.cook(messages, now_us())
            started = time.perf_counter()
            try:
                await slab.write(batch, sync, self.executor)
            except Exception as error:
                self.failed = error  # what the cooking learned is in memory only: `recover`
                raise
            if self._written(slab, batch, started):
                await self._rotate_locked()

    async def recover(self) -> bool:
        """builtin_local, after a failed write: the current generation as the disk holds it
        (Slab.reload), then writes go on; False while it cannot be opened."""
        async with self._lock:
            if self.failed is None:
                return True
            slab = self.current
            try:
                await asyncio.get_running_loop().run_in_executor(self.executor, slab.reload)
            except Exception as error:
                log.error("reopening %s failed, again later: %s", slab.path, error)
                return False
            self.cooker = Cooker(slab.lts, slab.stats, self.cooker.last_timestamp)
            self.failed = None
            log.info("reopened %s after a failed write", slab.path)
            return True

    def _written(self, slab: Slab, batch: CookedBatch, started: float) -> bool:
        """Counts a batch written and tells its readers; True when the generation is full."""
        self.flush_seconds += time.perf_counter() - started
        self.batches += 1
        self.messages += batch.messages
        self.bytes += batch.size
        self._on_change(self.index, slab.generation, batch.streams)
        return slab.stats.size >= self._max_bytes

    async def rotate(self) -> int:
        """Seals the current generation (the seal itself completes in the background: see
        `wait_sealed`) and returns the new generation's number."""
        if self.replication is not None:
            await self.replication.rotate(self.index)
            return self.current.generation
        async with self._lock:
            return await self._rotate_locked()

    async def _rotate_locked(self) -> int:
        loop = asyncio.get_running_loop()
        old = self.current
        now = max(now_us(), self.cooker.last_timestamp)
        new = await self.next.take(old.generation + 1)
        if new is None:
            new = await loop.run_in_executor(
                self.executor, _create_slab, self.path, old.generation + 1, self.thresholds,
                now, self.compression,
            )
            self.open_slabs.acquire(new)
        else:
            await loop.run_in_executor(self.executor, new.activate, now, None, True)
        self._switch(old, new, now)
        return new.generation

    def _switch(self, old: Slab, new: Slab, now: int) -> None:
        """`new` (open and pinned) becomes current; the old generation ends at `now` for
        readers at once and is sealed on a worker thread, where it loses the writer's pin
        once sealed (closing what the bound on open slabs then closes there too)."""
        self.slabs[new.generation] = new
        self.current = new
        self.cooker = Cooker(new.lts, new.stats, self.cooker.last_timestamp)
        old.sealed_at = now
        self._sealing[old.generation] = self.executor.submit(self._seal, old, now)
        self._on_change(self.index, old.generation, None)
        if self.next.wanted:
            self.prepare_next()

    def _seal(self, old: Slab, until: int) -> None:
        """Blocking: the rotations so far committed, then `old` sealed and unpinned."""
        try:
            self.commit()
            old.seal(until, self.index)
        finally:
            self.open_slabs.release(old)

    def prepare_next(self) -> "Future[Slab]":
        """Starts making the next generation's slab on a worker thread (spare.py), and one
        after each rotation from now on (any thread); returns the making."""
        return self.next.prepare(self.current.generation + 1)

    def _make_spare(self, generation: int) -> Slab:
        return _create_slab(self.path, generation, self.thresholds, now_us(), self.compression,
                            spare=True)

    def commit(self) -> None:
        """Blocking, any thread: each rotation applied without a sync made durable, in
        order (its old slab synced, then its new one unmarked)."""
        with self._committing:
            while self._uncommitted:
                old, new = self._uncommitted[0]
                old.checkpoint()
                new.unmark()
                self._uncommitted.pop(0)

    async def wait_sealed(self) -> None:
        while self._sealing:
            generation, sealing = next(iter(self._sealing.items()))
            # A cancelled waiter must not cancel the seal (wrap_future would pass it on).
            await asyncio.shield(asyncio.wrap_future(sealing))
            self._sealing.pop(generation, None)

    def finish_seals(self) -> None:
        """Blocking: waits for the seals under way, whatever their outcome. A seal compacts
        its slab's LevelDB on a worker thread; closing that LevelDB under it would leave
        LevelDB's destructor waiting forever for the compaction it cut short, the event
        loop with it. Callers that can await `wait_sealed` first."""
        concurrent.futures.wait(list(self._sealing.values()))

    async def drop_older_than(self, cutoff: int) -> list[int]:
        """Retention: drops sealed generations that ended before `cutoff`, after sealing a
        current generation that is itself too old (so it can go next time)."""
        if self.replication is not None:
            if self.current.created < cutoff and self.current.stats.messages:
                await self.replication.rotate(self.index)
            before = set(self.slabs)
            await self.wait_sealed()
            await self.replication.drop(self.index, cutoff)
            return sorted(before - set(self.slabs))
        async with self._lock:
            current = self.current
            if current.created < cutoff and current.stats.messages:
                await self._rotate_locked()
        await self.wait_sealed()
        dropped = [
            generation for generation, slab in self.slabs.items()
            if slab is not self.current and slab.sealed_at is not None and slab.sealed_at < cutoff
        ]
        loop = asyncio.get_running_loop()
        for generation in dropped:
            slab = self.slabs.pop(generation)
            self.open_slabs.drop(slab)
            await loop.run_in_executor(self.executor, shutil.rmtree, slab.path)
            self._on_change(self.index, generation, None)
        return dropped

    # ---- builtin_raft: applying the shard's log ----------------------------------------------
    def _resume_at_checkpoint(self) -> bool:
        """The applied index and writers of the current slab's checkpoint (its counters are
        the checkpoint's too: Slab.open leaves what followed to the log); whether it holds
        one."""
        slab = self.current
        raw = slab.db.get(CHECKPOINT_KEY)
        if raw is None:
            every_batch = slab.db.get(_EVERY_BATCH_APPLIED)
            if every_batch is None:
                return False  # builtin_local, or nothing applied yet
            self._applied = _APPLIED.unpack(every_batch)
            self._writers = json.loads(slab.db.get(_EVERY_BATCH_WRITERS) or b"{}")
            self._write_checkpoint(sync=True)
            return True
        self._applied = _APPLIED.unpack_from(raw)
        self._writers = json.loads(raw[_APPLIED.size:])
        return True

    def _checkpoint(self) -> tuple[tuple[bytes, bytes], ...]:
        stats = (STATS_KEY, self.current.stats.encode())
        if self._applied is None:
            return (stats,)
        return stats, (CHECKPOINT_KEY, _checkpoint_value(self._applied, self._writers))

    def _write_checkpoint(self, sync: bool) -> None:
        if sync and self._uncommitted:
            self.commit()  # a synced checkpoint lets the log go: it must not outrun them
        with self.current.db.write_batch(sync=sync) as batch:
            for key, value in self._checkpoint():
                batch.put(key, value)
        self._checkpointed = self._applied is not None

    def applied(self) -> tuple[int, int]:
        """(index, term) of the last command applied (0, 0: none); at open, the
        checkpoint's."""
        return self._applied or (0, 0)

    def checkpoint_now(self) -> None:
        """Blocking: the current slab's checkpoint at the last command applied, not synced
        (a snapshot is about to read the slab: its rotations committed first, so it holds
        no spare's mark)."""
        self.commit()
        self._write_checkpoint(sync=False)

    def apply_store(self, store: Store, index: int, term: int) -> None:
        """Cooks and writes a STORE command (without fsync: the log is the durable copy);
        a generation that reached its size is rotated at once, by every replica alike."""
        writers = self._writers
        if store.serial <= writers.get(store.writer, 0):
            self.duplicates += 1
            self.apply_mark(index, term)
            return
        writers[store.writer] = store.serial
        self._applied = (index, term)
        slab = self.current
        batch = self.cooker.cook_encoded(store.data, store.spans, store.messages, store.clock)
        if batch.checkpoint or not self._checkpointed:
            batch.puts += self._checkpoint()
            self._checkpointed = True
        started = time.perf_counter()
        prepare_batch(slab.db, batch, False).write()
        if self._written(slab, batch, started):
            self.apply_rotate(store.clock, index, term)

    def apply_mark(self, index: int, term: int, sync: bool = False) -> None:
        """Records a command applied that changed no data, in memory only (the log replays
        it after a crash); with `sync`, writes the checkpoint and makes all that was applied
        durable: the log may then be compacted up to `index`."""
        self._applied = (index, term)
        if sync:
            self._write_checkpoint(sync=True)

    def apply_rotate(self, clock: int, index: int, term: int) -> None:
        """The new slab records `index` as applied, so a crash before it is one for sure
        replays the rotation and one after does not; the old one is synced first, so it
        cannot lose a tail the new one already counts as applied. With a spare at hand
        nothing here waits for the disk: the spare is activated without a sync and the
        seal's worker commits it (module docstring); without, the slab is created here
        (blocking: a dozen fsyncs)."""
        old = self.current
        if not old.stats.messages:
            self.apply_mark(index, term)
            return
        new = self.next.take_now(old.generation + 1)
        self._write_checkpoint(sync=new is None)
        now = max(clock, self.cooker.last_timestamp)
        self._applied = (index, term)
        checkpoint = _checkpoint_value(self._applied, self._writers)
        if new is None:
            new = _create_slab(self.path, old.generation + 1, self.thresholds, now,
                               self.compression, checkpoint)
            self.open_slabs.acquire(new)
        else:
            new.activate(now, checkpoint, sync=False)
            self._uncommitted.append((old, new))
        self._checkpointed = True
        self._switch(old, new, now)

    def apply_drop(self, cutoff: int, index: int, term: int) -> list[int]:
        """Sealed generations that ended before `cutoff` leave the shard now; their
        directories are removed in the background."""
        dropped = [
            generation for generation, slab in self.slabs.items()
            if slab is not self.current and slab.sealed_at is not None
            and slab.sealed_at < cutoff and generation not in self._sealing
        ]
        loop = asyncio.get_running_loop()
        for generation in dropped:
            slab = self.slabs.pop(generation)
            self.open_slabs.drop(slab)
            loop.run_in_executor(self.executor, shutil.rmtree, slab.path, True)
            self._on_change(self.index, generation, None)
        self.apply_mark(index, term)
        return dropped

    def apply_load(self, load: Load, index: int, term: int) -> None:
        """A generation restored from a backup (broker/backup), in chunks. The first takes
        the place of the current generation, which must hold no message, with a synced
        checkpoint at this command, so a restart (a crash mid-load) replays the chunks after
        it; the last reads the generation's counters and
        topic structure back from what it holds and, when it was sealed, rotates as
        `apply_rotate` does. A load into a shard holding data is refused, by every replica
        alike."""
        old = self.current
        if load.flags & LOAD_FIRST:
            self.commit()
            self.next.discard()  # generations are numbered from the archive's now
            if (load.generation < old.generation or max(self.slabs) > old.generation
                    or old.stats.messages):
                raise BadCommand(f"shard {self.index}: no load of generation"
                                 f" {load.generation} into a shard holding data")
            self.slabs.pop(old.generation)
            self.open_slabs.drop(old, writer_pin=True)
            shutil.rmtree(old.path)
            self._on_change(self.index, old.generation, None)
            self._applied = (index, term)
            new = _create_slab(self.path, load.generation, self.thresholds, now_us(),
                               self.compression, _checkpoint_value(self._applied, self._writers))
            self.open_slabs.acquire(new)
            self.slabs[new.generation] = self.current = old = new
            self._checkpointed = True
        elif old.generation != load.generation:
            raise BadCommand(f"shard {self.index}: a chunk of generation {load.generation}"
                             f" while {old.generation} is current")
        prepared = old.db.write_batch()
        for key, value in load.pairs:
            prepared.put(key, value)
        prepared.write()
        self._applied = (index, term)
        if load.flags & LOAD_LAST:
            old.reload()
            old.count_after_checkpoint()  # its counters: the archive's, behind its data
            self.cooker = Cooker(old.lts, old.stats,
                                 max(self.cooker.last_timestamp, old.stats.max_timestamp))
            self._write_checkpoint(sync=True)
            if load.sealed_at:
                self.apply_rotate(load.sealed_at, index, term)

    async def close(self) -> None:
        """Writes what is buffered and a last checkpoint. On a full volume the checkpoint
        may fail: the shard closes all the same, and the next start counts what followed
        the previous one, as after a crash (and finishes a seal that failed)."""
        await self.buffer.drain()
        self.next.wanted = False
        try:
            await self.wait_sealed()
            self._write_checkpoint(sync=True)
        except (plyvel.Error, OSError) as error:
            log.warning("shard %d closed without its last checkpoint: %s", self.index, error)
        await asyncio.get_running_loop().run_in_executor(self.executor, self.next.discard)

    def info(self) -> dict[str, Any]:
        return {
            "shard": self.index,
            "generations": [
                {
                    "generation": slab.generation,
                    "state": "sealed" if slab.sealed else "current",
                    "since": slab.created,
                    "until": slab.sealed_at,
                    "min_timestamp": slab.stats.min_timestamp,
                    "max_timestamp": slab.stats.max_timestamp,
                    "messages": slab.stats.messages,
                    "bytes": slab.stats.size,
                    "streams": len(slab.lts.streams()),
                }
                for slab in self.slabs.values()
            ],
        }


def _rotation_cut_short(slab: Slab, max_bytes: int) -> bool:
    """builtin_raft: the current slab's checkpoint counts it full. A STORE that fills a slab
    rotates it at once (apply_store), syncing that checkpoint first: a crash before the next
    slab existed leaves this."""
    return (not slab.sealed and slab.db.get(CHECKPOINT_KEY) is not None
            and slab.stats.size >= max_bytes)


def _checkpoint_value(applied: tuple[int, int], writers: dict[str, int]) -> bytes:
    return _APPLIED.pack(*applied) + json.dumps(writers).encode()


def checkpoint_at(checkpoint: bytes | None, index: int, term: int) -> bytes:
    """A slab's checkpoint (or none) moved to (index, term), its writers kept: a snapshot's
    current slab as installed."""
    return _APPLIED.pack(index, term) + (checkpoint[_APPLIED.size:] if checkpoint else b"{}")


def load_slabs(index: int, path: Path, thresholds: tuple[int, ...], max_generation_bytes: int,
               compression: Compression) -> list[Slab]:
    """Blocking: every slab's state, the interrupted seals and rotations finished; only the
    current generation is left open. Touches nothing outside `path`, so the shards of a
    database load on threads side by side (MessagesDB)."""
    path.mkdir(parents=True, exist_ok=True)
    for leftover in path.glob(f"{_GEN_PREFIX}*{_TMP_SUFFIX}"):
        shutil.rmtree(leftover)  # a creation that did not finish holds no data
    generations = sorted(
        int(child.name[len(_GEN_PREFIX):]) for child in path.glob(f"{_GEN_PREFIX}*")
    )
    slabs = [Slab.open(generation_dir(path, g), g, compression) for g in generations]
    while slabs and not slabs[-1].sealed and slabs[-1].spare:
        spare = slabs.pop()  # made ahead, or activated by a rotation the log replays
        spare.close()
        shutil.rmtree(spare.path)
    for slab in slabs[:-1]:
        if not slab.sealed:
            log.info("finishing the seal of %s", slab.path)
            slab.seal(max(slab.created, slab.stats.max_timestamp), index)
            slab.close()
    if slabs and _rotation_cut_short(slabs[-1], max_generation_bytes):
        # The log will not replay the STORE that filled it: the rotation that STORE
        # started is finished here as every other replica finished it (apply_rotate).
        full = slabs[-1]
        log.info("finishing the rotation of %s", full.path)
        until = full.stats.max_timestamp
        slabs.append(_create_slab(path, full.generation + 1, thresholds, until, compression,
                                  full.db.get(CHECKPOINT_KEY)))
        full.seal(until, index)
        full.close()
    elif not slabs or slabs[-1].sealed:
        after = slabs[-1].generation + 1 if slabs else generations[0] if generations else 1
        slabs.append(_create_slab(path, after, thresholds, now_us(), compression))
    return slabs


def _create_slab(shard_dir: Path, generation: int, thresholds: tuple[int, ...], now: int,
                 compression: Compression, checkpoint: bytes | None = None,
                 spare: bool = False) -> Slab:
    """Built under a temporary name and renamed, so a crash never leaves a half-made slab
    that looks real."""
    final = generation_dir(shard_dir, generation)
    tmp = final.with_name(final.name + _TMP_SUFFIX)
    slab = Slab.create(tmp, generation, thresholds, now, compression, spare)
    if checkpoint is not None:
        slab.db.put(CHECKPOINT_KEY, checkpoint, sync=True)
    slab.close()
    tmp.rename(final)
    fsync_dir(shard_dir)
    return Slab.open(final, generation, compression)
