"""A shard of the messages database is created on its first write: a node started on an
empty data dir makes none before its first client (a dozen fsyncs each). Writes that
arrive while it is being made wait for it, in order, and are acknowledged only once
durable; a shard made so opens again with the database; a failed creation fails the writes
waiting for it, and the next write tries again."""

import asyncio
import shutil
from collections.abc import Callable
from pathlib import Path

from broker.ds import DurableStorage
from broker.ds.db import shard_of
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message, read_all

Open = Callable[..., DurableStorage]


def shard_dirs(storage: DurableStorage) -> list[str]:
    return sorted(path.name for path in storage.messages.path.glob("shard-*"))


def publisher_of(shard: int, n_shards: int) -> str:
    return next(name for name in (f"p{i}" for i in range(1000))
                if shard_of(name, n_shards) == shard)


async def test_an_empty_data_dir_gets_no_shard_until_a_write(open_storage: Open) -> None:
    storage = open_storage(n_shards=4)
    storage.start()
    assert shard_dirs(storage) == [] and storage.messages.created_shards == []
    assert read_all(storage, "#") == [] and storage.get_streams(MESSAGES, "#", shard=2) == []
    assert storage.messages.info()["shards"] == [] and storage.metrics()
    assert await storage.seal() == 0 and await storage.apply_retention() == 0
    await storage.store_batch(MESSAGES, [message("t", publisher=publisher_of(2, 4))])
    assert shard_dirs(storage) == ["shard-002"]
    assert [shard.index for shard in storage.messages.created_shards] == [2]
    assert [m.payload for m in read_all(storage, "t")] == [b"t"]
    # made ahead as for the shards opened at the start (storage.start)
    await asyncio.wrap_future(storage.messages.shard(2).prepare_next())


async def test_writes_waiting_for_their_shard_keep_their_order(
        open_storage: Open, tmp_path: Path) -> None:
    storage = open_storage(n_shards=2)
    first, second = publisher_of(0, 2), publisher_of(1, 2)
    written = [storage.store_batch(MESSAGES, [message("o", publisher=first, payload=b"%d" % i)])
               for i in range(20)]
    written.append(storage.store_batch(
        MESSAGES, [message("o", publisher=first, payload=b"20"),
                   message("o", publisher=second, payload=b"x")]))
    assert storage.messages.created_shards == []  # made on a worker thread: not yet
    await asyncio.gather(*written)
    await storage.close()
    again = open_storage(tmp_path)  # both opened with the database, everything on disk
    assert [shard.index for shard in again.messages.created_shards] == [0, 1]
    by_shard = {shard: [m.payload for m in read_all(again, "o") if shard_of(m.publisher, 2)
                        == shard] for shard in (0, 1)}
    assert by_shard == {0: [b"%d" % i for i in range(21)], 1: [b"x"]}


async def test_a_close_waits_for_a_shard_being_made_and_its_writes(
        open_storage: Open, tmp_path: Path) -> None:
    storage = open_storage(n_shards=1)
    written = storage.store_batch(MESSAGES, [message("c")])
    await storage.close()
    await written
    assert [m.payload for m in read_all(open_storage(tmp_path), "c")] == [b"c"]


async def test_a_failed_creation_fails_its_writes_and_the_next_write_tries_again(
        open_storage: Open) -> None:
    storage = open_storage(n_shards=1)
    in_the_way = storage.messages.shard_path(0)
    in_the_way.write_bytes(b"")  # a file where the shard's directory goes
    failed = [storage.store_batch(MESSAGES, [message("f", payload=b"%d" % i)]) for i in range(2)]
    for write in failed:
        assert isinstance((await asyncio.gather(write, return_exceptions=True))[0], OSError)
    assert storage.messages.created_shards == []
    in_the_way.unlink()
    await storage.store_batch(MESSAGES, [message("f", payload=b"again")])
    assert [m.payload for m in read_all(storage, "f")] == [b"again"]


async def test_create_makes_the_shards_not_made_yet(open_storage: Open) -> None:
    storage = open_storage(n_shards=3)
    await storage.store_batch(MESSAGES, [message("k", publisher=publisher_of(1, 3))])
    kept = storage.messages.shard(1)
    storage.messages.create([0])
    assert shard_dirs(storage) == ["shard-000", "shard-001"]
    storage.messages.create()
    assert shard_dirs(storage) == ["shard-000", "shard-001", "shard-002"]
    assert storage.messages.shard(1) is kept
    assert [m.payload for m in read_all(storage, "k")] == [b"k"]


async def test_create_async_makes_the_rest_off_the_loop(open_storage: Open) -> None:
    storage = open_storage(n_shards=3)
    await storage.messages.create_async()
    assert [shard.index for shard in storage.messages.created_shards] == [0, 1, 2]
    await storage.messages.create_async()  # nothing left to make


async def _built_beside(open_storage: Open, tmp_path: Path) -> tuple[DurableStorage, Path]:
    """A one-shard node, and a shard holding "r" built beside it (as an import builds one)."""
    source = open_storage(tmp_path / "source", n_shards=1)
    await source.store_batch(MESSAGES, [message("r")])
    await source.close()
    target = open_storage(tmp_path / "target", n_shards=1)
    built = tmp_path / "target" / "built"
    shutil.copytree(source.messages.shard_path(0), built)
    return target, built


async def test_a_shard_never_created_is_replaced_like_any_other(
        open_storage: Open, tmp_path: Path) -> None:
    """A backup import into an empty node (MessagesDB.replace_shards): the shard built
    beside takes the place of one that was never made (files.swap_in)."""
    target, built = await _built_beside(open_storage, tmp_path)
    await target.messages.replace_shards({0: built})
    assert [m.payload for m in read_all(target, "r")] == [b"r"]
    assert sorted(p.name for p in target.messages.path.iterdir()) == ["db.json", "shard-000"]
    assert not built.exists()


async def test_writes_during_a_replace_wait_for_the_new_shard_in_order(
        open_storage: Open, tmp_path: Path) -> None:
    """The swap and open run on worker threads, the event loop free meanwhile: writes that
    arrive go into the shard swapped in, after what it brought, in their order."""
    target, built = await _built_beside(open_storage, tmp_path)
    await target.store_batch(MESSAGES, [message("old")])
    replacing = asyncio.ensure_future(target.messages.replace_shards({0: built}))
    await asyncio.sleep(0)  # it began: the shard is closed, its swap on a worker thread
    writes = [target.store_batch(MESSAGES, [message(f"w/{n}")]) for n in range(3)]
    assert not replacing.done()
    await replacing
    await asyncio.gather(*writes)
    assert [m.payload for m in read_all(target, "r")] == [b"r"]
    assert [m.payload for m in read_all(target, "w/+")] == [b"w/0", b"w/1", b"w/2"]
    assert read_all(target, "old") == []  # (an import refuses a node written to meanwhile)
