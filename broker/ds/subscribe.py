"""Push reads: subscribers get batches as data arrives instead of polling `next`.

A subscription starts in the catch-up pool and is read for as long as it finds data and its
consumer keeps up (at most `max_unacked` batches wait in it). When a read finds nothing it
moves to the real-time pool: it costs nothing until a write to its stream wakes it.
Subscriptions whose iterators are equal (same stream, filter and position) are served by one
read, which is what happens to every real-time subscriber of a stream after a write.
"""

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable

from broker.ds.iterator import Iterator, Stream
from broker.ds.ttv import TTV
from broker.mqtt.topic import topic_matches

Reader = Callable[[Iterator, int], tuple[Iterator | None, list[TTV]]]
Batch = tuple[Iterator | None, list[TTV]]


class Subscription:
    def __init__(
        self, pool: "SubscriptionPool", iterator: Iterator, batch_size: int, max_unacked: int
    ) -> None:
        self.iterator: Iterator | None = iterator
        self.batch_size = batch_size
        self._pool = pool
        self._max_unacked = max_unacked
        self._batches: deque[Batch] = deque()
        self._arrived = asyncio.Event()
        self.idle_on: Stream | None = None  # set while in the real-time pool

    @property
    def has_room(self) -> bool:
        return self.iterator is not None and len(self._batches) < self._max_unacked

    def push(self, batch: Batch) -> None:
        self._batches.append(batch)
        self._arrived.set()

    async def next(self) -> Batch:
        """The next batch and the iterator after it (the position to checkpoint); the
        iterator is None once the stream has ended (see MessagesDB.next)."""
        while not self._batches:
            self._arrived.clear()
            await self._arrived.wait()
        batch = self._batches.popleft()
        self._pool.consumed(self)
        return batch

    def close(self) -> None:
        self._pool.remove(self)


class SubscriptionPool:
    def __init__(self, db: str, read: Reader) -> None:
        self._db = db
        self._read = read
        self._catch_up: set[Subscription] = set()
        self._real_time: dict[Stream, set[Subscription]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._live: set[Subscription] = set()
        # Last timestamp written to each stream since start: a real-time subscriber at that
        # position has read everything before the next write.
        self._last: dict[Stream, int] = {}
        self.reads = 0
        self.handed_over = 0

    def __len__(self) -> int:
        """Live subscriptions: in the catch-up pool, in the real-time pool or waiting for
        their consumer."""
        return len(self._live)

    def subscribe(self, iterator: Iterator, batch_size: int, max_unacked: int = 2) -> Subscription:
        subscription = Subscription(self, iterator, batch_size, max_unacked)
        self._live.add(subscription)
        self._catch_up.add(subscription)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump())
        self._wakeup.set()
        return subscription

    def on_change(
        self, shard: int, generation: int, streams: dict[int, list[TTV]] | None
    ) -> None:
        """A write (the messages per stream), a seal or a drop (None): real-time subscribers
        that had read everything up to this write get its messages as they are; the others
        are woken to read."""
        if streams is None:
            touched = [s for s in self._real_time if (s.shard, s.generation) == (shard, generation)]
            for stream in [s for s in self._last if (s.shard, s.generation) == (shard, generation)]:
                del self._last[stream]
            for stream in touched:
                for subscription in self._real_time.pop(stream, ()):
                    self._wake(subscription)
            return
        for stream_id, fresh in streams.items():
            stream = Stream(self._db, shard, generation, stream_id)
            previous = self._last.get(stream)
            self._last[stream] = fresh[-1].timestamp
            waiting = self._real_time.pop(stream, None)
            if not waiting:
                continue
            groups: dict[tuple[Iterator, int], list[Subscription]] = {}
            for subscription in waiting:
                subscription.idle_on = None
                iterator = subscription.iterator
                if (previous is not None and iterator is not None and subscription.has_room
                        and iterator.position == previous):
                    key = (iterator, subscription.batch_size)
                    groups.setdefault(key, []).append(subscription)
                else:
                    self._wake(subscription)
            for (iterator, batch_size), subscribers in groups.items():
                self._hand_over(stream, iterator, batch_size, fresh, subscribers)

    def _wake(self, subscription: Subscription) -> None:
        subscription.idle_on = None
        self._catch_up.add(subscription)
        self._wakeup.set()

    def _hand_over(self, stream: Stream, iterator: Iterator, batch_size: int,
                   fresh: list[TTV], subscribers: list[Subscription]) -> None:
        """What `next(iterator, batch_size)` would read, taken from the write itself."""
        topic_filter = iterator.topic_filter
        matching = [ttv for ttv in fresh if topic_matches(topic_filter, ttv.topic)]
        complete = len(matching) <= batch_size
        if complete:
            after = Iterator(stream, topic_filter, fresh[-1].timestamp)
        else:
            matching = matching[:batch_size]
            after = Iterator(stream, topic_filter, matching[-1].timestamp)
        self.handed_over += 1
        for subscription in subscribers:
            subscription.iterator = after
            if matching:
                subscription.push((after, matching))
            if complete:
                subscription.idle_on = stream  # read up to the last write: real-time again
                self._real_time.setdefault(stream, set()).add(subscription)
            elif subscription.has_room:
                self._wake(subscription)

    def consumed(self, subscription: Subscription) -> None:
        if subscription.has_room and subscription.idle_on is None:
            self._catch_up.add(subscription)
            self._wakeup.set()

    def remove(self, subscription: Subscription) -> None:
        self._live.discard(subscription)
        self._catch_up.discard(subscription)
        if subscription.idle_on is not None:
            self._real_time.get(subscription.idle_on, set()).discard(subscription)
        subscription.iterator = None

    async def _pump(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self._catch_up:
                groups: dict[tuple[Iterator, int], list[Subscription]] = {}
                for subscription in self._catch_up:
                    if subscription.iterator is not None and subscription.has_room:
                        key = (subscription.iterator, subscription.batch_size)
                        groups.setdefault(key, []).append(subscription)
                self._catch_up = set()
                for (iterator, batch_size), subscribers in groups.items():
                    self._serve(iterator, batch_size, subscribers)
                await asyncio.sleep(0)  # let consumers and writers run between rounds

    def _serve(self, iterator: Iterator, batch_size: int, subscribers: list[Subscription]) -> None:
        self.reads += 1
        after, messages = self._read(iterator, batch_size)
        for subscription in subscribers:
            subscription.iterator = after
            if messages or after is None:
                subscription.push((after, messages))
                if after is None:
                    self._live.discard(subscription)
                if subscription.has_room:
                    self._catch_up.add(subscription)
            else:
                subscription.idle_on = iterator.stream
                self._real_time.setdefault(iterator.stream, set()).add(subscription)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
