"""Durable Storage's databases as Raft state machines (backend `builtin_raft`).

`ShardMachine` is one shard of `messages`, `KVMachine` the `sessions` database. Both apply
committed commands (replication_layer.py) to LevelDB without fsync, with the applied index
in the same atomic write: the Raft log is the durable copy, and after a crash the log
replays what LevelDB lost. `flush` syncs LevelDB and answers the index up to which the log
may be compacted.

A snapshot is the database's content at the applied index as one byte string, cut into
chunks by offset:

    snapshot := record*
    record   := kind:u8  length:u32  bytes
    kind 1   := a slab: generation:u64 created:u64 sealed_at:u64 (0: current) thresholds
                (JSON); the key/value records that follow are that slab's
    kind 2   := a key/value pair: klen:u32 key value

The sender spools it to a file beside the database (`<dir>.snapshot-out`) and reads each
chunk asked for from there; the receiver appends chunks to `<dir>.snapshot-in`. Neither holds
more than a chunk in memory: a shard's snapshot is as large as the shard (up to
`generation_max_size` per generation), far more than a node may hold. The spooled one serves
every transfer that asks for a snapshot (a follower that starts over, another one catching
up) until its last chunk is sent or it lies unused for `SPOOL_IDLE_SECONDS`; meanwhile
`flush` keeps the log from being compacted past it, so it stays one the leader can send. A
crash leaves at most these two files, removed at the next start.

A shard is dumped on a worker thread: reading a whole shard would hold the event loop for
seconds, long enough for every group this node leads to lose it. What the thread reads is
fixed on the loop when the dump starts: the checkpoint is written, the current slab is read
through a LevelDB snapshot (it goes on taking writes) and pinned, and the sealed ones,
immutable, are pinned by the thread as it reads them (OpenSlabs); a sealed one dropped
meanwhile fails the dump, and the next request starts another. Until the file is complete
the machine answers None; then `on_dumped` has the core ask again. The sessions database is
dumped on the loop.

Installing a shard's snapshot writes it, a few MiB per LevelDB batch, to a new directory and
swaps it in, then reopens the shard there; the sessions database is replaced in one atomic
batch. """

import asyncio
import concurrent.futures
import json
import logging
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.ds import replication_layer as cmd
from broker.ds.db import MessagesDB
from broker.ds.kv import KVStore
from broker.ds.open_slabs import OpenSlabs
from broker.ds.shard import Shard, checkpoint_at, generation_dir
from broker.ds.slab import CHECKPOINT_KEY, Slab
from broker.ds.ttv import TTV
from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk, SnapshotMeta

log = logging.getLogger(__name__)

CHUNK_BYTES: Final = 256 << 10
# LevelDB batch size when a snapshot's slabs are written (their directory is not in use yet,
# so a slab need not be one atomic batch).
INSTALL_BATCH_BYTES: Final = 4 << 20
_SPOOL_BUFFER: Final = 1 << 20
SPOOL_IDLE_SECONDS: Final = 30.0
_RECORD: Final = struct.Struct(">BI")
_SLAB: Final = struct.Struct(">QQQ")
_U32: Final = struct.Struct(">I")
_APPLIED: Final = struct.Struct(">QQ")
_SLAB_RECORD: Final = 1
_PAIR_RECORD: Final = 2
APPLIED_KEY: Final = b"A" + b"raft_applied"  # sessions: the last command applied
SNAPSHOT_KEY: Final = b"A" + b"raft_snapshot"  # (index, term, config) of the last installed
# Writer -> serial of its last KV command applied: a database key, so snapshots carry it.
CHAINS_KEY: Final = b"A" + b"raft_kv_chains"


def _record(kind: int, data: bytes) -> bytes:
    return _RECORD.pack(kind, len(data)) + data


def _pair(key: bytes, value: bytes) -> bytes:
    return _record(_PAIR_RECORD, _U32.pack(len(key)) + key + value)


def _records(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb", buffering=_SPOOL_BUFFER) as file:
        while head := file.read(_RECORD.size):
            if len(head) < _RECORD.size:
                raise cmd.BadCommand("a snapshot cut short in a record's head")
            kind, length = _RECORD.unpack(head)
            body = file.read(length)
            if len(body) < length:
                raise cmd.BadCommand("a snapshot cut short in a record")
            yield kind, body


def _split_pair(body: bytes) -> tuple[bytes, bytes]:
    (klen,) = _U32.unpack_from(body)
    return body[4:4 + klen], body[4 + klen:]


class _Machine:
    """What both machines share: applied index, flush bookkeeping, snapshot chunking."""

    def __init__(self, applied: tuple[int, int], directory: Path) -> None:
        self.applied_index, self.applied_term = applied
        # What LevelDB recovered at start is not known to be synced: 0 until a flush.
        self.flushed_index = 0
        self.unflushed_bytes = 0
        self.bad_commands = 0
        self._outgoing_path = directory.with_name(directory.name + ".snapshot-out")
        self._incoming_path = directory.with_name(directory.name + ".snapshot-in")
        for leftover in (self._outgoing_path, self._incoming_path):
            leftover.unlink(missing_ok=True)
        self._outgoing: tuple[int, int] | None = None  # the spooled one's index and size
        self._spool_used = 0.0  # when a chunk of it was last read (monotonic)
        self.spool_idle = SPOOL_IDLE_SECONDS
        self._proposed: tuple[bytes, list[TTV]] | None = None

    def proposing(self, data: bytes, messages: list[TTV]) -> None:
        """This node proposes `data`, the encoding of `messages`: applied without decoding
        (the log hands back the very same bytes object)."""
        self._proposed = (data, messages)

    def apply(self, entry: Entry) -> None:
        if entry.kind == NORMAL and not cmd.is_barrier(entry.data):
            self.unflushed_bytes += len(entry.data)
            try:
                self._apply(entry)
            except cmd.BadCommand as error:
                # Every replica skips it alike: the replicas stay the same.
                self.bad_commands += 1
                log.error("skipping command %d: %s", entry.index, error)
                self._mark(entry.index, entry.term)
        else:
            self._mark(entry.index, entry.term)
        self.applied_index, self.applied_term = entry.index, entry.term

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        outgoing = self._outgoing
        if outgoing is None:
            outgoing = self._spool()
            if outgoing is None:
                return None
            offset = 0
        elif index not in (0, outgoing[0]):
            return None  # one no longer kept: the core starts over, and gets the one spooled
        at, size = outgoing
        with self._outgoing_path.open("rb") as file:
            file.seek(offset)
            data = file.read(CHUNK_BYTES)
        done = offset + len(data) >= size
        self._spool_used = time.monotonic()
        if done:
            self._drop_spool()
        return at, data, done

    def _spool(self) -> tuple[int, int] | None:
        """A new snapshot of the applied state into the spool file: its (index, size), or
        None while it is being written."""
        with self._outgoing_path.open("wb", buffering=_SPOOL_BUFFER) as file:
            for piece in self._dump():
                file.write(piece)
            self._outgoing = (self.applied_index, file.tell())
        return self._outgoing

    def _drop_spool(self) -> None:
        self._outgoing = None
        self._outgoing_path.unlink(missing_ok=True)

    def install_chunk(self, chunk: SnapshotChunk) -> None:
        # The core hands chunks over in order, from offset 0 (core.py `_on_snapshot`).
        path = self._incoming_path
        with path.open("wb" if chunk.offset == 0 else "ab") as file:
            file.write(chunk.data)
        if not chunk.done:
            return
        meta = _APPLIED.pack(chunk.index, chunk.term) + chunk.config.encode()
        try:
            self._install(path, chunk.index, chunk.term, meta)
        finally:
            path.unlink()
        self.applied_index, self.applied_term = chunk.index, chunk.term
        self.flushed_index = chunk.index

    def flush(self) -> int:
        """Syncs what was applied; returns the index the log may be compacted up to."""
        if self.flushed_index < self.applied_index:
            self._mark(self.applied_index, self.applied_term, sync=True)
            self.flushed_index = self.applied_index
        self.unflushed_bytes = 0
        self.drop_idle_spool()
        return min([self.flushed_index, *self._kept()])

    def _kept(self) -> list[int]:
        """The indexes of the snapshots being sent or prepared: the log keeps what follows."""
        return [] if self._outgoing is None else [self._outgoing[0]]

    def drop_idle_spool(self) -> None:
        """Removes a spooled snapshot no transfer read for `spool_idle` seconds: its
        transfers were given up (a follower that asks again gets a new one)."""
        if (self._outgoing is not None
                and time.monotonic() - self._spool_used > self.spool_idle):
            self._drop_spool()

    def _apply(self, entry: Entry) -> None:
        raise NotImplementedError

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        raise NotImplementedError

    def _dump(self) -> Iterator[bytes]:
        """The snapshot's records (the sessions database's, read on the event loop)."""
        raise NotImplementedError

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        raise NotImplementedError


def _snapshot_meta(raw: bytes | None) -> SnapshotMeta | None:
    if not raw:
        return None
    index, term = _APPLIED.unpack_from(raw)
    return SnapshotMeta(index, term, Config.decode(raw[_APPLIED.size:]))


class DumpStopped(Exception):
    pass


class _Dump:
    """A shard's dump under way: its thread's job and what the loop fixed for it."""

    __slots__ = ("current", "done", "index", "job", "open_slabs", "stop", "view")

    def __init__(self, index: int, job: "concurrent.futures.Future[int]",
                 stop: threading.Event, view: Any, current: Slab, open_slabs: OpenSlabs,
                 done: "asyncio.Future[None]") -> None:
        self.index = index
        self.job = job
        self.stop = stop
        self.view = view  # the current slab's LevelDB snapshot
        self.current = current
        self.open_slabs = open_slabs
        self.done = done

    def release(self) -> None:
        self.view.close()
        self.open_slabs.release(self.current)


def _write_dump(path: Path, slabs: list[tuple[Slab, int]], current: Slab, view: Any,
                open_slabs: OpenSlabs, thresholds: bytes, stop: threading.Event) -> int:
    """On a worker thread: the shard's snapshot into `path`; returns its size."""
    with path.open("wb", buffering=_SPOOL_BUFFER) as file:
        for slab, sealed_at in slabs:
            file.write(_record(_SLAB_RECORD, _SLAB.pack(slab.generation, slab.created,
                                                         sealed_at) + thresholds))
            if slab is current:
                _write_pairs(file, view.iterator(), stop)
                continue
            open_slabs.acquire(slab)
            try:
                _write_pairs(file, slab.db.iterator(), stop)
            finally:
                open_slabs.release(slab)
        return file.tell()


def _write_pairs(file: IO[bytes], items: Any, stop: threading.Event) -> None:
    try:
        for n, (key, value) in enumerate(items):
            if not n % 1024 and stop.is_set():
                raise DumpStopped
            file.write(_pair(key, value))
    finally:
        items.close()


class ShardMachine(_Machine):
    """One shard of the messages database; `reopen` rebuilds the shard object after a
    snapshot replaced its directory."""

    def __init__(self, db: MessagesDB, index: int, reopen: Callable[[int], Shard]) -> None:
        self._db = db
        self.index = index
        self._reopen = reopen
        super().__init__(self.shard.applied(), self.shard.path)
        self._dumping: _Dump | None = None
        self._refuse_dumps = False
        # The last dump started: done once its file is complete, or it failed or stopped.
        self.dumped: asyncio.Future[None] | None = None
        self.on_dumped: Callable[[], None] | None = None  # a dump's file is complete

    @property
    def shard(self) -> Shard:
        return self._db.shards[self.index]

    def snapshot(self) -> SnapshotMeta | None:
        return _snapshot_meta(self.shard.current.db.get(SNAPSHOT_KEY))

    def _apply(self, entry: Entry) -> None:
        data = entry.data
        kind = cmd.kind_of(data)
        shard = self.shard
        if kind == cmd.STORE:
            proposed = self._proposed
            mine = proposed is not None and proposed[0] is data
            store = cmd.decode_store(data, proposed[1] if mine and proposed else None)
            if mine:
                self._proposed = None
            shard.apply_store(store, entry.index, entry.term)
        elif kind == cmd.ROTATE:
            shard.apply_rotate(cmd.decode_clock(data), entry.index, entry.term)
        elif kind == cmd.DROP:
            shard.apply_drop(cmd.decode_clock(data), entry.index, entry.term)
        else:
            raise cmd.BadCommand(f"command kind {kind} in a messages shard")

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        self.shard.apply_mark(index, term, sync)

    def _kept(self) -> list[int]:
        kept = super()._kept()
        return kept if self._dumping is None else [*kept, self._dumping.index]

    def _spool(self) -> tuple[int, int] | None:
        """Starts dumping the shard on a worker thread (see the module docstring)."""
        if self._dumping is not None or self._refuse_dumps:
            return None
        shard = self.shard
        shard.checkpoint_now()  # the current slab's counters and checkpoint: its data's
        current = shard.current
        shard.open_slabs.acquire(current)  # open: pinned, not opened
        try:
            view = current.db.snapshot()
        except BaseException:
            shard.open_slabs.release(current)
            raise
        loop = asyncio.get_running_loop()
        stop = threading.Event()
        slabs = [(slab, slab.sealed_at or 0) for _, slab in sorted(shard.slabs.items())]
        thresholds = json.dumps(list(shard.thresholds)).encode()
        job = shard.executor.submit(_write_dump, self._outgoing_path, slabs, current, view,
                                    shard.open_slabs, thresholds, stop)
        dump = self._dumping = _Dump(self.applied_index, job, stop, view, current,
                                     shard.open_slabs, loop.create_future())
        self.dumped = dump.done
        job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._dumped, dump))
        return None

    def _dumped(self, dump: "_Dump") -> None:
        """On the loop, once the dump's thread ended (or at once, by `end_dump`)."""
        if self._dumping is not dump:
            return  # ended already
        self._dumping = None
        dump.release()
        job = dump.job
        if job.cancelled() or job.exception() is not None:
            if not dump.stop.is_set():
                log.warning("snapshot of messages shard %d at index %d failed: %r",
                            self.index, dump.index, job.exception())
            self._outgoing_path.unlink(missing_ok=True)
        else:
            self._outgoing = (dump.index, job.result())
            self._spool_used = time.monotonic()
            if self.on_dumped is not None:
                self.on_dumped()
        dump.done.set_result(None)

    def end_dump(self, for_good: bool = False) -> None:
        """Blocking: stops a dump under way (its thread ends at the next key), before
        the shard's slabs are closed under it; `for_good`: none starts any more (the node
        is stopping)."""
        self._refuse_dumps = self._refuse_dumps or for_good
        dump = self._dumping
        if dump is None:
            return
        dump.stop.set()
        concurrent.futures.wait([dump.job])
        self._dumped(dump)

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        """Blocking: builds the shard's slabs in a new directory, then swaps it in."""
        self.end_dump()
        self._drop_spool()
        shard = self.shard
        fresh = shard.path.with_name(shard.path.name + ".snapshot")
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir(parents=True)
        sealed: list[tuple[Path, int, int]] = []
        db: plyvel.DB | None = None
        batch: Any = None  # the open slab's LevelDB write batch
        batched = 0  # bytes in it
        checkpoint: bytes | None = None  # the last slab's (the current one: see _spool)
        for kind, body in _records(snapshot):
            if kind == _SLAB_RECORD:
                if db is not None:
                    batch.write()
                    db.close()
                checkpoint = None
                generation, _created, sealed_at = _SLAB.unpack_from(body)
                path = generation_dir(fresh, generation)
                db = plyvel.DB(str(path), create_if_missing=True)
                batch, batched = db.write_batch(), 0
                if sealed_at:
                    sealed.append((path, generation, sealed_at))
            elif kind == _PAIR_RECORD and db is not None:
                key, value = _split_pair(body)
                batch.put(key, value)
                batched += len(body)
                if batched >= INSTALL_BATCH_BYTES:
                    batch.write()
                    batch, batched = db.write_batch(), 0
                if key == CHECKPOINT_KEY:
                    checkpoint = value
        if db is None:  # a shard always has a current generation: this one is garbled
            raise cmd.BadCommand("a shard snapshot without a generation")
        batch.put(CHECKPOINT_KEY, checkpoint_at(checkpoint, index, term))
        batch.put(SNAPSHOT_KEY, meta)
        batch.write()
        db.close()
        for slab_path, generation, until in sealed:
            slab = Slab.open(slab_path, generation)
            slab.seal(until, self.index)
            slab.close()
        self._db.close_shard_now(self.index)
        retired = shard.path.with_name(shard.path.name + ".retired")
        shutil.rmtree(retired, ignore_errors=True)
        shard.path.rename(retired)
        fresh.rename(shard.path)
        shutil.rmtree(retired, ignore_errors=True)
        self._reopen(self.index)
        log.info("messages shard %d replaced by a snapshot at index %d", self.index, index)


# (writer, writes, stored value of a key, the command's serial) -> (the admitted writes,
# the refused client IDs)
Admit = Callable[[str, list[cmd.KVWrite], Callable[[bytes], bytes | None], int],
                 tuple[list[cmd.KVWrite], set[str]]]
SessionsOf = Callable[[list[cmd.KVWrite]], set[str]]  # the client IDs whose keys are written


def follows(last: int, command: cmd.KVCommand) -> bool | None:
    """Whether a replica applies a KV command whose writer's last applied one has serial
    `last` (0: none): True when it follows that one (or starts its writer's chain, after a
    restart); None to skip it as applied already (a retried copy, or one its writer gave up
    on and chained the next command past); False to refuse it: the command it follows was
    never applied, so applying it would leave a gap in its writer's writes."""
    if command.prev is None:
        return True
    if command.serial <= last:
        return None
    return command.prev in (0, last)


def _stored_chains(kv: KVStore) -> dict[str, int]:
    chains: dict[str, int] = json.loads(kv.raw_get(CHAINS_KEY) or b"{}")
    return chains


class KVMachine(_Machine):
    """The sessions database; `on_writes` hears every applied write (durable routes), with
    True when a snapshot replaced everything. `admit` picks, from a command's writes, those
    its writer may make given the replica's state (the database knows no owners: sessions
    do), so every replica drops the same ones; `on_refused` hears the client IDs refused
    to this node's own commands (`me`): some of their writes by `admit`, or all of a
    command that does not follow its writer's chain (`follows`; `sessions_of` names them)."""

    def __init__(self, kv: KVStore,
                 on_writes: Callable[[list[cmd.KVWrite], bool], None] | None = None,
                 admit: Admit | None = None, me: str = "",
                 on_refused: Callable[[set[str]], None] | None = None,
                 sessions_of: SessionsOf | None = None) -> None:
        self.kv = kv
        self.on_writes = on_writes
        self.admit = admit
        self.me = me
        self.on_refused = on_refused
        self.sessions_of = sessions_of
        self.refused_writes = 0  # sessions of a command some of whose writes were refused
        self.chain_breaks = 0  # commands refused whole: what they follow was never applied
        self.refused_serial = 0  # the last command of this node's refused whole
        self.chains = _stored_chains(kv)
        raw = kv.raw_get(APPLIED_KEY)
        super().__init__(_APPLIED.unpack(raw) if raw else (0, 0), kv.path)

    def snapshot(self) -> SnapshotMeta | None:
        return _snapshot_meta(self.kv.raw_get(SNAPSHOT_KEY))

    def _apply(self, entry: Entry) -> None:
        data = entry.data
        if cmd.kind_of(data) not in (cmd.KV, cmd.KV_V1):
            raise cmd.BadCommand(f"command kind {data[0]} in the sessions database")
        command = cmd.decode_kv(data)
        writer, writes = command.writer, command.writes
        step = follows(self.chains.get(writer, 0), command)
        if not step:
            if step is False:
                self.chain_breaks += 1
                if writer == self.me:
                    self.refused_serial = command.serial
                    self.lost(writes)
            self._mark(entry.index, entry.term)
            return
        extra = [(APPLIED_KEY, _APPLIED.pack(entry.index, entry.term))]
        if command.prev is not None:
            self.chains[writer] = command.serial
            extra.append((CHAINS_KEY, json.dumps(self.chains).encode()))
        refused: set[str] = set()
        if self.admit is not None:
            admitted, refused = self.admit(writer, writes, self.kv.raw_get, command.serial)
            self.refused_writes += len(refused)
            writes = admitted
        self.kv.apply(writes, extra)
        if self.on_writes is not None:
            self.on_writes(writes, False)
        if writer == self.me:
            self._refused(refused)

    def lost(self, writes: list[cmd.KVWrite]) -> None:
        """This node's `writes` will never be applied (refused whole here, or not committed
        in time): their sessions are told, as for refused writes."""
        self._refused(self.sessions_of(writes) if self.sessions_of else set())

    def _refused(self, client_ids: set[str]) -> None:
        if client_ids and self.on_refused is not None:
            self.on_refused(client_ids)

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        self.kv.apply([], [(APPLIED_KEY, _APPLIED.pack(index, term))], sync)

    def _dump(self) -> Iterator[bytes]:
        for key, value in self.kv.raw_items():
            if key not in (APPLIED_KEY, SNAPSHOT_KEY):
                yield _pair(key, value)

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        pairs = [_split_pair(body) for kind, body in _records(snapshot) if kind == _PAIR_RECORD]
        self.kv.replace(pairs, [(APPLIED_KEY, _APPLIED.pack(index, term)),
                                (SNAPSHOT_KEY, meta)])
        self.chains = _stored_chains(self.kv)
        if self.on_writes is not None:
            self.on_writes([(key, value) for key, value in pairs], True)
