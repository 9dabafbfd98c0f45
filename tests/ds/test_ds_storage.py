"""Writing and reading real slabs: iterators, restarts, sharding, end of stream."""

from pathlib import Path

from broker.ds import TTV, Iterator, now_us
from broker.ds.db import read_db_file, shard_of
from broker.ds.storage import MESSAGES
from tests.ds.conftest import drain, message, read_all


async def test_round_trip_keeps_order_and_fields(open_storage) -> None:
    storage = open_storage()
    sent = [TTV(f"room/{i % 3}/temp", bytes([i]), i % 3, i % 2 == 0, "sensor", {2: 60})
            for i in range(50)]
    await storage.store_batch(MESSAGES, sent)
    got = read_all(storage, "room/+/temp")
    by_payload = sorted(got, key=lambda m: m.payload)
    assert [(m.topic, m.payload, m.qos, m.retain, m.publisher, m.properties)
            for m in by_payload] == [
        (m.topic, m.payload, m.qos, m.retain, m.publisher, m.properties) for m in sent]
    stamps = [m.timestamp for m in by_payload]  # one publisher = one shard: strictly rising
    assert stamps == sorted(stamps) and len(set(stamps)) == len(stamps)


async def test_iterator_survives_restart_and_sees_later_writes(open_storage, tmp_path) -> None:
    storage = open_storage()
    await storage.store_batch(MESSAGES, [message("t", payload=b"%d" % i) for i in range(10)])
    (stream,) = storage.get_streams(MESSAGES, "t/#")
    iterator, first = storage.next(storage.make_iterator(stream, "t/#"), 4)
    assert [m.payload for m in first] == [b"0", b"1", b"2", b"3"]
    saved = iterator.to_bytes()
    await storage.close()

    storage = open_storage()
    await storage.store_batch(MESSAGES, [message("t", payload=b"10")])
    iterator, rest = storage.next(Iterator.from_bytes(saved), 100)
    assert [m.payload for m in rest] == [b"%d" % i for i in range(4, 11)]
    assert storage.next(iterator, 100) == (iterator, [])


async def test_start_time_skips_older_messages(open_storage) -> None:
    storage = open_storage()
    await storage.store_batch(MESSAGES, [message("a")])
    boundary = now_us() + 1
    await storage.store_batch(MESSAGES, [message("a", payload=b"new")])
    assert [m.payload for m in read_all(storage, "a", boundary)] == [b"new"]


async def test_messages_are_sharded_by_publisher_and_n_shards_is_fixed(
    open_storage, tmp_path: Path
) -> None:
    storage = open_storage(n_shards=4)
    publishers = [f"client-{i}" for i in range(20)]
    await storage.store_batch(MESSAGES, [message("x", p) for p in publishers])
    for stream in storage.get_streams(MESSAGES, "x"):
        for m in drain(storage, stream, "x"):
            assert shard_of(m.publisher, 4) == stream.shard
    # CRC-32 of the client ID: the same in every process (hash() of a str is not)
    assert [shard_of(f"client-{i}", 4) for i in range(4)] == [0, 2, 0, 2]
    await storage.close()
    reopened = open_storage(n_shards=16)
    assert reopened.messages.n_shards == 4
    assert read_db_file(tmp_path / "ds" / MESSAGES)["n_shards"] == 4
    assert len(read_all(reopened, "x")) == 20


async def test_sealed_stream_ends_and_new_writes_go_to_a_new_generation(open_storage) -> None:
    storage = open_storage(n_shards=1)
    await storage.store_batch(MESSAGES, [message("s/1")])
    (old,) = storage.get_streams(MESSAGES, "s/1")
    iterator = storage.make_iterator(old, "s/1")
    assert await storage.seal() == 1
    await storage.store_batch(MESSAGES, [message("s/1", payload=b"after")])
    iterator, batch = storage.next(iterator, 10)
    assert [m.payload for m in batch] == [b"s/1"]
    assert storage.next(iterator, 10) == (None, [])
    streams = storage.get_streams(MESSAGES, "s/1")
    assert [s.generation for s in streams] == [1, 2]
    assert [m.payload for m in drain(storage, streams[1], "s/1")] == [b"after"]
