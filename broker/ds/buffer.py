"""Write buffer: collects writes for one shard and flushes them as one batch.

A flush happens when `max_items` are waiting, when the oldest has waited `flush_interval`,
when nothing new arrived for `idle_flush_interval` (a lone writer should not wait the full
interval), or at once when none of the waiting writes asked for fsync, unless the buffer
is paced (`pace`): then writes without fsync wait up to the pace interval, since each
flush costs a round of its own (a Raft commit on every replica). Only one flush runs
at a time, so batches reach the disk in the order they were buffered; writes that arrive
meanwhile form the next batch, which starts as soon as the running one ends. Each `add`
returns a future that resolves once the flush containing it completed (is durable when any
write in it asked for sync), which is what a PUBACK waits on.
"""

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")
Flush = Callable[[list[T], bool], Awaitable[None]]


class WriteBuffer(Generic[T]):
    def __init__(
        self, flush: Flush[T], flush_interval: float, max_items: int, idle_flush_interval: float
    ) -> None:
        self._flush = flush
        self._interval = flush_interval
        self._max_items = max_items
        self._idle = idle_flush_interval
        self._items: list[T] = []
        self._sync = False
        self._waiters: list[asyncio.Future[None]] = []
        self._first_at = 0.0
        self._last_at = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._running: asyncio.Task[None] | None = None
        self._pace: float | None = None

    def pace(self, interval: float) -> None:
        """From now on, writes without fsync are flushed `interval` after the first of them
        arrived rather than at once (those with fsync keep their own timers)."""
        self._pace = interval

    def __len__(self) -> int:
        return len(self._items)

    @property
    def busy(self) -> bool:
        """Writes are waiting or being written: a new write must go after them."""
        return bool(self._items) or self._running is not None

    def add(self, items: list[T], sync: bool) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        if not self._items:
            self._first_at = now
        self._last_at = now
        self._items.extend(items)
        self._sync = self._sync or sync
        waiter: asyncio.Future[None] = loop.create_future()
        self._waiters.append(waiter)
        if self._running is None:
            self._schedule(now)
        return waiter

    def _schedule(self, now: float) -> None:
        """Starts the flush of what waits if it is due, else sets the timer for when it is."""
        due = self._due()
        if due <= now or len(self._items) >= self._max_items:
            self._start()
            return
        if self._timer is not None:
            if self._timer.when() <= due:
                return
            self._timer.cancel()  # a write with fsync joined paced ones: it is due sooner
        self._timer = asyncio.get_running_loop().call_at(due, self._on_timer)

    def _due(self) -> float:
        if not self._sync:
            # Without fsync a write costs no disk round trip, so there is nothing to batch
            # it for: it goes now, unless paced.
            return self._first_at + (self._pace or 0.0)
        return min(self._first_at + self._interval, self._last_at + self._idle)

    def _on_timer(self) -> None:
        self._timer = None
        if self._items and self._running is None:
            self._schedule(asyncio.get_running_loop().time())

    def _start(self) -> None:
        if self._running is not None:
            return  # the running flush picks the items up when it ends
        items, waiters, sync = self._take()
        self._running = asyncio.get_running_loop().create_task(self._run(items, waiters, sync))

    def _take(self) -> tuple[list[T], list[asyncio.Future[None]], bool]:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        taken = self._items, self._waiters, self._sync
        self._items, self._waiters, self._sync = [], [], False
        return taken

    async def _run(self, items: list[T], waiters: list[asyncio.Future[None]], sync: bool) -> None:
        try:
            while True:
                try:
                    await self._flush(items, sync)
                except Exception as error:  # every writer must learn its batch failed
                    _settle(waiters, error)
                else:
                    _settle(waiters, None)
                if not self._items or (self._pace is not None and not self._sync):
                    return
                # Group commit: what arrived during that flush has waited one flush already,
                # so it goes now, in this task: a new one would wait a turn of the event
                # loop, under load the length of a whole round of connections. The disk
                # never idles and batches grow by themselves; the timers only pace a
                # writer that starts from idle.
                items, waiters, sync = self._take()
        except BaseException as error:  # cancelled: the writers of the batch learn it too
            _settle(waiters, error)
            raise
        finally:
            self._running = None
            if self._items:
                self._schedule(asyncio.get_running_loop().time())

    async def drain(self) -> None:
        """Flushes whatever is waiting now and returns when it is written."""
        while self._items or self._running is not None:
            if self._running is None:
                self._start()
            running = self._running
            assert running is not None
            await asyncio.shield(running)


def _settle(waiters: list[asyncio.Future[None]], error: BaseException | None) -> None:
    for waiter in waiters:
        if not waiter.done():
            if error is None:
                waiter.set_result(None)
            else:
                waiter.set_exception(error)
