"""A generation restored from a backup through a shard's Raft log (LOAD commands,
Shard.apply_load): every replica ends with the source's slabs, sealed ones sealed; a load
into a shard holding data is refused alike everywhere; a crash mid-load replays."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import plyvel

from broker.backup.collect import RAFT_META
from broker.ds import replication_layer as cmd
from tests.ds.replicas import Replica, by_generation, stores


def loads(source: Replica, pairs_per_chunk: int = 7) -> list[bytes]:
    """The source shard's generations as LOAD commands, oldest first (as an import makes
    them from an archive)."""
    commands = []
    for generation, slab in sorted(source.machine.shard.slabs.items()):
        db = plyvel.DB(str(slab.path)) if not slab.is_open else slab.db
        pairs = [(k, v) for k, v in db.iterator() if not k.startswith(RAFT_META)]
        if not slab.is_open:
            db.close()
        chunks = [pairs[i:i + pairs_per_chunk] for i in range(0, len(pairs), pairs_per_chunk)]
        for n, chunk in enumerate(chunks):
            flags = (cmd.LOAD_FIRST if n == 0 else 0) | (
                cmd.LOAD_LAST if n == len(chunks) - 1 else 0)
            commands.append(cmd.encode_load(generation, slab.sealed_at or 0, flags, chunk))
    return commands


async def filled(path: Path, executor: ThreadPoolExecutor) -> Replica:
    source = Replica(path, executor)
    index = 0
    for batch in (stores(1, 10), [cmd.encode_rotate(2_000)], stores(11, 20),
                  [cmd.encode_rotate(3_000)], stores(21, 25)):
        for data in batch:
            index += 1
            source.apply(index, data)
    await source.machine.shard.wait_sealed()
    assert len(source.machine.shard.slabs) == 3
    return source


async def test_loaded_generations_equal_the_source_and_take_writes_after(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await filled(tmp_path / "source", executor)
    target = Replica(tmp_path / "target", executor)
    for index, data in enumerate(loads(source), start=1):
        target.apply(index, data)
    await target.machine.shard.wait_sealed()
    assert by_generation(target) == by_generation(source)
    shard = target.machine.shard
    assert [slab.sealed for _, slab in sorted(shard.slabs.items())] == [True, True, False]
    assert (shard.slabs[1].path / "manifest.json").exists()
    last = max(t for t, _, _ in target.stored())
    target.apply(1000, stores(26, 26)[0])
    assert max(t for t, _, _ in target.stored()) > last
    assert cmd.decode_load(loads(source)[0]).flags & cmd.LOAD_FIRST


async def test_a_load_into_a_shard_holding_data_is_refused(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await filled(tmp_path / "source", executor)
    target = Replica(tmp_path / "target", executor)
    target.apply(1, stores(1, 1)[0])
    before = by_generation(target)
    target.apply(2, loads(source)[0])
    assert target.machine.bad_commands == 1
    assert by_generation(target) == before


async def test_a_crash_mid_load_replays_from_the_first_chunk(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await filled(tmp_path / "source", executor)
    commands = loads(source)
    target = Replica(tmp_path / "target", executor)
    for index, data in enumerate(commands[:3], start=1):
        target.apply(index, data)
    target.crash()
    target = Replica(tmp_path / "target", executor)
    for index, data in enumerate(commands, start=1):
        if index > target.machine.applied_index:
            target.apply(index, data)
    await target.machine.shard.wait_sealed()
    assert by_generation(target) == by_generation(source)
