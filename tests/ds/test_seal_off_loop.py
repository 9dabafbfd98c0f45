"""A generation's rotation and seal wait for the disk on worker threads, never on the event
loop (every node's loop serves its clients meanwhile): the LevelDB of the next generation is
made ahead, and a replicated rotation applied in log order only activates it; syncs,
compaction, LevelDB creations and closes run on the seal's worker. Checked structurally:
every blocking LevelDB call and slab creation is recorded with the thread that made it. The
crash tests stop a replica between a rotation and its commit, and just after, and check that
it restarts where the Raft log can take it on."""

import asyncio
import functools
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from broker.ds import replication_layer as cmd
from broker.ds.shard import Shard
from broker.ds.slab import Slab
from broker.ds.spare import NextSlab
from broker.ds.storage import MESSAGES
from tests.ds.conftest import message
from tests.ds.replicas import Replica, by_generation, stores

Calls = list[tuple[str, int]]  # (what, thread)


class _WatchedDB:
    """A slab's LevelDB that notes each call that waits for the disk (synced writes,
    compaction, close) with its thread; everything else passes through."""

    def __init__(self, db: Any, calls: Calls) -> None:
        self._db, self._calls = db, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._db, name)

    def _note(self, what: str) -> None:
        self._calls.append((what, threading.get_ident()))

    def put(self, key: bytes, value: bytes, sync: bool = False) -> None:
        if sync:
            self._note("synced put")
        self._db.put(key, value, sync=sync)

    def delete(self, key: bytes, sync: bool = False) -> None:
        if sync:
            self._note("synced delete")
        self._db.delete(key, sync=sync)

    def write_batch(self, sync: bool = False, **options: Any) -> Any:
        if sync:
            self._note("synced batch")
        return self._db.write_batch(sync=sync, **options)

    def compact_range(self, **options: Any) -> None:
        self._note("compaction")
        self._db.compact_range(**options)

    def close(self) -> None:
        self._note("close")
        self._db.close()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    """Every fsync from now on is noted (files.py's: directories, manifests). The shard and
    slab modules may be compiled (mypyc), so nothing of theirs is patched."""
    noted: Calls = []
    fsync = os.fsync

    def noted_fsync(fd: int) -> None:
        noted.append(("fsync", threading.get_ident()))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", noted_fsync)
    yield noted


def _watch(slab: Slab, calls: Calls) -> None:
    if not isinstance(slab._db, _WatchedDB):
        slab._db = _WatchedDB(slab.db, calls)


def _watch_spares(shard: Shard, calls: Calls) -> None:
    """The spares the shard makes from now on are noted and watched."""
    make = shard._make_spare

    def made(generation: int) -> Slab:
        calls.append(("slab creation", threading.get_ident()))
        spare = make(generation)
        _watch(spare, calls)
        return spare

    shard.next = NextSlab(shard.next.name, shard.executor, shard.open_slabs, made)


def _on(calls: Calls, thread: int) -> list[str]:
    return [what for what, ident in calls if ident == thread]


async def _rotate(replica: Replica, index: int, calls: Calls) -> list[str]:
    """ROTATE applied at `index` after the spare was made; what the loop did that waits
    for the disk, from the rotation to the end of the seal."""
    shard = replica.machine.shard
    _watch_spares(shard, calls)
    await asyncio.wrap_future(shard.prepare_next())
    for slab in shard.slabs.values():
        if slab.is_open:
            _watch(slab, calls)
    calls.clear()
    replica.apply(index, cmd.encode_rotate(1_000))
    await shard.wait_sealed()
    await asyncio.wrap_future(shard.prepare_next())  # the one made after the rotation
    return _on(calls, threading.get_ident())


async def test_a_replicated_rotation_leaves_the_disk_to_worker_threads(
        tmp_path: Path, executor: ThreadPoolExecutor, calls: Calls) -> None:
    replica = Replica(tmp_path, executor, max_open_slabs=1)
    for index, data in enumerate(stores(1, 5), start=1):
        replica.apply(index, data)
    on_loop = await _rotate(replica, 6, calls)
    assert on_loop == []
    done = [what for what, _ in calls]
    # The work was moved, not skipped: the old slab synced and compacted, the new one
    # committed (its mark removed, the directory synced), the next one made, and the sealed
    # one closed by the bound (1 open).
    for what in ("synced put", "compaction", "fsync", "slab creation", "close"):
        assert what in done
    shard = replica.machine.shard
    assert sorted(shard.slabs) == [1, 2] and shard.slabs[1].sealed
    assert not shard.current.spare and shard.current.created >= shard.slabs[1].sealed_at


async def test_a_local_seal_leaves_the_disk_to_worker_threads(
        open_storage: Any, calls: Calls) -> None:
    storage = open_storage(n_shards=1, max_open_slabs=1)
    await storage.store_batch(MESSAGES, [message("t/first")])  # made by its first write
    shard: Shard = storage.messages.shard(0)
    _watch_spares(shard, calls)
    storage.start()
    for round_ in range(3):  # the first rotation finds its spare made at the start
        await storage.store_batch(MESSAGES, [message(f"t/{round_}")])
        await asyncio.wrap_future(shard.prepare_next())
        _watch(shard.current, calls)
        calls.clear()
        assert await storage.seal() == 1
        assert _on(calls, threading.get_ident()) == []
        done = [what for what, _ in calls]
        assert "compaction" in done and "synced batch" in done  # sealed; spare activated
    assert sorted(shard.slabs) == [1, 2, 3, 4]


class _HeldExecutor(Executor):
    """Runs what is submitted only when told, on the caller's thread: a worker that has not
    got to a job yet when a crash comes."""

    def __init__(self) -> None:
        self.queued: list[tuple[Callable[..., Any], tuple[Any, ...], Future[Any]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self.queued.append((functools.partial(fn, **kwargs), args, future))
        return future

    def run(self, name: str) -> None:
        """Runs the queued jobs that call `name`."""
        for job in [job for job in self.queued if _name(job[0]) == name]:
            self.queued.remove(job)
            fn, args, future = job
            future.set_result(fn(*args))


def _name(job: functools.partial[Any]) -> str:
    return getattr(job.func, "__name__", "")


async def _crashed_after_rotation(tmp_path: Path, committed: bool) -> Replica:
    """A replica that applied STOREs 1-5 and ROTATE 6 and crashed: before the seal's
    worker committed the rotation, or after."""
    held = _HeldExecutor()
    replica = Replica(tmp_path, held)  # type: ignore[arg-type]
    for index, data in enumerate(stores(1, 5), start=1):
        replica.apply(index, data)
    shard = replica.machine.shard
    shard.prepare_next()
    held.run("_make")
    replica.apply(6, cmd.encode_rotate(1_000))
    if committed:
        shard.commit()
    assert sorted(shard.slabs) == [1, 2]
    held.run("_make")  # the next spare (the crash's close discards it)
    replica.crash()  # the seal's job never runs
    return replica


async def test_a_crash_before_a_rotation_is_committed_replays_it(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    intact = Replica(tmp_path / "intact", executor)
    for index, data in enumerate([*stores(1, 5), cmd.encode_rotate(1_000), *stores(6, 8)],
                                 start=1):
        intact.apply(index, data)
    await intact.machine.shard.wait_sealed()

    await _crashed_after_rotation(tmp_path / "cut", committed=False)
    restarted = Replica(tmp_path / "cut", executor)
    # The activated spare went (it was never one for sure): the rotation is the log's.
    assert sorted(restarted.machine.shard.slabs) == [1]
    assert restarted.machine.applied_index == 5
    for index, data in enumerate([cmd.encode_rotate(1_000), *stores(6, 8)], start=6):
        restarted.apply(index, data)
    await restarted.machine.shard.wait_sealed()
    assert by_generation(restarted) == by_generation(intact)


async def test_a_crash_after_a_rotation_is_committed_keeps_it(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = await _crashed_after_rotation(tmp_path, committed=True)
    before = by_generation(replica)
    restarted = Replica(tmp_path, executor)
    shard = restarted.machine.shard
    assert sorted(shard.slabs) == [1, 2] and shard.slabs[1].sealed  # its seal finished
    assert restarted.machine.applied_index == 6
    assert by_generation(restarted) == before


async def test_a_spare_left_by_a_crash_is_dropped_at_open(
        tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    replica = Replica(tmp_path, executor)
    replica.apply(1, stores(1, 1)[0])
    spare = await asyncio.wrap_future(replica.machine.shard.prepare_next())
    spare.close()  # as a kill leaves it: on disk, marked
    replica.machine.shard.next = NextSlab("kept", executor, replica.db.open_slabs,
                                          lambda _: spare)
    replica.crash()
    assert spare.path.exists()
    restarted = Replica(tmp_path, executor)
    assert not spare.path.exists() and sorted(restarted.machine.shard.slabs) == [1]
    assert restarted.machine.applied_index == 1
