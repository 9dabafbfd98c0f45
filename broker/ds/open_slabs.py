"""The slabs whose LevelDB is open: at most `limit` of them, least recently used closed first.

Each open slab holds file descriptors (slab.py), so an unbounded number of generations must
not mean an unbounded number open. A slab is pinned while something uses its LevelDB (a
read, a write, a seal, or being a shard's current generation): a pinned slab is never
closed, so the bound may be exceeded while more than `limit` are in use at once, and is
restored as they are released. A closed slab is reopened by the next reader: iterators name
a generation, not an open database.

The pins and the order are guarded by a lock, so readers on worker threads may pin too; the
open itself (~10 ms of LevelDB file writes and syncs) runs outside that lock.
"""

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Executor

from broker.ds.slab import Slab


class OpenSlabs:
    def __init__(self, limit: int, executor: Executor) -> None:
        if limit < 1:
            raise ValueError("max_open_slabs must be at least 1")
        self.limit = limit
        self._executor = executor
        self._lock = threading.Lock()
        # Open or pinned slabs, least recently used first (the values mean nothing).
        self._order: OrderedDict[Slab, None] = OrderedDict()
        self._opening: set[asyncio.Future[None]] = set()
        self.reopened = 0  # closed slabs opened again for a reader

    def __len__(self) -> int:
        return len(self._order)

    def acquire(self, slab: Slab) -> None:
        """Pins the slab, opening it if it is closed (blocking); `release` unpins it."""
        self._pin(slab)
        if not slab.is_open:
            try:
                self._reopen(slab)
            except BaseException:
                self.release(slab)
                raise

    async def acquire_async(self, slab: Slab) -> None:
        """`acquire` with the open, when one is needed, on a worker thread. A caller
        cancelled meanwhile keeps its pin until the open is done, so nothing closes a slab
        while a thread is opening it."""
        self._pin(slab)
        if slab.is_open:
            return
        opening = asyncio.get_running_loop().run_in_executor(
            self._executor, self._reopen, slab
        )
        self._opening.add(opening)
        opening.add_done_callback(self._opening.discard)
        try:
            await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(lambda _: self.release(slab))
            raise
        except BaseException:
            self.release(slab)
            raise

    def release(self, slab: Slab) -> None:
        with self._lock:
            slab.pins -= 1
            if not slab.pins:
                if slab.dropped:
                    slab.close()
                elif not slab.is_open:  # its open failed
                    self._order.pop(slab, None)
            self._close_excess()

    def drop(self, slab: Slab, writer_pin: bool = False) -> None:
        """Retention removed the slab, or its shard's directory is about to be replaced
        (with `writer_pin`, a current slab: the writer's pin goes too): closed now, or by
        its last user. Never opened again (`Slab.reopen`): a new slab may take its path."""
        with self._lock:
            self._order.pop(slab, None)
            slab.dropped = True
            if writer_pin:
                slab.pins -= 1
            if not slab.pins:
                slab.close()

    async def close(self) -> None:
        """Closes every slab, once the opens under way have finished."""
        while self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)
        with self._lock:
            for slab in self._order:
                slab.close()
            self._order.clear()

    def _pin(self, slab: Slab) -> None:
        with self._lock:
            slab.pins += 1
            order = self._order
            if slab in order:
                order.move_to_end(slab)
            elif not slab.dropped:
                order[slab] = None
                self._close_excess()

    def _reopen(self, slab: Slab) -> None:
        if slab.reopen():
            with self._lock:
                self.reopened += 1

    def _close_excess(self) -> None:
        """Closes the least recently used unpinned slabs past the limit (lock held)."""
        order = self._order
        excess = len(order) - self.limit
        if excess <= 0:
            return
        victims: list[Slab] = []
        for slab in order:
            if not slab.pins:
                victims.append(slab)
                if len(victims) == excess:
                    break
        for slab in victims:
            del order[slab]
            slab.close()
