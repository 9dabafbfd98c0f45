"""A bounded number of open slabs: sealed generations are opened by readers and closed least
recently used first, never while in use; start-up opens none of them (issue 15, defect 1)."""

import asyncio

import plyvel

from broker.ds import now_us
from broker.ds.slab import Slab
from broker.ds.storage import MESSAGES
from tests.ds.conftest import drain, message, read_all

LIMIT = 3


async def sealed_generations(storage, count: int, topic: str = "g") -> None:
    """`count` sealed generations of one message each (payload = its number)."""
    for i in range(count):
        await storage.store_batch(MESSAGES, [message(topic, payload=b"%d" % i)])
        assert await storage.seal() == 1


def slabs(storage) -> list[Slab]:
    return list(storage.messages.created_shards[0].slabs.values())


def open_count(storage) -> int:
    return sum(slab.is_open for slab in slabs(storage))


async def test_open_slabs_stay_within_the_bound_and_reads_reopen_closed_ones(open_storage):
    storage = open_storage(n_shards=1, max_open_slabs=LIMIT)
    await sealed_generations(storage, 10)
    assert open_count(storage) == len(storage.messages.open_slabs) == LIMIT
    assert [m.payload for m in read_all(storage, "g")] == [b"%d" % i for i in range(10)]
    assert open_count(storage) == LIMIT
    assert storage.messages.open_slabs.reopened >= 10 - LIMIT
    metrics = {name: value for name, _, _, value in storage.metrics()}
    assert metrics["ds_open_slabs"] == LIMIT and metrics["ds_max_open_slabs"] == LIMIT


async def test_start_up_opens_only_current_generations_and_keeps_sealed_state(
    open_storage, tmp_path
) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=LIMIT, wildcard_thresholds=(1,))
    await sealed_generations(storage, 5, topic="a/b")
    before = storage.messages.info()
    await storage.close()

    storage = open_storage(n_shards=1, max_open_slabs=LIMIT, wildcard_thresholds=(1,))
    assert [slab.is_open for slab in slabs(storage)] == [False] * 5 + [True]
    assert storage.messages.info() == before  # counters, periods and states from manifests
    assert len(storage.get_streams(MESSAGES, "a/+")) == 5  # LTS from manifests
    assert open_count(storage) == 1
    assert len(read_all(storage, "a/#")) == 5


async def test_slabs_in_use_are_not_closed_until_released(open_storage) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=LIMIT)
    await sealed_generations(storage, 8)
    open_slabs = storage.messages.open_slabs
    in_use = slabs(storage)[:LIMIT]
    for slab in in_use:  # as readers on worker threads would
        open_slabs.acquire(slab)
    read_all(storage, "g")  # opens every other generation, one after another
    assert all(slab.is_open for slab in in_use)
    assert open_count(storage) == LIMIT + 1  # and the current generation's writer
    for slab in in_use:
        open_slabs.release(slab)
    assert open_count(storage) == LIMIT
    assert not in_use[0].is_open  # least recently used


async def test_async_read_opens_a_closed_slab_and_cancelled_opens_finish_before_close(
    open_storage, tmp_path
) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=LIMIT)
    await sealed_generations(storage, 6)
    (stream, *_) = storage.get_streams(MESSAGES, "g")
    assert not slabs(storage)[0].is_open
    iterator, batch = await storage.messages.read(storage.make_iterator(stream, "g"), 10)
    assert [m.payload for m in batch] == [b"0"] and iterator is not None

    second = slabs(storage)[1]
    assert not second.is_open
    opening = asyncio.ensure_future(storage.messages.open_slabs.acquire_async(second))
    await asyncio.sleep(0)  # the open is now on a worker thread
    opening.cancel()
    await storage.close()  # waits for that open, then closes everything
    assert not second.is_open
    for slab in (tmp_path / "ds" / MESSAGES / "shard-000").iterdir():
        plyvel.DB(str(slab), create_if_missing=False).close()  # no LevelDB left locked


async def test_subscription_reads_closed_sealed_generations(open_storage) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=1)
    await sealed_generations(storage, 4)
    payloads = []
    for stream in storage.get_streams(MESSAGES, "g"):
        subscription = storage.subscribe(storage.make_iterator(stream, "g"), 10)
        while True:
            after, batch = await subscription.next()
            payloads += [m.payload for m in batch]
            if after is None:
                break
        assert open_count(storage) <= 2  # the current generation, and the one just read
    assert payloads == [b"%d" % i for i in range(4)]


async def test_retention_drops_closed_and_pinned_generations(open_storage) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=LIMIT, retention_period=60.0)
    await sealed_generations(storage, 6)
    old = slabs(storage)
    closed, pinned = old[0], old[1]
    assert not closed.is_open
    storage.messages.open_slabs.acquire(pinned)
    (stream, *_) = storage.get_streams(MESSAGES, "g")
    assert await storage.apply_retention(now_us() + 61 * 10**6) == 6
    assert not closed.path.exists() and not pinned.path.exists()
    assert pinned.is_open  # its user still holds it: closed when released
    storage.messages.open_slabs.release(pinned)
    assert not pinned.is_open
    assert len(storage.messages.open_slabs) == 1  # the new current generation
    assert drain(storage, stream, "g") == []
