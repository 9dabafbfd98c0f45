"""Generations: rotation by size and on demand, manifests, retention, interrupted seals."""

import json
import shutil
from pathlib import Path

import plyvel

from broker.ds import now_us
from broker.ds.manifest import read_manifest
from broker.ds.shard import generation_dir
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message, read_all


def shard_dir(root: Path, shard: int = 0) -> Path:
    return root / "ds" / MESSAGES / f"shard-{shard:03d}"


async def test_seal_writes_a_manifest_an_offline_reader_can_use(open_storage, tmp_path) -> None:
    storage = open_storage(n_shards=1, wildcard_thresholds=(1,))
    await storage.store_batch(MESSAGES, [message(f"m/{i}/x") for i in range(30)])
    shard = storage.messages.created_shards[0]
    stats = shard.current.stats
    assert await storage.seal() == 1
    manifest = read_manifest(generation_dir(shard_dir(tmp_path), 1))
    assert manifest is not None
    assert manifest["messages"] == 30 and manifest["bytes"] == stats.size
    assert manifest["since"] <= manifest["min_timestamp"] <= manifest["max_timestamp"]
    assert manifest["max_timestamp"] <= manifest["until"]
    assert sorted(s["structure"] for s in manifest["streams"]) == ["m/+/x", "m/0/x"]
    assert manifest["lts"]["thresholds"] == [1]
    assert [g["state"] for g in shard.info()["generations"]] == ["sealed", "current"]
    assert await storage.seal() == 0  # an empty current generation is left alone


async def test_size_limit_starts_a_new_generation(open_storage) -> None:
    storage = open_storage(n_shards=1, generation_max_size=4000)
    for i in range(10):
        await storage.store_batch(MESSAGES, [message("big", payload=bytes(900), publisher="p")])
        assert len(read_all(storage, "big")) == i + 1
    await storage.messages.created_shards[0].wait_sealed()
    generations = storage.messages.created_shards[0].info()["generations"]
    assert len(generations) >= 3
    assert all(g["bytes"] < 4000 + 1000 for g in generations)
    assert sum(g["messages"] for g in generations) == 10


async def test_retention_drops_old_generations_and_iterators_move_on(open_storage) -> None:
    storage = open_storage(n_shards=1, retention_period=60.0)
    await storage.store_batch(MESSAGES, [message("r", payload=b"old")])
    (old_stream,) = storage.get_streams(MESSAGES, "r")
    iterator = storage.make_iterator(old_stream, "r")
    assert await storage.apply_retention() == 0
    assert len(storage.messages.created_shards[0].slabs) == 1
    # a minute later every generation is too old: the current one is sealed first (a new
    # one takes the writes) and then dropped whole
    assert await storage.apply_retention(now_us() + 61 * 10**6) == 1
    assert not generation_dir(shard_dir(storage.root.parent), 1).exists()
    assert list(storage.messages.created_shards[0].slabs) == [2]
    await storage.store_batch(MESSAGES, [message("r", payload=b"new")])
    assert storage.next(iterator, 10) == (None, [])
    assert [m.payload for m in read_all(storage, "r")] == [b"new"]


async def test_open_finishes_a_seal_a_crash_interrupted(open_storage, tmp_path) -> None:
    storage = open_storage(n_shards=1)
    await storage.store_batch(MESSAGES, [message("c")])
    await storage.seal()
    await storage.close()
    first = generation_dir(shard_dir(tmp_path), 1)
    (first / "manifest.json").unlink()  # as if the process died before writing it
    leftover = shard_dir(tmp_path) / "gen-000003.tmp"
    shutil.copytree(generation_dir(shard_dir(tmp_path), 2), leftover)  # a half-made slab

    storage = open_storage(n_shards=1)
    assert json.loads((first / "manifest.json").read_text())["messages"] == 1
    assert not leftover.exists()
    assert [g["state"] for g in storage.messages.created_shards[0].info()["generations"]] == [
        "sealed", "current"]
    assert len(read_all(storage, "c")) == 1
    await storage.close()
    for slab in shard_dir(tmp_path).iterdir():
        plyvel.DB(str(slab), create_if_missing=False).close()


async def test_generation_timer_seals_and_subscribers_see_the_end(open_storage) -> None:
    storage = open_storage(n_shards=1, generation_interval=0.05)
    await storage.store_batch(MESSAGES, [message("tick")])
    (stream,) = storage.get_streams(MESSAGES, "tick")
    subscription = storage.subscribe(storage.make_iterator(stream, "tick"), 10)
    _, first = await subscription.next()
    assert [m.topic for m in first] == ["tick"]
    storage.start()
    assert await subscription.next() == (None, [])  # woken by the seal, not by polling
    assert storage.messages.created_shards[0].slabs[1].sealed


def _tables_bytes(generation: Path) -> int:
    return sum(table.stat().st_size for table in generation.glob("*.ldb"))


async def test_compression_setting_decides_how_the_tables_are_written(
        open_storage, tmp_path) -> None:
    """The same compressible messages, sealed (so compacted into tables) under each setting:
    snappy's tables are a fraction of the uncompressed ones', and both read back alike."""
    sizes = {}
    for compression in ("none", "snappy"):
        root = tmp_path / compression
        storage = open_storage(root, n_shards=1, compression=compression)
        batch = [message(f"dev/{i % 7}/t", payload=b'{"temp": 21.5, "unit": "C"}' * 8)
                 for i in range(3000)]
        await storage.store_batch(MESSAGES, batch)
        assert await storage.seal() == 1
        await storage.messages.created_shards[0].wait_sealed()
        assert len(read_all(storage, "dev/+/t")) == 3000
        sizes[compression] = _tables_bytes(generation_dir(shard_dir(root), 1))
    assert sizes["none"] > 3000 * 8 * 27  # every payload byte on disk
    assert sizes["snappy"] * 4 < sizes["none"]


async def test_a_sealed_generation_has_no_level_0_table_left(open_storage, tmp_path) -> None:
    """The seal compacts the whole slab: its level-0 tables (many streams' keys overlap in
    each) go into the levels below, so LevelDB finds nothing to rewrite in a sealed slab's
    files later (an export or a catch-up ships them as they are). An omitted end of the
    range compacted nothing: plyvel gives it as the empty key."""
    storage = open_storage(n_shards=1)
    for batch in range(12):
        await storage.store_batch(MESSAGES, [message(f"t/{i}", payload=bytes(1000))
                                             for i in range(batch, 1200, 12)])
    assert await storage.seal() == 1
    assert len(read_all(storage, "t/+")) == 1200
    await storage.close()
    db = plyvel.DB(str(generation_dir(shard_dir(tmp_path), 1)))
    try:
        assert db.get_property(b"leveldb.num-files-at-level0") == b"0"
    finally:
        db.close()
