"""A replicated shard's snapshot (replication_shard.py): dumped on a worker thread from a
view fixed when it starts, and moved through files on both sides, since a shard can be far
larger than a node may hold in memory or stop its event loop to read."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.ds import replication_layer as cmd
from broker.raft.spool import PACED_SECONDS, Pace
from tests.ds.conftest import message
from tests.ds.replicas import Replica, by_generation, snapshot_chunk, traced_transfer, transfer

PER_STORE = 200


def big_stores(first: int, last: int) -> list[bytes]:
    """STORE commands of 200 messages of 1 KiB each."""
    return [cmd.encode_store(1_000 + n, "site-a", n,
                             [message(f"t/{i % 4}", payload=b"%06d" % n + bytes(1018))
                              for i in range(PER_STORE)])
            for n in range(first, last + 1)]


def filled(path: Path, executor: ThreadPoolExecutor, stores: int, **settings: int) -> Replica:
    replica = Replica(path, executor, **settings)
    for index, data in enumerate(big_stores(1, stores), start=1):
        replica.apply(index, data)
    return replica


def held(replica: Replica) -> int:
    return sum(map(len, by_generation(replica).values()))


def spooled(*roots: Path) -> list[Path]:
    return [path for root in roots for path in root.rglob("*.snapshot-*")]


async def test_a_snapshot_larger_than_memory_allows_moves_chunk_by_chunk(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = filled(tmp_path / "source", executor, 120, generation_max_size=8 << 20)
    await source.machine.shard.wait_sealed()  # 24 MiB of payload
    assert len(source.machine.shard.slabs) >= 3  # sealed generations and the current one
    target = Replica(tmp_path / "target", executor)

    at, peak = await traced_transfer(source.machine, target.machine)

    assert at == 120
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB held at once for a 24 MiB snapshot"
    assert by_generation(target) == by_generation(source)
    assert held(target) == 120 * PER_STORE
    assert target.machine.applied_index == at
    assert spooled(tmp_path) == []  # both files go once the transfer is done
    target.apply(at + 1, big_stores(at + 1, at + 1)[0])  # the target carries on from there
    assert target.machine.applied_index == at + 1


async def test_the_dump_runs_off_the_event_loop_on_the_state_it_started_from(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = filled(tmp_path / "source", executor, 30)
    told: list[int] = []
    source.machine.spool.on_dumped = lambda: told.append(source.machine.applied_index)
    assert source.machine.snapshot_chunk(0, 0) is None  # started, on a worker thread
    dumped = source.machine.spool.dumped
    for index, data in enumerate(big_stores(31, 40), start=31):  # while it runs
        source.apply(index, data)
    assert source.machine.flush() == 30  # the log keeps what follows the dump
    assert dumped is not None
    await dumped
    assert told == [40]  # the core is told to ask again
    target = Replica(tmp_path / "target", executor)
    assert await transfer(source.machine, target.machine) == 30
    assert held(target) == 30 * PER_STORE and held(source) == 40 * PER_STORE
    assert source.machine.flush() == 40


async def test_a_spooled_snapshot_serves_every_transfer_and_holds_back_compaction(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """One dump serves a follower that starts over and another that catches up too, and
    the log keeps what follows it so the leader can still send it."""
    source = filled(tmp_path / "source", executor, 10)
    at, first, done = await snapshot_chunk(source.machine, 0, 0)
    assert (at, done) == (10, False)
    source.apply(11, big_stores(11, 11)[0])
    assert source.machine.flush() == 10  # not past the snapshot being sent
    assert source.machine.snapshot_chunk(0, 0) == (10, first, False)  # a new transfer
    target = Replica(tmp_path / "target", executor)
    assert await transfer(source.machine, target.machine) == 10
    assert held(target) == 10 * PER_STORE  # the state at 10, not at 11
    assert source.machine.flush() == 11  # sent whole: the log may go
    assert spooled(tmp_path) == []
    # A request of the transfer that ended starts a new dump, at the applied index, which
    # the core gets once it starts over.
    assert source.machine.snapshot_chunk(10, 262_144) is None
    assert (await snapshot_chunk(source.machine, 0, 0))[0] == 11
    assert source.machine.snapshot_chunk(10, 0) is None  # not the one spooled now


async def test_a_spooled_snapshot_no_transfer_reads_is_dropped(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = filled(tmp_path, executor, 8)  # 1.6 MiB: two chunks
    assert (await snapshot_chunk(replica.machine, 0, 0))[0] == 8
    replica.apply(9, big_stores(9, 9)[0])
    replica.machine.spool.drop_idle()
    assert spooled(tmp_path) != []  # read just now
    replica.machine.spool.idle = 0.0
    replica.machine.spool.drop_idle()
    assert spooled(tmp_path) == []
    assert replica.machine.flush() == 9


async def test_a_slow_pace_cuts_chunks_that_leave_well_within_an_election_timeout(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """A paced chunk holds the next one back for as long as it takes at the rate: at 1MB/s
    a whole chunk would hold it over a second, past the one after which the Raft core
    gives a transfer up."""
    replica = filled(tmp_path, executor, 30)
    replica.machine.spool.pace = Pace((1_000_000, 1.0))
    at, data, done = await snapshot_chunk(replica.machine, 0, 0)
    assert (at, len(data), done) == (30, 1_000_000 * PACED_SECONDS, False)


async def test_a_dump_is_ended_before_its_slabs_are_closed(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = filled(tmp_path, executor, 60)
    assert replica.machine.snapshot_chunk(0, 0) is None
    dumped = replica.machine.spool.dumped
    replica.machine.spool.end_dump()  # as a snapshot install or the node's stop does
    assert dumped is not None and dumped.done()
    assert spooled(tmp_path) == []
    assert replica.machine.flush() == 60  # nothing held back any more
    replica.apply(61, big_stores(61, 61)[0])  # the shard goes on
    assert (await snapshot_chunk(replica.machine, 0, 0))[0] == 61  # and dumps again
    replica.machine.spool.idle = 0.0
    replica.machine.spool.drop_idle()
    replica.machine.spool.end_dump(for_good=True)
    assert replica.machine.snapshot_chunk(0, 0) is None  # the node stops: no new dump
    assert replica.machine.spool.dumped is not None and replica.machine.spool.dumped.done()
    assert spooled(tmp_path) == []


def test_files_a_crash_left_mid_transfer_are_removed_at_start(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    Replica(tmp_path, executor).crash()
    for suffix in (".snapshot-out", ".snapshot-in"):
        (tmp_path / f"shard-000{suffix}").write_bytes(bytes(1 << 20))
    Replica(tmp_path, executor)
    assert spooled(tmp_path) == []
