"""Push subscriptions: catch-up, then real-time woken by writes; shared reads; back-pressure."""

import asyncio

from broker.ds.storage import MESSAGES
from tests.ds.conftest import message


async def stream_of(storage, topic: str):
    await storage.store_batch(MESSAGES, [message(topic, payload=b"seed")])
    (stream,) = storage.get_streams(MESSAGES, topic)
    return stream


async def test_catch_up_then_real_time(open_storage) -> None:
    storage = open_storage(n_shards=1)
    stream = await stream_of(storage, "t")
    await storage.store_batch(MESSAGES, [message("t", payload=b"%d" % i) for i in range(24)])
    subscription = storage.subscribe(storage.make_iterator(stream, "t"), 10)
    sizes = [len((await subscription.next())[1]) for _ in range(3)]
    assert sizes == [10, 10, 5]

    pending = asyncio.ensure_future(subscription.next())
    await asyncio.sleep(0)
    assert not pending.done()  # nothing new: the subscription is idle
    await storage.store_batch(MESSAGES, [message("t", payload=b"live")])
    iterator, batch = await pending
    assert [m.payload for m in batch] == [b"live"]
    assert iterator is not None and iterator.position == batch[-1].timestamp


async def test_one_read_serves_every_subscriber_at_the_same_position(open_storage) -> None:
    storage = open_storage(n_shards=1)
    stream = await stream_of(storage, "fan")
    subscriptions = [storage.subscribe(storage.make_iterator(stream, "fan"), 100)
                     for _ in range(50)]
    for s in subscriptions:
        assert [m.payload for m in (await s.next())[1]] == [b"seed"]
    reads = storage.subscriptions.reads
    await storage.store_batch(MESSAGES, [message("fan", payload=b"x")])
    for s in subscriptions:
        assert [m.payload for m in (await s.next())[1]] == [b"x"]
    # one read with the data and at most one finding nothing more, for all 50
    assert storage.subscriptions.reads - reads <= 2


async def test_a_slow_consumer_is_not_read_ahead_of(open_storage) -> None:
    storage = open_storage(n_shards=1)
    stream = await stream_of(storage, "slow")
    await storage.store_batch(MESSAGES, [message("slow") for _ in range(20)])
    subscription = storage.subscribe(storage.make_iterator(stream, "slow"), 1, max_unacked=2)
    first = await subscription.next()
    await storage.store_batch(MESSAGES, [message("slow")])  # lets the pump run its rounds
    assert storage.subscriptions.reads == 3  # the batch taken + 2 waiting, not 22
    got = len(first[1])
    while got < 22:
        _, batch = await subscription.next()
        got += len(batch)
    assert got == 22


async def test_closed_subscription_gets_nothing(open_storage) -> None:
    storage = open_storage(n_shards=1)
    stream = await stream_of(storage, "c")
    keep = storage.subscribe(storage.make_iterator(stream, "c"), 10)
    gone = storage.subscribe(storage.make_iterator(stream, "c"), 10)
    await keep.next()
    await gone.next()
    assert len(storage.subscriptions) == 2
    gone.close()
    assert len(storage.subscriptions) == 1
    await storage.store_batch(MESSAGES, [message("c")])
    await keep.next()
    assert gone.iterator is None
