"""Bulk loading of LevelDB databases nothing uses yet: Raft snapshots being installed.

A snapshot can be larger than a node may hold in memory, and need not be one atomic batch
while nothing reads the database it goes into: it is written a few MiB per batch, the last
one synced, and the finished database then replaces the one in use whole (files.swap_in).
"""

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import plyvel  # type: ignore[import-untyped]

from broker.ds.files import rebuild, recover_swap

BATCH_BYTES: Final = 4 << 20
# LevelDB's memtable while a database is built (its default is 4 MiB): fewer, larger level-0
# tables to compact. Only while building: the node opens it with its own options.
BUILD_BUFFER: Final = 64 << 20
_PAST_KEYS: Final = b"\xff" * 64  # after every key a database built here holds


class Batches:
    """Writes into a database nothing uses yet, BATCH_BYTES per batch."""

    def __init__(self, db: plyvel.DB) -> None:
        self.db = db
        self._batch = db.write_batch()
        self._size = 0

    def put(self, key: bytes, value: bytes) -> None:
        self._batch.put(key, value)
        self._size += len(key) + len(value)
        if self._size >= BATCH_BYTES:
            self._batch.write()
            self._batch, self._size = self.db.write_batch(), 0

    def finish(self, last: list[tuple[bytes, bytes]], sync: bool = True) -> None:
        """The rest, then `last` in a synced batch: everything written is then on disk
        (LevelDB syncs the tables it makes; the sync, its log). Without `sync` for a caller
        that makes it durable otherwise (reopened, LevelDB writes its log out as a synced
        table)."""
        self._batch.write()
        with self.db.write_batch(sync=sync) as batch:
            for key, value in last:
                batch.put(key, value)


def write_out(db: plyvel.DB) -> None:
    """Blocking: a built database's memtable written out as a table, synced, and the
    database closed, rather than its log replayed at the node's open, on its event loop
    (tens of milliseconds a MiB). LevelDB flushes its memtable before any manual
    compaction; one of a range past every key compacts nothing else (a reopen, which this
    replaces, read the log back in and built the memtable again)."""
    try:
        db.compact_range(start=_PAST_KEYS, stop=_PAST_KEYS)
    finally:
        db.close()


def open_db(path: Path) -> plyvel.DB:
    """Blocking: the database at `path`, which `replace` may have been swapping in when a
    crash cut it short (files.recover_swap)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    recover_swap(path)
    return plyvel.DB(str(path), create_if_missing=True)


def replace(path: Path, pairs: Iterable[tuple[bytes, bytes]], last: list[tuple[bytes, bytes]],
            close: Callable[[], None]) -> plyvel.DB:
    """Blocking: the database at `path` becomes `pairs`, then `last`, durably
    (files.rebuild: built beside it, then swapped in once `close()` closed the one in use);
    returns it opened."""
    def build(fresh: Path) -> None:
        db = plyvel.DB(str(fresh), create_if_missing=True)
        try:
            batches = Batches(db)
            for key, value in pairs:
                batches.put(key, value)
            batches.finish(last)
        finally:
            db.close()

    rebuild(path, build, close)
    return plyvel.DB(str(path))
