"""The sessions database's Raft machine keeps a prefix of each writer's KV commands: one
that does not follow its writer's last applied command is refused whole, so a read position
can never be applied without the batch record written before it (replication_layer.py)."""

from collections.abc import Callable
from pathlib import Path

import pytest

from broker.ds import DurableStorage
from broker.ds import replication_layer as cmd
from broker.ds.replication_shard import follows
from broker.raft.messages import Config
from broker.raft.ready import SnapshotChunk
from broker.session.durable import records as r
from broker.session.durable.ownership import admitted, sweep_writes
from tests.ds.replicas import SessionsReplica, snapshot_chunk


def test_follows() -> None:
    def command(serial: int, prev: int | None) -> cmd.KVCommand:
        return cmd.KVCommand("A", serial, prev, [])

    assert follows(0, command(5, 0)) is True  # the writer's first command
    assert follows(5, command(9, 5)) is True
    assert follows(5, command(20, 0)) is True  # the writer restarted: a new chain
    assert follows(9, command(9, 5)) is None  # a retried copy
    assert follows(9, command(7, 5)) is None  # given up on and chained past
    assert follows(9, command(12, 7)) is False  # its predecessor 7 was never applied
    assert follows(9, command(3, None)) is True  # KV_V1: no chain


def record(client_id: str, first: int) -> cmd.KVWrite:
    return r.batch_key(client_id, first), b"record"


def position(client_id: str, value: bytes) -> cmd.KVWrite:
    return r.prefix(b"p", client_id) + b"t", value


@pytest.fixture
def replica(open_storage: Callable[..., DurableStorage]) -> SessionsReplica:
    return SessionsReplica(open_storage())


def test_a_gap_is_refused_whole_and_told_to_its_writer(replica: SessionsReplica) -> None:
    kv = replica.machine.kv
    replica.apply(cmd.encode_kv("A", 10, 0, [record("c1", 1), position("c1", b"1")]))
    # Command 11 (c1's next record) timed out and never reached the log; 12 followed it.
    replica.apply(cmd.encode_kv("A", 12, 11, [position("c1", b"3"), record("c2", 1)]))
    assert kv.raw_get(position("c1", b"")[0]) == b"1"  # not the position past record 11
    assert kv.raw_get(r.batch_key("c2", 1)) is None
    assert replica.refused == [{"c1", "c2"}]
    assert replica.machine.refused_serial == 12
    assert replica.machine.chain_breaks == 1
    # The writer chains on from what was applied: 13 follows 10.
    replica.apply(cmd.encode_kv("A", 13, 10, [position("c1", b"4")]))
    assert kv.raw_get(position("c1", b"")[0]) == b"4"
    assert replica.machine.chains == {"A": 13}


def test_a_late_command_its_writer_chained_past_is_skipped(replica: SessionsReplica) -> None:
    kv = replica.machine.kv
    replica.apply(cmd.encode_kv("A", 10, 0, [position("c1", b"1")]))
    replica.apply(cmd.encode_kv("A", 12, 10, [position("c1", b"2")]))
    replica.apply(cmd.encode_kv("A", 11, 10, [position("c1", b"old")]))  # came late
    replica.apply(cmd.encode_kv("A", 12, 10, [position("c1", b"2")]))  # a retried copy
    assert kv.raw_get(position("c1", b"")[0]) == b"2"
    assert replica.refused == []  # nothing the writer must act on
    assert replica.machine.applied_index == replica.index


def test_other_writers_refusals_are_not_told_here(replica: SessionsReplica) -> None:
    replica.apply(cmd.encode_kv("B", 5, 0, [position("c9", b"1")]))
    replica.apply(cmd.encode_kv("B", 7, 6, [position("c9", b"2")]))
    assert replica.refused == []  # B's refusal is B's to hear, on its own replica
    assert replica.machine.chain_breaks == 1


async def test_chains_are_durable_and_travel_in_snapshots(
        open_storage: Callable[..., DurableStorage], tmp_path: Path) -> None:
    first = open_storage(tmp_path / "a")
    replica = SessionsReplica(first)
    replica.apply(cmd.encode_kv("A", 10, 0, [position("c1", b"1")]))
    replica.apply(cmd.encode_kv("B", 4, 0, []))
    at, snapshot, done = await snapshot_chunk(replica.machine, 0, 0)
    assert done
    await first.close()
    assert SessionsReplica(open_storage(tmp_path / "a")).machine.chains == {"A": 10, "B": 4}
    other = SessionsReplica(open_storage(tmp_path / "b"))
    other.machine.install_chunk(SnapshotChunk(at, 1, Config(frozenset({"A"})), 0, snapshot,
                                              True))
    assert other.machine.chains == {"A": 10, "B": 4}
    other.index = at
    other.apply(cmd.encode_kv("A", 11, 9, [position("c1", b"x")]))  # a gap after 10
    assert other.machine.chain_breaks == 1


def test_kv_v1_commands_are_applied_unchained(replica: SessionsReplica) -> None:
    name = b"A"
    legacy = (bytes((cmd.KV_V1,)) + len(name).to_bytes(2, "big") + name
              + (1).to_bytes(4, "big") + (2).to_bytes(4, "big") + b"kk"
              + (1).to_bytes(4, "big", signed=True) + b"v")
    replica.apply(legacy)
    assert replica.machine.kv.raw_get(b"kk") == b"v"
    assert replica.machine.chains == {}


def test_a_tombstone_is_dated_by_its_command_and_swept_by_a_later_one(
        open_storage: Callable[..., DurableStorage]) -> None:
    """The end of a session is dated by the serial of the command that ended it (its
    writer's clock), the same on every replica; the leader's sweep deletes it once that is
    older than its cutoff."""
    replica = SessionsReplica(open_storage(), admit=admitted)
    kv = replica.machine.kv
    meta = r.Meta(60, 5, False, None, None, "A", 3, True).to_bytes()
    replica.apply(cmd.encode_kv("A", 1_000, 0, [(r.meta_key("c"), meta)]))
    replica.apply(cmd.encode_kv("A", 2_000, 1_000, [(r.meta_key("c"), None)]))
    tombstone = kv.raw_get(r.ended_key("c"))
    assert r.loads(tombstone) == {"epoch": 3, "at": 2_000}
    assert sweep_writes([(r.ended_key("c"), tombstone)], cutoff=1_999) == []
    replica.apply(cmd.encode_kv("L", 9_000, 0, sweep_writes([(r.ended_key("c"), tombstone)],
                                                             cutoff=2_000)))
    assert kv.raw_get(r.ended_key("c")) is None
    assert kv.raw_get(r.TOMBSTONE_SWEEP_KEY) is None
    assert replica.refused == []


async def test_a_key_written_and_deleted_in_one_flush_is_in_its_command_twice(
    open_storage: Callable[..., DurableStorage],
) -> None:
    """The replicas end with the delete, and judge what was written: a batch record read
    back within one flush still vouches for the batch a member hands back (group_fencing)."""
    kv = open_storage().sessions
    commands: list[list[cmd.KVWrite]] = []

    async def replicate(writes: list[cmd.KVWrite]) -> None:
        commands.append(writes)

    kv.replicate = replicate
    kv.buffer.pace(60.0)  # both writes wait for one flush
    kv.write_soon({b"k": b"v", b"j": b"1"}, sync=False)
    kv.write_soon({b"k": None, b"j": b"2"}, sync=False)
    await kv.drain()
    assert commands == [[(b"k", b"v"), (b"k", None), (b"j", b"2")]]
