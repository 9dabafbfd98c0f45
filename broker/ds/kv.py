"""A key-value database with optimistic transactions (tx.py): the `sessions` database.

Validated commits get a serial and enter an in-memory overlay at once, before they are on
disk, so the next transaction already sees them and is checked against them; the overlay
entry goes when the write is durable. A short log of (serial, keys written) answers "what
changed since serial N"; a transaction older than the log is treated as conflicting.
Commits are group-committed through the same write buffer as messages.
"""

import asyncio
import logging
import weakref
from bisect import bisect_left, insort
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Final

import plyvel  # type: ignore[import-untyped]

from broker.ds import bulk
from broker.ds.buffer import WriteBuffer
from broker.ds.cook import CookedBatch
from broker.ds.slab import prepare_batch, write_batch
from broker.ds.tx import Conflict, Transaction, check_preconditions, conflicts, overlay

log = logging.getLogger(__name__)

_LOG_LIMIT: Final = 100_000
Write = tuple[bytes, bytes | None]


class _Overlay:
    """Writes on their way to disk, by key, and their keys in order: a scan overlays those
    under its prefix only. (Each scan went through every write on its way: a node busy with
    sessions coming and going has thousands, and a CONNECT scans several prefixes.)"""

    def __init__(self) -> None:
        self.entries: dict[bytes, tuple[int, bytes | None]] = {}  # key -> (serial, value)
        self._keys: list[bytes] = []

    def put(self, key: bytes, serial: int, value: bytes | None) -> None:
        if key not in self.entries:
            insort(self._keys, key)
        self.entries[key] = (serial, value)

    def discard(self, key: bytes) -> None:
        if self.entries.pop(key, None) is not None:
            del self._keys[bisect_left(self._keys, key)]

    def under(self, prefix: bytes) -> list[tuple[bytes, bytes | None]]:
        keys = self._keys
        found: list[tuple[bytes, bytes | None]] = []
        for i in range(bisect_left(keys, prefix), len(keys)):
            key = keys[i]
            if not key.startswith(prefix):
                break
            found.append((key, self.entries[key][1]))
        return found

    def clear(self) -> None:
        self.entries.clear()
        self._keys.clear()


class KVStore:
    def __init__(
        self, name: str, path: Path, executor: Executor, buffer_settings: tuple[float, int, float]
    ) -> None:
        self.name = name
        self.path = path
        self._db = bulk.open_db(path)
        self.executor = executor
        self._serial = 0
        self._log: deque[tuple[int, frozenset[bytes]]] = deque(maxlen=_LOG_LIMIT)
        # Transactions begun and not committed, weakly: an abandoned one is simply forgotten.
        # Log entries no open transaction can conflict with are dropped, so the log costs
        # nothing when, as with durable sessions, every transaction commits right away.
        self._open: weakref.WeakValueDictionary[int, Transaction] = (
            weakref.WeakValueDictionary()
        )
        self._pending = _Overlay()
        self.buffer: WriteBuffer[Write] = WriteBuffer(self._flush, *buffer_settings)
        self.commits = 0
        # builtin_raft: a flush becomes a command of the sessions Raft group, which every
        # replica applies (`apply`); set by the cluster (broker/cluster/ds_groups.py).
        self.replicate: Callable[[list[Write]], Awaitable[None]] | None = None
        # Told of every failed write (DurableStorage: a lack of space closes its gate).
        self.on_error: Callable[[BaseException], object] | None = None
        self.failed = False
        self._reopen_first = False  # `recover` found a write on its way: the next reopens

    def get(self, key: bytes) -> bytes | None:
        pending = self._pending.entries.get(key)
        if pending is not None:
            return pending[1]
        return self._db.get(key)  # type: ignore[no-any-return]

    def scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        return self.scan_many((prefix,))[0]

    def scan_many(self, prefixes: Iterable[bytes]) -> list[list[tuple[bytes, bytes]]]:
        """`scan` of each prefix, through one LevelDB iterator that seeks from one to the
        next: making an iterator (a snapshot, and one over every level's tables) costs more
        than the few keys a session has under most prefixes (loading one scans six)."""
        found = []
        with self._db.iterator() as items:
            for prefix in prefixes:
                items.seek(prefix)
                stored = []
                for key, value in items:
                    if not key.startswith(prefix):
                        break
                    stored.append((key, value))
                pending = self._pending.under(prefix)
                found.append(overlay(stored, pending, prefix) if pending else stored)
        return found

    def begin(self) -> Transaction:
        tx = Transaction(self._serial, self.get, self.scan)
        self._open[id(tx)] = tx  # an id is unique while its object lives, which is enough here
        return tx

    def _prune_log(self) -> None:
        oldest = min((tx.serial for tx in self._open.values()), default=self._serial)
        log = self._log
        while log and log[0][0] <= oldest:
            log.popleft()

    def _validate(self, tx: Transaction) -> None:
        log = self._log
        if tx.serial < self._serial and (not log or log[0][0] > tx.serial + 1):
            raise Conflict("transaction older than the conflict log")
        for serial, written in reversed(log):
            if serial <= tx.serial:
                break
            if conflicts(tx, written):
                raise Conflict("a key read was written since the transaction began")
        check_preconditions(tx, self.get)

    async def commit(self, tx: Transaction, sync: bool = True) -> None:
        """Raises Conflict or PreconditionFailed (retry from `begin`); returns once the
        writes are on disk."""
        await self.commit_soon(tx, sync)

    def commit_soon(self, tx: Transaction, sync: bool = True) -> asyncio.Future[None]:
        """`commit` without a coroutine: validated, and visible to readers, when this
        returns (raising Conflict or PreconditionFailed); the future resolves once the
        writes are on disk. For writers that commit on every event-loop turn."""
        self._validate(tx)
        self._open.pop(id(tx), None)
        return self.write_soon(tx.writes, sync)

    def write_soon(self, writes: dict[bytes, bytes | None],
                   sync: bool = True) -> asyncio.Future[None]:
        """Blind writes: what a commit does once validated, for a writer that read nothing
        (durable session state, every event-loop turn), without a transaction to make.
        Replicated and without `sync`, the returned future is settled at once: the writes
        are seen here at once and reach the replicas (a Raft commit) behind, in order; a
        node killed first loses them, as one node loses a write without fsync in a power
        cut (the replicas keep a prefix of each node's writes: replication_layer.py)."""
        if not writes:
            return _settled(None)
        self._serial += 1
        serial = self._serial
        if self._open:  # only a transaction open now can conflict with these keys
            self._log.append((serial, frozenset(writes)))
            self._prune_log()
        else:
            self._log.clear()
        pending = self._pending
        if not sync and not self.buffer.busy and self.replicate is None:
            # Nothing written before it is still on its way, and without fsync there is no
            # disk round trip to share: written now, with no overlay entry, task or callback
            # (the path of every acknowledgement a durable session records).
            for key in writes:  # an entry of a write just completed would shadow this one
                pending.discard(key)
            if self._reopen_first:
                self._reopen_failed()
            try:
                prepare_batch(self._db, _cooked(writes), False).write()
            except Exception as exc:
                self._failed(exc)
                return _settled(exc)
            self.commits += 1
            return _settled(None)
        for key, value in writes.items():
            pending.put(key, serial, value)
        written = self.buffer.add(list(writes.items()), sync)
        written.add_done_callback(lambda result: self._written(writes, serial, result))
        return written if sync or self.replicate is None else _settled(None)

    def _written(self, writes: dict[bytes, bytes | None], serial: int,
                 result: asyncio.Future[None]) -> None:
        """On disk, or failed: either way the overlay entry goes (the disk is the truth)."""
        pending = self._pending
        for key in writes:
            if pending.entries.get(key, (None,))[0] == serial:
                pending.discard(key)
        if result.cancelled():
            return
        error = result.exception()
        if error is None:
            self.commits += 1
        elif self.replicate is None:
            self._failed(error)

    def _failed(self, error: BaseException) -> None:
        self.failed = True
        if self.on_error is not None:
            self.on_error(error)

    def recover(self) -> bool:
        """After a failed write (builtin_local): the LevelDB closed and opened again, since
        after a failed background write it refuses every write until then; while a write
        is on its way, by the next write before it writes (a busy node's buffer may never
        be idle). False when it cannot be opened now (call again)."""
        if not self.failed:
            return True
        if self.buffer.busy:
            self._reopen_first = True
            return True
        return self._reopen_failed()

    def _reopen_failed(self) -> bool:
        self._reopen_first = False
        try:
            self.reopen()
        except plyvel.Error as error:
            log.error("reopening %s failed, again later: %s", self.path, error)
            return False
        self.failed = False
        return True

    def reopen(self) -> None:
        """Blocking: the LevelDB closed and opened again (raises if it cannot be opened:
        call again; reads fail meanwhile)."""
        if not self._db.closed:
            self._db.close()
        self._db = bulk.open_db(self.path)

    async def _flush(self, writes: list[Write], sync: bool) -> None:
        # The last write of a key in the batch wins.
        if self.replicate is not None:
            await self.replicate(_command(writes))
            return
        if self._reopen_first:
            self._reopen_failed()  # (if it cannot, the write fails as before it)
        await write_batch(self._db, _cooked(dict(writes)), sync, self.executor)

    # ---- builtin_raft: the sessions group's replica ---------------------------------------
    def raw_get(self, key: bytes) -> bytes | None:
        """What LevelDB holds, without the overlay of writes on their way."""
        return self._db.get(key)  # type: ignore[no-any-return]

    def raw_scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        """What LevelDB holds under `prefix`, without the overlay of writes on their way."""
        with self._db.iterator(prefix=prefix) as items:
            return list(items)

    def raw_keys(self, prefix: bytes) -> Iterator[bytes]:
        """The keys LevelDB holds under `prefix`, without their values or the overlay, read
        as the caller goes from a snapshot taken at the first one (start-up: an index of
        what is stored, without reading it all)."""
        with self._db.iterator(prefix=prefix, include_value=False) as keys:
            yield from keys

    def raw_iter(self, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
        """`raw_scan` read as the caller goes, from a snapshot taken at the first item."""
        with self._db.iterator(prefix=prefix) as items:
            yield from items

    def raw_items(self) -> Iterator[tuple[bytes, bytes]]:
        """Every key LevelDB holds, read as the caller goes (do not write meanwhile)."""
        with self._db.iterator() as items:
            yield from items

    def view(self) -> Any:
        """A LevelDB snapshot: what the database holds now, for a reader on another thread
        (close it before the database closes)."""
        return self._db.snapshot()

    def apply(self, writes: list[Write], extra: list[tuple[bytes, bytes]],
              sync: bool = False) -> None:
        """A committed command, written with `extra` (the applied index, the writers'
        chains) atomically."""
        cooked = _cooked(dict(writes))
        cooked.puts.extend(extra)
        prepare_batch(self._db, cooked, sync).write()

    def replace(self, pairs: Iterable[tuple[bytes, bytes]],
                last: list[tuple[bytes, bytes]]) -> None:
        """Blocking: the whole content becomes `pairs`, then `last` (a snapshot installed),
        durably, without holding them in memory (bulk.replace)."""
        self._db = bulk.replace(self.path, pairs, last, self._db.close)
        self._pending.clear()

    async def drain(self) -> None:
        """Returns once every write made so far is written (replicated: committed), or
        failed, also those whose future was settled at once."""
        await self.buffer.drain()

    async def close(self) -> None:
        await self.drain()
        self._db.close()

    def info(self) -> dict[str, Any]:
        """`bytes`: LevelDB's estimate of its tables on disk (what is only in its memtable,
        a few MiB at most, is left out). Not a count of keys: that reads the whole database
        on the event loop, and the dashboard asks every second."""
        return {"name": self.name, "n_shards": 1,
                "bytes": self._db.approximate_size(b"", b"\xff"), "commits": self.commits}


def written_then_deleted(writes: list[Write]) -> dict[bytes, bytes | None]:
    """The last value of each key that `writes` then delete. A replicated command keeps
    them, before the deletes (`_command`): every replica ends with the delete, and judges
    (the sessions database's fencing) what was written, a record read back in the same
    flush still vouching for what refers to it."""
    last = dict(writes)
    return {key: value for key, value in writes if value is not None and last[key] is None}


def _command(writes: list[Write]) -> list[Write]:
    """A flush as one command: the last write of each key, after the values of keys
    written and then deleted within it."""
    return [*written_then_deleted(writes).items(), *dict(writes).items()]


def _cooked(writes: dict[bytes, bytes | None]) -> CookedBatch:
    return CookedBatch(
        puts=[(key, value) for key, value in writes.items() if value is not None],
        deletes=[key for key, value in writes.items() if value is None],
    )


def _settled(error: Exception | None) -> asyncio.Future[None]:
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    if error is None:
        done.set_result(None)
    else:
        done.set_exception(error)
    return done
