"""Push reads: subscribers get batches as data arrives instead of polling `next`.

A subscription starts in the catch-up pool and is read for as long as it finds data and its
consumer keeps up (at most `max_unacked` batches wait in it). When a read finds nothing it
moves to the real-time pool: it costs nothing until a write to its stream wakes it.
Subscriptions whose iterators are equal (same stream, filter and position) are served by one
read. A subscription that has read everything before a write is handed that write's
messages (the very objects the writer stored) instead of reading them back: the steady
state of a consumer that keeps up never reads LevelDB. Idle subscriptions of a topic (a
filter without wildcards) are parked by topic: a write costs those of its topics, not every
subscription of the stream (1,000 sessions reading `jobs/<i>` each, from the stream
`jobs/+`).
"""

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Final

from broker.ds.cook import StreamWrite
from broker.ds.iterator import Iterator, Stream
from broker.ds.ttv import TTV
from broker.mqtt.topic import topic_matches

# MessagesDB.read: suspends only to open a sealed slab the LRU closed (open_slabs.py)
Reader = Callable[[Iterator, int], Awaitable[tuple[Iterator | None, Sequence[TTV]]]]
Batch = tuple[Iterator | None, Sequence[TTV]]


HANDOVER_BATCHES: Final = 8
"""Batches a subscription may have waiting when they are handed to it from writes. More than
a read may queue (`max_unacked`): a handed-over batch costs references to messages that are
in memory anyway, while a read costs LevelDB work, so a consumer that is briefly busy still
stays on the cheap path; one that falls further behind reads from disk later."""


class Subscription:
    def __init__(
        self, pool: "SubscriptionPool", iterator: Iterator, batch_size: int, max_unacked: int
    ) -> None:
        self.iterator: Iterator | None = iterator
        self.stream = iterator.stream
        self.batch_size = batch_size
        self._pool = pool
        self._max_unacked = max_unacked
        self._batches: deque[Batch] = deque()
        self._arrived = asyncio.Event()
        self.idle_on: Stream | None = None  # set while in the real-time pool
        self.parked = False  # idle at its stream's last write: `iterator` may be older

    @property
    def has_room(self) -> bool:
        return self.iterator is not None and len(self._batches) < self._max_unacked

    @property
    def handover_room(self) -> int:
        return HANDOVER_BATCHES - len(self._batches) if self.iterator is not None else 0

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
        # A closed subscription can outlive its reader (the pump's last groups refer to it):
        # what was handed to it, up to HANDOVER_BATCHES x batch_size messages, must not.
        self._batches.clear()
        self._pool.remove(self)


class SubscriptionPool:
    def __init__(self, db: str, read: Reader) -> None:
        self._db = db
        self._read = read
        self._catch_up: set[Subscription] = set()
        # Every live subscription by stream, but the parked ones; those with `idle_on` set
        # form the real-time pool (read to the end, costing nothing until a write).
        self._on_stream: dict[Stream, set[Subscription]] = {}
        # Subscriptions of a topic idle at their stream's last write, by stream and topic:
        # what a write to the stream does not match leaves them at its end, untouched.
        self._parked: dict[Stream, dict[str, set[Subscription]]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        # Last timestamp written to each stream since start: a subscriber at that position
        # has read everything before the next write.
        self._last: dict[Stream, int] = {}
        self.reads = 0
        self.handed_over = 0

    def __len__(self) -> int:
        """Live subscriptions: in the catch-up pool, in the real-time pool or waiting for
        their consumer."""
        return (sum(len(subscriptions) for subscriptions in self._on_stream.values())
                + sum(len(subscriptions) for topics in self._parked.values()
                      for subscriptions in topics.values()))

    def subscribe(self, iterator: Iterator, batch_size: int, max_unacked: int = 2) -> Subscription:
        subscription = Subscription(self, iterator, batch_size, max_unacked)
        self._on_stream.setdefault(subscription.stream, set()).add(subscription)
        self._catch_up.add(subscription)
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._pump())
        self._wakeup.set()
        return subscription

    def on_change(
        self, shard: int, generation: int, streams: dict[int, StreamWrite] | None
    ) -> None:
        """A write (the messages per stream), a seal or a drop (None). Subscribers that had
        read everything up to this write get its messages as they are, whether idle or
        waiting for their consumer (up to HANDOVER_BATCHES); idle ones behind are woken to
        read; the rest read when their consumer catches up."""
        if streams is None:
            slab = (shard, generation)
            for stream in [s for s in self._parked if (s.shard, s.generation) == slab]:
                for subscriptions in list(self._parked[stream].values()):
                    for subscription in list(subscriptions):
                        self._unpark(subscription)
            for stream in [s for s in self._last if (s.shard, s.generation) == (shard, generation)]:
                del self._last[stream]
            for stream, subscriptions in self._on_stream.items():
                if (stream.shard, stream.generation) == (shard, generation):
                    for subscription in subscriptions:
                        if subscription.idle_on is not None:
                            self._wake(subscription)
            return
        for stream_id, written in streams.items():
            stream = Stream(self._db, shard, generation, stream_id)
            parked = self._parked.get(stream)
            if parked:
                for topic in {m.topic for m in written.messages()}:
                    for subscription in list(parked.get(topic, ())):
                        self._unpark(subscription)
            previous = self._last.get(stream)
            self._last[stream] = written.last
            waiting = self._on_stream.get(stream)
            if not waiting:
                continue
            groups: dict[tuple[Iterator, int], list[Subscription]] = {}
            for subscription in waiting:
                iterator = subscription.iterator
                if (previous is not None and iterator is not None
                        and iterator.position == previous and subscription.handover_room):
                    key = (iterator, subscription.batch_size)
                    groups.setdefault(key, []).append(subscription)
                elif subscription.idle_on is not None:
                    self._wake(subscription)
            for (iterator, batch_size), subscribers in groups.items():
                self._hand_over(stream, iterator, batch_size, written.messages(), subscribers)

    def _wake(self, subscription: Subscription) -> None:
        subscription.idle_on = None
        self._catch_up.add(subscription)
        self._wakeup.set()

    def _hand_over(self, stream: Stream, iterator: Iterator, batch_size: int,
                   fresh: list[TTV], subscribers: list[Subscription]) -> None:
        """What reading `iterator` on in `batch_size` batches would give, taken from the
        write itself; each subscriber takes as many batches as it has room for and reads
        the rest later."""
        topic_filter = iterator.topic_filter
        matching = [m for m in fresh if topic_matches(topic_filter, m.topic)]
        batches = [
            (Iterator(stream, topic_filter, chunk[-1].timestamp), chunk)
            for chunk in (matching[i:i + batch_size] for i in range(0, len(matching), batch_size))
        ]
        end = Iterator(stream, topic_filter, fresh[-1].timestamp)
        if batches:  # the last batch's position skips what did not match, as a read would
            batches[-1] = (end, batches[-1][1])
        self.handed_over += 1
        for subscription in subscribers:
            taken = batches[:subscription.handover_room]
            for batch in taken:
                subscription.push(batch)
            if len(taken) == len(batches):  # everything up to the last write: idle again
                subscription.iterator = end
                self._catch_up.discard(subscription)
                subscription.idle_on = stream
                self._park(subscription)
            else:
                subscription.iterator = taken[-1][0]
                subscription.idle_on = None  # reads the rest once its consumer has room

    def consumed(self, subscription: Subscription) -> None:
        if subscription.has_room and subscription.idle_on is None:
            self._catch_up.add(subscription)
            self._wakeup.set()

    def remove(self, subscription: Subscription) -> None:
        self._catch_up.discard(subscription)
        self._forget(subscription)
        subscription.idle_on = None
        subscription.iterator = None

    def _park(self, subscription: Subscription) -> None:
        """Idle: parked by its topic if it is at its stream's last write."""
        iterator, stream = subscription.iterator, subscription.stream
        if (iterator is None or iterator.position != self._last.get(stream)
                or "+" in iterator.topic_filter or "#" in iterator.topic_filter):
            return
        on_stream = self._on_stream[stream]
        on_stream.discard(subscription)
        if not on_stream:
            del self._on_stream[stream]
        topics = self._parked.setdefault(stream, {})
        topics.setdefault(iterator.topic_filter, set()).add(subscription)
        subscription.parked = True

    def _unpark(self, subscription: Subscription) -> None:
        """Back with its stream's other subscriptions, at the stream's last write: a write
        to its topic (before it is counted as the last), the generation sealed or dropped,
        or closed."""
        if not subscription.parked:
            return
        stream, iterator = subscription.stream, subscription.iterator
        assert iterator is not None
        topics = self._parked[stream]
        parked = topics[iterator.topic_filter]
        parked.discard(subscription)
        if not parked:
            del topics[iterator.topic_filter]
            if not topics:
                del self._parked[stream]
        subscription.parked = False
        subscription.iterator = Iterator(stream, iterator.topic_filter, self._last[stream])
        self._on_stream.setdefault(stream, set()).add(subscription)

    def _forget(self, subscription: Subscription) -> None:
        """No longer live: closed, or read to the end of its stream."""
        self._unpark(subscription)
        on_stream = self._on_stream.get(subscription.stream)
        if on_stream is not None:
            on_stream.discard(subscription)
            if not on_stream:
                del self._on_stream[subscription.stream]

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
                    await self._serve(iterator, batch_size, subscribers)
                await asyncio.sleep(0)  # let consumers and writers run between rounds

    async def _serve(
        self, iterator: Iterator, batch_size: int, subscribers: list[Subscription]
    ) -> None:
        self.reads += 1
        after, messages = await self._read(iterator, batch_size)
        if not messages and after is not None:
            # Nothing more: everything up to the stream's last write was read (its data is
            # stored before it is told of), so the next write is handed over, not read back.
            # (An indexed read that finds nothing does not move: 1,000 subscribers of one
            # stream with a topic each read every message of it.)
            last = self._last.get(iterator.stream)
            if last is not None and last > after.position:
                after = Iterator(after.stream, after.topic_filter, last)
        for subscription in subscribers:
            if subscription.iterator != iterator:
                continue  # closed, or handed a write, while the read waited for its slab
            subscription.iterator = after
            if messages or after is None:
                subscription.push((after, messages))
                if after is None:
                    self._forget(subscription)
                if subscription.has_room:
                    self._catch_up.add(subscription)
            else:
                subscription.idle_on = iterator.stream
                self._park(subscription)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
