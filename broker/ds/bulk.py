"""Bulk loading of LevelDB databases nothing uses yet: Raft snapshots being installed,
archives being imported.

A snapshot can be larger than a node may hold in memory, and need not be one atomic batch
while nothing reads the database it goes into: it is written a few MiB per batch, the last
one synced, and the finished database then replaces the one in use whole (files.swap_in).
A database built from pairs in key order (`Build`) skips LevelDB's write path and is
written as tables (table_writer.py): a catch-up's slabs, and an import's databases
(backup/unpack.py), whose tables go past the page cache (`direct`). Built so through the
page cache, an online import of 256 MiB had taken 1.80-1.98 s against LevelDB's write
path's 1.16-1.35 s (native, alternating, load 0.3-0.5): every page of the tables was a new
one (on this VM a fault on the host each), where LevelDB's writes reuse the pages of the
logs it deletes. Past the page cache they cost the node less than LevelDB's path (its log,
memtable and table in new pages): node CPU per import 1.06-1.36 s against 1.41-1.71 s
(native, alternating, load 1.9-2.6, both with the sealed tables past the page cache).
"""

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import plyvel  # type: ignore[import-untyped]

from broker.ds.files import fsync_dir, rebuild, recover_swap
from broker.ds.keys import PAST_EVERY_KEY
from broker.ds.table_writer import TableWriter

BATCH_BYTES: Final = 4 << 20
# LevelDB's memtable while a database is built (its default is 4 MiB): fewer, larger level-0
# tables to compact. Only while building: the node opens it with its own options.
BUILD_BUFFER: Final = 64 << 20


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
        db.compact_range(start=PAST_EVERY_KEY, stop=PAST_EVERY_KEY)
    finally:
        db.close()


class Build:
    """A new database at `path` (which must not exist) from pairs, then `finish`. Blocking.
    Pairs in strictly increasing key order, as the dumps and archives hold them, are written
    as tables (table_writer.py): once, where LevelDB's write path wrote each into its log,
    then into a level-0 table, then again at each compaction. The first pair out of order
    (an archive made by hand, say) ends that: what was written becomes a database, LevelDB
    opens it, and the rest goes through `Batches` as it always did (a later pair of a key
    wins either way). With `compression` (snappy: the writer writes no compressed blocks)
    everything goes through `Batches`. The finished database is on disk (its files and
    directory synced), but for a `direct` one's tables."""

    def __init__(self, path: Path, compression: str | None, direct: bool = False) -> None:
        """`direct`: tables written past the page cache and not synced, for a database
        nothing reads soon whose tree the caller syncs (files.sync_tree) before it is
        used (TableWriter: an import's)."""
        self.path = path
        self._compression = compression
        self._writer: TableWriter | None = None
        self._batches: Batches | None = None
        if compression is None:
            self._writer = TableWriter(path, sync=not direct, direct=direct)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._batches = Batches(self._open(True))

    def put(self, key: bytes, value: bytes) -> None:
        writer = self._writer
        if writer is not None:
            if writer.add(key, value):
                return
            writer.finish()
            self._writer = None
            self._batches = Batches(self._open(False))
        assert self._batches is not None
        self._batches.put(key, value)

    def finish(self, late: list[tuple[bytes, bytes]]) -> bool:
        """The pairs put, then `late` (pairs known last, of any key: they win), made a
        database on disk; whether it was written as tables (else through LevelDB)."""
        if self._writer is not None:
            self._writer.finish(late)
            self._writer = None
            return True
        assert self._batches is not None
        batches, self._batches = self._batches, None
        try:
            batches.finish(late, sync=False)
        except BaseException:
            batches.db.close()
            raise
        write_out(batches.db)
        fsync_dir(self.path)  # (LevelDB syncs the tables and manifest, not their entries)
        return False

    def close(self) -> None:
        """An unfinished build given up: what it opened is closed (what it wrote is the
        caller's to remove)."""
        writer, self._writer = self._writer, None
        if writer is not None:
            # (a table's write that failed: what it wrote goes with the rest)
            with contextlib.suppress(OSError):
                writer.close()
        if self._batches is not None:
            self._batches.db.close()
            self._batches = None

    def _open(self, create: bool) -> plyvel.DB:
        return plyvel.DB(str(self.path), create_if_missing=create, error_if_exists=create,
                         compression=self._compression, write_buffer_size=BUILD_BUFFER)


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
