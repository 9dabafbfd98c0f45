"""Shard 0 of a `messages` database as its Raft group applies it, on real LevelDB
directories: the replicas of the replicated-shard tests."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.ds import Settings
from broker.ds import replication_layer as cmd
from broker.ds.db import MessagesDB
from broker.ds.replication_shard import ShardMachine
from broker.raft.host import StateMachine
from broker.raft.messages import NORMAL, Entry
from tests.ds.conftest import message


class Replica:
    """Shard 0 of a `messages` database in `path`, as its Raft group applies it."""

    def __init__(self, path: Path, executor: ThreadPoolExecutor, **settings: int) -> None:
        self.db = MessagesDB("messages", path, Settings(n_shards=1, **settings), executor,
                             lambda *_: None)
        self.machine = ShardMachine(self.db, 0, self.db.reopen_shard)

    def apply(self, index: int, data: bytes) -> None:
        self.machine.apply(Entry(index, 1, NORMAL, data))

    def crash(self) -> None:
        self.db.close_shard_now(0)

    def stored(self) -> list[tuple[int, str, bytes]]:
        shard = self.machine.shard
        out = []
        for slab in shard.slabs.values():
            for stream in slab.lts.streams():
                out += [(m.timestamp, m.topic, m.payload)
                        for m in slab.scan(stream, 0, 1_000_000, None)[0]]
        return sorted(out)


def stores(first: int, last: int, writer: str = "site-a") -> list[bytes]:
    """STORE commands `first`..`last` of one writer, three messages each; clocks that stand
    still, so timestamps come from the shard's last one (the case a replay must redo)."""
    return [cmd.encode_store(1_000, writer, n, [message(f"t/{n % 2}", payload=b"%d-%d" % (n, i))
                                                for i in range(3)])
            for n in range(first, last + 1)]


def by_generation(replica: Replica) -> dict[int, list[tuple[int, str, bytes]]]:
    out: dict[int, list[tuple[int, str, bytes]]] = {}
    for generation, slab in replica.machine.shard.slabs.items():
        opened = slab.reopen()
        try:
            out[generation] = sorted(
                (m.timestamp, m.topic, m.payload) for stream in slab.lts.streams()
                for m in slab.scan(stream, 0, 1_000_000, None)[0])
        finally:
            if opened:
                slab.close()
    return out


async def snapshot_chunk(machine: StateMachine, index: int, offset: int
                         ) -> tuple[int, bytes, bool]:
    """The chunk, once the machine has its snapshot (a shard dumps it on a worker thread)."""
    answer = machine.snapshot_chunk(index, offset)
    if answer is None:
        assert isinstance(machine, ShardMachine) and machine.dumped is not None
        await machine.dumped
        answer = machine.snapshot_chunk(index, offset)
    assert answer is not None, "the dump failed"
    return answer

