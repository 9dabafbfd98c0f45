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

It moves through files on both nodes and is dumped on a worker thread (broker/raft/spool.py).
What the thread reads is fixed on the loop when the dump starts. For a shard: the checkpoint
is written, the current slab is read through a LevelDB snapshot (it goes on taking writes)
and pinned, and the sealed ones, immutable, are pinned by the thread as it reads them
(OpenSlabs); a sealed one dropped meanwhile fails the dump, and the next request starts
another. For the sessions database: a LevelDB snapshot of it.

Installing a snapshot writes it, a few MiB per LevelDB batch, the last one synced, into new
directories beside the database (`<dir>.snapshot`), then swaps them in (files.swap_in): a
crash leaves the old database or the new one, never a mix (files.recover_swap at the next
start). """

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import shutil
import struct
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Final

import plyvel  # type: ignore[import-untyped]

from broker.ds import files
from broker.ds import replication_layer as cmd
from broker.ds.db import MessagesDB
from broker.ds.kv import KVStore
from broker.ds.shard import Shard
from broker.ds.shard_snapshot import (
    SlabBuilder,
    pairs,
    write_pairs,
    write_slabs,
    write_slabs_and_files,
)
from broker.ds.shipped import (
    FORMAT_RECORD,
    Receiver,
    install_files,
    staging_of,
)
from broker.ds.slab import Compression, SlabClosed
from broker.ds.ttv import TTV
from broker.raft.host import ApplyFailed, PendingInstall
from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk, SnapshotMeta
from broker.raft.spool import (
    FILE_BUFFER,
    DumpWriter,
    Pace,
    SnapshotSpool,
    Splice,
)

log = logging.getLogger(__name__)

_APPLIED: Final = struct.Struct(">QQ")
APPLIED_KEY: Final = b"A" + b"raft_applied"  # sessions: the last command applied
SNAPSHOT_KEY: Final = b"A" + b"raft_snapshot"  # (index, term, config) of the last installed
# Writer -> serial of its last KV command applied: a database key, so snapshots carry it.
CHAINS_KEY: Final = b"A" + b"raft_kv_chains"
# A replica's own: the snapshot installed sets them.
_NOT_DUMPED: Final = frozenset({APPLIED_KEY, SNAPSHOT_KEY})


class _Machine:
    """What both machines share: applied index, flush bookkeeping, snapshot files."""

    def __init__(self, applied: tuple[int, int], directory: Path, name: str,
                 pace: Pace | None = None) -> None:
        self.applied_index, self.applied_term = applied
        # What LevelDB recovered at start is not known to be synced: 0 until a flush.
        self.flushed_index = 0
        self.unflushed_bytes = 0
        self.bad_commands = 0
        self.spool = SnapshotSpool(directory, name, self._executor, self._start_dump, pace)
        self._proposed: tuple[bytes, list[TTV]] | None = None

    def proposing(self, data: bytes, messages: list[TTV]) -> None:
        """This node proposes `data`, the encoding of `messages`: applied without decoding
        (the log hands back the very same bytes object)."""
        self._proposed = (data, messages)

    def apply(self, entry: Entry) -> None:
        try:
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
        except (plyvel.Error, SlabClosed, OSError) as failure:  # its storage: `rewind`, again
            # (Not `error`, the BadCommand above: compiled, a name keeps one type.)
            raise ApplyFailed(f"{self.spool.name}: entry {entry.index}: {failure}",
                              failure) from failure
        self.applied_index, self.applied_term = entry.index, entry.term

    def snapshot_chunk(self, index: int, offset: int) -> tuple[int, bytes, bool] | None:
        return self.spool.chunk(self.applied_index, index, offset)

    def install_chunk(self, chunk: SnapshotChunk) -> int | PendingInstall | None:
        meta = _APPLIED.pack(chunk.index, chunk.term) + chunk.config.encode()
        try:
            installed = self.spool.receive(
                chunk, lambda path: self._install(path, chunk.index, chunk.term, meta))
        except (plyvel.Error, OSError) as failure:  # kept as it was: the transfer starts over
            raise ApplyFailed(f"{self.spool.name}: snapshot {chunk.index} at offset"
                              f" {chunk.offset}: {failure}", failure) from failure
        if installed:
            self._installed(chunk)
        return None

    def _installed(self, chunk: SnapshotChunk) -> None:
        self.applied_index, self.applied_term = chunk.index, chunk.term
        self.flushed_index = chunk.index

    def flush(self) -> int:
        """Syncs what was applied; returns the index the log may be compacted up to."""
        if self.flushed_index < self.applied_index:
            self._mark(self.applied_index, self.applied_term, sync=True)
            self.flushed_index = self.applied_index
        self.unflushed_bytes = 0
        self.spool.drop_idle()
        return min([self.flushed_index, *self.spool.kept()])

    def _apply(self, entry: Entry) -> None:
        raise NotImplementedError

    def _rewound(self, applied: tuple[int, int]) -> int:
        """The machine at what its reopened storage holds (see `rewind`)."""
        self.applied_index, self.applied_term = applied
        self.flushed_index = min(self.flushed_index, self.applied_index)
        self._proposed = None
        return self.applied_index

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        raise NotImplementedError

    def _executor(self) -> concurrent.futures.Executor:
        raise NotImplementedError

    def _start_dump(self) -> tuple[DumpWriter, Callable[[], None]]:
        """On the loop: fixes what the dump reads (see spool.py)."""
        raise NotImplementedError

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        raise NotImplementedError


def _snapshot_meta(raw: bytes | None) -> SnapshotMeta | None:
    if not raw:
        return None
    index, term = _APPLIED.unpack_from(raw)
    return SnapshotMeta(index, term, Config.decode(raw[_APPLIED.size:]))


def _always() -> bool:
    return True


class ShardMachine(_Machine):
    """One shard of the messages database; `reopen` rebuilds the shard object after a
    snapshot replaced its directory. `ship_files`: whether its snapshots may ship sealed
    generations as files (version 2, shipped.py; the cluster's effective version says
    whether every node reads them); `pace`: the node's byte rate for snapshot chunks."""

    def __init__(self, db: MessagesDB, index: int, reopen: Callable[[int], Shard],
                 ship_files: Callable[[], bool] = _always, pace: Pace | None = None) -> None:
        self._db = db
        self.index = index
        self._reopen = reopen
        self._ship_files = ship_files
        # A version 2 snapshot being received.
        self._receiver: Receiver[SlabBuilder] | None = None
        db.create([index])  # a group applies to its shard, written or not
        super().__init__(self.shard.applied(), self.shard.path, f"messages shard {index}",
                         pace)

    def ships_sealed(self) -> bool:
        """Whether a snapshot would ship sealed generations as files, faster than a new
        replica rebuilds them from the log (the Raft core's `snapshot_empty_followers`)."""
        shard = self.shard
        return self._ship_files() and any(
            slab.sealed_at is not None and slab is not shard.current
            for slab in shard.slabs.values())

    def install_chunk(self, chunk: SnapshotChunk) -> int | PendingInstall | None:
        """Version 1 through the spool's file; version 2 (its first record says so) through
        a Receiver, which may have the transfer resume elsewhere (shipped.py)."""
        if chunk.offset == 0:
            self._drop_receiver()
            if chunk.data[:1] == bytes((FORMAT_RECORD,)):
                compression = self.shard.compression
                self._receiver = Receiver(
                    staging_of(self.shard.path),
                    lambda directory: SlabBuilder(directory, compression),
                    self.shard.executor)
        receiver = self._receiver
        if receiver is None:
            return super().install_chunk(chunk)
        try:
            resume = receiver.feed(chunk.offset, chunk.data)
            if resume is not None or not chunk.done:
                return resume
        except (plyvel.Error, OSError, cmd.BadCommand) as failure:
            self._drop_receiver()
            raise self._failed(chunk, failure) from failure
        self._receiver = None  # the install's now
        self.spool.end_dump()
        self.spool.drop()
        return self._install_shipped(receiver, chunk)

    def _failed(self, chunk: SnapshotChunk, failure: Exception) -> ApplyFailed:
        """The shard is kept as it was; the transfer starts over, what was received whole
        is kept."""
        return ApplyFailed(f"{self.spool.name}: snapshot {chunk.index} at offset"
                           f" {chunk.offset}: {failure}", failure)

    def _drop_receiver(self) -> None:
        if self._receiver is not None:
            self._receiver.close()
            self._receiver = None

    def _install_shipped(self, receiver: Receiver[SlabBuilder], chunk: SnapshotChunk
                         ) -> PendingInstall:
        """On a thread of its own (the event loop serves the node's other groups
        meanwhile): the received files synced, the slabs sent as records (built as they
        came) finished and moved, with the files, into a directory beside the shard's.
        Then, on the loop: that directory swapped in."""
        staging = receiver.staging
        meta = _APPLIED.pack(chunk.index, chunk.term) + chunk.config.encode()
        job: list[concurrent.futures.Future[None]] = []

        def build() -> None:
            try:
                synced = receiver.synced()
                builder = receiver.take_records()
            finally:
                receiver.close()
            try:
                def fill(fresh: Path) -> None:
                    builder.finish(self.index, chunk.index, chunk.term, [(SNAPSHOT_KEY, meta)])
                    fresh.mkdir(parents=True)
                    for built in builder.directory.iterdir():
                        os.replace(built, fresh / built.name)
                    files.fsync_dir(fresh)
                    install_files(fresh, receiver.files, staging, synced)

                files.build_staged(self.shard.path, fill)
            finally:
                builder.close()

        def start(done: Callable[[], object]) -> None:
            thread = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="snapshot-install")
            job.append(thread.submit(build))
            thread.shutdown(wait=False)
            # Meanwhile the shard's seals under way end (finish closes its slabs).
            over = asyncio.gather(asyncio.wrap_future(job[0]), self.shard.wait_sealed(),
                                  return_exceptions=True)
            over.add_done_callback(lambda _: done())

        def finish() -> int | None:
            try:
                job[0].result()
                self._db.close_shard_now(self.index)
                files.swap_in(self.shard.path)
                self._reopen(self.index)
            except (plyvel.Error, SlabClosed, OSError, cmd.BadCommand) as failure:
                raise self._failed(chunk, failure) from failure
            shutil.rmtree(staging, ignore_errors=True)
            log.info("messages shard %d replaced by a snapshot at index %d: %d files"
                     " shipped, %d kept from an earlier transfer, %d fetched again",
                     self.index, chunk.index, len(receiver.files), receiver.skipped,
                     receiver.refetched)
            self._installed(chunk)
            return None

        return PendingInstall(start, finish)

    @property
    def shard(self) -> Shard:
        return self._db.shard(self.index)

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
        elif kind == cmd.LOAD:
            shard.apply_load(cmd.decode_load(data), entry.index, entry.term)
        else:
            raise cmd.BadCommand(f"command kind {kind} in a messages shard")

    def rewind(self) -> int:
        """Blocking: the shard reopened from its directory, as at a restart (its current
        generation at its checkpoint; interrupted rotations and seals finished)."""
        self._db.close_shard_now(self.index)
        self._reopen(self.index)
        return self._rewound(self.shard.applied())

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        self.shard.apply_mark(index, term, sync)

    def _executor(self) -> concurrent.futures.Executor:
        return self.shard.executor

    def _start_dump(self) -> tuple[DumpWriter, Callable[[], None]]:
        shard = self.shard
        shard.checkpoint_now()  # the current slab's counters and checkpoint: its data's
        current = shard.current
        open_slabs = shard.open_slabs
        open_slabs.acquire(current)  # open: pinned, not opened
        try:
            view = current.db.snapshot()
        except BaseException:
            open_slabs.release(current)
            raise
        slabs = [(slab, slab.sealed_at or 0) for _, slab in sorted(shard.slabs.items())]
        thresholds = json.dumps(list(shard.thresholds)).encode()

        def release() -> None:
            view.close()
            open_slabs.release(current)

        if self._ship_files():
            return functools.partial(write_slabs_and_files, slabs=slabs, current=current,
                                     view=view, open_slabs=open_slabs, thresholds=thresholds,
                                     links=self.spool.links), release
        def write(file: IO[bytes], stop: threading.Event, _splice: Splice) -> None:
            write_slabs(file, stop, slabs, current, view, open_slabs, thresholds)

        return write, release

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        """Blocking: builds the shard's slabs in a new directory, then swaps it in."""
        compression = self.shard.compression
        files.rebuild(self.shard.path,
                      lambda fresh: _build_slabs(fresh, snapshot, self.index, index, term,
                                                 meta, compression),
                      lambda: self._db.close_shard_now(self.index))
        self._reopen(self.index)
        log.info("messages shard %d replaced by a snapshot at index %d", self.index, index)


def _build_slabs(fresh: Path, snapshot: Path, shard: int, index: int, term: int,
                 meta: bytes, compression: Compression) -> None:
    """A shard snapshot's slabs written into `fresh`, the sealed ones sealed once written."""
    builder = SlabBuilder(fresh, compression)
    try:
        with snapshot.open("rb") as file:
            while data := file.read(FILE_BUFFER):
                builder.feed(data)
        builder.finish(shard, index, term, [(SNAPSHOT_KEY, meta)])
    except BaseException:
        builder.close()
        raise


# (writer, writes, stored value of a key, the command's serial) -> (the admitted writes,
# the refused client IDs)
Admit = Callable[[str, list[cmd.KVWrite], Callable[[bytes], bytes | None], int],
                 tuple[list[cmd.KVWrite], set[str]]]
SessionsOf = Callable[[list[cmd.KVWrite]], set[str]]  # the client IDs whose keys are written
# (writes applied, whether they replace everything: a snapshot's whole content)
OnWrites = Callable[[Iterable[cmd.KVWrite], bool], None]


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
                 on_writes: OnWrites | None = None,
                 admit: Admit | None = None, me: str = "",
                 on_refused: Callable[[set[str]], None] | None = None,
                 sessions_of: SessionsOf | None = None, pace: Pace | None = None) -> None:
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
        super().__init__(_APPLIED.unpack(raw) if raw else (0, 0), kv.path,
                         "the sessions database", pace)

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

    def rewind(self) -> int:
        """Blocking: the database reopened (LevelDB refuses writes after a failed one until
        then), and the chains and applied index it holds (each command's writes carry
        them)."""
        self.kv.reopen()
        self.chains = _stored_chains(self.kv)
        raw = self.kv.raw_get(APPLIED_KEY)
        return self._rewound(_APPLIED.unpack(raw) if raw else (0, 0))

    def lost(self, writes: list[cmd.KVWrite]) -> None:
        """This node's `writes` will never be applied (refused whole here, or not committed
        in time): their sessions are told, as for refused writes."""
        self._refused(self.sessions_of(writes) if self.sessions_of else set())

    def _refused(self, client_ids: set[str]) -> None:
        if client_ids and self.on_refused is not None:
            self.on_refused(client_ids)

    def _mark(self, index: int, term: int, sync: bool = False) -> None:
        self.kv.apply([], [(APPLIED_KEY, _APPLIED.pack(index, term))], sync)

    def _executor(self) -> concurrent.futures.Executor:
        return self.kv.executor

    def _start_dump(self) -> tuple[DumpWriter, Callable[[], None]]:
        view = self.kv.view()

        def write(file: IO[bytes], stop: threading.Event, _splice: Splice) -> None:
            write_pairs(file, stop, view.iterator(), _NOT_DUMPED)

        return write, view.close

    def _install(self, snapshot: Path, index: int, term: int, meta: bytes) -> None:
        self.kv.replace(pairs(snapshot),
                        [(APPLIED_KEY, _APPLIED.pack(index, term)), (SNAPSHOT_KEY, meta)])
        self.chains = _stored_chains(self.kv)
        if self.on_writes is not None:
            self.on_writes(self.kv.raw_items(), True)
        log.info("the sessions database replaced by a snapshot at index %d", index)
