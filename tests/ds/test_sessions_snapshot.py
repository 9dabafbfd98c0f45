"""The sessions database's Raft snapshot (replication_shard.py): dumped on a worker thread
from a LevelDB snapshot taken when it starts, and installed from its file into a new
database swapped in whole. Neither side holds the database in memory or stops its event
loop to read it: a million durable sessions make a database of hundreds of MiB."""

from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

from broker.ds import DurableStorage
from broker.ds import replication_layer as cmd
from broker.ds.replication_shard import APPLIED_KEY, SNAPSHOT_KEY
from broker.raft.ready import SnapshotChunk
from tests.ds.replicas import CONFIG, SessionsReplica, snapshot_chunk, traced_transfer, transfer

PER_COMMAND = 64
VALUE = 4096


def commands(first: int, last: int, size: int = VALUE) -> list[bytes]:
    """KV commands `first`..`last` of writer A, chained, 64 keys of `size` bytes each."""
    return [cmd.encode_kv("A", n, n - 1, [(b"s%06d-%03d" % (n, i), b"%06d" % n + bytes(size))
                                          for i in range(PER_COMMAND)])
            for n in range(first, last + 1)]


def filled(storage: DurableStorage, count: int, size: int = VALUE,
           **kwargs: object) -> SessionsReplica:
    replica = SessionsReplica(storage, **kwargs)  # type: ignore[arg-type]
    for data in commands(1, count, size):
        replica.apply(data)
    return replica


def content(replica: SessionsReplica) -> dict[bytes, bytes]:
    """What a snapshot carries: all but the replica's own Raft bookkeeping."""
    return {key: value for key, value in replica.machine.kv.raw_items()
            if key not in (APPLIED_KEY, SNAPSHOT_KEY)}


def written_by(replica: SessionsReplica) -> set[int]:
    return {int(key[1:7]) for key in content(replica) if key.startswith(b"s")}


async def test_the_dump_runs_off_the_event_loop_on_the_state_it_started_from(
        open_storage: Callable[..., DurableStorage], tmp_path: Path) -> None:
    source = filled(open_storage(tmp_path / "source"), 20)
    told: list[int] = []
    source.machine.spool.on_dumped = lambda: told.append(source.machine.applied_index)
    assert source.machine.snapshot_chunk(0, 0) is None  # started, on a worker thread
    dumped = source.machine.spool.dumped
    for data in commands(21, 30):  # applied before the loop hears the dump is done
        source.apply(data)
    assert source.machine.flush() == 20  # the log keeps what follows the dump
    assert dumped is not None
    await dumped
    assert told == [30]  # the core is told to ask again
    target = SessionsReplica(open_storage(tmp_path / "target"))
    assert await transfer(source.machine, target.machine) == 20
    assert written_by(target) == set(range(1, 21))
    assert target.machine.chains == {"A": 20}
    assert source.machine.flush() == 30


async def test_a_sessions_database_larger_than_memory_allows_moves_and_is_swapped_in(
        open_storage: Callable[..., DurableStorage], tmp_path: Path) -> None:
    source = filled(open_storage(tmp_path / "source"), 64)  # 16 MiB of values
    heard: list[tuple[int, bool]] = []

    def on_writes(writes: Iterable[cmd.KVWrite], replaced: bool) -> None:
        heard.append((sum(1 for _ in writes), replaced))

    target_storage = open_storage(tmp_path / "target")
    target = filled(target_storage, 3, on_writes=on_writes)
    stale = target_storage.sessions.path.with_name("sessions.retired")
    heard.clear()

    at, peak = await traced_transfer(source.machine, target.machine)

    assert at == 64
    assert peak < 6 << 20, f"{peak / 2**20:.1f} MiB held at once for 16 MiB of sessions"
    assert content(target) == content(source)  # what it held before is gone
    assert target.machine.applied_index == 64
    installed = target.machine.snapshot()
    assert installed is not None and installed.index == 64
    assert heard == [(64 * PER_COMMAND + 3, True)]  # every key, and the Raft bookkeeping
    assert not stale.exists() and list(tmp_path.rglob("*.snapshot*")) == []
    target.index = at
    target.apply(commands(65, 65)[0])  # the target carries on from there
    assert written_by(target) == set(range(1, 66))


async def test_an_install_that_fails_leaves_the_database_as_it_was(
        open_storage: Callable[..., DurableStorage], tmp_path: Path) -> None:
    source = filled(open_storage(tmp_path / "source"), 8, size=10)  # one chunk
    target = filled(open_storage(tmp_path / "target"), 2, size=10)
    at, data, done = await snapshot_chunk(source.machine, 0, 0)
    assert done
    with pytest.raises(cmd.BadCommand):  # cut short in its last record
        target.machine.install_chunk(SnapshotChunk(at, 1, CONFIG, 0, data[:-10], True))
    assert written_by(target) == {1, 2}
    assert target.machine.applied_index == 2
    assert list(tmp_path.rglob("*.snapshot*")) == []


async def test_a_dump_is_ended_before_the_database_closes(
        open_storage: Callable[..., DurableStorage], tmp_path: Path) -> None:
    storage = open_storage(tmp_path)
    replica = filled(storage, 40)
    assert replica.machine.snapshot_chunk(0, 0) is None
    dumped = replica.machine.spool.dumped
    replica.machine.spool.end_dump(for_good=True)  # as the node's stop does
    assert dumped is not None and dumped.done()  # its thread reads no more
    replica.machine.spool.idle = 0.0
    replica.machine.spool.drop_idle()  # had it ended before it was stopped
    assert replica.machine.snapshot_chunk(0, 0) is None  # and none starts again
    assert replica.machine.spool.dumped is dumped
    await storage.close()
