"""A shard whose directory is about to be replaced (a snapshot's install, a rewind after a
failed apply, an import) has its slabs closed, but never under a worker thread that uses
them: closing a LevelDB while a seal compacts it left LevelDB's destructor waiting forever
for the compaction it cut short, and the event loop with it (seen: `close_shard_now` right
after a rotation); closing one a reader holds frees what the reader is reading."""

import asyncio
import threading
from typing import Any

import pytest

from broker.ds.slab import Slab, SlabClosed
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message

CLOSE_GRACE_S = 1.0  # how long a close that does not wait gets to show it


class _HeldCompaction:
    """A slab's LevelDB whose compaction waits for `release` once `started`, and which
    notes whether it was closed while compacting (then it is not really closed: that is
    the deadlock this file is about)."""

    def __init__(self, db: Any) -> None:
        self._db = db
        self.started, self.release, self.close_called = (threading.Event(), threading.Event(),
                                                   threading.Event())
        self.compacting = False
        self.closed_while_compacting = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def compact_range(self, **options: Any) -> None:
        self.compacting = True
        self.started.set()
        self.release.wait(30)
        self._db.compact_range(**options)
        self.compacting = False

    def close(self) -> None:
        self.closed_while_compacting |= self.compacting
        self.close_called.set()
        if not self.compacting:
            self._db.close()


async def test_a_shard_closes_once_its_seal_under_way_is_over(open_storage) -> None:
    storage = open_storage(n_shards=1)
    await storage.store_batch(MESSAGES, [message(f"t/{n}") for n in range(100)])
    db = storage.messages
    shard = db.created_shards[0]
    old = shard.current
    held = old._db = _HeldCompaction(old.db)
    await shard.rotate()  # the seal compacts `old` on a worker thread
    loop = asyncio.get_running_loop()
    assert await loop.run_in_executor(None, held.started.wait, 30)

    closing = loop.run_in_executor(None, db.close_shard_now, 0)
    # A close that does not wait for the seal closes within the grace; one that waits
    # does not, and must not: the seal goes on only once released.
    await loop.run_in_executor(None, held.close_called.wait, CLOSE_GRACE_S)
    held.release.set()
    await closing
    assert not held.closed_while_compacting
    assert held.close_called.is_set() and not old.is_open
    await shard.wait_sealed()  # the seal itself succeeded: its manifest is written
    assert old.sealed
    db.reopen_shard(0)


async def test_a_slab_a_reader_holds_is_closed_by_the_reader_and_never_reopened(
        open_storage) -> None:
    storage = open_storage(n_shards=1)
    await storage.store_batch(MESSAGES, [message("t/1")])
    assert await storage.seal() == 1
    db = storage.messages
    shard = db.created_shards[0]
    sealed: Slab = shard.slabs[min(shard.slabs)]
    current = shard.current
    db.open_slabs.acquire(sealed)  # a reader on a worker thread, say an export
    db.close_shard_now(0)
    assert sealed.is_open and not current.is_open  # the writer's pin went with the shard
    db.open_slabs.release(sealed)
    assert not sealed.is_open
    with pytest.raises(SlabClosed):
        db.open_slabs.acquire(sealed)
    assert sealed.pins == 0 and not sealed.is_open
    db.reopen_shard(0)
