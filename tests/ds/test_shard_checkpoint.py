"""A replicated shard's checkpoint (shard.py): the applied index and the writers' serials are
written with the counters, not with every batch, so a restarted shard holds more than its
checkpoint counts and the log replays the commands after it. These tests run the shard's
Raft machine on real LevelDB directories and stop it the way a crash does (slabs closed, no
checkpoint written on the way out)."""

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.ds.keys import meta_key
from broker.ds.manifest import NAME as MANIFEST
from broker.ds.slab import CHECKPOINT_KEY
from broker.raft.messages import Config
from broker.raft.ready import SnapshotChunk
from tests.ds.replicas import Replica, by_generation, install_chunk, snapshot_chunk, stores


def test_a_restarted_shard_replays_past_its_checkpoint_to_the_same_keys(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = Replica(tmp_path, executor)
    for index, data in enumerate(stores(1, 20), start=1):
        replica.apply(index, data)
    before = replica.stored()
    assert len(before) == 60 and len({ts for ts, _, _ in before}) == 60
    replica.crash()

    restarted = Replica(tmp_path, executor)
    # The first STORE wrote the checkpoint; the other 19 are in LevelDB and counted nowhere.
    assert restarted.machine.applied_index == 1
    assert restarted.machine.shard.current.stats.messages == 3
    for index, data in enumerate(stores(2, 20), start=2):  # the log replays them
        restarted.apply(index, data)
    assert restarted.stored() == before  # rewritten, not written twice
    assert restarted.machine.shard.current.stats.messages == 60
    assert restarted.machine.shard.duplicates == 0

    restarted.apply(21, stores(21, 21)[0])
    after = restarted.stored()
    assert after[:60] == before and len(after) == 63 and after[60][0] > before[-1][0]


def test_a_flush_checkpoints_what_was_applied(tmp_path: Path,
                                              executor: ThreadPoolExecutor) -> None:
    replica = Replica(tmp_path, executor)
    for index, data in enumerate(stores(1, 5), start=1):
        replica.apply(index, data)
    assert replica.machine.flush() == 5
    replica.crash()
    restarted = Replica(tmp_path, executor)
    assert restarted.machine.applied_index == 5
    assert restarted.machine.shard.current.stats.messages == 15
    restarted.apply(6, stores(5, 5)[0])  # a writer's retry, applied again as a new entry
    assert restarted.machine.shard.duplicates == 1 and len(restarted.stored()) == 15


async def test_a_snapshot_carries_the_writers_of_its_index(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = Replica(tmp_path / "source", executor)
    for index, data in enumerate(stores(1, 4), start=1):
        source.apply(index, data)
    at, data, done = await snapshot_chunk(source.machine, 0, 0)
    assert (at, done) == (4, True)
    target = Replica(tmp_path / "target", executor)
    await install_chunk(target.machine, SnapshotChunk(4, 1, Config(frozenset({"a", "b", "c"})),
                                                      0, data, True))
    assert target.stored() == source.stored()
    target.apply(5, stores(4, 4)[0])  # the writer's retry of serial 4: skipped
    assert target.machine.shard.duplicates == 1
    target.crash()
    # The duplicate changed no data: only the log knows it was applied.
    assert Replica(tmp_path / "target", executor).machine.applied_index == 4


def test_a_slab_written_with_the_applied_index_in_every_batch_is_converted(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = Replica(tmp_path, executor)
    for index, data in enumerate(stores(1, 6), start=1):
        replica.apply(index, data)
    db = replica.machine.shard.current.db
    db.delete(CHECKPOINT_KEY)  # as the previous format left it: exact, in every batch
    db.put(meta_key("raft_applied"), (6).to_bytes(8, "big") + (1).to_bytes(8, "big"))
    db.put(meta_key("raft_writers"), b'{"site-a": 6}')
    before = replica.stored()
    replica.crash()
    restarted = Replica(tmp_path, executor)
    assert restarted.machine.applied_index == 6
    assert restarted.machine.shard.current.stats.messages == 18  # counted at open
    restarted.apply(7, stores(6, 7)[0])  # serial 6 again: a retry
    restarted.apply(8, stores(7, 7)[0])
    assert restarted.machine.shard.duplicates == 1
    assert restarted.stored()[:18] == before and len(restarted.stored()) == 21
    restarted.crash()
    assert Replica(tmp_path, executor).machine.applied_index == 6  # its checkpoint



async def test_a_rotation_cut_short_by_a_crash_is_finished_at_open(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """The STORE that fills a slab rotates it at once, syncing the checkpoint (which then
    counts that STORE) before the next slab exists: the log does not replay it, so opening
    must finish that rotation, or the next commands would land in another generation than
    on every other replica."""
    settings = {"generation_max_size": 400}
    intact = Replica(tmp_path / "intact", executor, **settings)
    commands = stores(1, 12)
    for index, data in enumerate(commands, start=1):
        intact.apply(index, data)
        if len(intact.machine.shard.slabs) > 1:
            break
    rotated_at = index
    assert rotated_at < 12, "no rotation: make the generations smaller"
    await intact.machine.shard.wait_sealed()

    cut = Replica(tmp_path / "cut", executor, **settings)
    for index, data in enumerate(commands[:rotated_at], start=1):
        cut.apply(index, data)
    await cut.machine.shard.wait_sealed()
    cut.crash()
    shard_dir = tmp_path / "cut" / "shard-000"
    newest = max(shard_dir.iterdir())
    shutil.rmtree(newest)  # the next slab was never created,
    (min(shard_dir.iterdir()) / MANIFEST).unlink()  # so the full one never sealed

    restarted = Replica(tmp_path / "cut", executor, **settings)
    assert restarted.machine.applied_index == rotated_at
    for index, data in enumerate(commands[rotated_at:], start=rotated_at + 1):
        restarted.apply(index, data)
        intact.apply(index, data)
    await restarted.machine.shard.wait_sealed()
    await intact.machine.shard.wait_sealed()
    assert by_generation(restarted) == by_generation(intact)
