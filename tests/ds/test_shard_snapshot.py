"""A replicated shard's snapshot goes through files on both sides (replication_shard.py): a
shard can be far larger than a node may hold in memory, so neither the sender nor the
receiver may hold more than a few chunks of it at once."""

import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.ds import replication_layer as cmd
from broker.raft.messages import Config
from broker.raft.ready import SnapshotChunk
from tests.ds.conftest import message
from tests.ds.replicas import Replica, by_generation

CONFIG = Config(frozenset({"a", "b", "c"}))
PER_STORE = 200


def big_stores(first: int, last: int) -> list[bytes]:
    """STORE commands of 200 messages of 1 KiB each."""
    return [cmd.encode_store(1_000 + n, "site-a", n,
                             [message(f"t/{i % 4}", payload=b"%06d" % n + bytes(1018))
                              for i in range(PER_STORE)])
            for n in range(first, last + 1)]


def transfer(source: Replica, target: Replica) -> int:
    """Moves a snapshot chunk by chunk, as the Raft core asks for them; returns its index."""
    index = offset = 0
    while True:
        at, data, done = source.machine.snapshot_chunk(index, offset)
        target.machine.install_chunk(SnapshotChunk(at, 1, CONFIG, offset, data, done))
        if done:
            return at
        index, offset = at, offset + len(data)


def spooled(*roots: Path) -> list[Path]:
    return [path for root in roots for path in root.rglob("*.snapshot-*")]


async def test_a_snapshot_larger_than_memory_allows_moves_chunk_by_chunk(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = Replica(tmp_path / "source", executor, generation_max_size=8 << 20)
    commands = big_stores(1, 120)  # 24 MiB of payload
    for index, data in enumerate(commands, start=1):
        source.apply(index, data)
    await source.machine.shard.wait_sealed()
    assert len(source.machine.shard.slabs) >= 3  # sealed generations and the current one
    target = Replica(tmp_path / "target", executor)

    tracemalloc.start()
    try:
        at = transfer(source, target)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert at == len(commands)
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB held at once for a 24 MiB snapshot"
    assert by_generation(target) == by_generation(source)
    assert sum(len(messages) for messages in by_generation(target).values()) == 120 * PER_STORE
    assert target.machine.applied_index == at
    assert spooled(tmp_path) == []  # both files go once the transfer is done
    target.apply(at + 1, big_stores(at + 1, at + 1)[0])  # the target carries on from there
    assert target.machine.applied_index == at + 1


def test_a_spooled_snapshot_serves_every_transfer_and_holds_back_compaction(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """The dump blocks the event loop: one serves a follower that starts over and another
    that catches up too, and the log keeps what follows it so the leader can still send it."""
    source = Replica(tmp_path / "source", executor)
    for index, data in enumerate(big_stores(1, 10), start=1):
        source.apply(index, data)
    at, first, done = source.machine.snapshot_chunk(0, 0)
    assert (at, done) == (10, False)
    source.apply(11, big_stores(11, 11)[0])
    assert source.machine.flush() == 10  # not past the snapshot being sent
    again, restarted, _ = source.machine.snapshot_chunk(0, 0)  # a new transfer
    assert (again, restarted) == (10, first)
    target = Replica(tmp_path / "target", executor)
    assert transfer(source, target) == 10
    held = by_generation(target)
    assert sum(map(len, held.values())) == 10 * PER_STORE  # the state at 10, not at 11
    assert source.machine.flush() == 11  # sent whole: the log may go
    assert spooled(tmp_path) == []
    # A stale request (an index no longer spooled) gets a new one, at the applied index.
    assert source.machine.snapshot_chunk(10, 262_144)[0] == 11


def test_a_spooled_snapshot_no_transfer_reads_is_dropped(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = Replica(tmp_path, executor)
    for index, data in enumerate(big_stores(1, 3), start=1):
        replica.apply(index, data)
    assert replica.machine.snapshot_chunk(0, 0)[0] == 3
    replica.apply(4, big_stores(4, 4)[0])
    replica.machine.drop_idle_spool()
    assert spooled(tmp_path) != []  # read just now
    replica.machine.spool_idle = 0.0
    replica.machine.drop_idle_spool()
    assert spooled(tmp_path) == []
    assert replica.machine.flush() == 4


def test_files_a_crash_left_mid_transfer_are_removed_at_start(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    Replica(tmp_path, executor).crash()
    for suffix in (".snapshot-out", ".snapshot-in"):
        (tmp_path / f"shard-000{suffix}").write_bytes(bytes(1 << 20))
    Replica(tmp_path, executor)
    assert spooled(tmp_path) == []
