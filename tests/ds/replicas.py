"""The Raft state machines of Durable Storage as their groups apply them, on real LevelDB
directories: shard 0 of a `messages` database and the `sessions` database, the replicas of
the replicated-storage tests."""

import asyncio
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from broker.ds import DurableStorage, Settings
from broker.ds import replication_layer as cmd
from broker.ds.db import MessagesDB
from broker.ds.replication_shard import Admit, KVMachine, OnWrites, ShardMachine
from broker.ds.shard import ChangeListener
from broker.raft.host import PendingInstall, StateMachine
from broker.raft.messages import NORMAL, Config, Entry
from broker.raft.ready import SnapshotChunk
from broker.session.durable.ownership import sessions_of
from tests.ds.conftest import message

CONFIG = Config(frozenset({"a", "b", "c"}))


class Replica:
    """Shard 0 of a `messages` database in `path`, as its Raft group applies it."""

    def __init__(self, path: Path, executor: ThreadPoolExecutor,
                 on_change: ChangeListener = lambda *_: None, **settings: int) -> None:
        self.db = MessagesDB("messages", path, Settings(n_shards=1, **settings), executor,
                             on_change)
        self.machine = ShardMachine(self.db, 0, self.db.reopen_shard)

    def apply(self, index: int, data: bytes) -> None:
        self.machine.apply(Entry(index, 1, NORMAL, data))

    def crash(self) -> None:
        """As a kill leaves the shard: its spare and every LevelDB closed at once, without
        waiting for a seal under way (its job may never run: a kill ends its thread)."""
        shard = self.machine.shard
        shard.next.discard()
        for slab in shard.slabs.values():
            slab.close()

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


class SessionsReplica:
    """The sessions database of a storage, as its Raft group applies it on node `me`."""

    def __init__(self, storage: DurableStorage, me: str = "A", admit: Admit | None = None,
                 on_writes: OnWrites | None = None) -> None:
        self.refused: list[set[str]] = []
        self.machine = KVMachine(storage.sessions, on_writes, admit, me, self.refused.append,
                                 sessions_of)
        self.index = self.machine.applied_index

    def apply(self, data: bytes) -> None:
        self.index += 1
        self.machine.apply(Entry(self.index, 1, NORMAL, data))


async def snapshot_chunk(machine: StateMachine, index: int, offset: int
                         ) -> tuple[int, bytes, bool]:
    """The chunk, once the machine has its snapshot (dumped on a worker thread)."""
    answer = machine.snapshot_chunk(index, offset)
    if answer is None:
        assert isinstance(machine, ShardMachine | KVMachine) and machine.spool.dumped is not None
        await machine.spool.dumped
        answer = machine.snapshot_chunk(index, offset)
    assert answer is not None, "the dump failed"
    return answer


async def install_chunk(machine: StateMachine, chunk: SnapshotChunk) -> int | None:
    """The machine's `install_chunk`, run to its end as the node's shell does when the
    install goes on off the loop (a PendingInstall: awaited, then finished)."""
    answer = machine.install_chunk(chunk)
    if not isinstance(answer, PendingInstall):
        return answer
    loop = asyncio.get_running_loop()
    over = loop.create_future()
    answer.start(lambda: loop.call_soon_threadsafe(over.set_result, None))
    await over
    return answer.finish()


async def transfer(source: StateMachine, target: StateMachine) -> int:
    """Moves a snapshot chunk by chunk, as the Raft core asks for them; returns its index."""
    index = offset = 0
    while True:
        at, data, done = await snapshot_chunk(source, index, offset)
        await install_chunk(target, SnapshotChunk(at, 1, CONFIG, offset, data, done))
        if done:
            return at
        index, offset = at, offset + len(data)



async def traced_transfer(source: StateMachine, target: StateMachine) -> tuple[int, int]:
    """`transfer`, and the most Python memory held at once meanwhile (bytes), both nodes'."""
    tracemalloc.start()
    try:
        at = await transfer(source, target)
        return at, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
