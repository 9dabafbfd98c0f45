"""A shard's snapshot of version 2 (broker/ds/shipped.py): its sealed generations go as the
LevelDB files they are, checksummed, and a transfer that breaks off (a lost link, a restart
of the receiver) or brings a damaged file resumes without installing anything wrong."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from broker.ds.replication_shard import ShardMachine
from broker.ds.shipped import FILE_RECORD, staging_of
from broker.raft.ready import SnapshotChunk
from tests.ds.replicas import CONFIG, Replica, by_generation, install_chunk, snapshot_chunk
from tests.ds.test_shard_snapshot import PER_STORE, big_stores, filled, held, spooled


async def sealed_source(tmp_path: Path, executor: ThreadPoolExecutor) -> Replica:
    source = filled(tmp_path / "source", executor, 60, generation_max_size=4 << 20)
    await source.machine.shard.wait_sealed()
    assert len(source.machine.shard.slabs) >= 3
    return source


async def move(source: ShardMachine, target: ShardMachine, *, stop_after: int = 0,
               damage: int = -1) -> tuple[int, int]:
    """Chunks from source to target as the Raft core moves them, honouring the target's
    resume offsets; returns (index, bytes sent). `stop_after`: break off after that many
    chunks (returns index 0); `damage`: flip a byte of the chunk at that number once."""
    index = offset = sent = chunks = 0
    while True:
        at, data, done = await snapshot_chunk(source, index, offset)
        if chunks == damage:
            data = data[:len(data) // 2] + bytes((data[len(data) // 2] ^ 0xFF,)) \
                + data[len(data) // 2 + 1:]
        chunks += 1
        sent += len(data)
        resume = await install_chunk(target, SnapshotChunk(at, 1, CONFIG, offset, data, done))
        if resume is None and done:
            return at, sent
        index, offset = at, resume if resume is not None else offset + len(data)
        if stop_after and chunks >= stop_after:
            return 0, sent


class _HeldView:
    """A LevelDB snapshot whose records are read only once `held` is set."""

    def __init__(self, view: Any, held: threading.Event) -> None:
        self._view, self._held = view, held

    def iterator(self, *args: Any, **kwargs: Any) -> Any:
        assert self._held.wait(10)
        return self._view.iterator(*args, **kwargs)

    def close(self) -> None:
        self._view.close()


class _HeldDB:
    """The current slab's LevelDB, its snapshots held (_HeldView): the dump's records wait
    while the rest goes on. Through the slab's `db`, not a patched module function, which
    the native build's compiled calls would not see."""

    def __init__(self, db: Any, held: threading.Event) -> None:
        self._db, self._held = db, held

    def snapshot(self) -> _HeldView:
        return _HeldView(self._db.snapshot(), self._held)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)


async def test_the_files_leave_while_the_rest_is_dumped(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """The sealed generations' files do not wait for the current one's records: the
    stream up to their end is sent while the dump writes those, the rest once it is over."""
    source = await sealed_source(tmp_path, executor)
    records_held = threading.Event()
    current = source.machine.shard.current
    current._db = _HeldDB(current.db, records_held)  # (its `db` property reads it)
    ready = asyncio.Event()
    source.machine.spool.on_dumped = ready.set
    assert source.machine.snapshot_chunk(0, 0) is None  # the dump starts
    await asyncio.wait_for(ready.wait(), 10)  # its files are spliced in
    target = Replica(tmp_path / "target", executor)
    index = offset = 0
    while (answer := source.machine.snapshot_chunk(index, offset)) is not None:
        index, data, done = answer
        assert not done
        assert await install_chunk(target.machine, SnapshotChunk(index, 1, CONFIG, offset,
                                                                 data, done)) is None
        offset += len(data)
    dumped = source.machine.spool.dumped
    assert dumped is not None and not dumped.done()  # sent before the records are written
    sealed = [slab for slab in source.machine.shard.slabs.values() if slab.sealed]
    assert offset > sum(f.stat().st_size for slab in sealed for f in slab.path.glob("*.ldb"))
    records_held.set()
    await dumped
    while True:
        index, data, done = await snapshot_chunk(source.machine, index, offset)
        assert await install_chunk(target.machine, SnapshotChunk(index, 1, CONFIG, offset,
                                                                 data, done)) is None
        offset += len(data)
        if done:
            break
    assert index == 60
    assert by_generation(target) == by_generation(source)
    assert held(target) == 60 * PER_STORE


def shipped_dirs(replica: Replica) -> list[str]:
    return sorted(p.name for p in replica.machine.shard.path.iterdir())


async def test_sealed_generations_arrive_as_their_files(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await sealed_source(tmp_path, executor)
    first = await snapshot_chunk(source.machine, 0, 0)
    assert first[1][5] == 2 and first[1][10] == FILE_RECORD  # version 2, files listed first
    target = Replica(tmp_path / "target", executor)

    at, _ = await move(source.machine, target.machine)

    assert at == 60
    assert by_generation(target) == by_generation(source)
    assert held(target) == 60 * PER_STORE
    sealed = [slab for slab in target.machine.shard.slabs.values() if slab.sealed]
    assert len(sealed) == len(source.machine.shard.slabs) - 1
    for slab in sealed:  # the sender's very tables
        names = {p.name for p in slab.path.glob("*.ldb")}
        assert names and names <= {p.name for p in (source.machine.shard.path
                                                    / slab.path.name).glob("*.ldb")}
    assert spooled(tmp_path) == []  # spools, links and staged files all gone
    assert not staging_of(target.machine.shard.path).exists()
    target.apply(at + 1, big_stores(at + 1, at + 1)[0])
    assert target.machine.applied_index == at + 1


async def test_a_damaged_file_is_fetched_again_never_installed(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await sealed_source(tmp_path, executor)
    target = Replica(tmp_path / "target", executor)
    clean = await move(source.machine, Replica(tmp_path / "clean", executor).machine)

    at, sent = await move(source.machine, target.machine, damage=2)

    assert at == 60
    assert sent > clean[1]  # the damaged file went twice
    assert by_generation(target) == by_generation(source)


async def test_a_transfer_broken_off_resumes_after_what_the_receiver_kept(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    """The receiver restarts (a new machine on the same directory: kill -9), the leader
    starts over from offset 0: the files received whole and the part of the one under way
    are not sent again."""
    source = await sealed_source(tmp_path, executor)
    total = (await move(source.machine, Replica(tmp_path / "clean", executor).machine))[1]
    target = Replica(tmp_path / "target", executor)
    _, first = await move(source.machine, target.machine, stop_after=8)
    # kill -9 between two chunks: what was written is in the page cache; here the writer's
    # thread would go on beside the next receiver's, so it ends first.
    target.machine._drop_receiver()
    target.crash()
    staged = list(staging_of(target.machine.shard.path).rglob("*"))
    assert any(p.name.endswith(".part") for p in staged) or len(staged) > 8
    restarted = Replica(tmp_path / "target", executor)
    assert restarted.machine.applied_index == 0  # nothing installed

    at, second = await move(source.machine, restarted.machine)

    assert at == 60
    assert second < total - first // 2, (first, second, total)
    assert by_generation(restarted) == by_generation(source)
    assert not staging_of(restarted.machine.shard.path).exists()


async def test_version_1_is_sent_while_the_cluster_cannot_read_version_2(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    source = await sealed_source(tmp_path, executor)
    old = ShardMachine(source.db, 0, source.db.reopen_shard, ship_files=lambda: False)
    first = await snapshot_chunk(old, 0, 0)
    assert first[1][0] == 1  # a slab record: version 1
    assert not old.ships_sealed() and source.machine.ships_sealed()
    target = Replica(tmp_path / "target", executor)
    assert (await move(old, target.machine))[0] == 60
    assert by_generation(target) == by_generation(source)
