"""Push subscriptions: catch-up, then real-time woken by writes; shared reads; back-pressure."""

import asyncio

from broker.ds.storage import MESSAGES
from broker.ds.subscribe import HANDOVER_BATCHES
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


async def until_idle(*subscriptions) -> None:
    """Lets the pump run until every subscription has found nothing more to read."""
    for _ in range(1000):
        if all(s.idle_on is not None for s in subscriptions):
            return
        await asyncio.sleep(0)  # one event-loop turn: the pump's, not a timed wait
    raise AssertionError("subscriptions never went idle")


async def caught_up(storage, topic: str, batch_size: int):
    """A subscription idle at the end of its stream, with the pool knowing the stream's last
    write (it learns that from a write, so one write is made and read first)."""
    stream = await stream_of(storage, topic)
    subscription = storage.subscribe(storage.make_iterator(stream, topic), batch_size)
    await subscription.next()
    await until_idle(subscription)
    await storage.store_batch(MESSAGES, [message(topic, payload=b"learnt")])
    await subscription.next()
    await until_idle(subscription)
    return stream, subscription


async def test_caught_up_subscribers_get_writes_without_reading_them_back(open_storage) -> None:
    storage = open_storage(n_shards=1)
    stream, subscription = await caught_up(storage, "rt/a", 100)
    reads, handed = storage.subscriptions.reads, storage.subscriptions.handed_over
    await storage.store_batch(MESSAGES, [message("rt/a", payload=b"%d" % i) for i in range(5)])
    iterator, batch = await subscription.next()
    assert [m.payload for m in batch] == [b"0", b"1", b"2", b"3", b"4"]
    assert iterator is not None and iterator.position == batch[-1].timestamp
    assert storage.subscriptions.handed_over == handed + 1
    assert storage.subscriptions.reads == reads  # not read back from LevelDB
    _, stored = storage.next(storage.make_iterator(stream, "rt/a"), 100)
    assert stored[-5:] == batch  # exactly what a reader gets from the disk


async def test_a_handed_over_write_larger_than_a_batch_is_finished_by_reading(
    open_storage,
) -> None:
    storage = open_storage(n_shards=1)
    _, subscription = await caught_up(storage, "rt/b", 2)
    await storage.store_batch(MESSAGES, [message("rt/b", payload=b"%d" % i) for i in range(5)])
    got = []
    while len(got) < 5:
        got.extend(m.payload for m in (await subscription.next())[1])
    assert got == [b"0", b"1", b"2", b"3", b"4"]  # nothing lost or doubled


async def test_a_busy_consumer_at_the_head_is_handed_writes_not_read(open_storage) -> None:
    """A consumer that has not taken its last batch yet (not idle, not reading) but is at the
    stream's end gets the next writes handed over: nothing is read back from LevelDB."""
    storage = open_storage(n_shards=1)
    _, subscription = await caught_up(storage, "busy", 10)
    reads = storage.subscriptions.reads
    for i in range(3):  # three writes while the consumer takes nothing
        await storage.store_batch(MESSAGES, [message("busy", payload=b"%d" % i)])
    got = [(await subscription.next())[1][0].payload for _ in range(3)]
    assert got == [b"0", b"1", b"2"]
    assert storage.subscriptions.reads == reads


async def test_handed_over_messages_are_the_objects_written(open_storage) -> None:
    storage = open_storage(n_shards=1)
    _, subscription = await caught_up(storage, "same", 10)
    written = [message("same", payload=b"a"), message("same", payload=b"b")]
    await storage.store_batch(MESSAGES, written)
    _, batch = await subscription.next()
    assert [id(m) for m in batch] == [id(m) for m in written]
    assert all(m.timestamp > 0 for m in batch)  # stamped by the shard when stored


async def test_a_consumer_beyond_the_handover_limit_reads_the_rest_later(open_storage) -> None:
    """Handovers stop at HANDOVER_BATCHES waiting batches (a bound on what a stalled
    consumer holds); what was not handed over is read once the consumer catches up,
    nothing lost, nothing twice."""
    storage = open_storage(n_shards=1)
    _, subscription = await caught_up(storage, "cap", 1)
    writes = HANDOVER_BATCHES + 5
    for i in range(writes):
        await storage.store_batch(MESSAGES, [message("cap", payload=b"%d" % i)])
    assert storage.subscriptions.handed_over >= HANDOVER_BATCHES
    reads = storage.subscriptions.reads
    got = []
    while len(got) < writes:
        got.extend(m.payload for m in (await subscription.next())[1])
    assert got == [b"%d" % i for i in range(writes)]
    assert storage.subscriptions.reads > reads  # the part beyond the limit came from disk


async def test_subscribers_of_one_stream_are_handed_a_write_not_woken_to_read_it(
        open_storage) -> None:
    """Subscribers of `jobs/1`..`jobs/20`, all in the stream `jobs/+` and caught up: a write
    to one topic reaches its subscriber and reads nothing back from LevelDB for the others.
    (An indexed read that found nothing left its subscriber where it was, and every later
    write to the stream woke it to read again: a read per subscriber per message.)"""
    storage = open_storage(n_shards=1, wildcard_thresholds=(1,))
    await storage.store_batch(MESSAGES, [message(f"jobs/{i}") for i in range(21)])
    (stream,) = storage.get_streams(MESSAGES, "jobs/1")  # jobs/0, the first, has its own
    subscriptions = {i: storage.subscribe(storage.make_iterator(stream, f"jobs/{i}"), 10)
                     for i in range(1, 21)}
    for subscription in subscriptions.values():
        await subscription.next()
    await until_idle(*subscriptions.values())
    await storage.store_batch(MESSAGES, [message("jobs/5", payload=b"first")])
    assert [m.payload for m in (await subscriptions[5].next())[1]] == [b"first"]
    await until_idle(*subscriptions.values())
    reads = storage.subscriptions.reads
    for n in (7, 7, 3):
        await storage.store_batch(MESSAGES, [message(f"jobs/{n}", payload=b"%d" % n)])
    await until_idle(*subscriptions.values())
    assert [m.payload for m in (await subscriptions[7].next())[1]] == [b"7"]
    assert [m.payload for m in (await subscriptions[7].next())[1]] == [b"7"]
    assert [m.payload for m in (await subscriptions[3].next())[1]] == [b"3"]
    assert storage.subscriptions.reads == reads
    subscriptions.pop(9).close()  # a closed one, idle at the end, is gone from the pool
    assert len(storage.subscriptions) == 19
    await storage.store_batch(MESSAGES, [message("jobs/9"), message("jobs/4", payload=b"4")])
    assert [m.payload for m in (await subscriptions[4].next())[1]] == [b"4"]
    await storage.seal()  # every one, idle, reads on to the end of the sealed generation
    for subscription in subscriptions.values():
        assert await subscription.next() == (None, [])
    assert len(storage.subscriptions) == 0
